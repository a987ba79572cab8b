"""The engine interface without starting vLLM: flags, log excerpts, port and endpoint checks."""

import json
import socket
import time

import pytest
from fake_vllm import serve_json

from fakes import held_port
from helpers.engine.interface import EngineError, ExternalEngine, default_config, log_excerpt, resolve_model
from helpers.engine.local import LocalEngine
from helpers.core.vllm_args import EngineConfig, flag_value
from helpers.core.settings import load_settings

def test_log_excerpt_keeps_the_error_and_drops_argparse_usage():
    log = "\n".join(["INFO starting", "usage: api_server.py [-h]", "                [--log-error-stack]",
                     "api_server.py: error: argument --max-num-seqs: invalid int value: 'x'"] + [f"INFO {i}" for i in range(40)])
    excerpt = log_excerpt(log)
    assert "invalid int value" in excerpt
    assert "--log-error-stack" not in excerpt
    assert "INFO 39" in excerpt


def test_cpu_default_config_sets_kv_memory_and_tool_parser():
    cfg = default_config(load_settings({}))
    assert cfg.served_name == "tiny-agent" and cfg.model.endswith("models/tiny-agent")
    assert flag_value(cfg.args, "--kv-cache-memory-bytes") == str(1 << 30)
    assert flag_value(cfg.args, "--tool-call-parser") == "hermes"
    assert EngineConfig.from_json(cfg.to_json()) == cfg


def test_local_engine_refuses_an_external_endpoint():
    with pytest.raises(EngineError, match="external endpoint"):
        LocalEngine(load_settings({"VLLM_HOST": "http://example.invalid:1/v1"}))


def test_port_in_use_is_reported_before_starting_anything():
    with held_port() as port:
        engine = LocalEngine(load_settings({"WORKSHOP_PORT": str(port)}))
        with pytest.raises(EngineError, match=f"Port {port} is already in use"):
            engine.start(timeout_s=5)


def test_log_excerpt_keeps_a_workers_root_cause_before_the_cascade():
    log = "\n".join(["INFO loading"] * 5
                    + ["(Worker pid=7) RuntimeError: _C::static_scaled_fp8_quant() expected at most 0 argument(s)"]
                    + [f"(EngineCore pid=6) ERROR WorkerProc initialization failed {i}" for i in range(40)]
                    + ["RuntimeError: Engine core initialization failed. See root cause above."])
    excerpt = log_excerpt(log).splitlines()
    assert excerpt[0].endswith("expected at most 0 argument(s)") and len(excerpt) <= 20
    assert "RuntimeError: Engine core initialization failed. See root cause above." in excerpt


def test_status_of_an_unreachable_endpoint_says_why_it_is_not_ready():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    status = ExternalEngine(load_settings({"VLLM_HOST": f"http://127.0.0.1:{port}/v1"})).status()
    assert status["ready"] is False and status["problem"].startswith(f"cannot reach http://127.0.0.1:{port}/v1/models")


def test_status_names_a_refused_key_and_another_model():
    server = serve_json(401, {"error": "Unauthorized"})
    try:
        settings = load_settings({"VLLM_HOST": f"http://127.0.0.1:{server.server_port}/v1", "VLLM_API_KEY": "sk-wrong"})
        engine = ExternalEngine(settings)
        assert "refused the API key (HTTP 401): set VLLM_API_KEY" in engine.status()["problem"]
        assert "sk-wrong" not in json.dumps(engine.status())
        started = time.monotonic()
        with pytest.raises(EngineError, match="refused the API key"):  # not "not ready yet" until the deadline
            engine.wait_serving("tiny-agent", time.monotonic() + 60, 60)
        assert time.monotonic() - started < 30
    finally:
        server.shutdown()
    server = serve_json(200, {"data": [{"id": "tiny-moe"}]})
    try:
        status = ExternalEngine(load_settings({"VLLM_HOST": f"http://127.0.0.1:{server.server_port}/v1",
                                               "MODEL_NAME": "tiny-agent"})).status()
        assert status["served"] == ["tiny-moe"] and status["problem"] == "the endpoint serves ['tiny-moe'], not 'tiny-agent'"
    finally:
        server.shutdown()


def test_a_model_name_that_is_not_shipped_is_refused_on_the_cpu_profile_naming_the_shipped_ones():
    with pytest.raises(EngineError, match=r"Model 'nope' is neither a model shipped in models/ \(.*tiny-agent.*\)"):
        default_config(load_settings({"MODEL_NAME": "nope"}))
    assert resolve_model("tiny-moe", "cpu").endswith("models/tiny-moe")
    assert resolve_model("Qwen/Qwen3-0.6B", "cpu") == "Qwen/Qwen3-0.6B"  # a hub id: vLLM fetches it when it can
    assert resolve_model("nope", "gpu") == "nope"  # the GPU profile has the network: vLLM says what is wrong
