"""What notebook 01 (connect and build a first agent) needs beyond the floors below: the conclusions on one
streamed request, on the agent's growing context and on renting against owning, and the outcomes of its two
exercises (a longer answer, the tools' context tax).

``conclude_stream`` judges one ``StreamTiming`` (a steady pace, or a stall named with its gap);
``conclude_context_growth`` the prompt of an agent's calls; ``conclude_rent_vs_own`` an API's price per million
output tokens against this engine's, with ``cpu_gpu_caveat``; ``rent_vs_own_costs`` prices one conversation from the
dated table (``helpers.hardware.gpus``: an API's input, cached-input and output prices, this engine's hourly price),
``conclude_cache`` and ``conclude_break_even`` say what cached input and the engine's utilization change, and
``not_cost_table`` / ``runtimes_table`` name what decides besides the price and where other runtimes fit.
``length_outcome`` and ``tool_tax_outcome`` turn the exercises' measurements into one of ``LENGTH_CHOICES`` /
``TOOL_TAX_CHOICES``; ``tpot_check`` checks the TPOT the attendee writes from a run's chunk times and says what is
wrong. ``conclude_thinking`` judges one thinking turn (the thinking model served for the block by
``helpers.engine.session.thinking_model_served``): its reasoning apart from the content, next to its tool call, the
arguments shown as they came. The rest of what the notebook
calls comes from the floors and is re-exported here (``__all__``), so the notebook imports from this module
and ``helpers.engine.session`` alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from statistics import median
from typing import TYPE_CHECKING, Any

from helpers.core.models import by_profile, lesson_model
from helpers.core.conclusion import NOT_SHOWN, SHOWN, Conclusion, report
from helpers.core.lesson import (check_exercise, check_prediction, ratio_outcome, should_see, should_see_conclusion,
                                 show_conclusions, show_solution)
from helpers.core.progress import steps
from helpers.engine.session import REASONING_PARSER, served_for_the_block, thinking_model_served
from helpers.evals.agent import AgentRun, prompt_tokens_with_tools, run_agent
from helpers.hardware.machine import check_quiet
from helpers.lessons import plots
from helpers.measure.request_life import RequestLife, alignment, from_rows, from_stream, plot_request_life
from helpers.measure.server_metrics import MetricsError, scrape, window_until_finished
from helpers.measure.stream_timing import StreamTiming, stream_chat, time_lengths
from helpers.hardware.gpus import API_CACHE_MIN_PREFIX_TOKENS, ApiPrice, api_price, engine_price
from helpers.planning.cost import (api_cost_cached_usd, api_cost_usd, api_usd_per_million_output_tokens,
                                   break_even_utilization, cached_prefix_tokens, own_usd_per_million_output_tokens)
from helpers.tiny.tools import TOOLS, call_tool

if TYPE_CHECKING:
    import pandas as pd

    from helpers.engine.session import Lab

__all__ = [
    # this notebook's own
    "STALL_FACTOR", "conclude_stream", "conclude_context_growth", "cpu_gpu_caveat", "conclude_rent_vs_own",
    "LENGTH_CHOICES", "length_outcome", "TOOL_TAX_CHOICES", "tool_tax_outcome", "rent_vs_own_costs",
    "conclude_cache", "conclude_break_even", "not_cost_table", "runtimes_table", "RUNTIMES", "tpot_check", "TPOT_HINT",
    "conclude_thinking", "one_request_life", "conclude_request_life",
    "trace_agent_run", "ANSWERS",
    # from the floors below, for the notebook
    "Conclusion", "report", "check_exercise", "show_solution", "check_prediction", "should_see",
    "should_see_conclusion",
    "show_conclusions", "steps", "prompt_tokens_with_tools", "run_agent", "check_quiet", "plots", "stream_chat",
    "time_lengths", "api_cost_usd", "api_usd_per_million_output_tokens", "own_usd_per_million_output_tokens", "TOOLS",
    "call_tool", "api_price", "engine_price", "REASONING_PARSER", "thinking_model_served", "by_profile",
    "lesson_model", "plot_request_life",
]

# A gap between chunks longer than this many times the median gap counts as a stall (not a steady pace).
STALL_FACTOR = 3.0

# issue 42: what gives each core-path check's answer away; tests/test_core_path.py fails if a phrase shows above it
ANSWERS: dict[str, tuple[str, ...]] = {
    "Write it yourself: TPOT from the recorded chunks": ("over the tokens after the first",
                                                         "sum(timing.chunk_tokens) - 1"),
    "Exercise 1: a twice longer answer": ("each extra token is one more decode step",
                                          "so the prefill behind TTFT is too"),
    "Exercise 2: the tools' share of the prompt": ("JSON schemas travel in the prompt",
                                                   "re-sent on every call of the agent"),
}


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



def rent_vs_own_costs(prompt_tokens: list[int], completion_tokens: list[int], busy_s: float, api: ApiPrice,
                      hourly_usd: float, profile: str) -> "pd.DataFrame":
    """USD per million output tokens for one conversation's calls (prompts included): the API with a cold prompt
    cache, the API with a warm one (each call's re-sent history billed as cached input, from the API's minimum
    cached prefix on), and this engine, busy ``busy_s`` at ``hourly_usd`` serving one stream."""
    import pandas as pd

    prompts, completions = sum(prompt_tokens), sum(completion_tokens)
    cached = sum(cached_prefix_tokens(prompt_tokens, completion_tokens, API_CACHE_MIN_PREFIX_TOKENS))
    cold = api_usd_per_million_output_tokens(prompts, completions, api.usd_per_m_input, api.usd_per_m_output)
    warm = api_cost_cached_usd(prompts, cached, completions, api.usd_per_m_input, api.usd_per_m_cached_input,
                               api.usd_per_m_output) / completions * 1e6
    own = own_usd_per_million_output_tokens(hourly_usd, busy_s, completions)
    return pd.DataFrame([
        {"option": f"API {api.model}, no cached input", "cached_prompt_tokens": 0, "usd_per_million_output_tokens": cold},
        {"option": f"API {api.model}, warm prompt cache", "cached_prompt_tokens": cached,
         "usd_per_million_output_tokens": warm},
        {"option": f"own engine ({profile}), 1 stream", "cached_prompt_tokens": 0, "usd_per_million_output_tokens": own},
    ])


def conclude_cache(costs: "pd.DataFrame", prompt_tokens: int, api: ApiPrice) -> Conclusion:
    """What cached-input pricing changed for this conversation (``rent_vs_own_costs`` rows 0 and 1)."""
    cold, warm = costs["usd_per_million_output_tokens"].iloc[:2]
    cached = int(costs["cached_prompt_tokens"].iloc[1])
    if cached == 0:
        return Conclusion(f"Cached input: none of the {prompt_tokens:,} prompt tokens would be billed as cached: every "
                          f"call re-sends its history, but the API caches a prefix only from {API_CACHE_MIN_PREFIX_TOKENS:,} "
                          f"tokens on, and these prompts are shorter; an agent with long instructions or documents would "
                          f"pay {api.usd_per_m_cached_input:g} instead of {api.usd_per_m_input:g} USD per million for them.")
    return Conclusion(f"Cached input: {cached:,} of the {prompt_tokens:,} prompt tokens are re-sent history an API with a "
                      f"warm cache bills at {api.usd_per_m_cached_input:g} instead of {api.usd_per_m_input:g} USD per "
                      f"million: {cold:.3f} -> {warm:.3f} USD per million output tokens ({1 - warm / cold:.0%} less).")


def conclude_break_even(api_usd_per_m_output: float, hourly_usd: float, tokens_per_s: float, profile: str) -> Conclusion:
    """The share of each day this engine must serve at its measured ``tokens_per_s`` to cost what the API would
    for the same tokens (``cost.break_even_utilization``); above 100% it never does at this speed."""
    share = break_even_utilization(hourly_usd, api_usd_per_m_output, tokens_per_s)
    text = (f"Break-even: rented all day at {hourly_usd:g} USD/h and producing {tokens_per_s:,.1f} output tokens/s (one "
            f"stream, measured), this {profile} engine matches the API's {api_usd_per_m_output:.3f} USD per million "
            f"output tokens only if it is busy {share:.0%} of the day")
    if share > 1:
        return Conclusion(text + ": more than the day has, so at one stream it never pays off; batching (notebook 07) "
                                 "multiplies the tokens per second an hour buys.")
    return Conclusion(text + ": below that, the API is cheaper; above it, owning is.")


def not_cost_table(ttft_ms: float) -> "pd.DataFrame":
    """What decides rent or own besides the price: a question for each, and where an engine you run stands
    (the latency row with this run's measured time to first token)."""
    import pandas as pd

    return pd.DataFrame([
        ("data control", "Who may log, keep or train on your prompts and outputs?",
         "they stay on machines you run", "the provider's data terms"),
        ("regulation", "Must the data stay in a country, a region or on premises?",
         "you choose where it runs", "the provider's regions and certifications"),
        ("service level", "What uptime is promised, and who is woken at night?",
         "you are (notebook 07 kills a replica to show what that means)", "the provider's SLA, if your plan has one"),
        ("latency", "How far is the model from your agent?",
         f"in the cluster: this run's first token came after {ttft_ms:,.0f} ms",
         "a public endpoint adds the internet round trip and its queue"),
    ], columns=["not cost", "question", "an engine you run", "a hosted API"])


# Where other open runtimes fit, each from its own documentation (read 2026-12-01).
RUNTIMES = (
    ("SGLang", "serving on GPUs when requests share prefixes (multi-turn chats, agents): RadixAttention reuses their "
               "KV cache; fast grammar-constrained JSON output; OpenAI-compatible API",
     "NVIDIA, 'SGLang inference' guide, build.nvidia.com/station/sglang-inference"),
    ("TensorRT-LLM", "NVIDIA GPUs only: builds optimized TensorRT engines from a Python API, with Python and C++ "
                     "runtimes", "NVIDIA TensorRT-LLM documentation, docs.nvidia.com/TensorRT-LLM"),
    ("llama.cpp", "plain C/C++ on a laptop or a server: CPUs (AVX2, AVX512, AMX, Apple silicon) and GPUs, 1.5- to "
                  "8-bit integer quantization, CPU+GPU hybrid for models larger than the GPU",
     "llama.cpp README, github.com/ggml-org/llama.cpp"),
    ("Ollama", "one command to download and run a model on your own machine (`ollama run`), GGUF files imported",
     "Ollama README, github.com/ollama/ollama (v0.14.2, 2026-01-15)"),
)


def runtimes_table() -> "pd.DataFrame":
    """``RUNTIMES`` as a table: runtime, where it fits, source."""
    import pandas as pd

    return pd.DataFrame(RUNTIMES, columns=["runtime", "where it fits", "source"])


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
                     f"{extra:+,} tokens ({extra / max(1, n_tools):+,.0f} per tool). The tools' JSON schemas travel in "
                     "the prompt, re-sent on every call of the agent.")


# ---------------------------------------------------------------- write it yourself: TPOT from the chunk times

TPOT_HINT = ("the decode runs from the first chunk's arrival to the last one's; n tokens leave n - 1 gaps, and a chunk "
             "may carry more than one token (timing.chunk_tokens)")


def _near(a: float, b: float | None, rel: float = 1e-6) -> bool:
    return b is not None and math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def tpot_check(timing: StreamTiming) -> Callable[[Any], str | None]:
    """The check of an attendee's TPOT (seconds) for ``timing``: None when it is the run's TPOT, else the sentence that
    names the likely slip (milliseconds, the TTFT counted in, every token divided, chunks counted for tokens)."""
    times, tokens = timing.chunk_times, sum(timing.chunk_tokens)

    def check(answer: Any) -> str | None:
        if timing.tpot_s is None:
            return (f"this run has {tokens} token(s), so its TPOT is undefined: run section 3 again with a larger "
                    "STREAM_MAX_TOKENS.")
        if isinstance(answer, bool) or not isinstance(answer, (int, float)):
            return f"my_tpot_s must be a number of seconds, not {type(answer).__name__}."
        if _near(answer, timing.tpot_s):
            return None
        decode_s = times[-1] - times[0]
        slips = [
            (timing.tpot_s * 1000, "that is the TPOT in milliseconds; my_tpot_s is in seconds."),
            ((times[-1] - timing.t_sent) / (tokens - 1),
             "that counts from the moment the request was sent, so the TTFT (prefill) is in it: start at the first chunk."),
            (decode_s / tokens, f"you divided by all {tokens} tokens: the first one's time is the TTFT, so the "
                                f"decode covers {tokens - 1} gaps."),
            (decode_s / max(1, len(times) - 1), f"you divided by the {len(times)} chunks: some carried more than one "
                                                f"token, and this run has {tokens} tokens."),
        ]
        for value, why in slips:
            if _near(answer, value):
                return why
        return (f"{answer * 1000:.3g} ms per token is not this run's TPOT; it is the time from the first chunk to the "
                "last, over the tokens after the first.")

    return check


# ---------------------------------------------------------------- the workshop model thinks

def _in_question(arguments: Any, question: str) -> bool:
    """True when every text value of a tool call's arguments appears in the question (case ignored)."""
    values = list(arguments.values()) if isinstance(arguments, dict) else [arguments]
    texts = [v for v in values if isinstance(v, str)]
    return bool(texts) and all(t.lower() in question.lower() for t in texts)


def conclude_thinking(run: AgentRun, model: str) -> Conclusion:
    """One thinking turn of ``model`` judged: the reasoning came back apart from the content (vLLM's ``reasoning``
    field), next to a tool call; the tool call's arguments set against the question, as they came."""
    expectation = "the model thinks first: its reasoning comes back apart from the content, next to its tool call"
    step = run.steps[0]
    content = step.content or ""
    if not step.reasoning:
        leaked = "<think>" in content or "</think>" in content
        why = ("its content holds <think> tags: the engine runs without --reasoning-parser qwen3, so the reasoning "
               "stayed in the text" if leaked else "it did not think here (a model without a thinking mode ignores "
               "enable_thinking)")
        return Conclusion(f"the model served as {model} returned no reasoning: {why}.", NOT_SHOWN, expectation)
    tokens = f"{step.reasoning_tokens} reasoning tokens" if step.reasoning_tokens else "reasoning tokens not counted"
    thought = f"{model} thought first ({len(step.reasoning.split())} words, {tokens} of {step.completion_tokens})"
    if not step.tool_calls:
        if step.ended_in_reasoning:
            return Conclusion(f"{thought}, and the turn ended inside the reasoning (max_tokens): no tool call yet.",
                              NOT_SHOWN, expectation)
        return Conclusion(f"{thought}, then answered without a tool call: {content!r}.", NOT_SHOWN, expectation)
    call = step.tool_calls[0]
    arguments = json.dumps(call["arguments"], ensure_ascii=False)
    where = ("they name what the question asked" if _in_question(call["arguments"], run.question) else
             f"they do not match the question {run.question!r}, and the answer follows from them")
    return Conclusion(f"{thought}, then called {call['name']}({arguments}); the arguments are the model's own: {where}.",
                      SHOWN, expectation)


# ---------------------------------------------------------------- one request's life, and one agent run's trace

def one_request_life(lab: Lab, messages: list[dict[str, Any]], max_tokens: int = 32,
                     wait_s: float = 1.0) -> tuple[StreamTiming, RequestLife | None, str]:
    """One streamed request with the server's metrics read around it: its timing, its life for the picture
    (``helpers.measure.request_life``), or None with the sentence why when the server cannot tell one request's
    phases (no metrics here, or another request finished in the same window). The metrics are polled up to ``wait_s``:
    vLLM observes a request's histograms as it finishes."""
    try:
        before = scrape(lab.settings.metrics_url, model=lab.model)
    except MetricsError as err:
        timing = stream_chat(lab.client, lab.model, messages, max_tokens=max_tokens)
        return timing, None, f"the server's metrics cannot be read here ({err}), so only the client's side is known"
    timing = stream_chat(lab.client, lab.model, messages, max_tokens=max_tokens)
    served = window_until_finished(lab.settings.metrics_url, before, model=lab.model, wait_s=wait_s)
    finished = served.get("queue_time_count") or 0
    if finished != 1 or not timing.ok:
        why = timing.error or f"{finished:.0f} requests finished in the window (another client is using the engine)"
        return timing, None, f"no single request's phases to draw: {why}"
    return timing, from_stream(timing, served), ""


def conclude_request_life(life: RequestLife) -> Conclusion:
    """The server's account of one request set against the client's: its prefill should end just before the first
    chunk arrives (the first token's way out), and queue + prefill should be most of the client's TTFT."""
    a = alignment(life)
    gap, server, ttft = a["first_chunk_after_prefill_ms"], a["queue_plus_prefill_ms"], a["client_ttft_ms"]
    expectation = "the first chunk arrives just after the server's prefill ends"
    if gap is None or server is None or ttft is None:
        return Conclusion("the server reported no queue or prefill time for this request: nothing to set against the "
                          "client's clock.", "", expectation)
    text = (f"the server spent {server:,.1f} ms queued and in prefill of the client's {ttft:,.1f} ms TTFT; the first "
            f"chunk arrived {gap:,.1f} ms after the prefill ended (detokenizing and sending it)")
    # -1 ms: the server's durations and the client's clock are read apart, each rounded; a negative gap beyond that
    # would mean the server's phases do not fit the client's clock
    return Conclusion(text + ".", SHOWN if gap >= -1.0 else NOT_SHOWN, expectation)


def trace_agent_run(lab: Lab, question: str, run: bool = True) -> tuple[RequestLife | None, str]:
    """One agent run traced from its steps down to vLLM's own request spans, read back from a local Arize Phoenix: the
    timeline (for ``plot_request_life``) and the viewer's address; (None, why) when it cannot run here. Tracing is a
    restart (``--otlp-traces-endpoint``) and one back, whatever happened; on the cpu profile's local engine, one start
    of a traced copy beside it (``served_for_the_block``)."""
    from helpers.engine.trace_store import INSTALL_PHOENIX, TraceStore, phoenix_executable, with_tracing
    from helpers.measure.tracing import AgentTracer, phoenix_spans, timeline, trace_complete, wait_for_spans

    if not run:
        return None, ("Not run (RUN_GO_DEEPER is False): tracing restarts the engine. On a cluster the spans go to "
                      "the OTLP endpoint your instructor gives (k8s/README.md, \"Tracing on the cluster\").")
    if not lab.engine.reconfigurable:
        return None, f"{lab.settings.base_url} is run elsewhere: its tracing flag is set where it runs."
    if lab.settings.profile == "k8s":  # the engine pod's 127.0.0.1 is not this notebook pod's
        return None, ("Not run on the cluster: your engine runs in its own pod and cannot send its spans to a viewer on "
                      "this notebook's 127.0.0.1. There they go to an OTLP endpoint your instructor runs and opens to "
                      "the engines (k8s/README.md, \"Tracing on the cluster\").")
    if phoenix_executable() is None:
        return None, f"Not run: {INSTALL_PHOENIX}."
    with TraceStore() as store:
        print(f"Phoenix, the trace viewer, is at {store.url}; the engine sends it one span per request "
              "(--otlp-traces-endpoint)")
        with served_for_the_block(lab, with_tracing(lab.engine.config(), store.otlp_endpoint),
                                  f"{lab.model} with tracing on"):
            tracer = AgentTracer(store.otlp_endpoint)
            traced = run_agent(lab, question, tracer=tracer)
            tracer.shutdown()
            spans = wait_for_spans(lambda: phoenix_spans(store.url, tracer.last_trace_id),
                                   lambda found: trace_complete(found, len(traced.steps)), 60)
        rows = timeline(spans)
    return from_rows(rows, notes=(f"trace {tracer.last_trace_id} as Phoenix stored it ({len(spans)} spans)",)), store.url
