"""The restart budget: how many engine restarts a notebook makes on the cluster, and what they cost on a GPU (pure).

Every flag or model change restarts the participant's engine (a Deployment rollout). The Kubernetes engine
(``helpers.engine.k8s``) appends one record per rollout to ``$WORKSHOP_RESTART_LOG`` (JSON lines: when it
started, what changed, how long it took, how it ended); ``workshop run`` gives each notebook its own log, maps
each restart to the section it happened in (a restart in or after a "Go deeper" section is off the core path),
prints one table, and one ``restarts {...}`` line per notebook that the rehearsal reads back from the pod.

The time on a GPU is computed from published start-up figures, not from this run (``GPU_START_S``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RESTART_LOG_ENV = "WORKSHOP_RESTART_LOG"
GO_DEEPER = "Go deeper"  # STYLE.md: the core path, then "Go deeper" sections after it
CORE_PATH_MAX_RESTARTS = 3  # issue 26: a 12-minute module holds at most 3 restarts
ROW_PREFIX = "restarts "
# Start-up to ready of one vLLM engine on a GPU, seconds, cold (no compile cache) and warm (the compile cache
# of an earlier start on the same configuration). Published by vLLM's `vllm bench startup` (vllm-project/vllm
# pull request 32191, "[AOT compilation] cached inductor artifacts benchmark": Qwen/Qwen3-32B, cold 68.47 s,
# warm 43.91 s). No published figure for Qwen3-4B was found; its weights are an eighth of Qwen3-32B's, so its
# start is shorter (vllm-project/vllm issue 20264 shows a 3.4 GiB model ready in ~59 s with a warm cache): these
# are an upper bound until `vllm bench startup --model Qwen/Qwen3-4B` is run on the workshop GPU.
GPU_START_S = {"cold": 68.47, "warm": 43.91}
GPU_START_SOURCE = "vllm bench startup, Qwen/Qwen3-32B (vllm-project/vllm PR 32191); upper bound for Qwen3-4B"


@dataclass(frozen=True)
class Restart:
    """One rollout of the engine: when it started (Unix time, s), what changed, how long, how it ended."""

    started: float
    change: str
    seconds: float
    outcome: str  # "ready", "failed" (the change did not become ready), "rolled back" (the way back to the last good)


@dataclass(frozen=True)
class RestartRow:
    """One notebook's restarts on the cluster: on its core path, in all, and their seconds here."""

    notebook: str
    core: int
    total: int
    seconds_here: float

    def gpu_minutes(self, kind: str, core_only: bool = False) -> float:
        """The restarts' time on a GPU (minutes), from GPU_START_S[kind] ("cold" or "warm")."""
        return (self.core if core_only else self.total) * GPU_START_S[kind] / 60

    def encode(self) -> str:
        """The row as one line that ``workshop run`` prints and the rehearsal reads back."""
        return ROW_PREFIX + json.dumps(asdict(self), sort_keys=True)


def record(path: Path | str, restart: Restart) -> None:
    """Append one restart to a restart log."""
    with Path(path).open("a") as out:
        out.write(json.dumps(asdict(restart)) + "\n")


def read_restarts(path: Path | str) -> list[Restart]:
    """The restarts of a log (none when it does not exist)."""
    path = Path(path)
    if not path.is_file():
        return []
    return [Restart(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def in_core_path(section: str, sections: Sequence[str]) -> bool:
    """Is ``section`` before the notebook's first "Go deeper" section (``sections``: every heading, in order)?"""
    deeper = next((i for i, s in enumerate(sections) if s.startswith(GO_DEEPER)), None)
    if deeper is None or section not in sections:
        return True
    return sections.index(section) < deeper


def core_restarts(restarts: Iterable[Restart], cells: Sequence[tuple[str, float, float]]) -> list[Restart]:
    """The restarts on the core path: ``cells`` are (section, start, end) of each executed cell (Unix time, s); a
    restart is on it when the cell it started in lies before the first "Go deeper" section."""
    sections = list(dict.fromkeys(section for section, _, _ in cells))
    return [r for r in restarts
            if in_core_path(next((s for s, start, end in cells if start <= r.started <= end), ""), sections)]


def count(notebook: str, restarts: Iterable[Restart], cells: Sequence[tuple[str, float, float]]) -> RestartRow:
    """A notebook's row: its restarts on the core path (``core_restarts``) and in all, and their seconds here."""
    restarts = list(restarts)
    return RestartRow(notebook, len(core_restarts(restarts, cells)), len(restarts),
                      round(sum(r.seconds for r in restarts), 1))


def decode_rows(text: str) -> list[RestartRow]:
    """The rows ``workshop run`` printed (its ``restarts {...}`` lines) in ``text``."""
    rows = []
    for line in text.splitlines():
        if line.startswith(ROW_PREFIX):
            try:
                rows.append(RestartRow(**json.loads(line[len(ROW_PREFIX):])))
            except (ValueError, TypeError):
                continue
    return rows


def table_lines(rows: Sequence[RestartRow]) -> list[str]:
    """The restart table: notebook, restarts on the core path and in all, their time here and on a GPU cold and
    warm (minutes), and whether the core path is within the budget; the source of the GPU figures last."""
    header = ("notebook", "core", "all", "here", "GPU cold (core/all)", "GPU warm (core/all)", "core within budget")
    body = [(r.notebook, str(r.core), str(r.total), f"{r.seconds_here:.0f} s",
             f"{r.gpu_minutes('cold', True):.1f} / {r.gpu_minutes('cold'):.1f} min",
             f"{r.gpu_minutes('warm', True):.1f} / {r.gpu_minutes('warm'):.1f} min",
             "yes" if r.core <= CORE_PATH_MAX_RESTARTS else f"no (over {CORE_PATH_MAX_RESTARTS})") for r in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in [header, *body]]
    return lines + [f"GPU start-up per restart: {GPU_START_S['cold']:.0f} s cold, {GPU_START_S['warm']:.0f} s with a warm "
                    f"compile cache ({GPU_START_SOURCE}; not measured here)."]


def merge(rows: Iterable[RestartRow]) -> list[RestartRow]:
    """One row per notebook from several namespaces' rows: the most restarts any namespace made, the mean time."""
    by_notebook: dict[str, list[RestartRow]] = {}
    for r in rows:
        by_notebook.setdefault(r.notebook, []).append(r)
    return [RestartRow(name, max(r.core for r in rs), max(r.total for r in rs),
                       round(sum(r.seconds_here for r in rs) / len(rs), 1)) for name, rs in sorted(by_notebook.items())]


def as_json(rows: Sequence[RestartRow]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]
