"""Endpoint errors are clear and fast, checked against small local HTTP servers (no vLLM needed)."""

import socket
import time

import pytest
from fake_vllm import serve_json as serve

from helpers.session import EndpointError, check_endpoint
from helpers.settings import load_settings


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
