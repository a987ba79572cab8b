"""Tracing for the engine: vLLM's flag that exports a span per request, and the trace store that receives them.

- ``with_tracing(config, endpoint)``: the same configuration with ``--otlp-traces-endpoint`` (a restart, as every
  flag change is). vLLM 0.32 exports over OTLP/gRPC unless ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` says
  ``http/protobuf`` (vllm/tracing/otel.py, ``get_span_exporter``); this sends OTLP/HTTP, the protocol Phoenix takes
  on its one web port, and exports every half second (``OTEL_BSP_SCHEDULE_DELAY``; the SDK's default is 5 s).
  ``--collect-detailed-traces`` is left out: 0.32 accepts it, but nothing in its request span reads it.
- ``TraceStore``: Arize Phoenix, a trace viewer people use, as a local process on 127.0.0.1 that needs no network.
  It runs from its own environment, ``.venv-phoenix`` (``bash install/phoenix.sh`` builds it from
  requirements-phoenix.txt): vLLM pins fastapi and starlette, and Phoenix needs others.

Tracing off is the default: no configuration of the kit carries the flag unless ``with_tracing`` added it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from helpers.core.kit_paths import work_root
from helpers.core.vllm_args import EngineConfig, with_flag
from helpers.engine.interface import EngineError

TRACES_FLAG = "--otlp-traces-endpoint"
PHOENIX_VARIABLE = "WORKSHOP_PHOENIX"  # the phoenix executable to run, if not .venv-phoenix's or one on PATH
INSTALL_PHOENIX = ("Arize Phoenix (the trace store) is not installed: `bash install/phoenix.sh` builds its own "
                   "environment, .venv-phoenix, from requirements-phoenix.txt")
START_TIMEOUT_S = 120.0
TRACING_ENV = (("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"), ("OTEL_BSP_SCHEDULE_DELAY", "500"))


def with_tracing(config: EngineConfig, endpoint: str) -> EngineConfig:
    """``config`` exporting one span per request to ``endpoint``, an OTLP/HTTP traces URL (``.../v1/traces``)."""
    env = dict(config.env)
    env.update(TRACING_ENV)
    return EngineConfig(config.model, config.served_name, with_flag(config.args, TRACES_FLAG, endpoint),
                        tuple(sorted(env.items())))


def phoenix_executable() -> Path | None:
    """Phoenix's command: ``WORKSHOP_PHOENIX``, else ``.venv-phoenix/bin/phoenix`` in the clone, else one on PATH."""
    named = os.environ.get(PHOENIX_VARIABLE)
    if named:
        return Path(named) if Path(named).is_file() else None
    local = work_root() / ".venv-phoenix" / "bin" / "phoenix"
    if local.is_file():
        return local.resolve()
    found = shutil.which("phoenix")
    return Path(found) if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TraceStore:
    """A Phoenix server of our own on 127.0.0.1: its web UI and REST API at ``url``, OTLP/HTTP at ``otlp_endpoint``.

    Its database lives in ``working_dir`` (a new temporary folder unless given), its telemetry is off, and it is
    stopped by ``stop`` or at the end of a ``with`` block."""

    def __init__(self, port: int | None = None, working_dir: Path | None = None) -> None:
        self.port = port or _free_port()
        self.working_dir = Path(working_dir or tempfile.mkdtemp(prefix="phoenix-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def otlp_endpoint(self) -> str:
        return f"{self.url}/v1/traces"

    @property
    def log_path(self) -> Path:
        return self.working_dir / "phoenix.log"

    def start(self, timeout_s: float = START_TIMEOUT_S) -> "TraceStore":
        """Start Phoenix and wait until it answers; raises EngineError with its log's end if it does not."""
        executable = phoenix_executable()
        if executable is None:
            raise EngineError(INSTALL_PHOENIX)
        env = {**os.environ, "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(self.port),
               "PHOENIX_GRPC_PORT": str(_free_port()), "PHOENIX_WORKING_DIR": str(self.working_dir),
               "PHOENIX_TELEMETRY_ENABLED": "false"}
        log = self.log_path.open("ab")
        self.process = subprocess.Popen([str(executable), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-15:])
        self.stop()
        raise EngineError(f"Phoenix did not start on {self.url} within {timeout_s:.0f} s; its log ends:\n{tail}")

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout_s)

    def __enter__(self) -> "TraceStore":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
