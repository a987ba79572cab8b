"""The engine interface without starting vLLM: flags, log excerpts, port and endpoint checks."""

import socket

import pytest

from helpers.engine import EngineError, default_config, log_excerpt
from helpers.local_engine import LocalEngine
from helpers.vllm_args import EngineConfig, flag_value
from helpers.settings import load_settings

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
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
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
