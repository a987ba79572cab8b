"""Benchmark: our load generator against ``vllm bench serve`` on the same engine and workload (prints both).

Usage: python benchmarks/compare_vllm_bench.py [--concurrency 1,8] [--input-len 128] [--output-len 128]
                                                [--num-prompts 32] [--repeats 2] [--json PATH]

Starts its own local engine (own port and state directory) and stops it at the end. For each
concurrency and repeat it runs both tools back to back, alternating which goes first. Both send
streaming chat completions with ``ignore_eos``; vLLM's tool makes random-token prompts of
``--input-len`` tokens (its count, before the chat template), ours is then given the mean prompt
length the *server* counted for vLLM's requests (``vllm:prompt_tokens`` delta / requests), so both
prefill the same number of tokens. Each tool discards its warm-up requests.

Definitions that coincide: request and output throughput (completed requests / tokens over the
run's wall time), mean TTFT (send -> first token) and mean TPOT ((e2e - ttft) / (n_out - 1) per
request). Where they differ: vLLM's ``itl`` is per chunk (one gap per streamed chunk); ours reports
``itl_chunk`` (same meaning) and ``itl_token`` (a chunk of k tokens spreads its gap over k tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from helpers.bench_results import summarize
from helpers.loadgen import Load, Workload, run_load
from helpers.server_metrics import scrape, window
from helpers.session import connect
from helpers.settings import load_settings

FIELDS = ("request_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms",
          "median_tpot_ms", "mean_itl_ms", "mean_e2el_ms")
TOLERANCE = {"request_throughput": 0.05, "output_throughput": 0.05, "mean_ttft_ms": 0.10, "mean_tpot_ms": 0.10}


def run_vllm_bench(base_url: str, model: str, tokenizer: str, concurrency: int, args: argparse.Namespace,
                   out_dir: Path, tag: str) -> dict:
    """One ``vllm bench serve`` run (through helpers.vllm_cli); returns its --save-result JSON."""
    cmd = [sys.executable, "-m", "helpers.vllm_cli", "bench", "serve", "--backend", "openai-chat",
           "--base-url", base_url, "--endpoint", "/v1/chat/completions", "--model", model,
           "--tokenizer", tokenizer, "--dataset-name", "random", "--random-input-len", str(args.input_len),
           "--random-output-len", str(args.output_len), "--ignore-eos", "--max-concurrency", str(concurrency),
           "--num-prompts", str(args.num_prompts), "--num-warmups", str(args.warmups), "--temperature", "0",
           "--seed", str(args.seed), "--disable-tqdm", "--save-result", "--result-dir", str(out_dir),
           "--result-filename", f"{tag}.json"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"vllm bench serve failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads((out_dir / f"{tag}.json").read_text())


def bench_and_count(settings, model: str, tokenizer: str, concurrency: int, args: argparse.Namespace,
                    out_dir: Path, tag: str) -> tuple[dict, int]:
    """One ``vllm bench serve`` run and the mean prompt length the server counted for its requests."""
    before = scrape(settings.metrics_url)
    figures = run_vllm_bench(settings.root_url, model, tokenizer, concurrency, args, out_dir, tag)
    served = window(before, scrape(settings.metrics_url))
    return figures, round(served["prompt_tokens"] / served["request_success"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--warmups", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", default="8797")
    parser.add_argument("--json", default=None, help="write every run's figures here")
    args = parser.parse_args()
    os.environ.update(WORKSHOP_PORT=args.port, WORKSHOP_STATE_DIR=tempfile.mkdtemp(prefix="bench-compare-"))
    out_dir = Path(tempfile.mkdtemp(prefix="vllm-bench-"))
    lab = connect(load_settings())
    settings, model, tokenizer = lab.settings, lab.model, lab.engine.config().model
    rows = []
    try:
        for concurrency in [int(c) for c in args.concurrency.split(",")]:
            for repeat in range(args.repeats):
                order = ("vllm", "ours") if repeat % 2 == 0 else ("ours", "vllm")
                figures: dict[str, dict] = {}
                prompt_len = None
                for tool in order:
                    if tool == "vllm":
                        figures[tool], prompt_len = bench_and_count(settings, model, tokenizer, concurrency, args,
                                                                    out_dir, f"c{concurrency}-r{repeat}")
                    else:
                        if prompt_len is None:  # ours first: learn the server-counted length from a probe run
                            probe = argparse.Namespace(**{**vars(args), "num_prompts": 2, "warmups": 0})
                            _, prompt_len = bench_and_count(settings, model, tokenizer, 1, probe, out_dir,
                                                            f"probe-c{concurrency}-r{repeat}")
                        result = run_load(settings, Workload(input_len=prompt_len, output_len=args.output_len),
                                          Load(concurrency=concurrency, num_requests=args.num_prompts,
                                               warmup_requests=args.warmups))
                        figures[tool] = summarize(result)
                for tool in ("vllm", "ours"):
                    rows.append({"concurrency": concurrency, "repeat": repeat, "tool": tool, "first": order[0],
                                 "server_prompt_tokens": prompt_len,
                                 **{f: figures[tool].get(f) for f in FIELDS},
                                 "completed": figures[tool].get("completed"), "failed": figures[tool].get("failed"),
                                 "client_loop_lag_max_ms": figures[tool].get("client_loop_lag_max_ms")})
                print(pd.DataFrame(rows[-2:]).to_string(index=False), flush=True)
    finally:
        lab.engine.stop()
    frame = pd.DataFrame(rows)
    means = frame.groupby(["concurrency", "tool"])[list(FIELDS)].mean()
    comparison = []
    for concurrency in frame["concurrency"].unique():
        ours, theirs = means.loc[(concurrency, "ours")], means.loc[(concurrency, "vllm")]
        for field in FIELDS:
            diff = (ours[field] - theirs[field]) / theirs[field]
            tol = TOLERANCE.get(field)
            comparison.append({"concurrency": concurrency, "metric": field, "vllm_bench": round(theirs[field], 2),
                               "ours": round(ours[field], 2), "diff_pct": round(100 * diff, 1),
                               "within": None if tol is None else bool(abs(diff) <= tol)})
    table = pd.DataFrame(comparison)
    print("\nmeans over repeats; tolerance: 5% throughput, 10% mean TTFT/TPOT\n" + table.to_string(index=False))
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": rows, "comparison": comparison, "args": vars(args)}, indent=1,
                                              default=str))


if __name__ == "__main__":
    main()
