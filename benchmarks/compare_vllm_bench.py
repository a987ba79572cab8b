"""Benchmark: ``workshop bench`` against ``vllm bench serve`` on one local engine, pair by pair (prints figures).

Usage: python benchmarks/compare_vllm_bench.py [--pairs 4] [--requests 64] [--concurrency 4] [--port 8790]
                                                [--input-len 256] [--output-len 64] [--warmups 4] [--range-ratio R]
                                                [--workshop-args "--no-metrics"] [--json PATH] [--dry-run]

Starts one local engine (the profile's baseline, its own port and state directory), then runs PAIRS pairs,
each ``vllm bench serve`` then ``workshop bench`` (A/B/A/B), both as a user runs them, with the shape of
issue 32: random prompts of ``--input-len`` tokens, ``--output-len`` output tokens (ignore_eos), ``--requests``
requests at ``--concurrency`` (vLLM: request rate inf under ``--max-concurrency``; ours: a closed loop of that
many users, the same thing). What is made the same, so that the figures measure the tools and not the requests:
- the prompt length: vLLM's random dataset counts ``--input-len`` tokens before the chat template, ours counts
  the template too, so ours is given the server's mean prompt tokens that vLLM's first run reported;
- the sampling: vLLM's tool sends no temperature (the server's default, 1.0 for these models) and ours sends
  0, so vLLM's is given ``--temperature 0``;
- the cache: each vLLM run has its own ``--seed`` (its random prompts are otherwise the same every run, and the
  second run would find the first's in the prefix cache); ours salts every run's prompts;
- the warm-up: ``--warmups`` uncounted requests for both (vLLM's tool also sends one test request first);
- the definitions: ``workshop bench`` takes vLLM's e2el, TPOT and ITL (helpers/measure/bench_results.py); vLLM's
  tool writes e2el only when asked (``--percentile-metrics ... e2el``).
Issue 32's candidates, each undone on its own to measure what it does to the ratio (one switch per run):
- ``--same-seed``: every vLLM run gets ``--seed 0``, as a user's back-to-back runs do (runs after the first find
  their prompts in the prefix cache);
- ``--vllm-default-temperature``: vLLM's tool sends no temperature (the server's default sampling);
- ``--same-input-len``: ours is given ``--input-len`` itself (our prompts then hold the template in those tokens);
- ``--warmups 0`` and ``--workshop-args "--no-metrics"`` (our /metrics sampling during the run);
- ``--requests 192`` against 64: the client's CPU per request is the slope of ``client_cpu_s``;
- ``--range-ratio 0.25``: lengths drawn within 25% for both tools. At fixed lengths a closed loop's users finish
  and send together (lockstep: one prefill alone, the others wait behind it); a run where a late send breaks the
  lock reads a lower TTFT, so the two tools' figures can differ by which runs broke it (README).
For each figure it prints ours / vLLM's per pair, their mean, the pairs' spread (half the range of the
per-pair ratios) and "within noise" when the spread covers the difference, beside the issue's tolerance
(5% throughput, 10% TTFT and TPOT) and the machine's kind and load (``workshop machine``). A figure, not a
test: on a shared 2-core machine the spread is large; read the ratio with it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

FIGURES = ("output_throughput", "request_throughput", "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "mean_e2el_ms")
TOLERANCE = {"output_throughput": 0.05, "request_throughput": 0.05, "mean_ttft_ms": 0.10, "mean_tpot_ms": 0.10}
WORKSHOP = [sys.executable, "-m", "helpers.cli.main"]


# ---------------------------------------------------------------- arithmetic (tests/test_compare_vllm_bench.py)

def pair_ratios(ours: list[float | None], theirs: list[float | None]) -> list[float]:
    """ours / vLLM's for each pair where both figures exist and vLLM's is not zero."""
    return [a / b for a, b in zip(ours, theirs) if a is not None and b is not None and b != 0]


def spread(ratios: list[float]) -> float | None:
    """The pairs' spread: half the range of the per-pair ratios (None under two pairs)."""
    return (max(ratios) - min(ratios)) / 2 if len(ratios) >= 2 else None


def verdict(ratio: float | None, half_range: float | None) -> str:
    """"within noise" when the spread covers the difference from 1, else which way ours reads, in percent."""
    if ratio is None:
        return "no data"
    if half_range is not None and abs(ratio - 1) <= half_range:
        return "within noise"
    return f"ours {100 * (ratio - 1):+.1f}%" + (" (one pair: no spread)" if half_range is None else "")


def compare(rows: list[dict[str, Any]], figures: tuple[str, ...] = FIGURES) -> list[dict[str, Any]]:
    """One line per figure from the pairs' rows ({"pair", "tool": "vllm"|"workshop", figure: value}):
    vLLM's and our means, the mean per-pair ratio, its spread, the verdict and the issue's tolerance."""
    by_tool: dict[str, dict[int, dict[str, Any]]] = {"vllm": {}, "workshop": {}}
    for row in rows:
        by_tool[row["tool"]][row["pair"]] = row
    pairs = sorted(set(by_tool["vllm"]) & set(by_tool["workshop"]))
    out = []
    for name in figures:
        theirs = [by_tool["vllm"][p].get(name) for p in pairs]
        ours = [by_tool["workshop"][p].get(name) for p in pairs]
        ratios = pair_ratios(ours, theirs)
        ratio = statistics.mean(ratios) if ratios else None
        half = spread(ratios)
        tol = TOLERANCE.get(name)
        out.append({"figure": name, "pairs": len(ratios),
                    "vllm_mean": _mean(theirs), "workshop_mean": _mean(ours), "ratio": ratio, "spread": half,
                    "verdict": verdict(ratio, half),
                    "within_tolerance": None if tol is None or ratio is None else abs(ratio - 1) <= tol,
                    "tolerance": tol})
    return out


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.mean(kept) if kept else None


def format_table(lines: list[dict[str, Any]]) -> str:
    """The comparison as text: one row per figure."""
    head = f"{'figure':<20} {'pairs':>5} {'vllm bench':>11} {'workshop':>10} {'ratio':>7} {'spread':>8}  verdict"
    rows = [head]
    for line in lines:
        num = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        tol = line["tolerance"]
        tol_text = "" if tol is None else (f"; tolerance {tol:.0%}: "
                                           + ("n/a" if line["within_tolerance"] is None else
                                              "met" if line["within_tolerance"] else "NOT met"))
        rows.append(f"{line['figure']:<20} {line['pairs']:>5} {num(line['vllm_mean'], '11.2f')} "
                    f"{num(line['workshop_mean'], '10.2f')} {num(line['ratio'], '7.3f')} "
                    f"{'-' if line['spread'] is None else '±' + format(line['spread'], '.3f'):>8}  "
                    f"{line['verdict']}{tol_text}")
    return "\n".join(rows)


# ---------------------------------------------------------------- the runs

def vllm_command(args: argparse.Namespace, root_url: str, model: str, tokenizer: str, pair: int,
                 out_dir: Path) -> list[str]:
    """``vllm bench serve`` (through helpers.engine.vllm_cli, which runs it under the CPU build) for one pair."""
    return [sys.executable, "-m", "helpers.engine.vllm_cli", "bench", "serve", "--backend", "openai-chat",
            "--base-url", root_url, "--endpoint", "/v1/chat/completions", "--model", model, "--tokenizer", tokenizer,
            "--dataset-name", "random", "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.output_len), "--ignore-eos", "--num-prompts", str(args.requests),
            *(["--random-range-ratio", str(args.range_ratio)] if args.range_ratio else []),
            "--request-rate", "inf", "--max-concurrency", str(args.concurrency), "--num-warmups", str(args.warmups),
            *([] if args.vllm_default_temperature else ["--temperature", "0"]),
            "--seed", "0" if args.same_seed else str(pair),
            "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--save-result", "--result-dir", str(out_dir), "--result-filename", f"vllm-{pair}.json"]


def length_spec(length: int, spread_tokens: int, ratio: float) -> str:
    """``N``, or with ``--range-ratio`` the ``LOW:HIGH`` of vLLM's ``[n * (1 - r), n * (1 + r)]`` around ``length``
    (``spread_tokens``: the n vLLM's ratio applies to; ours may be offset by the chat template's tokens)."""
    if not ratio:
        return str(length)
    half = int(spread_tokens * ratio)
    return f"{max(1, length - half)}:{length + half}"


def workshop_command(args: argparse.Namespace, input_len: int, pair: int, out_dir: Path) -> list[str]:
    """``workshop bench`` with vLLM's requests for one pair (``--workshop-args`` appended)."""
    return [*WORKSHOP, "bench", "--concurrency", str(args.concurrency),
            "--input-len", length_spec(input_len, args.input_len, args.range_ratio),
            "--output-len", length_spec(args.output_len, args.output_len, args.range_ratio),
            "--num-requests", str(args.requests), "--warmup", str(args.warmups),
            "--vllm-bench-requests", *shlex.split(args.workshop_args),
            "--json", str(out_dir / f"workshop-{pair}.jsonl")]


def run_tool(cmd: list[str], env: dict[str, str], result: Path) -> dict[str, Any]:
    """Run one tool, return its saved figures plus the client's CPU seconds (process start included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0 or not result.exists():
        raise SystemExit(f"{shlex.join(cmd[:6])} ... failed ({proc.returncode}):\n{proc.stdout[-1500:]}\n"
                         f"{proc.stderr[-1500:]}")
    text = result.read_text().strip()
    figures = json.loads(text.splitlines()[-1] if result.suffix == ".jsonl" else text)
    figures["client_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return figures


def machine_line(env: dict[str, str]) -> str:
    """The machine's kind and how busy it is now, from ``workshop machine --json``."""
    proc = subprocess.run([*WORKSHOP, "machine", "--json", "--sample", "2"], capture_output=True, text=True, env=env)
    try:
        facts = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return f"machine: unknown (workshop machine failed: {proc.stderr.strip()[-200:]})"
    quiet = facts["quiet"]
    return (f"machine: {facts['cpu']}, {facts['isa']}, {facts['cores']} cores; {quiet['busy_share']:.0%} busy over 2 s "
            f"(engine idle), 1-min load {quiet['load_1m']}" + ("" if quiet["quiet"] else
                                                               f"; NOT quiet: {'; '.join(quiet['warnings'])}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=4, help="vllm bench / workshop bench pairs (A/B/A/B)")
    parser.add_argument("--requests", type=int, default=64, help="measured requests per run")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--port", default="8790", help="the engine's port (not the tests' 8765)")
    parser.add_argument("--input-len", type=int, default=256, help="vLLM's --random-input-len (tokens)")
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--warmups", type=int, default=4)
    parser.add_argument("--range-ratio", type=float, default=0.0,
                        help="lengths drawn from [n(1-r), n(1+r)] for both tools (vLLM's --random-range-ratio): "
                             "at fixed lengths a closed loop's users send in lockstep, and a run's figures depend "
                             "on whether a late send breaks it")
    parser.add_argument("--workshop-args", default="", help='more flags for workshop bench, e.g. "--no-metrics"')
    parser.add_argument("--same-seed", action="store_true",
                        help="issue 32's runs: --seed 0 for every vLLM run (its prompts repeat: prefix-cache hits)")
    parser.add_argument("--vllm-default-temperature", action="store_true",
                        help="issue 32's runs: vLLM's tool sends no temperature (ours sends 0)")
    parser.add_argument("--same-input-len", action="store_true",
                        help="issue 32's runs: ours gets --input-len, not the server's count of vLLM's prompts")
    parser.add_argument("--json", default=None, help="write every run's figures and the comparison here")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, start nothing")
    args = parser.parse_args()
    if args.pairs < 1 or args.requests < 1 or args.concurrency < 1:
        parser.error("--pairs, --requests and --concurrency must be >= 1")
    from helpers.core.settings import load_settings
    from helpers.engine.session import connect, make_engine

    if args.dry_run:
        os.environ["WORKSHOP_PORT"] = args.port
        settings = load_settings()
        work = Path("RESULTS_DIR")
        print(f"# starts the local engine (the profile's baseline) on port {args.port}, "
              f"then for pair i = 0..{args.pairs - 1}:")
        command = shlex.join(vllm_command(args, settings.root_url, settings.model,
                                          make_engine(settings).config().model, 0, work))
        print(command if args.same_seed else command.replace("--seed 0", "--seed i"))
        print(shlex.join(workshop_command(args, args.input_len, 0, work))
              + ("" if args.same_input_len else "   # --input-len: the server's mean prompt tokens in vLLM's first run"))
        return
    os.environ.update(WORKSHOP_PORT=args.port, WORKSHOP_STATE_DIR=tempfile.mkdtemp(prefix="compare-bench-"))
    work = Path(tempfile.mkdtemp(prefix="compare-bench-out-"))
    settings = load_settings()
    env = dict(os.environ)

    print(machine_line(env), flush=True)
    lab = connect(settings)
    rows: list[dict[str, Any]] = []
    input_len = None
    try:
        model, tokenizer = lab.model, lab.engine.config().model
        for pair in range(args.pairs):
            figures = run_tool(vllm_command(args, settings.root_url, model, tokenizer, pair, work), env,
                               work / f"vllm-{pair}.json")
            rows.append({"pair": pair, "tool": "vllm", **figures})
            if input_len is None and args.same_input_len:
                input_len = args.input_len
                print(f"vLLM's prompts are {figures['total_input_tokens'] / figures['completed']:.0f} tokens as the "
                      f"server counts them; ours get --input-len {input_len} (--same-input-len)", flush=True)
            elif input_len is None:
                input_len = round(figures["total_input_tokens"] / figures["completed"])
                print(f"vLLM's prompts are {input_len} tokens as the server counts them: ours get that", flush=True)
            figures = run_tool(workshop_command(args, input_len, pair, work), env, work / f"workshop-{pair}.jsonl")
            rows.append({"pair": pair, "tool": "workshop", **figures})
            for row in rows[-2:]:
                print(f"pair {pair} {row['tool']:<9} out {row['output_throughput']:7.1f} tok/s  "
                      f"TTFT {row['mean_ttft_ms']:7.1f} ms  TPOT {row['mean_tpot_ms']:6.2f} ms  "
                      f"prompt {row['total_input_tokens'] / max(1, row['completed']):.0f} tok  "
                      f"client CPU {row['client_cpu_s']:.1f} s", flush=True)
    finally:
        lab.engine.stop()
    print(machine_line(env))
    lines = compare(rows)
    undone = [flag for flag, on in (("--same-seed", args.same_seed),
                                    ("--vllm-default-temperature", args.vllm_default_temperature),
                                    ("--same-input-len", args.same_input_len)) if on]
    spread_note = f" (lengths within {args.range_ratio:g} of these)" if args.range_ratio else ""
    print(f"\n{args.pairs} pairs of {args.requests} requests at concurrency {args.concurrency}, "
          f"{args.warmups} warm-ups{', ' + ' '.join(undone) if undone else ''}"
          f"{', workshop ' + args.workshop_args if args.workshop_args else ''}; "
          f"{args.input_len}-token random prompts, {args.output_len} output tokens"
          f"{spread_note}; ratio = workshop / vllm bench, "
          "mean over pairs; spread = half the range of the pairs' ratios\n" + format_table(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": rows, "comparison": lines},
                                              indent=1, default=str))


if __name__ == "__main__":
    main()
