"""Several local vLLM engines behind vLLM's router, as one engine (``workshop up --replicas N``).

``ReplicaSet`` is an ``Engine`` backend: its endpoint is the router on the workshop's port (``WORKSHOP_PORT``);
replica ``i`` is a ``LocalEngine`` on port ``WORKSHOP_PORT + 1 + i`` with its own state file and log, and
the router's Prometheus metrics are on ``WORKSHOP_PORT + N + 1``. ``replicas-PORT.json`` in the state
directory records the set, so ``workshop status`` / ``down`` and a notebook find it (``session.make_engine``).

- **A KV budget per replica**: ``--kv-cache-memory-bytes`` is set explicitly (512 MiB by default; N
  replicas need N times that in RAM).
- **CPU threads split, not pinned**: each replica runs ``cores // N`` compute threads (``OMP_NUM_THREADS``,
  at least one) with ``VLLM_CPU_OMP_THREADS_BIND=nobind``. Pinning each replica's threads to its own slice of
  the cores (the first design) starves the replica's API server: its pinned OpenMP thread spins on the core
  the server also needs. Measured on 2 cores (AMX Xeon; 8 conversations x 3 turns, 4 at a time, 3 interleaved
  rounds against one engine with vLLM's own "auto" binding, which keeps a core free for the server): pinned
  replicas gave 0.08x the one engine's output tokens/s, unpinned ones 0.94x (within the +/-19% noise).
  With more replicas than cores, threads are shared and ``status`` says so.
- **Reconfiguring** (``set_flag``, ``switch_model``, ``restart``) is a rolling restart: one replica at a
  time, so the router keeps serving on the others; the router itself is restarted only by ``set_policy``.
- **Stop** ends the router, then every replica (each with every process of its session); nothing is left.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import replace
from typing import Any

from helpers.engine.interface import Engine, EngineConfig, EngineError, EngineStartError, default_config
from helpers.engine.local import LocalEngine
from helpers.engine.router import POLICIES, RouterError, RouterProcess, router_binary
from helpers.core.settings import Settings, state_dir
from helpers.core.vllm_args import flag_value, with_flag

REPLICA_KV_CACHE_BYTES = 512 << 20  # per replica (tiny-agent: 2,048 B/token -> 262,144 tokens)
DEFAULT_POLICY = "consistent_hash"
BIND_VARIABLE, THREADS_VARIABLE = "VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS"
MAX_REPLICAS = 8


def replica_ports(port: int, n: int) -> list[int]:
    """The replicas' ports: the ones after the router's."""
    return [port + 1 + i for i in range(n)]


def router_metrics_port(port: int, n: int) -> int:
    """Where the router's Prometheus metrics listen: the port after the last replica's."""
    return port + n + 1


def usable_cores() -> list[int]:
    """The CPU ids this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return list(range(os.cpu_count() or 1))


def omp_threads(n: int, cores: list[int]) -> int:
    """Compute threads per replica (``OMP_NUM_THREADS``): an equal share of ``cores``, at least one."""
    if n < 1 or not cores:
        raise EngineError(f"need at least one replica and one core (got {n} replicas, cores {cores})")
    return max(1, len(cores) // n)


def cores_shared(n: int, cores: list[int]) -> bool:
    """True when replicas must share cores (more replicas than cores)."""
    return n > len(cores)


def replica_config(base: EngineConfig, threads: int, kv_bytes: int | None) -> EngineConfig:
    """``base`` for one replica: its KV budget (when given) and ``threads`` unpinned compute threads (``nobind``:
    see the module's docstring for why replicas are not pinned to cores)."""
    args = with_flag(base.args, "--kv-cache-memory-bytes", kv_bytes) if kv_bytes else base.args
    env = dict(base.env)
    env.update({BIND_VARIABLE: "nobind", THREADS_VARIABLE: str(threads)})
    return replace(base, args=args, env=tuple(sorted(env.items())))


def replica_settings(settings: Settings, port: int) -> Settings:
    """The settings of one replica: the same model and key, its own port and URL."""
    return replace(settings, port=port, base_url=f"http://127.0.0.1:{port}/v1")


def _record_path(port: int):
    return state_dir() / f"replicas-{port}.json"


def read_record(port: int) -> dict[str, Any] | None:
    """The recorded replica set on this port ({"replicas", "policy", "kv_bytes"}), None when there is none."""
    try:
        data = json.loads(_record_path(port).read_text())
        return data if isinstance(data, dict) and isinstance(data.get("replicas"), int) else None
    except (OSError, ValueError):
        return None


def replica_set_for(settings: Settings) -> "ReplicaSet | None":
    """The replica set recorded on the settings' port (a managed, non-k8s endpoint), else None."""
    if not settings.managed or settings.profile == "k8s":
        return None
    return ReplicaSet(settings) if read_record(settings.port) else None


class ReplicaSet(Engine):
    """N local engines behind ``vllm-router``; the endpoint (``settings.base_url``) is the router."""

    def __init__(self, settings: Settings, replicas: int | None = None, policy: str | None = None,
                 kv_bytes: int | None = None) -> None:
        if not settings.managed:
            raise EngineError(f"{settings.base_url} is an external endpoint (VLLM_HOST is set): replicas run locally. "
                              "Unset VLLM_HOST to start them.")
        super().__init__(settings)
        record = read_record(settings.port) or {}
        self.n = replicas or record.get("replicas") or 2
        if not 1 <= self.n <= MAX_REPLICAS:
            raise EngineError(f"--replicas must be between 1 and {MAX_REPLICAS} (got {self.n}).")
        self.policy = policy or record.get("policy") or DEFAULT_POLICY
        if self.policy not in POLICIES:
            raise RouterError(f"Unknown router policy {self.policy!r}: choose one of {', '.join(POLICIES)}.")
        self.kv_bytes = kv_bytes or record.get("kv_bytes") or (REPLICA_KV_CACHE_BYTES if settings.profile == "cpu" else None)
        self.ports = replica_ports(settings.port, self.n)
        self.replicas = [LocalEngine(replica_settings(settings, p)) for p in self.ports]
        self.router = RouterProcess(settings.port)
        self.threads = omp_threads(self.n, usable_cores())

    # ---- configuration
    def _for_replica(self, config: EngineConfig, i: int) -> EngineConfig:
        if self.settings.profile != "cpu":
            return config
        return replica_config(config, self.threads, self.kv_bytes)

    def base_config(self) -> EngineConfig:
        """The configuration every replica runs, before its own threads and KV budget (replica 0's when it runs)."""
        running = self.replicas[0].config() if self.replicas[0].pid else None
        if running is None:
            base = default_config(self.settings)
            return self._for_replica(base, 0) if self.settings.profile == "cpu" else base
        return running

    def config(self) -> EngineConfig:
        return self.base_config()

    def worker_urls(self) -> list[str]:
        """The replicas' root URLs, as the router is given them."""
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def metrics_urls(self) -> list[str]:
        """Each replica's /metrics."""
        return [u + "/metrics" for u in self.worker_urls()]

    def _record(self) -> None:
        _record_path(self.settings.port).write_text(json.dumps({"replicas": self.n, "policy": self.policy,
                                                                "kv_bytes": self.kv_bytes}))

    # ---- start, stop
    def start(self, config: EngineConfig | None = None, timeout_s: float | None = None) -> None:
        """Start every replica (in parallel; those already serving are kept) and the router in front."""
        router_binary()  # a missing router says how to install it before any engine starts
        single = LocalEngine(self.settings)
        if single.pid:
            raise EngineError(f"A single engine (pid {single.pid}) serves on port {self.settings.port}, where the router "
                              "would listen: stop it with `workshop down`, then start the replicas.")
        previous = read_record(self.settings.port)
        if previous and previous["replicas"] > self.n:
            ReplicaSet(self.settings, previous["replicas"]).stop()
        base = config or self.base_config()
        if config is None and base.served_name != self.settings.model:  # as LocalEngine.start: MODEL_NAME decides
            print(f"The replicas serve {base.served_name!r}; the settings ask for {self.settings.model!r} "
                  "(MODEL_NAME): restarting them on it.", flush=True)
            base = default_config(self.settings)  # a name the engine cannot serve raises here, before any record
        self._record()
        errors: list[BaseException | None] = [None] * self.n

        def start_one(i: int) -> None:
            try:
                self.replicas[i].start(self._for_replica(base, i), timeout_s)
            except BaseException as err:  # noqa: BLE001 - reported below, with the replica named
                errors[i] = err

        threads = [threading.Thread(target=start_one, args=(i,), daemon=True) for i in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, err in enumerate(errors):
            if err is not None:
                self.stop()
                excerpt = getattr(err, "log_excerpt", "")
                message = getattr(err, "message", str(err))
                raise EngineStartError(f"Replica {i} (port {self.ports[i]}) did not start: {message} Its log: "
                                       f"{self.replicas[i].log_path()}. Every replica was stopped.", excerpt) from None
        self.ensure_router(self.policy)

    def ensure_router(self, policy: str) -> None:
        """Keep the router when it runs this policy on these workers; otherwise (re)start it."""
        state = self.router.load()
        if self.router.pid and state.policy == policy and state.worker_urls == self.worker_urls():
            self.router.wait_ready(model=self.model)
            return
        self.router.start(self.worker_urls(), policy, router_metrics_port(self.settings.port, self.n), model=self.model)

    def set_policy(self, policy: str) -> None:
        """Restart the router on another policy; the replicas (and their caches) are kept."""
        if policy not in POLICIES:
            raise RouterError(f"Unknown router policy {policy!r}: choose one of {', '.join(POLICIES)}.")
        self.policy = policy
        self._record()
        self.router.start(self.worker_urls(), policy, router_metrics_port(self.settings.port, self.n), model=self.model)

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Every replica serves and the router answers."""
        for replica in self.replicas:
            replica.wait_ready(timeout_s, progress=False)
        self.router.wait_ready(model=self.model)

    def apply(self, config: EngineConfig, timeout_s: float | None = None) -> None:
        """Rolling restart: one replica at a time on ``config`` (each with its threads and KV budget)."""
        for i, replica in enumerate(self.replicas):
            replica.apply(self._for_replica(config, i), timeout_s)
        self.ensure_router(self.policy)

    def stop(self) -> dict[str, int | None]:
        """Stop the router and every replica; forget the set. Returns the PIDs that were running."""
        stopped: dict[str, int | None] = {"router": self.router.stop()}
        for i, replica in enumerate(self.replicas):
            stopped[f"replica {i}"] = replica.pid
            replica.stop()
        self.router.forget()
        _record_path(self.settings.port).unlink(missing_ok=True)
        return stopped

    # ---- one replica
    def kill_replica(self, i: int) -> int:
        """SIGKILL replica ``i``'s server (a crash, for the failure lesson); returns its PID."""
        pid = self.replicas[i].pid
        if pid is None:
            raise EngineError(f"Replica {i} (port {self.ports[i]}) is not running.")
        os.kill(pid, signal.SIGKILL)
        return pid

    def restart_replica(self, i: int, timeout_s: float | None = None) -> float:
        """Start replica ``i`` again on the set's configuration (ends what is left of it first); seconds taken."""
        t0 = time.monotonic()
        last = self.replicas[i]._load().last_good  # what this replica last served, its threads included
        config = EngineConfig.from_json(last) if last else self._for_replica(self.base_config(), i)
        self.replicas[i].stop()  # ends what is left of it (its engine core outlives a killed server)
        self.replicas[i].start(config, timeout_s)
        return time.monotonic() - t0

    # ---- what is running
    def logs(self, lines: int = 50) -> str:
        parts = [f"--- router (port {self.settings.port}) ---\n{self.router.logs(lines)}"]
        parts += [f"--- replica {i} (port {p}) ---\n{r.logs(lines)}" for i, (p, r) in enumerate(zip(self.ports, self.replicas))]
        return "\n".join(parts)

    def replica_rows(self) -> list[dict[str, Any]]:
        """One row per replica: port, PID, ready, compute threads, KV budget."""
        rows = []
        for i, (port, replica) in enumerate(zip(self.ports, self.replicas)):
            last = replica._load().last_good  # what it last served, also while it is down
            config = replica.config() if replica.pid or not last else EngineConfig.from_json(last)
            rows.append({"replica": i, "port": port, "pid": replica.pid, "ready": bool(replica.pid) and replica.is_ready(),
                         "threads": dict(config.env).get(THREADS_VARIABLE, "auto"),
                         "kv_bytes": flag_value(config.args, "--kv-cache-memory-bytes")})
        return rows

    def status(self) -> dict[str, Any]:
        status = super().status()
        status.update(self.router.status())
        status["policy"] = self.router.load().policy or self.policy
        status["router_metrics"] = self.router.metrics_url()
        status["replicas"] = "; ".join(f"{r['replica']}: port {r['port']} pid {r['pid']} "
                                       f"{'ready' if r['ready'] else 'NOT READY'} threads {r['threads']} kv {r['kv_bytes']}"
                                       for r in self.replica_rows())
        if cores_shared(self.n, usable_cores()):
            status["cpu_note"] = (f"{self.n} replicas on {len(usable_cores())} cores: replicas share cores, so they "
                                  "slow each other down")
        return status



def replica_set_beside(settings: Settings, replicas: int = 2, policy: str | None = None, offset: int = 10,
                       kv_bytes: int | None = None) -> ReplicaSet:
    """A replica set whose router listens ``offset`` ports above the workshop's engine (which keeps running):
    for a notebook that compares one engine with replicas. Start it with ``.start()``, stop it with ``.stop()``."""
    port = settings.port + offset
    return ReplicaSet(replace(settings, port=port, base_url=f"http://127.0.0.1:{port}/v1"), replicas, policy, kv_bytes)
