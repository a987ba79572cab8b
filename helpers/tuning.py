"""Tuning one flag at a time: decide keep or roll back from two scorecard rows, keep a cumulative log,
and write the final configuration out as an engine command line or a Kubernetes manifest patch.

The rule (``decide``) is deliberately simple and printed with its reasons: a change is kept only when
the eval shows no regression beyond noise, the latency SLO still holds, and it either makes the chosen
throughput better by at least ``min_gain`` or keeps it (within ``min_gain``) while adding KV capacity.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

import yaml

from helpers.engine import EngineConfig


@dataclass(frozen=True)
class Rule:
    """What "better" means for this tuning session: one throughput column and optional latency SLO."""

    speed: str  # e.g. "c16_output_tok_s"
    latency: str | None = None  # e.g. "c16_p90_ttft_ms"
    max_latency_ms: float | None = None
    min_gain: float = 0.03  # relative


@dataclass(frozen=True)
class Decision:
    keep: bool
    reasons: tuple[str, ...]


def decide(current: dict[str, Any], candidate: dict[str, Any], rule: Rule, regressed: list[str] | None = None) -> Decision:
    """Keep ``candidate`` over ``current`` (two scorecard rows)? ``regressed``: eval categories that got worse."""
    reasons: list[str] = []
    ok = True
    if regressed:
        ok = False
        reasons.append(f"eval regressed in {', '.join(regressed)}")
    if rule.latency and rule.max_latency_ms is not None:
        value = candidate.get(rule.latency)
        if value is None or value > rule.max_latency_ms:
            ok = False
            reasons.append(f"{rule.latency} {value if value is None else round(value, 1)} ms breaks the "
                           f"{rule.max_latency_ms:g} ms SLO")
    before, after = current.get(rule.speed), candidate.get(rule.speed)
    if before is None or after is None:
        return Decision(False, tuple(reasons + [f"no {rule.speed} to compare"]))
    gain = after / before - 1
    kv_more = (candidate.get("kv_capacity_tokens") or 0) > (current.get("kv_capacity_tokens") or 0)
    if gain >= rule.min_gain:
        reasons.append(f"{rule.speed} {gain:+.1%}")
    elif kv_more and gain > -rule.min_gain:
        reasons.append(f"{rule.speed} {gain:+.1%} (within noise) with more KV capacity "
                       f"({current.get('kv_capacity_tokens'):,} -> {candidate.get('kv_capacity_tokens'):,} tokens)")
    else:
        ok = False
        reasons.append(f"{rule.speed} {gain:+.1%}: not better by {rule.min_gain:.0%}")
    return Decision(ok, tuple(reasons))


@dataclass
class TuningLog:
    """The cumulative record: every step tried, its scorecard row and the decision."""

    steps: list[dict[str, Any]] = field(default_factory=list)

    def record(self, change: str, row: dict[str, Any], decision: Decision | None) -> None:
        self.steps.append({"step": len(self.steps), "change": change,
                           "kept": None if decision is None else decision.keep,
                           "why": "baseline" if decision is None else "; ".join(decision.reasons), **row})

    def frame(self):  # -> pandas.DataFrame
        import pandas as pd

        return pd.DataFrame(self.steps)


def command_line(config: EngineConfig) -> str:
    """``vllm serve`` with the configuration's model, served name, flags and environment, shell-quoted."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in config.env)
    cmd = shlex.join(["vllm", "serve", config.model, "--served-model-name", config.served_name, *config.args])
    return f"{env} {cmd}" if env else cmd


def manifest_patch(config: EngineConfig, deployment: str = "vllm", container: str = "vllm") -> str:
    """A strategic-merge patch (YAML) that sets the vLLM container's args to ``config``: add it to an
    overlay's ``patches:`` in k8s/ so the next provisioning starts on the tuned flags."""
    from helpers.k8s_engine import container_args

    patch = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": deployment},
             "spec": {"template": {"spec": {"containers": [{"name": container, "args": container_args(config)}]}}}}
    return yaml.safe_dump(patch, sort_keys=False)
