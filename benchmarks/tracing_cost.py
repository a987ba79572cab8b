"""Benchmark: what vLLM's own tracing costs per request, tracing off against on, A/B/A/B (prints figures).

Usage: python benchmarks/tracing_cost.py [--rounds 2] [--requests 64] [--concurrency 4] [--port 8791]
                                         [--input-len 256] [--output-len 64] [--warmups 4] [--json PATH]
                                         [--dry-run]

Starts a local Arize Phoenix (helpers.engine.trace_store.TraceStore; ``bash install/phoenix.sh`` installs it) and
one local engine (the profile's baseline, its own port and state directory). Each round is two runs of the same
``workshop bench`` (random prompts, forced output lengths, a closed loop of ``--concurrency`` users), first with
tracing off, then on: the engine restarts between them with and without ``--otlp-traces-endpoint`` pointed at
Phoenix (``with_tracing``, the configuration notebook 01's trace uses: OTLP/HTTP, exported every half second). The
benchmark's own requests carry no ``traceparent``, so each of vLLM's ``llm_request`` spans is a trace of its own;
after every traced run it counts them in Phoenix, so a run that exported nothing cannot pass as "tracing on".

What it prints, per figure: off and on means over rounds, the mean per-round ratio on / off, the rounds' spread
(half the range of the ratios) and "within noise" when the spread covers the difference (the arithmetic of
benchmarks/compare_vllm_bench.py, one implementation), beside the machine's kind and load (``workshop machine``).
A figure, not a test: on a shared 2-core machine the spread is large, and the cost of tracing is small.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

FIGURES = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "p99_e2el_ms", "client_cpu_s")
ARMS = ("off", "on")


def _compare_module() -> Any:
    """benchmarks/compare_vllm_bench.py, for its ratio, spread and verdict (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("compare_vllm_bench", Path(__file__).with_name("compare_vllm_bench.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_command(args: argparse.Namespace, run: int, out_dir: Path) -> list[str]:
    """``workshop bench`` for one run (the same shape every run; each salts its own prompts)."""
    return [sys.executable, "-m", "helpers.cli.main", "bench", "--concurrency", str(args.concurrency),
            "--input-len", str(args.input_len), "--output-len", str(args.output_len),
            "--num-requests", str(args.requests), "--warmup", str(args.warmups), "--vllm-bench-requests",
            "--json", str(out_dir / f"run-{run}.jsonl")]


def order(rounds: int) -> list[tuple[int, str]]:
    """(round, arm) in the order they run: off, on, off, on, ..."""
    return [(r, arm) for r in range(rounds) for arm in ARMS]


def summarize(rows: list[dict[str, Any]], compare: Any) -> list[dict[str, Any]]:
    """One line per figure: the means off and on, the per-round ratio on / off, its spread and the verdict, from
    compare_vllm_bench's ``compare`` with each round as a pair (off in vLLM's place, on in ours)."""
    as_pairs = [{**row, "pair": row["round"], "tool": "workshop" if row["arm"] == "on" else "vllm"} for row in rows]
    return [{"figure": line["figure"], "rounds": line["pairs"], "off_mean": line["vllm_mean"],
             "on_mean": line["workshop_mean"], "ratio": line["ratio"], "spread": line["spread"],
             "verdict": line["verdict"].replace("ours", "tracing on")}
            for line in compare.compare(as_pairs, FIGURES)]


def format_table(lines: list[dict[str, Any]]) -> str:
    num = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    rows = [f"{'figure':<18} {'rounds':>6} {'off':>10} {'on':>10} {'on/off':>7} {'spread':>8}  verdict"]
    for line in lines:
        rows.append(f"{line['figure']:<18} {line['rounds']:>6} {num(line['off_mean'], '10.2f')} "
                    f"{num(line['on_mean'], '10.2f')} {num(line['ratio'], '7.3f')} "
                    f"{'-' if line['spread'] is None else '±' + format(line['spread'], '.3f'):>8}  {line['verdict']}")
    return "\n".join(rows)


def request_spans(base_url: str, project: str = "default") -> int:
    """How many of vLLM's ``llm_request`` spans Phoenix holds in ``project`` (every page of its REST API)."""
    from helpers.measure.tracing import LLM_REQUEST, _get_json

    count, cursor = 0, None
    while True:
        query = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
        page = _get_json(f"{base_url}/v1/projects/{project}/spans?{urllib.parse.urlencode(query)}", 10.0)
        count += sum(raw.get("name") == LLM_REQUEST for raw in page.get("data", []))
        cursor = page.get("next_cursor")
        if not cursor:
            return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="off/on rounds (A/B/A/B)")
    parser.add_argument("--requests", type=int, default=64, help="measured requests per run")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--port", default="8791", help="the engine's port (not the tests' 8765)")
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--warmups", type=int, default=4)
    parser.add_argument("--json", default=None, help="write every run's figures and the summary here")
    parser.add_argument("--dry-run", action="store_true", help="print the runs in order, start nothing")
    args = parser.parse_args()
    if args.rounds < 1 or args.requests < 1 or args.concurrency < 1:
        parser.error("--rounds, --requests and --concurrency must be >= 1")
    if args.dry_run:
        for run, (rnd, arm) in enumerate(order(args.rounds)):
            flag = " (engine restarted with --otlp-traces-endpoint PHOENIX/v1/traces)" if arm == "on" else \
                " (engine restarted without --otlp-traces-endpoint)"
            print(f"round {rnd} tracing {arm}{flag}: {shlex.join(bench_command(args, run, Path('RESULTS_DIR')))}")
        return

    from helpers.core.settings import load_settings
    from helpers.engine.session import connect
    from helpers.engine.trace_store import INSTALL_PHOENIX, TraceStore, phoenix_executable, with_tracing

    if phoenix_executable() is None:
        raise SystemExit(f"benchmarks/tracing_cost.py: {INSTALL_PHOENIX}.")
    compare = _compare_module()
    os.environ.update(WORKSHOP_PORT=args.port, WORKSHOP_STATE_DIR=tempfile.mkdtemp(prefix="tracing-cost-"))
    work = Path(tempfile.mkdtemp(prefix="tracing-cost-out-"))
    env = dict(os.environ)
    print(compare.machine_line(env), flush=True)
    rows: list[dict[str, Any]] = []
    with TraceStore() as store:
        lab = connect(load_settings())
        baseline = lab.engine.config()
        traced = with_tracing(baseline, store.otlp_endpoint)
        try:
            for run, (rnd, arm) in enumerate(order(args.rounds)):
                lab.engine.apply(traced if arm == "on" else baseline)
                spans_before = request_spans(store.url)
                figures = compare.run_tool(bench_command(args, run, work), env, work / f"run-{run}.jsonl")
                row = {"round": rnd, "arm": arm, **figures}
                if arm == "on":
                    time.sleep(2.0)  # the exporter sends every half second
                    row["spans"] = request_spans(store.url) - spans_before
                rows.append(row)
                print(f"round {rnd} tracing {arm:<3} out {row['output_throughput']:7.1f} tok/s  "
                      f"TTFT {row['mean_ttft_ms']:7.1f} ms  TPOT {row['mean_tpot_ms']:6.2f} ms  "
                      f"e2el {row['mean_e2el_ms']:7.1f} ms  client CPU {row['client_cpu_s']:.1f} s"
                      + (f"  spans in Phoenix {row['spans']}" if arm == "on" else ""), flush=True)
                if arm == "on" and row["spans"] < args.requests:
                    print(f"  tracing was on but Phoenix got {row['spans']} request spans for {args.requests} "
                          "measured requests: this round's 'on' may not have exported", flush=True)
        finally:
            lab.engine.stop()
    print(compare.machine_line(env))
    lines = summarize(rows, compare)
    print(f"\n{args.rounds} rounds (off, on) of {args.requests} requests at concurrency {args.concurrency}, "
          f"{args.input_len}-token random prompts, {args.output_len} output tokens; ratio = on / off, mean over "
          "rounds; spread = half the range of the rounds' ratios\n" + format_table(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": rows, "summary": lines}, indent=1,
                                              default=str))


if __name__ == "__main__":
    main()
