"""One row per engine configuration: speed, quality and memory side by side.

- speed, from load-generator summaries (``helpers.measure.bench_results.summarize``, vLLM's field names): per
  chosen concurrency, output throughput (tok/s), mean and p90 TTFT (ms), mean TPOT (ms);
- quality, from an eval run (``helpers.evals.suite``): pass rate per category with its 95% Wilson interval;
- memory, from the server's ``vllm:cache_config_info`` (``helpers.measure.server_metrics``): KV-cache capacity in
  tokens, block size, blocks; and the model's size on disk when given its directory.

``measure_config`` measures all three against the current endpoint (what notebooks 05, 06 and 08 call
after each engine change); ``Scorecard`` collects the rows, shows them side by side and saves them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import pandas as pd

from helpers.evals.suite import EvalRun

if TYPE_CHECKING:  # the lesson modules take a Lab; importing it at run time would pull in the engine
    from helpers.engine.session import Lab

SPEED_FIELDS = {  # bench summary field -> scorecard column suffix
    "output_throughput": "output_tok_s",
    "mean_ttft_ms": "mean_ttft_ms",
    "p90_ttft_ms": "p90_ttft_ms",
    "mean_tpot_ms": "mean_tpot_ms",
}
CACHE_FIELDS = ("block_size", "num_gpu_blocks", "kv_cache_max_concurrency")
SCORECARD_FORMAT = "workshop-scorecard"


def size_on_disk_mb(model_dir: str | Path) -> float:
    """Bytes of every file under a model directory, in MB (10^6 bytes)."""
    path = Path(model_dir)
    if not path.is_dir():
        raise ValueError(f"{path} is not a directory; give the model's local folder (config.json, weights)")
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def kv_capacity_tokens(cache: dict[str, Any] | None) -> int | None:
    """Token slots of the KV cache from ``cache_config``: kv_cache_size_tokens, else blocks x block size."""
    if not cache:
        return None
    if cache.get("kv_cache_size_tokens") is not None:
        return int(cache["kv_cache_size_tokens"])
    if cache.get("num_gpu_blocks") is not None and cache.get("block_size") is not None:
        return int(cache["num_gpu_blocks"]) * int(cache["block_size"])
    return None


def _speed(load: Iterable[dict[str, Any]], concurrencies: Iterable[int] | None) -> dict[str, Any]:
    """Columns c{C}_<field> for each closed-loop summary (only the chosen concurrencies, when given)."""
    by_c = {s.get("concurrency") or s.get("max_concurrency"): s for s in load
            if s.get("mode", "concurrency") == "concurrency"}
    chosen = list(concurrencies) if concurrencies is not None else sorted(c for c in by_c if c is not None)
    missing = [c for c in chosen if c not in by_c]
    if missing:
        raise ValueError(f"no load summary at concurrency {missing}; measured: {sorted(c for c in by_c if c)}")
    out: dict[str, Any] = {}
    for c in chosen:
        for src, name in SPEED_FIELDS.items():
            out[f"c{c}_{name}"] = by_c[c].get(src)
    return out


def _quality(evals_run: EvalRun | pd.DataFrame) -> dict[str, Any]:
    """Columns <category>_pass_rate, _ci_low, _ci_high (and ``all``), plus the suite."""
    out: dict[str, Any] = {}
    if isinstance(evals_run, EvalRun):
        out["eval_suite"] = f"{evals_run.suite} v{evals_run.suite_version}"
        summary = evals_run.summary()
    else:
        summary = evals_run
    for category, row in summary.iterrows():
        out[f"{category}_pass_rate"] = row["pass_rate"]
        out[f"{category}_ci_low"] = row["ci_low"]
        out[f"{category}_ci_high"] = row["ci_high"]
    return out


def scorecard_row(name: str, *, load: Iterable[dict[str, Any]] | None = None,
                  evals: EvalRun | pd.DataFrame | None = None, cache: dict[str, Any] | None = None,
                  model_dir: str | Path | None = None, concurrencies: Iterable[int] | None = None,
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One configuration as one flat dict: config, size_on_disk_mb, kv_capacity_tokens, speed per
    concurrency (c{C}_output_tok_s, c{C}_mean_ttft_ms, c{C}_p90_ttft_ms, c{C}_mean_tpot_ms), pass rates
    per category with CI, then ``extra``. A part not given is left out."""
    row: dict[str, Any] = {"config": name}
    if model_dir is not None:
        row["size_on_disk_mb"] = size_on_disk_mb(model_dir)
    if cache is not None:
        row["kv_capacity_tokens"] = kv_capacity_tokens(cache)
        row.update({k: cache.get(k) for k in CACHE_FIELDS})
    if load is not None:
        row.update(_speed(load, concurrencies))
    if evals is not None:
        row.update(_quality(evals))
    row.update(extra or {})
    return row


def _clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return value


class Scorecard:
    """Configurations side by side: ``add`` rows (from ``scorecard_row`` or ``measure_config``)."""

    def __init__(self, rows: Iterable[dict[str, Any]] = ()) -> None:
        self.rows: list[dict[str, Any]] = [dict(r) for r in rows]

    def add(self, row: dict[str, Any]) -> dict[str, Any]:
        """Add (or replace, by ``config`` name) one row; returns it."""
        if "config" not in row:
            raise ValueError("a scorecard row needs a 'config' name; build it with scorecard_row(name, ...)")
        self.rows = [r for r in self.rows if r["config"] != row["config"]] + [dict(row)]
        return row

    def frame(self) -> pd.DataFrame:
        """One row per configuration (index ``config``), columns in the order first seen."""
        columns: list[str] = []
        for r in self.rows:
            columns.extend(k for k in r if k not in columns)
        return pd.DataFrame(self.rows, columns=columns).set_index("config")

    def markdown(self, digits: int = 3) -> str:
        """A Markdown table with one column per configuration (one row per figure)."""
        table = self.frame().T
        header = "| figure | " + " | ".join(str(c) for c in table.columns) + " |"
        lines = [header, "|" + "---|" * (len(table.columns) + 1)]
        for figure, values in table.iterrows():
            cells = [_format(v, digits) for v in values]
            lines.append(f"| {figure} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def to_json(self, path: str | Path) -> Path:
        """Write the rows as JSON; returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [{k: _clean(v) for k, v in r.items()} for r in self.rows]
        path.write_text(json.dumps({"format": SCORECARD_FORMAT, "format_version": 1, "rows": rows}, indent=1) + "\n")
        return path

    @classmethod
    def from_json(cls, path: str | Path) -> "Scorecard":
        """A scorecard saved by ``to_json``."""
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict) or data.get("format") != SCORECARD_FORMAT:
            raise ValueError(f"{path} is not a scorecard file (written by Scorecard.to_json)")
        return cls(data["rows"])


def _format(value: Any, digits: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def measure_config(lab: Lab, name: str, concurrencies: Iterable[int] = (1, 8), input_len: int = 256,
                   output_len: int = 64, num_requests: int = 32, suite: str | None = "smoke",
                   model_dir: str | Path | None = None, extra: dict[str, Any] | None = None,
                   evals_run: EvalRun | None = None) -> dict[str, Any]:
    """Eval suite, load sweep and cache config against the current endpoint -> one scorecard row.

    ``evals_run``: an eval already run on this configuration (kept, e.g. for ``evals.compare``)
    instead of running ``suite``; ``suite=None`` and no run: a row without quality columns.
    ``lab``: the connected ``helpers.engine.session.Lab`` (``connect()``); this never connects one itself.
    Each load run sends ``num_requests`` measured requests of ``input_len`` prompt and exactly
    ``output_len`` output tokens, after 2 warm-up requests.
    """
    from helpers.measure import bench_results, server_metrics
    from helpers.evals import suite as evals
    from helpers.measure.loadgen import run_sweep
    from helpers.measure.workloads import Load, Workload
    settings = lab.settings
    concurrencies = list(concurrencies)
    run = evals_run if evals_run is not None else (evals.run_suite(lab, suite) if suite else None)
    results = run_sweep(settings, Workload(input_len=input_len, output_len=output_len), model=lab.model,
                        concurrencies=concurrencies, load=Load(num_requests=num_requests, warmup_requests=2))
    summaries = [bench_results.summarize(r) for r in results]
    cache = server_metrics.scrape(settings.metrics_url).cache_config()
    return scorecard_row(name, load=summaries, evals=run, cache=cache or {}, model_dir=model_dir,
                         concurrencies=[c for c in concurrencies if any(s["concurrency"] == c for s in summaries)],
                         extra={"model": lab.model, **(extra or {})})
