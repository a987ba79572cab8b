"""What several test files share: an engine that keeps its configuration in memory, an environment of its own for
a test's real engine, a port some other program holds, and a recorded stream. (Fake servers live in fake_vllm.py and
fake_engine_server.py, a fake kubectl in fixtures/fake_kubectl.py, fake package indexes in fake_index.py.) Also
a scripted chat completion (``reply``, with ``ToolCall``s) as the openai client returns it."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

from helpers.core.settings import CONTRACT_VARIABLES
from helpers.core.vllm_args import EngineConfig
from helpers.engine.interface import Engine
from helpers.measure.stream_timing import StreamTiming


class RecordingEngine(Engine):
    """Keeps a configuration in memory and records each apply (what a flag change or a rollback calls)."""

    def __init__(self, config: EngineConfig) -> None:
        self._config, self.applied = config, []

    def config(self) -> EngineConfig:
        return self._config

    def apply(self, config: EngineConfig, timeout_s: float | None = None) -> None:
        self.applied.append(config)
        self._config = config

    def logs(self, lines: int = 50) -> str:
        return ""

    def stop(self) -> None:
        pass


@contextmanager
def engine_environment(port: int | str, state_dir: Path) -> Iterator[Path]:
    """This process's environment for a test's own engine: no contract variable (VLLM_HOST, MODEL_NAME, ...), its own
    port and state directory; the environment as it was afterwards."""
    saved = dict(os.environ)
    for name in CONTRACT_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(WORKSHOP_PORT=str(port), WORKSHOP_STATE_DIR=str(state_dir))
    try:
        yield state_dir
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def held_port() -> Iterator[int]:
    """A port on 127.0.0.1 that this test process listens on (another program, as the engine sees it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def recorded_stream(events: list[tuple[float, int, str]]) -> StreamTiming:
    """A stream's timing from ``(seconds since sent, tokens so far, text)`` chunk events, done at the last one."""
    timing = StreamTiming(t_sent=0.0)
    for event in events:
        timing.record_chunk(*event)
    timing.t_done = events[-1][0]
    return timing


def fake_kubectl_on_path(tmp_path: Path, monkeypatch, state_path: Path) -> None:
    """Put tests/fixtures/fake_kubectl.py first on PATH as ``kubectl``, its cluster kept in ``state_path``."""
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "kubectl"
    fake = Path(__file__).resolve().parent / "fixtures" / "fake_kubectl.py"
    wrapper.write_text(f"#!/bin/sh\nexec '{sys.executable}' '{fake}' \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_KUBECTL_STATE", str(state_path))


class ToolCall(SimpleNamespace):
    """A tool call of a scripted reply: ``ToolCall(id=..., function=SimpleNamespace(name=..., arguments=...))``."""

    def model_dump(self, include=None):
        return {"id": self.id, "type": "function",
                "function": {"name": self.function.name, "arguments": self.function.arguments}}


def reply(content=None, calls=(), prompt_tokens=100, completion_tokens=10, finish_reason="stop"):
    """A chat completion as the openai client returns it: one choice with its message, and the usage."""
    message = SimpleNamespace(content=content, tool_calls=list(calls) or None)
    return SimpleNamespace(choices=[SimpleNamespace(message=message, finish_reason=finish_reason)],
                           usage=SimpleNamespace(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens))
