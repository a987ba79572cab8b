import pytest

from helpers.core.settings import SettingsError, load_settings


def test_cpu_is_the_default_without_vllm_host():
    s = load_settings({})
    assert s.profile == "cpu" and s.managed
    assert s.base_url == "http://127.0.0.1:8000/v1"
    assert s.metrics_url == "http://127.0.0.1:8000/metrics"
    assert s.model == "tiny-agent"


def test_k8s_profile_from_namespace_and_host():
    s = load_settings({"VLLM_HOST": "http://vllm-engine.ws-01:8000/v1/", "NAMESPACE": "ws-01",
                       "MODEL_NAME": "Qwen/Qwen3-4B", "VLLM_API_KEY": "sk-very-secret"})
    assert s.profile == "k8s" and not s.managed
    assert s.base_url == "http://vllm-engine.ws-01:8000/v1"
    assert s.metrics_url == "http://vllm-engine.ws-01:8000/metrics"


def test_base_url_gains_v1_and_metrics_keeps_path_prefix():
    s = load_settings({"VLLM_HOST": "https://gw.example/team-a", "WORKSHOP_PROFILE": "gpu"})
    assert s.base_url == "https://gw.example/team-a/v1"
    assert s.metrics_url == "https://gw.example/team-a/metrics"
    assert s.model == "Qwen/Qwen3-4B"


def test_secrets_never_printed():
    s = load_settings({"VLLM_HOST": "http://h:1/v1", "VLLM_API_KEY": "sk-very-secret"})
    assert "sk-very-secret" not in repr(s)
    assert "sk-very-secret" not in str(s.describe())
    assert s.describe()["api_key"] == "set"


@pytest.mark.parametrize("env, fragment", [
    ({"WORKSHOP_PROFILE": "tpu"}, "WORKSHOP_PROFILE must be one of"),
    ({"WORKSHOP_PROFILE": "k8s"}, "needs VLLM_HOST"),
    ({"VLLM_HOST": "vllm:8000"}, "must start with http"),
    ({"WORKSHOP_PORT": "eighty"}, "WORKSHOP_PORT must be a port number"),
])
def test_bad_settings_say_what_to_do(env, fragment):
    with pytest.raises(SettingsError, match=fragment):
        load_settings(env)


def test_auth_headers_only_with_a_key():
    assert load_settings({}).auth_headers() == {}
    keyed = load_settings({"VLLM_HOST": "http://h:1/v1", "VLLM_API_KEY": "sk-x"})
    assert keyed.auth_headers() == {"Authorization": "Bearer sk-x"}


@pytest.mark.parametrize("host, base_url", [
    ("http://h:8000", "http://h:8000/v1"),
    ("http://h:8000/", "http://h:8000/v1"),
    ("http://h:8000/v1", "http://h:8000/v1"),
    ("http://h:8000/v1/", "http://h:8000/v1"),
    ("http://h:8000/v1/chat/completions", "http://h:8000/v1"),  # pasted from a request: was .../completions/v1
    ("http://h:8000/v1/completions/", "http://h:8000/v1"),
    ("http://h:8000/v1/models", "http://h:8000/v1"),
    ("https://gw.example/team-a/v1/chat/completions", "https://gw.example/team-a/v1"),  # a proxy prefix stays
])
def test_vllm_host_is_normalized_to_the_v1_base_url(host, base_url):
    s = load_settings({"VLLM_HOST": host})
    assert s.base_url == base_url
    assert s.metrics_url == base_url[: -len("/v1")] + "/metrics"


@pytest.mark.parametrize("host, fragment", [
    ("http://h:8000/v1/chat", "did you mean http://h:8000/v1?"),
    ("http://h:8000/chat/completions", "did you mean http://h:8000/v1?"),
    ("http://h:8000/metrics", "did you mean http://h:8000/v1?"),
    ("http://h:8000/v1/v1", "did you mean http://h:8000/v1?"),
    ("http://h:port/v1", "port that is not a number"),
    ("http:///v1", "no host name"),
    ("http://h:8000/v1?key=1", "?query"),
])
def test_vllm_host_that_is_not_a_base_url_is_refused_with_the_expected_form(host, fragment):
    with pytest.raises(SettingsError) as err:
        load_settings({"VLLM_HOST": host})
    assert fragment in str(err.value)
    assert "e.g. http://vllm-engine:8000 or http://vllm-engine:8000/v1" in str(err.value)


def test_the_workshop_gpu_comes_from_provisioning_with_a_stated_default():
    from helpers.core.settings import DEFAULT_WORKSHOP_GPU

    unset = load_settings({})
    assert unset.gpu == DEFAULT_WORKSHOP_GPU and unset.gpu_is_default
    named = load_settings({"WORKSHOP_GPU": " H100 SXM "})
    assert named.gpu == "H100 SXM" and not named.gpu_is_default
    assert load_settings({"WORKSHOP_GPU": ""}).gpu_is_default  # an empty ConfigMap value is unset


def test_the_rooms_extra_models_are_read_as_a_list():
    assert load_settings({}).extra_models == ()
    assert load_settings({"WORKSHOP_EXTRA_MODELS": "Qwen/Qwen3-30B-A3B  other/x"}).extra_models == (
        "Qwen/Qwen3-30B-A3B", "other/x")
