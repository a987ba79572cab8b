import pytest

from helpers.settings import SettingsError, load_settings


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
