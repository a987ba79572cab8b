"""What notebook 06 (speculative decoding) needs beyond the floors below: build the ``--speculative-config``
of a method, measure methods interleaved with the baseline, conclude from the numbers whether it paid and why
not, judge the acceptance formula (``helpers.planning.acceptance``) against the counters, and the exercises'
outcomes. What the notebook uses from the floors is re-exported here (``__all__``), so its cells import from
this module and ``helpers.engine.session`` only.

A draft proposes ``num_speculative_tokens`` tokens; the target model checks them all in one forward
pass and keeps the longest agreeing prefix plus one token of its own. The server counts drafts, draft
tokens and accepted tokens (``helpers.measure.server_metrics``); the client sees several tokens arrive per
chunk. Greedy outputs do not change: speculation is lossless, only faster or slower.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import pandas as pd

from helpers.measure.bench_results import requests_frame, summarize
from helpers.core.comparison import BETTER, SAME, WORSE, Verdict, compare_samples, interleave
from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion, lesson_verdict, report
from helpers.core.lesson import check_prediction, should_see, should_see_conclusion
from helpers.core.vllm_args import flag_value
from helpers.evals.suite import compare, load_suite
from helpers.hardware.machine import check_quiet
from helpers.lessons import plots
from helpers.planning.acceptance import expected_length_table, more_guesses
from helpers.measure.loadgen import run_load
from helpers.measure.workloads import Load, Workload
from helpers.measure.server_metrics import scrape, window
from helpers.core.settings import models_dir

if TYPE_CHECKING:  # the lesson modules take a Lab; importing it at run time would pull in the engine
    from helpers.engine.session import Lab

__all__ = [  # this module's own, then what notebook 06 uses from the floors below
    "BASELINE", "METHODS", "SPEC_FLAG", "acceptance_conclusion", "agent_workload", "aligned_vs_misaligned",
    "baseline_tok_s", "copied_text_lookup", "formula_conclusion", "installed_spec_methods", "k_conclusion",
    "length_gain_outcome", "lookup_outcome", "lowest_concurrency_conclusion", "mean_runs", "measure_speculation",
    "method_conclusion", "method_map", "per_k", "prompt_lookup_length", "run_methods", "spec_config",
    "speculation_caveat", "speculation_conclusions", "speedups", "trend_conclusion",
    "check_prediction", "check_quiet", "compare", "expected_length_table", "more_guesses", "plots", "report",
    "should_see", "should_see_conclusion",
]


def spec_config(method: str, num_speculative_tokens: int, model: str | None = None, **options: Any) -> str:
    """The JSON for ``--speculative-config``: ``ngram`` (prompt lookup) or ``draft_model`` (a model name:
    a shipped tiny model's directory when one exists under models/, else a hub id)."""
    if num_speculative_tokens < 1:
        raise ValueError("num_speculative_tokens must be >= 1")
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": num_speculative_tokens, **options}
    if method == "draft_model":
        if not model:
            raise ValueError("method draft_model needs model= (a draft sharing the target's tokenizer)")
        path = models_dir() / model
        config["model"] = str(path) if path.is_dir() else model
    elif method == "ngram":
        config.setdefault("prompt_lookup_max", 4)
        config.setdefault("prompt_lookup_min", 2)
    else:
        raise ValueError(f"unknown method {method!r}: use 'ngram' or 'draft_model'")
    return json.dumps(config, separators=(",", ":"))


def agent_workload(suite: str = "agent-v1", max_tokens: int = 64,
                   categories: tuple[str, ...] = ("tool_call", "tool_answer", "no_tool")) -> Workload:
    """Real agent traffic: the eval suite's conversations, asked with the tools, answered as the model
    would (no forced length). What a draft has to guess depends on what is said, so acceptance is only
    meaningful on such traffic; on random-text prompts two models that both fall into repeating one
    token "agree"."""
    loaded = load_suite(suite)
    prompts = [t.messages for t in loaded.tasks if t.category in categories and t.tools]
    return Workload(output_len=max_tokens, exact_output=False, prompts=prompts, extra_body={"tools": loaded.tools})


def measure_speculation(lab: Lab, name: str, concurrencies: list[int], workload: Workload,
                        requests_per_stream: int = 4, min_requests: int = 8) -> list[dict[str, Any]]:
    """One row per concurrency: throughput, TTFT/TPOT, tokens per chunk seen by the client, and the
    server's acceptance rate and mean acceptance length over that run, its number of drafts and the acceptance
    rate of each draft position (None without speculation)."""
    rows = []
    for c in concurrencies:
        before = scrape(lab.settings.metrics_url)
        result = run_load(lab.settings, workload, Load(concurrency=c, num_requests=max(min_requests, c * requests_per_stream),
                                                       warmup_requests=min(c, 2)))
        served = window(before, scrape(lab.settings.metrics_url))
        s, frame = summarize(result), requests_frame(result)
        ok = frame[frame["ok"]]
        rows.append({"config": name, "concurrency": c, "output_tok_s": s["output_throughput"],
                     "mean_ttft_ms": s["mean_ttft_ms"], "mean_tpot_ms": s["mean_tpot_ms"],
                     "tokens_per_chunk": float(ok["completion_tokens"].sum() / ok["chunks"].sum()) if len(ok) else None,
                     "acceptance_rate": served["spec_decode_acceptance_rate"],
                     "mean_acceptance_length": served["spec_decode_mean_acceptance_length"],
                     "spec_drafts": served["spec_decode_num_drafts"],
                     "per_position_acceptance": served["spec_decode_per_position_acceptance_rate"],
                     "failed": s["failed"]})
    return rows


BASELINE = "no speculation"
SPEC_FLAG = "--speculative-config"


def run_methods(lab: Lab, methods: dict[str, str | None], concurrencies: list[int], workload: Workload,
                repeats: int = 2, requests_per_stream: int = 4, eval_suite: str | None = None,
                ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Each ``--speculative-config`` (None: no speculation) measured ``repeats`` times, interleaved A B C A B C
    so a machine that gets busier hits every method alike. One row per method, concurrency and repeat;
    ``eval_suite`` runs once per method in the first round. The engine is left without speculation."""
    from helpers.evals.suite import run_suite

    evals: dict[str, Any] = {}
    rounds = {name: 0 for name in methods}

    def runner(name: str, config: str | None):
        def run() -> list[dict[str, Any]]:
            if flag_value(lab.engine.args(), SPEC_FLAG) != config:
                lab.engine.set_flag(SPEC_FLAG, config)
            if eval_suite and name not in evals:
                evals[name] = run_suite(lab, eval_suite)
            rows = measure_speculation(lab, name, concurrencies, workload, requests_per_stream)
            rounds[name] += 1
            return [dict(r, repeat=rounds[name]) for r in rows]
        return run

    try:
        results = interleave({name: runner(name, config) for name, config in methods.items()}, repeats,
                             desc="speculative methods")
    finally:
        if flag_value(lab.engine.args(), SPEC_FLAG) is not None:
            lab.engine.set_flag(SPEC_FLAG, None)  # back to the baseline
    return pd.DataFrame([row for rows in results.values() for run_rows in rows for row in run_rows]), evals


def _mean(values: Any) -> float | None:
    clean = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(clean) / len(clean) if clean else None


def speedups(table: pd.DataFrame, baseline: str = BASELINE, k: dict[str, int] | None = None) -> pd.DataFrame:
    """One row per method and concurrency: mean throughput, its ratio to the baseline judged against the
    repeats' spread (``verdict``), acceptance, tokens per step and what one speculative step cost.

    ``step_cost_x``: a speculative step's time in plain decode steps (TPOT x tokens per step / baseline
    TPOT); ``draft_cost_x``: the part above one step spread over the k guesses (``k``: guesses per method),
    about what one draft token (and its share of the wider verification) costs next to a target step.
    ``consistent``: False when a speculative step measured cheaper than a plain one beyond the noise, which
    no machine does (a draft step and a verification cost at least one step): the baseline's runs were
    slowed by something else, and the ratio says nothing about speculation."""
    rows = []
    for (config, c), group in table[table.config != baseline].groupby(["config", "concurrency"], sort=False):
        base = table[(table.config == baseline) & (table.concurrency == c)]
        verdict = compare_samples(base.output_tok_s.tolist(), group.output_tok_s.tolist(), higher_is_better=True)
        base_tpot, tpot = _mean(base.mean_tpot_ms), _mean(group.mean_tpot_ms)
        length = _mean(group.mean_acceptance_length) or 1.0
        step_cost = tpot * length / base_tpot if base_tpot and tpot else None
        guesses = (k or {}).get(config)
        consistent = step_cost is None or verdict.noise_rel != verdict.noise_rel or step_cost >= 1 - verdict.noise_rel
        rows.append({"config": config, "concurrency": c, "output_tok_s": verdict.mean_b, "baseline_tok_s": verdict.mean_a,
                     "speedup": verdict.ratio, "verdict": verdict.label, "noise_rel": verdict.noise_rel,
                     "verdict_detail": verdict.describe(), "acceptance_rate": _mean(group.acceptance_rate),
                     "mean_acceptance_length": length, "tokens_per_chunk": _mean(group.tokens_per_chunk),
                     "baseline_tpot_ms": base_tpot, "mean_tpot_ms": tpot, "step_cost_x": step_cost,
                     "draft_cost_x": None if step_cost is None or not guesses else max(0.0, step_cost - 1) / guesses,
                     "consistent": consistent, "_verdict": verdict})
    return pd.DataFrame(rows)


def _pct(value: float | None) -> str:
    return "n/a (no drafts proposed)" if value is None or value != value else f"{value:.1%}"


def _why_not_faster(row: dict[str, Any]) -> str:
    """What the numbers say about a speculative method that did not speed up."""
    step, length, rate = row.get("step_cost_x"), row.get("mean_acceptance_length") or 1.0, row.get("acceptance_rate")
    parts = []
    if step is not None:
        parts.append(f"one speculative step took {step:.1f}x a plain step's time and yielded {length:.2f} tokens")
        if row.get("draft_cost_x") is not None:
            parts.append(f"each guessed token cost about {row['draft_cost_x']:.2f} of a target step (draft plus "
                         "wider verification)")
    if rate is not None and rate == rate and rate < 0.5:
        parts.append(f"only {rate:.0%} of the guesses were accepted")
    return "; ".join(parts) if parts else "no step timing to explain it"


def method_conclusion(row: dict[str, Any], expect: str | None = None, regressed: list[str] | None = None) -> Conclusion:
    """The sentence for one method at one concurrency (a ``speedups`` row): speed vs baseline within noise,
    acceptance, and why when it did not pay. ``expect``: BETTER (the lesson expects a speed-up), WORSE, or None."""
    verdict: Verdict = row["_verdict"]
    head = (f"{row['config']}, concurrency {row['concurrency']}: {row['output_tok_s']:.0f} vs "
            f"{row['baseline_tok_s']:.0f} output tok/s = {verdict.describe()}; acceptance {_pct(row['acceptance_rate'])}, "
            f"{row['mean_acceptance_length']:.2f} tokens per step, TPOT {row['baseline_tpot_ms']:.1f} -> "
            f"{row['mean_tpot_ms']:.1f} ms")
    if not row.get("consistent", True):
        quality = f"; eval regressed in {', '.join(regressed)}" if regressed else ""
        return Conclusion(f"{head}. Not a measurement of speculation: a speculative step measured "
                          f"{row['step_cost_x']:.1f}x a plain step, and no step with a draft and a verification is "
                          "cheaper than a plain one, so the baseline's runs were slowed by something else (a busy "
                          f"machine); re-run on a quiet machine, with REPEATS >= 2{quality}.",
                          "" if expect is None else WITHIN_NOISE)
    if verdict.label == BETTER:
        tail = f"faster: {row['mean_acceptance_length']:.2f} tokens per step outweighed the step's cost"
        if row.get("step_cost_x") is not None:
            tail += f" ({row['step_cost_x']:.1f}x a plain step)"
    elif verdict.label == WORSE:
        tail = "slower: " + _why_not_faster(row)
    elif verdict.label == SAME:
        tail = (f"no measurable difference: {verdict.ratio - 1:+.0%} is inside the run-to-run spread "
                f"(+/-{verdict.noise_rel:.0%})")
    else:
        tail = "not measured"
    quality = f"; eval regressed in {', '.join(regressed)}" if regressed else ""
    return Conclusion(f"{head}. {tail}{quality}.", "" if expect is None else lesson_verdict(verdict, expect))


def trend_conclusion(name: str, low: dict[str, Any], high: dict[str, Any]) -> Conclusion:
    """Does the speed-up shrink from the lowest to the highest concurrency (``speedups`` rows)? On a GPU it
    does: a bigger batch already uses the weights each step reads, leaving less for speculation to win."""
    lo, hi = low["speedup"], high["speedup"]
    if not (low.get("consistent", True) and high.get("consistent", True)):
        return Conclusion(f"{name}: no trend with concurrency can be read: the step times above are inconsistent "
                          "(a busy machine slowed the baseline's runs).", WITHIN_NOISE)
    noise = max(low["noise_rel"], high["noise_rel"])
    where = f"{name}: {lo:.2f}x at concurrency {low['concurrency']} -> {hi:.2f}x at {high['concurrency']}"
    if lo != lo or hi != hi:
        return Conclusion(f"{where}: not measured at both concurrencies.", WITHIN_NOISE)
    change = hi / lo - 1
    if abs(change) <= noise:
        return Conclusion(f"{where}: about the same (a {change:+.0%} change inside the +/-{noise:.0%} spread): "
                          "no trend with concurrency measurable here.", WITHIN_NOISE)
    if change < 0:
        return Conclusion(f"{where}: the gain shrinks as concurrency grows, as expected: a bigger batch already "
                          "makes use of each step, and every rejected guess still costs draft work.", SHOWN)
    steps = [r.get("step_cost_x") for r in (low, high)]
    reason = ("a speculative step cost {:.1f}x a plain step at concurrency {} but {:.1f}x at {}: the draft's "
              "per-step overhead is shared by more sequences in a batch".format(steps[0], low["concurrency"], steps[1],
                                                                                high["concurrency"])
              if None not in steps and steps[1] < steps[0] else
              "the step costs do not explain it; with a busy machine the runs at one concurrency may simply have "
              "been slowed more than the other's")
    return Conclusion(f"{where}: the ratio grew with concurrency, against the expectation of a smaller gain in "
                      f"bigger batches: {reason}.", NOT_SHOWN)


def acceptance_conclusion(aligned: list[float | None], misaligned: list[float | None]) -> Conclusion:
    """Aligned vs misaligned draft acceptance (fractions, one per run): the aligned draft should be accepted more."""
    verdict = compare_samples(misaligned, aligned, higher_is_better=True)
    a, m = _mean(aligned), _mean(misaligned)
    text = f"Aligned draft acceptance {_pct(a)} vs misaligned {_pct(m)}"
    if a is None or m is None:
        return Conclusion(text + ": not comparable (a draft proposed nothing).", WITHIN_NOISE)
    if verdict.label == BETTER or (m == 0 and a > 0):
        return Conclusion(text + ": a draft trained on the same text guesses what the target will say.", SHOWN)
    if verdict.label == SAME:
        return Conclusion(text + ": no measurable difference between the drafts on this traffic.", WITHIN_NOISE)
    return Conclusion(text + ": the untrained draft was accepted more, which only happens when both models "
                             "repeat the same tokens; look at the answers.", NOT_SHOWN)


def k_conclusion(k_rows: pd.DataFrame, baseline_tok_s: list[float]) -> Conclusion:
    """How many guesses (one row per k: output_tok_s, acceptance_rate, mean_acceptance_length): the accepted
    share per guess should fall as k grows, so speed stops growing with k."""
    k_rows = k_rows.sort_values("k")
    per_k = []
    for _, r in k_rows.iterrows():
        v = compare_samples(baseline_tok_s, [r.output_tok_s], higher_is_better=True)
        per_k.append(f"k={int(r.k)} {v.ratio:.2f}x (acceptance {_pct(r.acceptance_rate)})")
    best = k_rows.loc[k_rows.output_tok_s.idxmax()]
    best_v = compare_samples(baseline_tok_s, [best.output_tok_s], higher_is_better=True)
    head = f"Number of guesses: {', '.join(per_k)}; best k={int(best.k)} ({best_v.label} than no speculation)"
    first, last = k_rows.iloc[0], k_rows.iloc[-1]
    if len(k_rows) < 2 or first.acceptance_rate is None or last.acceptance_rate is None \
            or first.acceptance_rate != first.acceptance_rate or last.acceptance_rate != last.acceptance_rate:
        return Conclusion(head + ".", WITHIN_NOISE)
    drop = last.acceptance_rate - first.acceptance_rate
    if abs(drop) < 0.05:
        return Conclusion(head + f". Acceptance per guess stayed at about {first.acceptance_rate:.0%} from k={int(first.k)} "
                                 f"to k={int(last.k)}: later guesses were as good as the first here.", WITHIN_NOISE)
    if drop < 0:
        return Conclusion(head + f". Acceptance per guess fell from {first.acceptance_rate:.0%} at k={int(first.k)} to "
                                 f"{last.acceptance_rate:.0%} at k={int(last.k)}: each further guess is less likely to "
                                 "be kept, while it costs a full draft step.", SHOWN)
    return Conclusion(head + f". Acceptance per guess rose from {first.acceptance_rate:.0%} to {last.acceptance_rate:.0%} "
                             "with more guesses: on this traffic the later guesses were easier (e.g. repeated tool-call "
                             "syntax).", NOT_SHOWN)


def speculation_caveat(profile: str, draft_cost_x: float | None = None) -> Conclusion:
    """CPU vs GPU: why a CPU number says little about speculative decoding on a GPU; ``draft_cost_x`` (one guessed
    token's cost in target steps, measured) decides which way the CPU sentence goes."""
    gpu = ("On a GPU decode is memory-bound: verifying k tokens costs about one step (the weights are read once) "
           "and a draft about 10x smaller costs a fraction of one, so good acceptance gives a real speed-up at low "
           "concurrency.")
    if profile != "cpu":
        return Conclusion("GPU: " + gpu + (f" Here each guessed token cost about {draft_cost_x:.2f} of a target step."
                                           if draft_cost_x is not None and draft_cost_x == draft_cost_x else ""))
    fixed = ("on a CPU much of a decode step is fixed work (Python, scheduling, small matrix products on a few "
             "cores)")
    if draft_cost_x is None or draft_cost_x != draft_cost_x:
        return Conclusion(f"CPU vs GPU: {fixed}, so even a small draft's step costs nearly as much as the target's; "
                          f"k guesses then cost about k target steps and speculation rarely pays. {gpu}")
    if draft_cost_x >= 0.5:
        return Conclusion(f"CPU vs GPU: here each guessed token cost about {draft_cost_x:.2f} of a target step: {fixed}, "
                          f"so a small draft's step costs nearly as much as the target's, k guesses cost about k target "
                          f"steps and speculation rarely pays. {gpu}")
    return Conclusion(f"CPU vs GPU: here each guessed token cost only {draft_cost_x:.2f} of a target step (this draft is "
                      f"far smaller than the target), so speculation could pay even on this CPU. With a draft nearer the "
                      f"target's size it would not: {fixed}, so such a draft's step costs nearly as much as a target "
                      f"step. {gpu}")


def mean_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The repeats averaged: one row per method and concurrency (for a figure of the means)."""
    columns = ["output_tok_s", "mean_ttft_ms", "mean_tpot_ms", "tokens_per_chunk", "acceptance_rate",
               "mean_acceptance_length"]
    columns = [c for c in columns if c in runs]
    return runs.groupby(["config", "concurrency"], as_index=False, sort=False)[columns].mean()


def per_k(runs: pd.DataFrame, names_by_k: dict[int, str], concurrency: int) -> pd.DataFrame:
    """One row per number of guesses k: the mean throughput and acceptance of the method named for it."""
    rows = []
    for k, name in sorted(names_by_k.items()):
        r = runs[(runs.config == name) & (runs.concurrency == concurrency)]
        rows.append({"k": k, "config": name, "runs": len(r), "output_tok_s": _mean(r.output_tok_s),
                     "acceptance_rate": _mean(r.acceptance_rate),
                     "mean_acceptance_length": _mean(r.mean_acceptance_length)})
    return pd.DataFrame(rows)


def speculation_conclusions(runs: pd.DataFrame, table: pd.DataFrame, aligned: str, misaligned: str,
                            k_rows: pd.DataFrame | None = None, regressed: dict[str, list[str]] | None = None,
                            profile: str = "cpu") -> list[Conclusion]:
    """Notebook 06's "what we learned": each method at each concurrency (``speedups`` rows; the aligned draft is
    expected to be faster at the lowest concurrency, the misaligned one slower), the trend with concurrency,
    acceptance aligned vs misaligned, the number of guesses, and the CPU vs GPU caveat."""
    out: list[Conclusion] = []
    lowest = table.concurrency.min()
    for _, r in table.iterrows():
        expect = {aligned: BETTER if r.concurrency == lowest else None, misaligned: WORSE}.get(r.config)
        out.append(method_conclusion(r.to_dict(), expect, (regressed or {}).get(r.config)))
    for name in (aligned, misaligned):
        rows = table[table.config == name].sort_values("concurrency")
        if len(rows) >= 2:
            out.append(trend_conclusion(name, rows.iloc[0].to_dict(), rows.iloc[-1].to_dict()))
    out.append(acceptance_conclusion(runs[runs.config == aligned].acceptance_rate.tolist(),
                                     runs[runs.config == misaligned].acceptance_rate.tolist()))
    if k_rows is not None and len(k_rows):
        base = runs[(runs.config == BASELINE) & (runs.concurrency == lowest)].output_tok_s.tolist()
        out.append(k_conclusion(k_rows, base))
    low = table[(table.config == aligned) & (table.concurrency == lowest) & table.consistent]
    out.append(speculation_caveat(profile, low.draft_cost_x.iloc[0] if len(low) else None))
    return out


# ---------------------------------------------------------------- prompt lookup (ngram), by hand

def prompt_lookup_length(token_ids: list[int], start: int, k: int, n_min: int = 2, n_max: int = 4) -> float:
    """Mean tokens per step that ngram prompt lookup would give when the text from ``start`` on is what the model
    says (greedy, as if the target always agreed with the text): at each step the last n tokens (n from n_max
    down to n_min) are looked up earlier in the context, the k tokens after the latest match are proposed, and the
    step keeps the agreeing prefix plus one token. vLLM's ngram proposer works the same way."""
    if not 0 < start < len(token_ids):
        raise ValueError("start must fall inside the text: the prompt is token_ids[:start]")
    pos, steps = start, 0
    while pos < len(token_ids):
        proposal: list[int] = []
        for n in range(n_max, n_min - 1, -1):
            if pos < n:
                continue
            tail = token_ids[pos - n:pos]
            for i in range(pos - n - 1, -1, -1):
                if token_ids[i:i + n] == tail:
                    proposal = token_ids[i + n:i + n + k]
                    break
            if proposal:
                break
        accepted = 0
        while accepted < len(proposal) and pos + accepted < len(token_ids) and proposal[accepted] == token_ids[pos + accepted]:
            accepted += 1
        pos += accepted + 1
        steps += 1
    return (len(token_ids) - start) / steps


# ---------------------------------------------------------------- the method map

METHODS: tuple[dict[str, str], ...] = (  # facts: what proposes the guesses and what it needs; source per row
    {"method": "ngram", "vllm": "ngram", "proposer": "the last n tokens looked up earlier in the prompt and the "
     "text so far; the tokens after the match are the guesses", "needs": "nothing (no weights, no training)",
     "source": "vLLM docs, Speculative Decoding (n-gram / prompt lookup decoding)"},
    {"method": "suffix decoding", "vllm": "suffix", "proposer": "suffix trees over this request's prompt and "
     "earlier responses; guesses as long as the tree predicts well", "needs": "the arctic-inference package; no "
     "weights", "source": "Oliaro et al. 2024, SuffixDecoding; vLLM docs, Speculative Decoding"},
    {"method": "draft model", "vllm": "draft_model", "proposer": "a smaller model with the same tokenizer, run k "
     "steps ahead", "needs": "a draft checkpoint sharing the target's vocabulary (about 10x smaller)",
     "source": "Leviathan et al. 2023; Chen et al. 2023 (speculative sampling)"},
    {"method": "EAGLE / EAGLE-3", "vllm": "eagle / eagle3", "proposer": "a one-layer head fed the target's hidden "
     "states (EAGLE-3: from several layers), predicting the next tokens", "needs": "a head trained for this "
     "target model", "source": "Li et al. 2024, EAGLE; Li et al. 2025, EAGLE-3; vLLM docs"},
    {"method": "MTP", "vllm": "mtp", "proposer": "the model's own multi-token-prediction layers, trained with it",
     "needs": "a model pre-trained with MTP layers (DeepSeek-V3, Qwen3-Next, GLM-4.5 ...)",
     "source": "DeepSeek-V3 technical report (2024); vLLM docs, Speculative Decoding"},
    {"method": "Medusa", "vllm": "medusa", "proposer": "several extra heads on the target, head i guessing the "
     "token i positions ahead", "needs": "heads trained on the target", "source": "Cai et al. 2024, Medusa"},
)


def installed_spec_methods() -> tuple[str, ...] | None:
    """The ``--speculative-config`` method names the vLLM installed here accepts, read from its source without
    importing it; None when vLLM is not installed here."""
    import ast
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        tree = ast.parse((Path(next(iter(spec.submodule_search_locations))) / "config/speculative.py").read_text())
    except (OSError, SyntaxError):
        return None
    names = [c.value for node in tree.body if isinstance(node, ast.Assign)
             and getattr(node.targets[0], "id", "").endswith(("Method", "Types"))
             for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    return tuple(names) or None


def _heads_for(target_dir: Any, kind: str) -> bool:
    """Does a shipped model declare ``kind`` heads (eagle, medusa) or does the target have MTP layers?"""
    target = json.loads((target_dir / "config.json").read_text()) if (target_dir / "config.json").is_file() else {}
    if kind == "mtp":
        return any(k in target for k in ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers"))
    for config in models_dir().glob("*/config.json"):
        if any(kind in a.lower() for a in json.loads(config.read_text()).get("architectures", [])):
            return True
    return False


def method_map(target: str, measured: list[str], profile: str = "cpu") -> pd.DataFrame:
    """One row per method: what proposes, what it needs, vLLM's name, whether this engine can run it (the installed
    vLLM's accepted names, the packages and weights present) and whether this notebook measures it."""
    import importlib.util

    known, target_dir = installed_spec_methods(), models_dir() / target
    rows = []
    for m in METHODS:
        names = [n.strip() for n in m["vllm"].split("/")]
        if profile != "cpu":
            here = f"not probed: the engine runs on the {profile} profile"
        elif known is not None and not any(n in known for n in names):
            here = "no: this vLLM does not accept the method"
        elif m["vllm"] == "suffix":
            here = "yes" if importlib.util.find_spec("arctic_inference") else "no: the arctic_inference package is not installed"
        elif m["vllm"] in ("ngram", "draft_model"):
            here = "yes"
        elif _heads_for(target_dir, "mtp" if m["vllm"] == "mtp" else names[0]):
            here = "yes (trained weights found)"
        else:
            here = f"no: needs {m['needs']}; none is shipped for {target}"
        rows.append({**{k: m[k] for k in ("method", "proposer", "needs")}, "--speculative-config method": m["vllm"],
                     "this machine": here, "this notebook": "measured" if m["vllm"] in measured else "-",
                     "source": m["source"]})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- notebook 06's checks and exercises

def aligned_vs_misaligned(runs: pd.DataFrame, aligned: str, misaligned: str) -> Conclusion:
    """``acceptance_conclusion`` on a run table: the aligned draft's acceptance against the misaligned one's."""
    return acceptance_conclusion(runs[runs.config == aligned].acceptance_rate.tolist(),
                                 runs[runs.config == misaligned].acceptance_rate.tolist())


def lowest_concurrency_conclusion(table: pd.DataFrame, name: str, expect: str = BETTER) -> Conclusion:
    """``method_conclusion`` for ``name`` at the lowest concurrency of a ``speedups`` table."""
    rows = table[table.config == name].sort_values("concurrency")
    if not len(rows):
        return Conclusion(f"{name} was not measured", WITHIN_NOISE)
    return method_conclusion(rows.iloc[0].to_dict(), expect)


def baseline_tok_s(runs: pd.DataFrame, concurrency: int) -> list[float]:
    """The baseline's output tokens/s in each of its runs at ``concurrency``."""
    return runs[(runs.config == BASELINE) & (runs.concurrency == concurrency)].output_tok_s.tolist()


def copied_text_lookup(model: str, text: str, copies: int, k: int) -> tuple[float, str]:
    """Tokens per step ngram prompt lookup would give (``prompt_lookup_length``) on an answer that repeats
    ``text`` ``copies`` times after a prompt holding it once, tokenized with ``model``'s tokenizer."""
    if copies < 1:
        raise ValueError("copies must be >= 1 (the answer repeats the text at least once)")
    path = models_dir() / model / "tokenizer.json"
    if path.is_file():  # the tokenizers library reads it in milliseconds
        from tokenizers import Tokenizer

        fast = Tokenizer.from_file(str(path))
        encode = lambda s: fast.encode(s, add_special_tokens=False).ids  # noqa: E731
    else:  # a hub id: transformers fetches its tokenizer
        from transformers import AutoTokenizer

        slow = AutoTokenizer.from_pretrained(model)
        encode = lambda s: slow.encode(s, add_special_tokens=False)  # noqa: E731
    prompt = encode(f"Repeat this {copies} time(s): {text}\n")
    answer = encode(" ".join([text] * copies))
    length = prompt_lookup_length(prompt + answer, len(prompt), k)
    return length, f"{len(answer)} answer tokens in {len(answer) / length:.0f} steps = {length:.2f} tokens per step (k={k})"


def lookup_outcome(length: float, k: int) -> str:
    """'about 1', 'between 1 and k+1' or 'about k+1' tokens per step."""
    return "about 1" if length < 1.2 else "about k+1" if length >= 0.9 * (k + 1) else "between 1 and k+1"


def formula_conclusion(table: pd.DataFrame, within: float = 0.1) -> Conclusion:
    """How close the formula (i.i.d. acceptance) came to the measured accepted length for k > 1 (at k = 1 the two
    agree by construction), and why they differ: the conditional per-position acceptance. Shown when every k > 1
    is within ``within`` (a fraction) of the measurement. ``table``: ``expected_length_table`` rows."""
    tested = table[(table.k > 1) & (table.drafts > 0)] if len(table) else table
    if not len(tested):
        return Conclusion("no speculative configuration with k > 1 proposed drafts in this run: the formula was not "
                          "tested (at k = 1 it matches by construction)", WITHIN_NOISE)
    parts, worst, why, directions = [], 0.0, [], set()
    for _, r in tested.iterrows():
        rel = r.difference / r.measured_length if r.measured_length else 0.0
        worst = max(worst, abs(rel))
        parts.append(f"{r.config}: formula {r.formula_length:.2f} vs measured {r.measured_length:.2f} tokens per step "
                     f"({rel:+.0%}, a = {r.a_first_guess:.0%})")
        later = [c for c in r.conditional[1:] if c == c]
        if later and abs(rel) > within:
            direction = "higher" if sum(later) / len(later) > r.a_first_guess else "lower"
            directions.add(direction)
            why.append(f"{r.config}: after an accepted guess the next one was kept {', '.join(f'{c:.0%}' for c in later)} of the "
                       f"time against a = {r.a_first_guess:.0%} for the first ({direction})")
    text = "; ".join(parts)
    if worst <= within:
        return Conclusion(f"{text}: within {within:.0%}, so acceptance behaved about as if each guess were an "
                          "independent coin of probability a", SHOWN)
    because = {"higher": "once a draft is in an easy stretch (tool-call syntax, a copied name) its later guesses are "
                         "kept more often than the first, so the formula under-counts",
               "lower": "a guess further ahead builds on the draft's own earlier guesses and drifts from the target, "
                        "so later positions are kept less often than the first, and the formula over-counts"}
    reason = ("acceptance is not independent per position: " + "; ".join(why) + ". "
              + "; while ".join(because[d] for d in ("higher", "lower") if d in directions)
              + "; a wrong guess ends the step, whatever the later guesses were") if why else \
        "the per-position rates do not explain it (too few drafts to read them)"
    return Conclusion(f"{text}: the formula is off by up to {worst:.0%}: {reason}", NOT_SHOWN)


def length_gain_outcome(gain_tokens: float) -> str:
    """'under 0.25 tokens', '0.25 to 1 token' or 'over 1 token' per step."""
    return "under 0.25 tokens" if gain_tokens < 0.25 else "0.25 to 1 token" if gain_tokens <= 1 else "over 1 token"
