"""Benchmark: our load generator against ``vllm bench serve`` on the same engine and workload (prints both).

Usage: python benchmarks/compare_vllm_bench.py [--concurrency 1,8] [--input-len 128] [--output-len 128]
                                                [--num-prompts 32] [--repeats 3] [--also-defaults]
                                                [--json PATH]

Starts its own local engine (own port and state directory, prefix caching off) and stops it at the end.

Same workload means the same requests on the wire:
- the same prompts: our prompt factory writes them (exact server token counts), vLLM's tool reads them
  as a ``custom`` dataset (``--skip-chat-template``: the text is sent as the user message, as ours is);
  prefix caching is off so the tool that runs second does not find the first one's prompts cached;
- the same options: ``ignore_eos`` without ``min_tokens`` and without per-chunk usage, as vLLM's tool
  sends them (``Workload(min_tokens=False, usage_per_chunk=False)``). On a 2-core machine the server's
  own work per streamed chunk takes CPU from the model, so a request that streams more chunks lowers
  throughput: ``--also-defaults`` adds a run with our default options (``min_tokens`` keeps the model
  writing text to the end, continuous usage stats for per-token ITL) to show what they cost.
For each concurrency and repeat the tools run back to back, alternating which goes first; each tool
sends the same warm-up requests first (vLLM's tool repeats the first prompt; ours is given the same).

Definitions that coincide: request and output throughput (completed requests / tokens over the run's
wall time), mean TTFT (send -> first token) and mean TPOT ((e2e - ttft) / (n_out - 1) per request, n_out
from the server's usage). Where they differ: vLLM's ``itl`` is per chunk (one gap per streamed chunk);
ours reports ``itl_chunk`` (same meaning) and ``itl_token`` (a chunk of k tokens spreads its gap over k
tokens), which needs per-chunk usage, so it is only meaningful in the ``--also-defaults`` runs.
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

from helpers.measure.bench_results import summarize
from helpers.engine.session import make_engine
from helpers.measure.loadgen import prompt_factory, run_load
from helpers.measure.workloads import Load, Workload
from helpers.core.settings import load_settings

FIELDS = ("request_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms",
          "median_tpot_ms", "mean_itl_ms", "mean_e2el_ms")
TOLERANCE = {"request_throughput": 0.05, "output_throughput": 0.05, "mean_ttft_ms": 0.10, "mean_tpot_ms": 0.10}


def write_prompts(settings, model: str, count: int, input_len: int, path: Path) -> list[str]:
    """``count`` unique user messages whose chat prompts are ``input_len`` tokens, as a custom-dataset JSONL."""
    factory = prompt_factory(settings, model)
    texts = [factory.first_turn_content(uid, input_len) for uid in range(count)]
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    return texts


def run_vllm_bench(settings, model: str, tokenizer: str, dataset: Path, concurrency: int,
                   args: argparse.Namespace, out_dir: Path, tag: str) -> dict:
    """One ``vllm bench serve`` run (through helpers.engine.vllm_cli) on the dataset; returns its --save-result JSON."""
    cmd = [sys.executable, "-m", "helpers.engine.vllm_cli", "bench", "serve", "--backend", "openai-chat",
           "--base-url", settings.root_url, "--endpoint", "/v1/chat/completions", "--model", model,
           "--tokenizer", tokenizer, "--dataset-name", "custom", "--dataset-path", str(dataset),
           "--skip-chat-template", "--disable-shuffle", "--custom-output-len", str(args.output_len),
           "--ignore-eos", "--max-concurrency", str(concurrency), "--num-prompts", str(args.num_prompts),
           "--num-warmups", str(args.warmups), "--temperature", "0", "--disable-tqdm",
           "--save-result", "--result-dir", str(out_dir), "--result-filename", f"{tag}.json"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"vllm bench serve failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads((out_dir / f"{tag}.json").read_text())


def run_ours(settings, texts: list[str], concurrency: int, args: argparse.Namespace, defaults: bool) -> dict:
    """Our generator on the same prompts in the same order (warm-ups repeat the first, as vLLM's tool does)."""
    prompts = [[{"role": "user", "content": t}] for t in [texts[0]] * args.warmups + texts[:args.num_prompts]]
    workload = Workload(output_len=args.output_len, prompts=prompts,
                        min_tokens=defaults, usage_per_chunk=defaults)
    result = run_load(settings, workload, Load(concurrency=concurrency, num_requests=args.num_prompts,
                                               warmup_requests=args.warmups))
    return summarize(result)


def comparison_table(frame: pd.DataFrame, ours: str = "ours") -> pd.DataFrame:
    """Means over repeats of ``ours`` against vllm bench, with the issue's tolerances."""
    means = frame.groupby(["concurrency", "tool"])[list(FIELDS)].mean()
    rows = []
    for concurrency in frame["concurrency"].unique():
        mine, theirs = means.loc[(concurrency, ours)], means.loc[(concurrency, "vllm")]
        for field in FIELDS:
            diff = (mine[field] - theirs[field]) / theirs[field]
            tol = TOLERANCE.get(field)
            rows.append({"concurrency": concurrency, "metric": field, "vllm_bench": round(theirs[field], 2),
                         ours: round(mine[field], 2), "diff_pct": round(100 * diff, 1),
                         "within": None if tol is None else bool(abs(diff) <= tol)})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--input-len", type=int, default=128, help="prompt tokens as the server counts them")
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--warmups", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--port", default="8797")
    parser.add_argument("--also-defaults", action="store_true",
                        help="also run our generator with its default request options (min_tokens, per-chunk usage)")
    parser.add_argument("--json", default=None, help="write every run's figures here")
    args = parser.parse_args()
    os.environ.update(WORKSHOP_PORT=args.port, WORKSHOP_STATE_DIR=tempfile.mkdtemp(prefix="bench-compare-"))
    work = Path(tempfile.mkdtemp(prefix="vllm-bench-"))
    settings = load_settings()
    engine = make_engine(settings)
    engine.set_flag("--no-enable-prefix-caching")  # starts it: the profile's baseline plus this flag
    model, tokenizer = engine.model, engine.config().model
    dataset = work / "prompts.jsonl"
    texts = write_prompts(settings, model, args.num_prompts, args.input_len, dataset)
    tools = ["vllm", "ours", *(["ours_defaults"] if args.also_defaults else [])]
    rows = []
    try:
        for concurrency in [int(c) for c in args.concurrency.split(",")]:
            for repeat in range(args.repeats):
                order = tools if repeat % 2 == 0 else tools[::-1]
                for tool in order:
                    if tool == "vllm":
                        figures = run_vllm_bench(settings, model, tokenizer, dataset, concurrency, args, work,
                                                 f"c{concurrency}-r{repeat}")
                    else:
                        figures = run_ours(settings, texts, concurrency, args, defaults=tool == "ours_defaults")
                    rows.append({"concurrency": concurrency, "repeat": repeat, "tool": tool, "first": order[0],
                                 **{f: figures.get(f) for f in FIELDS},
                                 "completed": figures.get("completed"), "failed": figures.get("failed"),
                                 "total_output_tokens": figures.get("total_output_tokens"),
                                 "client_loop_lag_max_ms": figures.get("client_loop_lag_max_ms")})
                print(pd.DataFrame(rows[-len(tools):]).round(2).to_string(index=False), flush=True)
    finally:
        engine.stop()
    frame = pd.DataFrame(rows)
    table = comparison_table(frame)
    print(f"\nmeans over {args.repeats} repeats; {args.num_prompts} prompts of {args.input_len} tokens, "
          f"{args.output_len} output tokens; tolerance: 5% throughput, 10% mean TTFT/TPOT\n" + table.to_string(index=False))
    if args.also_defaults:
        print("\nour default request options (min_tokens, per-chunk usage) against vllm bench's:\n"
              + comparison_table(frame, "ours_defaults").to_string(index=False))
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": rows, "comparison": table.to_dict("records"),
                                               "args": vars(args)}, indent=1, default=str))


if __name__ == "__main__":
    main()
