"""vLLM's router (``vllm-router``, a Rust binary in a wheel) as a process on this machine, in front of replicas.

``RouterProcess`` starts, finds and stops one router per port, the way ``LocalEngine`` does for an engine:
a state file (``router-PORT.json``: PID, start time, command line, policy, workers), a short-lived launcher
so the router leads its own session, and a stop that ends every process of that session and checks that
the port is free. ``router_command`` builds the command line (pure); ``router_figures`` reads the router's
own Prometheus text (requests, retries, circuit-breaker state, per worker).

Flags are those of ``vllm-router --help`` (version 0.1.17): ``--worker-urls``, ``--policy``, ``--host``,
``--port``, ``--prometheus-port``, ``--health-check-interval-secs``, ``--retry-max-retries``,
``--cb-failure-threshold`` ... ``consistent_hash`` keys on the ``X-Session-ID`` header first (then
``X-User-ID``, ``X-Tenant-ID``, ``X-Request-ID``; the router's docs/load_balancing/README.md).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from helpers.engine.interface import EngineError, EngineStartError, log_excerpt
from helpers.engine.process import (STATE_MARK, describe_process, end_processes, launch_detached, port_holder,
                                    process_if_alive, read_log, session_members)
from helpers.core.settings import state_dir
from helpers.core.vllm_args import ROUTER_POLICIES as POLICIES
SESSION_HEADER = "X-Session-ID"  # what consistent_hash hashes on first
ROUTER_VERSION = "0.1.17"
INSTALL_HINT = f"pip install vllm-router=={ROUTER_VERSION} (into the workshop's environment: .venv/bin/pip install ...)"
ROUTER_START_TIMEOUT_S = 60.0
# A lab-sized router: health checks every 2 s (default 60 s) so a dead replica is noticed within seconds; the
# circuit breaker (opens after 10 failures in its window, the default) tries a worker again after 10 s, not
# 60 s, and closes after one success, so a restarted replica is back in the rotation soon after it serves.
DEFAULT_ROUTER_FLAGS = ("--health-check-interval-secs", "2", "--health-failure-threshold", "2",
                        "--health-success-threshold", "1", "--health-check-timeout-secs", "2",
                        "--cb-timeout-duration-secs", "10", "--cb-success-threshold", "1",
                        "--log-level", "info")


class RouterError(EngineError):
    """The router could not do what was asked; the message says what to do next."""


def router_binary() -> str:
    """The ``vllm-router`` program beside this Python (the workshop's venv), else on PATH; RouterError if absent."""
    beside = Path(sys.executable).parent / "vllm-router"
    if beside.is_file():
        return str(beside)
    found = shutil.which("vllm-router")
    if found:
        return found
    raise RouterError(f"vllm-router is not installed: {INSTALL_HINT}. It is in the `cpu` and `gpu` extras "
                      "(pip install -e '.[cpu]').")


def router_command(binary: str, worker_urls: Sequence[str], policy: str, port: int, prometheus_port: int,
                   host: str = "127.0.0.1", extra: Sequence[str] = DEFAULT_ROUTER_FLAGS) -> list[str]:
    """The router's command line: workers, policy, where it listens and where its metrics are."""
    if policy not in POLICIES:
        raise RouterError(f"Unknown router policy {policy!r}: choose one of {', '.join(POLICIES)}.")
    if not worker_urls:
        raise RouterError("The router needs at least one worker URL (start the replicas first).")
    return [binary, "--worker-urls", *worker_urls, "--policy", policy, "--host", host, "--port", str(port),
            "--prometheus-port", str(prometheus_port), "--prometheus-host", host, *extra]


# ---------------------------------------------------------------- the router's own metrics

def _labels_text(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def router_figures(text: str) -> dict[str, float]:
    """Counters and gauges of the router's /metrics by ``name{labels}`` (histograms left out); {} when empty."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:
        return out
    for family in families:
        if family.type not in ("counter", "gauge", "untyped", "unknown"):
            continue
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            key = sample.name + (f"{{{_labels_text(sample.labels)}}}" if sample.labels else "")
            out[key] = float(sample.value)
    return out


def fetch_figures(url: str, timeout_s: float = 3.0) -> dict[str, float]:
    """The router's figures read from its /metrics ``url``; RouterError saying what failed."""
    try:
        resp = httpx.get(url, timeout=timeout_s)
    except httpx.HTTPError as err:
        raise RouterError(f"{type(err).__name__} at {url}") from None
    if resp.status_code != 200:
        raise RouterError(f"HTTP {resp.status_code} at {url}")
    return router_figures(resp.text)


def figure_deltas(before: dict[str, float], after: dict[str, float], contains: Sequence[str] = ()) -> dict[str, float]:
    """What changed between two reads of the router's figures: counters by how much they grew, gauges by their
    value after (when it changed, or is not zero); only names containing one of ``contains`` (all when empty)."""
    out = {}
    for key, value in after.items():
        if contains and not any(c in key for c in contains):
            continue
        grown = value - before.get(key, 0.0)
        if "_total" in key or key.split("{")[0].endswith("_count"):
            if grown:
                out[key] = grown
        elif value or key in before and before[key] != value:
            out[key] = value
    return out


def _labels(key: str) -> dict[str, str]:
    """The labels of a figure's key, ``name{a=1,b=2}`` -> {"a": "1", "b": "2"}."""
    inside = key.partition("{")[2].rstrip("}")
    return dict(part.split("=", 1) for part in inside.split(",") if "=" in part)


def describe_failover(deltas: dict[str, float], worker_urls: Sequence[str]) -> str:
    """What the router did while a worker failed, from ``figure_deltas``: retries, requests that ran out of
    retries, failed attempts and circuit-breaker openings per replica (named by its index in ``worker_urls``)."""
    if not deltas:
        return "The router exposed no figures for this run."

    def total(name: str, **labels: str) -> int:
        return int(sum(v for k, v in deltas.items() if k.split("{")[0] == name
                       and all(_labels(k).get(a) == b for a, b in labels.items())))

    parts = [f"retried {total('vllm_router_retries_total')} time(s)",
             f"{total('vllm_router_retries_exhausted_total')} request(s) ran out of retries"]
    for i, url in enumerate(worker_urls):
        failed = total("vllm_router_cb_outcomes_total", outcome="failure", worker=url)
        opened = total("vllm_router_cb_state_transitions_total", to="open", worker=url)
        if failed or opened:
            parts.append(f"replica {i}: {failed} failed attempt(s), circuit breaker opened {opened} time(s)")
    return "The router " + "; ".join(parts) + "."


# ---------------------------------------------------------------- the process

@dataclass
class RouterState:
    pid: int | None = None
    create_time: float | None = None
    cmdline: list[str] | None = None
    policy: str | None = None
    worker_urls: list[str] = field(default_factory=list)
    prometheus_port: int | None = None
    log_offset: int = 0


class RouterProcess:
    """One ``vllm-router`` on ``port`` of this machine, owned through ``router-PORT.json``."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.state_path = state_dir() / f"router-{port}.json"

    # ---- state
    def load(self) -> RouterState:
        try:
            data = json.loads(self.state_path.read_text())
            known = set(RouterState.__dataclass_fields__)
            return RouterState(**{k: v for k, v in data.items() if k in known})
        except (OSError, ValueError, TypeError):
            return RouterState()

    def _save(self, state: RouterState) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state), indent=1))
        tmp.replace(self.state_path)

    @property
    def pid(self) -> int | None:
        """The router's PID while it runs."""
        state = self.load()
        proc = process_if_alive(state.pid, state.create_time)
        return proc.pid if proc else None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metrics_url(self) -> str | None:
        port = self.load().prometheus_port
        return f"http://127.0.0.1:{port}/metrics" if port else None

    def log_path(self) -> Path:
        return state_dir() / f"router-{self.port}.log"

    def logs(self, lines: int = 50) -> str:
        try:
            return "\n".join(self.log_path().read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _log_since(self, offset: int) -> str:
        return read_log(self.log_path(), offset)

    # ---- start, stop
    def start(self, worker_urls: Sequence[str], policy: str, prometheus_port: int,
              timeout_s: float = ROUTER_START_TIMEOUT_S, model: str | None = None,
              extra: Sequence[str] = DEFAULT_ROUTER_FLAGS) -> None:
        """Start the router (stopping ours first if it runs) and wait until it routes: ``/v1/models`` answers
        through it (and lists ``model`` when given)."""
        cmd = router_command(router_binary(), worker_urls, policy, self.port, prometheus_port, extra=extra)
        self.stop()
        for port, what in ((self.port, "the router"), (prometheus_port, "the router's metrics")):
            busy, holder = port_holder(port)
            if busy:
                raise RouterError(f"Port {port} (for {what}) is already in use by {describe_process(holder)}; nothing "
                                  f"was started. Stop it (`workshop down` if it is a workshop engine), or choose "
                                  f"another port: export WORKSHOP_PORT=...")
        env = dict(os.environ)
        env[STATE_MARK] = str(self.state_path)
        text, offset = launch_detached(cmd, env, self.log_path(), f"{policy} -> {' '.join(worker_urls)}")
        if not text.isdigit():
            raise EngineStartError("The router's launcher could not start vllm-router.", log_excerpt(self._log_since(offset)))
        import psutil

        proc = psutil.Process(int(text))
        self._save(RouterState(pid=proc.pid, create_time=proc.create_time(), cmdline=cmd, policy=policy,
                               worker_urls=list(worker_urls), prometheus_port=prometheus_port, log_offset=offset))
        self.wait_ready(timeout_s, model)

    def wait_ready(self, timeout_s: float = ROUTER_START_TIMEOUT_S, model: str | None = None) -> None:
        """Poll ``/v1/models`` through the router until it answers (listing ``model``); raise with the log if
        the router exits or does not answer in time."""
        state = self.load()
        deadline = time.monotonic() + timeout_s
        while True:
            if process_if_alive(state.pid, state.create_time) is None:
                raise EngineStartError("vllm-router exited before it answered.", log_excerpt(self._log_since(state.log_offset)))
            try:
                resp = httpx.get(self.url + "/v1/models", timeout=3.0)
                if resp.status_code == 200 and (model is None or model in resp.text):
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise EngineStartError(f"vllm-router on port {self.port} did not answer /v1/models within "
                                       f"{timeout_s:.0f} s.", log_excerpt(self._log_since(state.log_offset)))
            time.sleep(0.3)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """End the router and every process of its session; returns the PID it had (None: none ran)."""
        state = self.load()
        server = process_if_alive(state.pid, state.create_time)
        procs = session_members(state.pid, state.create_time, str(self.state_path)) \
            if state.pid and state.create_time else []
        if server and server not in procs:
            procs.append(server)
        survivors = end_processes(procs, timeout_s) if procs else []
        pid = server.pid if server else None
        state.pid = state.create_time = None
        self._save(state)
        if survivors:
            raise RouterError(f"{', '.join(describe_process(p.pid) for p in survivors)} of the router survived SIGKILL.")
        deadline = time.monotonic() + 10
        while procs and port_holder(self.port)[0] and time.monotonic() < deadline:
            time.sleep(0.1)
        return pid

    def forget(self) -> None:
        """Remove the state file (after stop)."""
        self.state_path.unlink(missing_ok=True)

    def status(self) -> dict[str, Any]:
        """PID, policy, workers, whether it answers, and the port holder when it is not ours."""
        state = self.load()
        pid = self.pid
        out: dict[str, Any] = {"router": f"{self.url} (pid {pid}, policy {state.policy})" if pid else "not running",
                               "workers": state.worker_urls}
        if pid:
            try:
                out["router_ready"] = httpx.get(self.url + "/v1/models", timeout=3.0).status_code == 200
            except httpx.HTTPError as err:
                out["router_ready"] = False
                out["router_problem"] = f"{type(err).__name__}: {err}"
        else:
            busy, holder = port_holder(self.port)
            if busy:
                out["router_port"] = f"{self.port}: held by {describe_process(holder)}, not our router"
        return out

    def read_figures(self, timeout_s: float = 3.0) -> dict[str, float]:
        """The router's Prometheus figures now ({} when it exposes none or is down)."""
        url = self.metrics_url()
        try:
            return fetch_figures(url, timeout_s) if url else {}
        except RouterError:
            return {}
