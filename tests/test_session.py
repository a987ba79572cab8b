"""Endpoint errors are clear and fast, checked against small local HTTP servers (no vLLM needed).

The model is always MODEL_NAME: against a local engine whose server is tests/fake_engine_server.py, and
against a remote endpoint that is a small server answering /v1/models.
"""

import socket
import time

import pytest
from fake_engine_server import use_fake_engine
from fake_vllm import serve_json as serve

from helpers.cli.main import main
from helpers.engine.interface import EngineError, shipped_models
from helpers.engine.local import LocalEngine
from helpers.engine.session import EndpointError, check_endpoint, connect
from helpers.core.settings import load_settings, models_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_endpoint_names_the_url_and_returns_quickly():
    settings = load_settings({"VLLM_HOST": f"http://127.0.0.1:{free_port()}/v1"})
    start = time.monotonic()
    with pytest.raises(EndpointError, match=r"Cannot reach the engine at http://127\.0\.0\.1:\d+/v1/models.*VLLM_HOST"):
        check_endpoint(settings)
    assert time.monotonic() - start < 10


def test_wrong_api_key_is_explained_without_showing_it():
    server = serve(401, {"error": "Unauthorized"})
    settings = load_settings({"VLLM_HOST": f"http://127.0.0.1:{server.server_port}/v1", "VLLM_API_KEY": "sk-wrong"})
    with pytest.raises(EndpointError, match="401 Unauthorized.*VLLM_API_KEY") as info:
        check_endpoint(settings)
    assert "sk-wrong" not in str(info.value)
    server.shutdown()


def test_unknown_model_lists_the_served_ones():
    server = serve(200, {"data": [{"id": "tiny-agent"}, {"id": "tiny-draft"}]})
    settings = load_settings({"VLLM_HOST": f"http://127.0.0.1:{server.server_port}/v1"})
    assert check_endpoint(settings) == ["tiny-agent", "tiny-draft"]
    with pytest.raises(EndpointError, match=r"'qwen' is not served.*\['tiny-agent', 'tiny-draft'\].*MODEL_NAME"):
        check_endpoint(settings, "qwen")
    server.shutdown()


# ---------------------------------------------------------------- the model is MODEL_NAME, or an error

@pytest.fixture
def running_engine(monkeypatch):
    """The local engine on a free port, serving tiny-agent; its server is tests/fake_engine_server.py (no vLLM)."""
    use_fake_engine(monkeypatch)
    monkeypatch.setenv("WORKSHOP_PORT", str(free_port()))
    engine = LocalEngine(load_settings())
    engine.start(timeout_s=60)
    assert engine.served_models() == ["tiny-agent"]
    yield engine
    engine.stop()


def test_a_shipped_model_name_switches_the_running_local_engine_to_it(running_engine, monkeypatch, capsys):
    before = running_engine.pid
    monkeypatch.setenv("MODEL_NAME", "tiny-moe")
    lab = connect(load_settings(), start=False)  # as `workshop eval` connects: starts nothing that is not running
    assert lab.model == "tiny-moe" and lab.check() == ["tiny-moe"]
    assert lab.engine.config().model == str(models_dir() / "tiny-moe") and lab.engine.pid != before
    said = capsys.readouterr().out
    assert "serves 'tiny-agent'; the settings ask for 'tiny-moe' (MODEL_NAME): restarting on it" in said


def test_workshop_eval_refuses_a_model_name_that_is_not_shipped_naming_the_shipped_ones(running_engine, monkeypatch,
                                                                                       capsys):
    before = running_engine.pid
    monkeypatch.setenv("MODEL_NAME", "no-such-model")
    assert main(["eval", "--suite", "smoke"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: Model 'no-such-model' is neither a model shipped in models/ (tiny-agent, ")
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert all(name in captured.err for name in shipped_models()) and "Set MODEL_NAME to one of the" in captured.err
    assert "tasks against" not in captured.out  # nothing was evaluated
    with pytest.raises(EngineError, match="'no-such-model' is neither a model shipped"):
        connect(load_settings())  # nor started on
    assert running_engine.pid == before and running_engine.served_models() == ["tiny-agent"]  # left as it was


def test_a_local_endpoint_not_serving_the_name_says_how_to_serve_it_or_names_the_shipped_models():
    server = serve(200, {"data": [{"id": "tiny-agent"}]})  # what `workshop bench` checks before it sends anything
    settings = load_settings({"WORKSHOP_PORT": str(server.server_port)})
    assert settings.managed
    with pytest.raises(EndpointError) as info:
        check_endpoint(settings, "tiny-moe")
    assert "'tiny-moe' is not served" in str(info.value) and "Served: ['tiny-agent']" in str(info.value)
    assert "`MODEL_NAME=tiny-moe workshop up`" in str(info.value)
    with pytest.raises(EndpointError, match=r"'no-such-model' is neither a model shipped in models/ \(tiny-agent, "):
        check_endpoint(settings, "no-such-model")
    server.shutdown()


def test_a_remote_endpoint_not_serving_the_model_name_is_refused_naming_the_served_ones(monkeypatch, capsys):
    server = serve(200, {"data": [{"id": "tiny-agent"}, {"id": "tiny-draft"}]})
    monkeypatch.setenv("VLLM_HOST", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("MODEL_NAME", "no-such-model")
    with pytest.raises(EndpointError, match=r"'no-such-model' is not served at .*\['tiny-agent', 'tiny-draft'\]"):
        connect(load_settings())
    assert main(["eval", "--suite", "smoke"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Model 'no-such-model' is not served at") and err.count("\n") == 1
    assert "['tiny-agent', 'tiny-draft']" in err
    server.shutdown()


def test_a_remote_endpoint_serving_the_model_name_is_used_with_that_name(monkeypatch):
    server = serve(200, {"data": [{"id": "tiny-agent"}, {"id": "tiny-draft"}]})
    monkeypatch.setenv("VLLM_HOST", f"http://127.0.0.1:{server.server_port}/v1")
    monkeypatch.setenv("MODEL_NAME", "tiny-draft")  # not the first one served
    lab = connect(load_settings(), start=False)
    assert lab.model == "tiny-draft" and lab.check() == ["tiny-agent", "tiny-draft"]
    server.shutdown()
