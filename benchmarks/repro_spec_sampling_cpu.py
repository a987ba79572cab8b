"""Reproduce vllm-project/vllm#55005 on a CPU machine and show vllm-project/vllm#55006 passing the same test.

On vLLM's CPU build without Triton's CPU backend, speculative decoding at temperature > 0 samples every verified
token at a temperature read from uninitialised memory (the CPU fallback of ``expand_kernel`` fills a temporary copy,
``vllm/utils/cpu_triton_utils.py``). This script samples one prompt many times without speculation (twice, and once
at 1.2x the temperature: the test's false alarms and its power), with a draft model on the stock engine, and with the
same draft on an engine carrying #55006's change alone (``helpers/engine/spec_sampling_fix.py``, put in place at
import by a site hook), then runs a permutation G-test on the tokens after the first (the first comes from the plain
sampler at prefill; it is tested too, as a control that must not differ).

Run from a checkout of this kit with its environment (``pip install -e .``; vLLM's CPU build), one engine at a time::

    python benchmarks/repro_spec_sampling_cpu.py                  # the kit's tiny target and draft (models/)
    python benchmarks/repro_spec_sampling_cpu.py --model Qwen/Qwen3-1.7B --draft Qwen/Qwen3-0.6B --samples 600

Each engine runs in a fresh Python (``vllm.LLM``, in-process engine core), the equivalent of::

    vllm serve MODEL --enforce-eager --max-model-len 1024 --kv-cache-memory-bytes 1073741824 \\
        --speculative-config '{"method": "draft_model", "model": "DRAFT", "num_speculative_tokens": 3}'

and one request: prompt "The weather in", n = --samples, temperature 1.0, max_tokens 4, seeded (continuation i of a
sample gets seed + i). It prints the engine's draft counters, the p-values and the verdict of each engine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter

CHILD = "--one-engine"  # internal: run one engine and print its samples as JSON
RESULT = "RESULT "  # the child's line with its JSON (vLLM logs to stdout too)


def one_engine(model: str, draft: str | None, prompt: str, n: int, temperatures: list[float], seeds: list[int],
               k: int) -> dict:
    """In this process: one vLLM engine (speculative when ``draft``), one seeded request per temperature."""
    from vllm import LLM, SamplingParams

    spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": k} if draft else None
    llm = LLM(model=model, enforce_eager=True, max_model_len=1024, kv_cache_memory_bytes=1 << 30,
              speculative_config=spec, disable_log_stats=False)
    tokenizer = llm.get_tokenizer()
    samples = []
    for temperature, seed in zip(temperatures, seeds):
        params = SamplingParams(n=n, temperature=temperature, max_tokens=4, seed=seed)
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        samples.append([[tokenizer.convert_ids_to_tokens(i) or f"<id {i}, no token>" for i in c.token_ids]
                        for c in out.outputs])
    counters = {m.name: getattr(m, "value", None) for m in llm.get_metrics()
                if m.name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens",
                              "vllm:spec_decode_num_draft_tokens")}
    return {"samples": samples, "counters": counters}


def run_child(args: argparse.Namespace, draft: str | None, temperatures: list[float], seeds: list[int],
              fixed: bool) -> dict:
    """``one_engine`` in a fresh Python; with ``fixed``, through the site hook that applies vllm#55006."""
    from helpers.engine.spec_sampling_fix import FIX_VARIABLE, engine_environment

    env = {k: v for k, v in os.environ.items() if k != FIX_VARIABLE}
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if fixed:
        env[FIX_VARIABLE] = "1"
        env.update(engine_environment(env))
    job = json.dumps({"model": args.model, "draft": draft, "prompt": args.prompt, "n": args.samples,
                      "temperatures": temperatures, "seeds": seeds, "k": args.k})
    done = subprocess.run([sys.executable, __file__, CHILD, job], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the engine ({'fixed' if fixed else 'stock'}, draft {draft}) failed:\n{done.stderr[-3000:]}")
    return json.loads(next(ln for ln in reversed(done.stdout.splitlines()) if ln.startswith(RESULT))[len(RESULT):])


def main() -> None:
    from helpers.core.settings import models_dir
    from helpers.lessons.l06.lossless import format_p, lossless_conclusion, permutation_test

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(models_dir() / "tiny-agent"))
    parser.add_argument("--draft", default=str(models_dir() / "tiny-draft"))
    parser.add_argument("--prompt", default="The weather in")
    parser.add_argument("--samples", type=int, default=600, help="continuations per sample (the request's n)")
    parser.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--permutations", type=int, default=2000)
    args = parser.parse_args()
    n, t, s = args.samples, args.temperature, args.seed
    print(f"target {args.model}, draft {args.draft}, k={args.k}; prompt {args.prompt!r}, n={n}, temperature {t}, "
          f"max_tokens 4, seeds from {s}", flush=True)
    plain = run_child(args, None, [t, t, t * 1.2], [s, s + n, s + 2 * n], fixed=False)
    base, again, hotter = plain["samples"]
    engines = {"stock": run_child(args, args.draft, [t], [s + 3 * n], fixed=False),
               "vllm#55006 applied": run_child(args, args.draft, [t], [s + 3 * n], fixed=True)}
    test = lambda a, b, skip, until=None: permutation_test(a, b, skip, args.permutations, until=until)[1]  # noqa: E731
    print(f"without speculation: again {format_p(test(base, again, 1), args.permutations)}, "
          f"x1.2 temperature {format_p(test(base, hotter, 1), args.permutations)} (positions 2 on)")
    stock_counts = Counter((i, tok) for seq in engines["stock"]["samples"][0] for i, tok in enumerate(seq) if i >= 1)
    base_counts = Counter((i, tok) for seq in base for i, tok in enumerate(seq) if i >= 1)
    moved = max(sorted(set(stock_counts) | set(base_counts)), key=lambda c: abs(stock_counts[c] - base_counts[c]))
    for name, found in engines.items():
        spec = found["samples"][0]
        c = found["counters"]
        drafts, accepted = c.get("vllm:spec_decode_num_drafts"), c.get("vllm:spec_decode_num_accepted_tokens")
        seen = sum(1 for seq in spec if len(seq) > moved[0] and seq[moved[0]] == moved[1])
        verdict = lossless_conclusion(test(base, spec, 1), test(base, hotter, 1), test(base, again, 1), n,
                                      shift=f"token {moved[1]!r} at position {moved[0] + 1}, above",
                                      permutations=args.permutations, p_first=test(base, spec, 0, 1),
                                      p_first_hotter=test(base, hotter, 0, 1))
        print(f"\n{name}: {drafts} drafts, {accepted} accepted tokens; token {moved[1]!r} at position {moved[0] + 1}: "
              f"{base_counts[moved]} of {n} without speculation, {seen} of {n} here (the token the stock engine moved most: an "
              "example, which one varies from run to run)")
        print(f"  [{verdict.verdict}] {verdict.text}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == CHILD:
        print(RESULT + json.dumps(one_engine(**json.loads(sys.argv[2]))), flush=True)
    else:
        main()
