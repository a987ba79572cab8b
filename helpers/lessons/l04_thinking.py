"""Notebook 04's thinking step: what a thinking mode costs, measured on the live engine.

The same questions go to the lesson's thinking model (``lesson_model("thinking")``: tiny-qwen3 on a CPU, Qwen/Qwen3-4B
on a GPU) with thinking off and on, interleaved (off, on, per question, ``rounds`` times), each as the agent's first
turn (the tools offered). Each reply is one row: its reasoning tokens (as vLLM counts them,
``usage.completion_tokens_details.reasoning_tokens``; where the server gives reasoning but no count, the engine's
own tokenizer counts the text, ``/tokenize``), its answer tokens (the rest of the output: the tool call or the
reply), and its decode time as the engine measured it (``vllm:request_decode_time_seconds``, first token to last;
the client's whole latency, prefill included, where the server exposes no metrics). ``conclude_thinking_cost``
prices both modes from the dated table (an API's output price, this engine's hourly price) and judges the decode
time against the rounds' spread; a model that returned no reasoning (a model without a thinking mode, or an engine
serving without a reasoning parser) is said so, never priced as if it had thought. The thinking model is served by
``helpers.engine.session.thinking_model_served`` (no restart where the engine serves it already, the configuration back after).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from helpers.core.comparison import WORSE, compare_samples
from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion, lesson_verdict
from helpers.core.lesson import ratio_outcome
from helpers.core.thinking import thinking_body
from helpers.evals.agent import reasoning_of
from helpers.engine.session import thinking_model_served
from helpers.hardware.gpus import ApiPrice, api_price, engine_price
from helpers.tiny.tools import TOOLS

if TYPE_CHECKING:  # the lesson modules take a Lab; importing it at run time would pull in the engine
    from helpers.engine.session import Lab

__all__ = [  # this module's own, then what notebook 04's thinking step uses from elsewhere
    "THINKING_EXPECTATION", "PER_TOKEN_CHOICES", "ANSWERS_PRICED", "ask", "measure_thinking", "thinking_table",
    "thinking_example", "conclude_thinking_cost", "per_token_outcome",
    "api_price", "engine_price", "thinking_model_served",
]

THINKING_EXPECTATION = "thinking costs output tokens and decode time: each reasoning token is one more decode step"
PER_TOKEN_CHOICES = ("lower", "about the same", "higher")
PER_TOKEN_SAME_WITHIN = 0.15  # exercise 2: per-token decode times within 15% count as the same (2-core noise)
ANSWERS_PRICED = 1000  # prices are per this many answers: one answer's cost is a fraction of a cent


def _tokenize_count(lab: Lab, text: str) -> int | None:
    """Tokens of ``text`` by the engine's own tokenizer (vLLM's ``/tokenize``, beside ``/v1``); None if unreachable."""
    import httpx

    root = lab.settings.base_url.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    headers = {"Authorization": f"Bearer {lab.settings.api_key}"} if lab.settings.api_key else {}
    try:
        reply = httpx.post(f"{root}/tokenize", json={"model": lab.model, "prompt": text, "add_special_tokens": False},
                           headers=headers, timeout=10.0)
        reply.raise_for_status()
        return int(reply.json()["count"])
    except (httpx.HTTPError, KeyError, ValueError):
        return None


def _reply_text(message: Any) -> str:
    """What a reply did after its reasoning: its tool calls as name(arguments), or its content."""
    calls = [f"{c.function.name}({c.function.arguments})" for c in (message.tool_calls or [])]
    return "; ".join(calls) if calls else (message.content or "").strip()


def ask(lab: Lab, question: str, thinking: bool, max_tokens: int) -> dict[str, Any]:
    """One question as the agent's first turn (the tools offered, temperature 0) with thinking on or off: one row of
    tokens (reasoning apart from answer) and decode seconds (the engine's, from its metrics)."""
    import time

    from helpers.measure.server_metrics import scrape, window

    try:
        before = scrape(lab.settings.metrics_url)
    except Exception:  # noqa: BLE001 - no metrics here: the client's latency stands in, and the row says so
        before = None
    start = time.perf_counter()
    resp = lab.chat([{"role": "user", "content": question}], tools=TOOLS, max_tokens=max_tokens,
                    extra_body=thinking_body(thinking))
    latency_s = time.perf_counter() - start
    decode_s, source = None, "client latency (prefill included)"
    if before is not None:
        try:
            seen = window(before, scrape(lab.settings.metrics_url))
            if seen.get("decode_time_count") and seen.get("decode_time_mean_s") is not None:
                decode_s, source = seen["decode_time_mean_s"] * seen["decode_time_count"], "engine"
        except Exception:  # noqa: BLE001 - as above
            pass
    choice = resp.choices[0]
    reasoning, reasoning_tokens = reasoning_of(choice.message, resp.usage)
    counted_by = "vLLM's usage"
    if reasoning and not reasoning_tokens:
        reasoning_tokens, counted_by = _tokenize_count(lab, reasoning), "the engine's tokenizer"
    output = int(resp.usage.completion_tokens)
    reasoning_tokens = int(reasoning_tokens or 0) if reasoning else 0
    reply = _reply_text(choice.message)
    return {"question": question, "thinking": bool(thinking), "output_tokens": output,
            "reasoning_tokens": reasoning_tokens, "answer_tokens": output - reasoning_tokens,
            "decode_s": latency_s if decode_s is None else decode_s, "decode_measured_by": source,
            "reasoning_counted_by": counted_by if reasoning else "", "finish_reason": choice.finish_reason,
            "ended_in_reasoning": bool(reasoning) and not reply and choice.finish_reason == "length",
            "max_tokens": max_tokens, "reasoning": reasoning or "", "reply": reply}


def measure_thinking(lab: Lab, questions: Sequence[str], max_tokens: int, rounds: int = 1) -> pd.DataFrame:
    """Every question with thinking off, then on, for ``rounds`` rounds (A B A B: a drift of the machine hits both
    modes alike); one row per reply (``ask``) with its ``round``, on the model the engine serves now."""
    from helpers.core.progress import steps

    plan = [(r, q, mode) for r in range(max(1, rounds)) for q in questions for mode in (False, True)]
    rows = []
    for r, question, mode in steps(plan, "thinking off / on", "request", None,
                                   label=lambda p: f"thinking {'on' if p[2] else 'off'}: {p[1][:40]}"):
        rows.append({"round": r, **ask(lab, question, mode, max_tokens)})
    return pd.DataFrame(rows)


def thinking_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per question and mode, the mean over rounds: reasoning, answer and output tokens, decode seconds, and ms per
    decode step (the decode runs from the first token to the last: output tokens - 1 steps)."""
    table = (runs.assign(mode=runs["thinking"].map({False: "off", True: "on"}))
             .groupby(["question", "mode"], sort=False)[["reasoning_tokens", "answer_tokens", "output_tokens", "decode_s"]]
             .mean().reset_index())
    return table.assign(decode_ms_per_token=1000 * table["decode_s"] / (table["output_tokens"] - 1).clip(lower=1))


def thinking_example(runs: pd.DataFrame) -> str:
    """One reply with thinking on, its reasoning beside what it did after (the first that reasoned, else the first)."""
    on = runs[runs["thinking"]]
    if on.empty:
        return "no reply with thinking on was measured"
    reasoned = on[on["reasoning_tokens"] > 0]
    row = (reasoned if len(reasoned) else on).iloc[0]
    if not row.reasoning_tokens:
        return f"{row.question!r}, thinking on: no reasoning came back; the reply: {row.reply or '(empty)'}"
    reasoning = " ".join(row.reasoning.split())
    reasoning = reasoning if len(reasoning) <= 200 else reasoning[:200] + "..."
    return (f"{row.question!r}, thinking on: reasoning ({row.reasoning_tokens} tokens) {reasoning!r}, then "
            f"({row.answer_tokens} tokens) {row.reply or '(nothing: it ended inside the reasoning)'}")


def _per_answer(part: pd.DataFrame) -> dict[str, float]:
    return {name: float(part[name].mean()) for name in ("reasoning_tokens", "answer_tokens", "output_tokens", "decode_s")}


def _round_totals(part: pd.DataFrame) -> list[float]:
    """Decode seconds of each round: the same questions answered once."""
    return part.groupby("round")["decode_s"].sum().tolist()


def conclude_thinking_cost(runs: pd.DataFrame, model: str, api: ApiPrice, hourly_usd: float,
                           hourly_source: str = "") -> Conclusion:
    """Thinking on against off from ``measure_thinking``'s rows: tokens per answer (reasoning apart from answer),
    decode seconds judged against the rounds' spread (``helpers.core.comparison``), and the price of
    ``ANSWERS_PRICED`` answers at ``api``'s output price and at this engine's ``hourly_usd``. The verdict: shown when
    thinking on takes longer to decode beyond the noise, not shown when no reasoning came back or it took less,
    within noise otherwise."""
    off, on = runs[~runs["thinking"].astype(bool)], runs[runs["thinking"].astype(bool)]
    if off.empty or on.empty:
        return Conclusion("not measured: the run holds no reply " + ("with thinking off" if off.empty else
                          "with thinking on"), NOT_SHOWN, THINKING_EXPECTATION)
    a, b = _per_answer(off), _per_answer(on)
    questions, rounds = runs["question"].nunique(), runs["round"].nunique()
    shape = f"{model}, {questions} question{'s' if questions != 1 else ''} x {rounds} round{'s' if rounds != 1 else ''}"
    if b["reasoning_tokens"] <= 0:
        return Conclusion(
            f"No reasoning came back: with thinking on, {shape} wrote {b['output_tokens']:.0f} output tokens per answer "
            f"against {a['output_tokens']:.0f} with it off, none of them reasoning. A model without a thinking mode "
            "ignores enable_thinking, and an engine serving without --reasoning-parser returns no reasoning field, so "
            "this run cannot price thinking; Qwen3 served with --reasoning-parser qwen3 can.",
            NOT_SHOWN, THINKING_EXPECTATION)
    v = compare_samples(_round_totals(off), _round_totals(on), higher_is_better=False)
    verdict = lesson_verdict(v, expect=WORSE)
    per_m = api.usd_per_m_output / 1e6 * ANSWERS_PRICED
    per_h = hourly_usd / 3600 * ANSWERS_PRICED
    where = f" ({hourly_source})" if hourly_source else ""
    text = (f"{shape}: thinking on wrote {b['reasoning_tokens']:.0f} reasoning + {b['answer_tokens']:.0f} answer tokens "
            f"per answer, against {a['answer_tokens']:.0f} answer tokens with it off "
            f"({b['output_tokens'] / max(a['output_tokens'], 1):.1f}x the output tokens); decode {b['decode_s']:.3f} s "
            f"against {a['decode_s']:.3f} s per answer ({v.describe()}). Priced from the dated table, per "
            f"{ANSWERS_PRICED:,} answers: at {api.model}'s output price ({api.usd_per_m_output:g} USD per 1M tokens, "
            f"{api.date}) {b['output_tokens'] * per_m:.4f} against {a['output_tokens'] * per_m:.4f} USD; on this "
            f"engine at {hourly_usd:g} USD/h{where}, {b['decode_s'] * per_h:.4f} against {a['decode_s'] * per_h:.4f} "
            "USD of decode time")
    if verdict == SHOWN:
        text += ": the reasoning is paid for like the answer, one decode step per token."
    elif verdict == WITHIN_NOISE:
        text += (": the decode times differ by less than the rounds' spread, so this run cannot tell them apart; the "
                 "tokens, and the API's price with them, still grew.")
    else:
        text += (": thinking on decoded in less time although it wrote more tokens, which no model difference explains: "
                 "a disturbed run; rerun on a quiet machine or with more THINKING_ROUNDS.")
    cut = int(on["ended_in_reasoning"].sum())
    if cut:
        text += (f" {cut} of {len(on)} replies ended inside the reasoning at max_tokens {int(on['max_tokens'].max())}: "
                 "their reasoning would have run longer.")
    return Conclusion(text, verdict, THINKING_EXPECTATION)


def per_token_outcome(runs: pd.DataFrame) -> tuple[str, str]:
    """Exercise 2: the decode time per output token with thinking on against off (one of ``PER_TOKEN_CHOICES``) and the
    numbers behind it."""
    on, off = runs[runs["thinking"].astype(bool)], runs[~runs["thinking"].astype(bool)]
    ms = {name: 1000 * part["decode_s"].sum() / max(int((part["output_tokens"] - 1).clip(lower=1).sum()), 1)
          for name, part in (("off", off), ("on", on))}  # per decode step: a reply of n tokens decodes n - 1 after the first
    outcome = ratio_outcome(ms["off"], ms["on"], PER_TOKEN_SAME_WITHIN, PER_TOKEN_CHOICES)
    return outcome, (f"{ms['on']:.2f} ms per output token with thinking on, {ms['off']:.2f} ms with it off "
                     f"({int(on['output_tokens'].sum()):,} and {int(off['output_tokens'].sum()):,} tokens): a reasoning "
                     "token is decoded like any other, so thinking costs its tokens times the step time.")
