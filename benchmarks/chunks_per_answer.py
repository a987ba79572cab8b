"""Benchmark: how many stream chunks carry one answer, ``vllm bench serve`` against our load generator (prints figures).

Usage: python benchmarks/chunks_per_answer.py [--pairs 3] [--concurrency 4] [--requests 64] [--output-len 64]
                                             [--port 8791]

Issue 32's ITL gap: with TPOT the same, our mean ITL (vLLM's definition: the gaps between chunks with ``choices``)
read about 1.45x vLLM's, so our answers came in fewer chunks. This counts them instead of inferring them: vLLM's
from ``--save-detailed`` (a request's ``itls`` are its gaps, so its chunks are one more), ours from each record's
``choice_times`` (helpers/measure/loadgen.py), pair after pair on one local engine (A/B/A/B), with vLLM's request
shape (random prompts, ``ignore_eos``, temperature 0) and our load generator as ``workshop bench
--vllm-bench-requests`` sends it but without the /metrics sampler (the candidate this rules in or out). Then one
run of ours at concurrency 1 with the server's token count in every chunk (``continuous_usage_stats``): how many
tokens each chunk carried when nothing else is in flight. Figures only, no verdict.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def vllm_chunks(result: dict[str, Any]) -> list[int]:
    """Chunks with ``choices`` per answer from a ``vllm bench serve --save-detailed`` result: len(itls) + 1, for the
    requests without an error (``errors``, one per request beside ``itls``)."""
    itls = result.get("itls") or []
    errors = result.get("errors") or [""] * len(itls)
    return [len(gaps) + 1 for gaps, error in zip(itls, errors) if gaps is not None and not error]


def describe(chunks: list[int]) -> str:
    return (f"chunks per answer: mean {statistics.mean(chunks):5.1f}, min {min(chunks)}, max {max(chunks)} "
            f"({len(chunks)} answers)") if chunks else "no answers"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=256, help="vLLM's --random-input-len")
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--port", default="8791", help="the engine's port (not the tests' 8765)")
    args = parser.parse_args()
    # what compare_vllm_bench.vllm_command reads beyond these: its request matching, none of it undone here
    args.range_ratio, args.warmups, args.same_seed, args.vllm_default_temperature = 0.0, 4, False, False
    os.environ.update(WORKSHOP_PORT=args.port, WORKSHOP_STATE_DIR=tempfile.mkdtemp(prefix="chunks-"))
    from helpers.core.settings import load_settings
    from helpers.engine.session import connect
    from helpers.measure.loadgen import run_load
    from helpers.measure.workloads import Load, Workload

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from compare_vllm_bench import vllm_command

    settings = load_settings()
    lab = connect(settings)
    out = Path(tempfile.mkdtemp(prefix="chunks-out-"))
    try:
        model, tokenizer = lab.model, lab.engine.config().model
        input_len = None
        for pair in range(args.pairs):
            name = f"vllm-{pair}.json"
            # compare_vllm_bench's command (each pair its own seed, temperature 0), with every request's gaps kept
            command = vllm_command(args, settings.root_url, model, tokenizer, pair, out)
            subprocess.run([*command, "--save-detailed"], check=True, capture_output=True)
            result = json.loads((out / name).read_text())
            input_len = input_len or round(result["total_input_tokens"] / result["completed"])
            print(f"pair {pair} vllm bench serve  {describe(vllm_chunks(result))}; mean ITL "
                  f"{result['mean_itl_ms']:.2f} ms", flush=True)
            ours = run_load(settings, Workload(input_len=input_len, output_len=args.output_len, min_tokens=False,
                                               usage_per_chunk=False),
                            Load(concurrency=args.concurrency, num_requests=args.requests, warmup_requests=4),
                            progress=False)
            done = [r for r in ours.completed if not r.warmup]
            gaps = [b - a for r in done for a, b in zip(r.choice_times, r.choice_times[1:])]
            print(f"pair {pair} ours              {describe([len(r.choice_times) for r in done])}; mean ITL "
                  f"{1000 * statistics.mean(gaps):.2f} ms", flush=True)
        one = run_load(settings, Workload(input_len=input_len, output_len=args.output_len, min_tokens=False,
                                          usage_per_chunk=True), Load(concurrency=1, num_requests=8), progress=False)
        carried = collections.Counter(k for r in one.completed for k in r.timing.chunk_tokens)
        print(f"ours at concurrency 1, the server's count per chunk: "
              f"{describe([len(r.choice_times) for r in one.completed])}; tokens per chunk "
              + ", ".join(f"{k}: {n} chunks" for k, n in sorted(carried.items())))
    finally:
        lab.engine.stop()


if __name__ == "__main__":
    main()
