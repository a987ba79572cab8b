"""What notebook 01 (connect and build a first agent) needs beyond the floors below: the conclusions on one
streamed request, on the agent's growing context and on renting against owning, and the outcomes of its two
exercises (a longer answer, the tools' context tax).

``conclude_stream`` judges one ``StreamTiming`` (a steady pace, or a stall named with its gap);
``conclude_context_growth`` the prompt of an agent's calls; ``conclude_rent_vs_own`` an API's price per million
output tokens against this engine's, with ``cpu_gpu_caveat``. ``length_outcome`` and ``tool_tax_outcome`` turn
the exercises' measurements into one of ``LENGTH_CHOICES`` / ``TOOL_TAX_CHOICES``. The rest of what the notebook
calls comes from the floors and is re-exported here (``__all__``), so the notebook imports from this module
and ``helpers.engine.session`` alone.
"""

from __future__ import annotations

from statistics import median
from typing import Any

from helpers.core.conclusion import NOT_SHOWN, SHOWN, Conclusion, report
from helpers.core.lesson import check_prediction, ratio_outcome, should_see, should_see_conclusion, show_conclusions
from helpers.core.progress import steps
from helpers.evals.agent import prompt_tokens_with_tools, run_agent
from helpers.hardware.machine import check_quiet
from helpers.lessons import plots
from helpers.measure.stream_timing import StreamTiming, stream_chat, time_lengths
from helpers.planning.cost import api_cost_usd, api_usd_per_million_output_tokens, own_usd_per_million_output_tokens
from helpers.tiny.tools import TOOLS

__all__ = [
    # this notebook's own
    "STALL_FACTOR", "conclude_stream", "conclude_context_growth", "cpu_gpu_caveat", "conclude_rent_vs_own",
    "LENGTH_CHOICES", "length_outcome", "TOOL_TAX_CHOICES", "tool_tax_outcome",
    # from the floors below, for the notebook
    "Conclusion", "report", "check_prediction", "should_see", "should_see_conclusion", "show_conclusions", "steps",
    "prompt_tokens_with_tools", "run_agent", "check_quiet", "plots", "stream_chat", "time_lengths", "api_cost_usd",
    "api_usd_per_million_output_tokens", "own_usd_per_million_output_tokens", "TOOLS",
]

# A gap between chunks longer than this many times the median gap counts as a stall (not a steady pace).
STALL_FACTOR = 3.0


# ---------------------------------------------------------------- one streamed request

def conclude_stream(timing: StreamTiming, stall_factor: float = STALL_FACTOR) -> list[Conclusion]:
    """What one streamed request showed: TTFT, TPOT, and whether the tokens came at a steady pace
    (longest gap between chunks within ``stall_factor`` x the median gap) or with a stall."""
    if not timing.ok or timing.tpot_s is None or timing.median_gap_s is None:
        return [Conclusion(f"The streamed request gave too few tokens to time ({timing.completion_tokens}; "
                           f"error: {timing.error}).", NOT_SHOWN, "tokens arrive at a steady pace")]
    tpot_ms, med_ms, top_ms = timing.tpot_s * 1000, timing.median_gap_s * 1000, timing.longest_gap_s * 1000
    first = Conclusion(f"First token after {timing.ttft_s * 1000:,.0f} ms (prefill, plus any queueing); then "
                       f"{timing.completion_tokens - 1} more tokens at one every {tpot_ms:.1f} ms on average "
                       f"({1000 / tpot_ms:.0f} tokens/s for one stream).")
    expectation = "after the first token, tokens arrive at a steady pace (one decode step each)"
    ratio = top_ms / med_ms if med_ms > 0 else float("inf")
    if ratio <= stall_factor:
        return [first, Conclusion(f"the gaps between chunks had a median of {med_ms:.1f} ms and a longest of "
                                  f"{top_ms:.1f} ms ({ratio:.1f}x the median).", SHOWN, expectation)]
    stall_token = max(timing.chunk_gaps(), key=lambda g: g[1])[0]
    without = (timing.chunk_times[-1] - timing.chunk_times[0] - timing.longest_gap_s) / max(1, timing.completion_tokens - 2)
    return [first, Conclusion(
        f"one gap of {top_ms:,.0f} ms before token {stall_token}, {ratio:.0f}x the median gap of {med_ms:.1f} ms: "
        f"a stall (the engine or this client did not run: a busy machine, another request's prefill), not the "
        f"decode pace. The average TPOT of {tpot_ms:.1f} ms includes it; without that gap it is "
        f"{without * 1000:.1f} ms.", NOT_SHOWN, expectation)]


# ---------------------------------------------------------------- the agent's context tax

def conclude_context_growth(prompt_tokens: list[int], completion_tokens: list[int],
                            min_growth: float = 1.5) -> Conclusion:
    """The context tax, judged: the prompt of the last call is at least ``min_growth`` x the first's while
    the answers stay shorter than the prompts (token counts as the server reported them)."""
    expectation = "the prompt grows with every call while the answers stay short"
    if len(prompt_tokens) < 2:
        return Conclusion(f"only {len(prompt_tokens)} model call was made: nothing to compare.", NOT_SHOWN, expectation)
    first, last = prompt_tokens[0], prompt_tokens[-1]
    growth = last / first if first else float("inf")
    mean_completion = sum(completion_tokens) / len(completion_tokens)
    text = (f"over {len(prompt_tokens)} calls the prompt went from {first:,} to {last:,} tokens ({growth:.1f}x); "
            f"the answers averaged {mean_completion:.0f} tokens")
    if growth >= min_growth and mean_completion < last:
        return Conclusion(text + ": agents pay for the whole context on every step.", SHOWN, expectation)
    return Conclusion(text + f": the prompt grew less than {min_growth:g}x (the conversation was short, or the "
                      "history was not re-sent).", NOT_SHOWN, expectation)


# ---------------------------------------------------------------- rent vs own

def cpu_gpu_caveat(profile: str) -> str:
    """The caveat that goes with a cost per token measured on ``profile`` ("cpu", "gpu", "k8s")."""
    if profile == "cpu":
        return ("Caveat: this is a CPU serving a tiny model to one stream. A CPU's tokens/s says nothing of a "
                "GPU's: a GPU serving a real model decodes many streams in one step, so its cost per token at "
                "load (notebook 07) is what to set against an API, with your own hourly price.")
    return ("Caveat: one stream at a time leaves most of the GPU idle; batching many streams (notebook 07) "
            "serves more tokens for the same hourly price.")


def conclude_rent_vs_own(api_usd_per_m_output: float, own_usd_per_m_output: float, prompt_tokens: int,
                         completion_tokens: int, busy_s: float, hourly_usd: float, profile: str) -> list[Conclusion]:
    """Rent (a pay-per-token API) against own (this engine), both in USD per million output tokens for the
    same requests with their prompts: which is cheaper, by how much, and the caveat for ``profile``."""
    shape = (f"For this conversation's requests ({prompt_tokens:,} prompt + {completion_tokens:,} completion "
             f"tokens), per million output tokens, prompts included: the API costs {api_usd_per_m_output:.3f} USD; "
             f"this engine, busy {busy_s:.1f} s at {hourly_usd:g} USD/h serving one stream, "
             f"{own_usd_per_m_output:.3f} USD")
    ratio = own_usd_per_m_output / api_usd_per_m_output
    if ratio < 1:
        verdict = Conclusion(f"{shape}: owning is {1 / ratio:.1f}x cheaper at this hourly price, "
                             "if the machine is busy all the time it is paid for.")
    else:
        verdict = Conclusion(f"{shape}: owning is {ratio:.1f}x dearer at one stream; it pays off only with "
                             "more streams at once, a lower hourly price, or a faster machine.")
    return [verdict, Conclusion(cpu_gpu_caveat(profile))]


# ---------------------------------------------------------------- try it yourself: a longer answer

LENGTH_CHOICES = ("only TTFT grows", "only the total time grows", "both grow", "neither grows")


def length_outcome(rows: list[dict[str, Any]], ttft_same_within: float = 0.5,
                   total_same_within: float = 0.25) -> tuple[str, str]:
    """Which of TTFT and the total time grew from the shortest to the longest ``max_tokens`` of ``time_lengths``
    rows (medians over the rounds), as one of LENGTH_CHOICES, with the numbers. TTFT, a few ms, is noisier:
    it counts as grown only beyond ``ttft_same_within`` (a fraction), the total beyond ``total_same_within``."""
    short, long_ = min(r["max_tokens"] for r in rows), max(r["max_tokens"] for r in rows)

    def med(n: int, key: str) -> float:
        return median(r[key] for r in rows if r["max_tokens"] == n)

    ttft = (med(short, "ttft_s"), med(long_, "ttft_s"))
    total = (med(short, "e2e_s"), med(long_, "e2e_s"))
    ttft_grew = ttft[1] > ttft[0] * (1 + ttft_same_within)
    total_grew = total[1] > total[0] * (1 + total_same_within)
    outcome = LENGTH_CHOICES[{(True, False): 0, (False, True): 1, (True, True): 2, (False, False): 3}[(ttft_grew, total_grew)]]
    detail = (f"max_tokens {short} -> {long_}: TTFT {ttft[0] * 1000:,.0f} -> {ttft[1] * 1000:,.0f} ms, total "
              f"{total[0]:.2f} -> {total[1]:.2f} s (medians of {len(rows) // 2} rounds). The prompt is the same, so the "
              "prefill behind TTFT is too; each extra token is one more decode step.")
    return outcome, detail


# ---------------------------------------------------------------- try it yourself: the tools' context tax

TOOL_TAX_CHOICES = ("fewer", "about the same", "more")


def tool_tax_outcome(without_tools: int, with_tools: int, n_tools: int) -> tuple[str, str]:
    """How the prompt changed when the tools were offered (one of TOOL_TAX_CHOICES), with the numbers."""
    outcome = ratio_outcome(without_tools, with_tools, 0.05, TOOL_TAX_CHOICES)
    extra = with_tools - without_tools
    return outcome, (f"{without_tools:,} prompt tokens without tools, {with_tools:,} with {n_tools} tools: "
                     f"{extra:+,} tokens ({extra / max(1, n_tools):+,.0f} per tool), re-sent on every call of the agent.")
