"""How one long prefill, arriving in a continuous batch, stalls the decodes already running.

``measure_prefill_stall`` starts ``n_streams`` long generations, waits until they decode steadily,
then sends one request with a long prompt (``max_tokens=1``: it is all prefill). Every running
stream's token arrival times are kept, so the gaps while the long prompt is prefilled can be set
against the steady gaps before it. vLLM chunks prefills by default (chunked prefill is on for generative models,
vllm/engine/arg_utils.py): ``--max-num-batched-tokens`` caps the tokens of one step (2,048 by default on the CPU
build, ``get_batch_defaults`` there), so a longer prompt is cut into pieces that share engine steps with the
decodes. The lesson compares two chunk sizes: a smaller one makes more, shorter stalls instead of fewer, longer ones.

The long prompt is sent only once every stream has received tokens (so there is a steady pace to
compare with, even on a busy machine whose first tokens come late). ``conclude_stall`` judges the
three expectations (a stall; the smaller chunk shortens it; the smaller chunk lengthens the long request's
own TTFT) against the repeats' spread.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass
from statistics import median
from typing import TYPE_CHECKING, Any

import pandas as pd

from helpers.core.comparison import BETTER, SAME, WORSE, Verdict, compare_samples
from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion
from helpers.core.settings import Settings
from helpers.measure.loadgen import prompt_factory
from helpers.measure.stream_timing import StreamTiming, stream_chat
from helpers.planning.kv import DEFAULT_MAX_NUM_BATCHED_TOKENS

if TYPE_CHECKING:  # the lesson modules take a Lab; importing it at run time would pull in the engine
    from helpers.engine.session import Lab

# A gap overlapping the long prefill counts as a stall when it is this many times the steady median gap.
STALL_FACTOR = 3.0


@dataclass
class StallResult:
    """The running streams, the long request, and when its prefill ran (perf_counter seconds)."""

    streams: list[StreamTiming]
    long_request: StreamTiming
    prefill_start: float  # the long request was sent
    prefill_end: float  # its first (and only) token arrived

    def gaps(self) -> pd.DataFrame:
        """Every inter-token gap of the running streams: when it ended, its length (ms), during the prefill?"""
        rows = []
        for number, s in enumerate(self.streams):
            for t0, t1 in zip(s.chunk_times, s.chunk_times[1:]):
                overlaps = t0 < self.prefill_end and t1 > self.prefill_start
                rows.append({"stream": number, "t_s": t1 - self.prefill_start, "gap_ms": (t1 - t0) * 1000,
                             "during_prefill": overlaps})
        return pd.DataFrame(rows, columns=["stream", "t_s", "gap_ms", "during_prefill"])

    def summary(self) -> dict[str, Any]:
        """Median gap outside the prefill, longest gap overlapping it (ms), and the prefill's own time."""
        g = self.gaps()
        before = g.loc[~g["during_prefill"] & (g["t_s"] < 0), "gap_ms"]
        during = g.loc[g["during_prefill"], "gap_ms"]
        return {"streams": len(self.streams), "long_prompt_tokens": self.long_request.prompt_tokens,
                "prefill_ms": round((self.prefill_end - self.prefill_start) * 1000, 1),
                "median_gap_before_ms": round(float(median(before)), 2) if len(before) else None,
                "max_gap_during_prefill_ms": round(float(during.max()), 2) if len(during) else None,
                "gaps_during_prefill": int(len(during))}


def budget_name(value: Any, settings: Settings) -> str:
    """How tables and conclusions name a ``--max-num-batched-tokens`` setting (``value`` None: the engine's default):
    its tokens per step; for the default of the CPU engine the helpers run, the 2,048 vLLM's CPU build picks
    (``get_batch_defaults`` in vllm/engine/arg_utils.py). Elsewhere the default depends on the hardware (on a GPU
    2,048 to 16,384, by its memory), so it is named 'default'."""
    if value is not None:
        return f"max-num-batched-tokens {value}"
    if settings.profile == "cpu" and settings.managed:
        return f"max-num-batched-tokens {DEFAULT_MAX_NUM_BATCHED_TOKENS} (default)"
    return "max-num-batched-tokens default"


def measure_prefill_stall(lab: Lab, n_streams: int = 4, stream_tokens: int = 400, long_prompt_tokens: int = 3000,
                          settle_s: float = 0.5, seed: int = 0, steady_chunks: int = 6,
                          wait_s: float = 120.0) -> StallResult:
    """Run the experiment against ``lab`` (helpers.engine.session.Lab); raises RuntimeError if a request failed.

    The long prompt goes out once every stream has received ``steady_chunks`` chunks (at most ``wait_s``
    seconds after they started), then ``settle_s`` more: the gaps before it are the steady pace."""
    factory = prompt_factory(lab.settings, lab.model, seed=seed)
    streams: list[StreamTiming | None] = [None] * n_streams
    started = threading.Barrier(n_streams + 1)
    decoding = [threading.Event() for _ in range(n_streams)]

    def decode(i: int) -> None:
        started.wait()

        def seen(timing: StreamTiming) -> None:
            if len(timing.chunk_times) >= steady_chunks:
                decoding[i].set()

        streams[i] = stream_chat(lab.client, lab.model,
                                 [{"role": "user", "content": factory.first_turn_content(10 + i, 64)}],
                                 max_tokens=stream_tokens, on_chunk=seen,
                                 extra_body={"ignore_eos": True, "min_tokens": stream_tokens})
        decoding[i].set()  # ended (or failed): stop waiting for it

    threads = [threading.Thread(target=decode, args=(i,), daemon=True) for i in range(n_streams)]
    for t in threads:
        t.start()
    started.wait()
    deadline = time.perf_counter() + wait_s
    for event in decoding:
        event.wait(max(0.0, deadline - time.perf_counter()))
    time.sleep(settle_s)
    long = stream_chat(lab.client, lab.model,
                       [{"role": "user", "content": factory.first_turn_content(1, long_prompt_tokens)}],
                       max_tokens=1)
    for t in threads:
        t.join()
    failed = [s.error for s in [*streams, long] if s is None or s.error]
    if failed or long.t_first_token is None:
        raise RuntimeError(f"a request of the stall experiment failed: {failed[:1] or 'no token'}; "
                           "check the engine (`workshop status`) and lower long_prompt_tokens below --max-model-len")
    return StallResult([s for s in streams if s is not None], long, long.t_sent, long.t_first_token)


def measure_stall_configs(lab: Lab, budgets: dict[str, Any], n_streams: int, long_prompt_tokens: int,
                          repeats: int = 1, rounds: int = 1, also: dict[str, Any] | None = None,
                          restore: bool = True) -> dict[str, list[StallResult]]:
    """The stall under each ``--max-num-batched-tokens`` value of ``budgets`` (name -> value; None: the
    engine's default), ``repeats`` runs per engine start, configurations interleaved for ``rounds`` rounds
    (A B A B: each switch restarts the engine). ``also``: flags set in the same restart with every budget but the
    engine's own (which runs them as it started), e.g. a later section's small KV pool. The engine ends on the flags
    it started with, unless ``restore`` is False: then on the last configuration measured."""
    from helpers.core.comparison import interleave
    from helpers.core.vllm_args import flag_value
    from helpers.lessons.l03.batching import apply_flags

    start = flag_value(lab.engine.args(), "--max-num-batched-tokens")
    started = {flag: flag_value(lab.engine.args(), flag) for flag in also or {}}
    if not lab.engine.reconfigurable:  # an endpoint run elsewhere: only the configuration it runs
        kept = {name: value for name, value in budgets.items() if (None if value is None else str(value)) == start}
        if len(kept) < len(budgets):
            print(f"measuring only {', '.join(kept) or 'nothing'}: {lab.settings.base_url} is run elsewhere, so its "
                  "--max-num-batched-tokens is set where it runs (the local engine or the cluster profile can change it)")
        budgets = kept

    def with_budget(value: Any):
        def run() -> list[StallResult]:
            own = (None if value is None else str(value)) == start
            apply_flags(lab, {"--max-num-batched-tokens": value, **(started if own else also or {})})
            # a new seed each run: a long prompt seen before would be served from the prefix cache
            return [measure_prefill_stall(lab, n_streams, long_prompt_tokens=long_prompt_tokens,
                                          seed=secrets.randbits(30)) for _ in range(max(1, repeats))]
        return run

    try:
        results = interleave({name: with_budget(value) for name, value in budgets.items()}, rounds,
                             desc="stall under each batch budget")
    except BaseException:
        apply_flags(lab, {"--max-num-batched-tokens": start, **started})  # a failed run leaves the engine as it was
        raise
    if restore:
        apply_flags(lab, {"--max-num-batched-tokens": start, **started})  # None removes a flag again
    return {name: [r for batch in runs for r in batch] for name, runs in results.items()}


def _samples(results: list[StallResult], key: str) -> list[float]:
    return [v for v in (r.summary()[key] for r in results) if v is not None and v == v]


def conclude_stall(runs: dict[str, list[StallResult]], stall_factor: float = STALL_FACTOR,
                   quiet: bool | None = None) -> list[Conclusion]:
    """The larger chunk (first entry of ``runs``: the engine's budget) against the smaller one (second), every
    repeat kept. vLLM chunks a prefill longer than the budget, so both runs chunk; they differ in chunk size:
    1. the long prefill stalls the running streams (longest gap overlapping it >= ``stall_factor`` x the
       steady median gap); 2. the smaller chunk shortens that stall; 3. the smaller chunk lengthens the long
    request's own prefill. Each is judged against the repeats' spread; a contrary result says what the numbers
    show."""
    out = []
    for name, results in list(runs.items())[:2]:
        steady, stall = _samples(results, "median_gap_before_ms"), _samples(results, "max_gap_during_prefill_ms")
        expectation = f"{name}: the long prefill stalls the running streams"
        if not steady or not stall:
            missing = "no running token's gap overlapped the prefill" if not stall else "no steady gap before it"
            out.append(Conclusion(f"{missing} (the streams were not decoding while it ran), so there is nothing to "
                                  "compare.", NOT_SHOWN, expectation))
            continue
        steady_ms, stall_ms = sum(steady) / len(steady), max(stall)
        text = (f"longest gap while it ran {stall_ms:,.0f} ms vs a steady gap of {steady_ms:,.1f} ms "
                f"({stall_ms / steady_ms:.0f}x, {len(results)} run(s))")
        if stall_ms >= stall_factor * steady_ms:
            out.append(Conclusion(text + ".", SHOWN, expectation))
        else:
            out.append(Conclusion(text + f": under {stall_factor:g}x, the streams hardly noticed (a prefill this short "
                                  "takes about one decode step here).", NOT_SHOWN, expectation))
    if len(runs) < 2:
        return out + [Conclusion("a second chunk size was not compared: only one --max-num-batched-tokens was measured "
                                 "(an endpoint whose flags are set where it runs keeps its own).")]
    (name_a, a), (name_b, b) = list(runs.items())[:2]
    stall = compare_samples(_samples(a, "max_gap_during_prefill_ms"), _samples(b, "max_gap_during_prefill_ms"),
                            higher_is_better=False)
    out.append(_judge(stall, BETTER, "a smaller prefill chunk shortens the longest stall",
                      f"longest stall {stall.mean_a:,.0f} ms ({name_a}) vs {stall.mean_b:,.0f} ms ({name_b})",
                      "the smaller chunk's longest gap was not shorter; compare the steady gaps above, since whatever "
                      "lengthens every gap (a busy machine) lengthens the stall too"
                      + ("; the machine was busy (quiet check)" if quiet is False else ""), quiet))
    own = compare_samples(_samples(a, "prefill_ms"), _samples(b, "prefill_ms"), higher_is_better=False)
    rates = ""
    tokens = [r.long_request.prompt_tokens for r in a + b if r.long_request.prompt_tokens]
    if tokens and own.mean_a == own.mean_a and own.mean_b > 0:
        n = sum(tokens) / len(tokens)
        rates = f" ({n / own.mean_a * 1000:,.0f} vs {n / own.mean_b * 1000:,.0f} prompt tokens/s)"
    out.append(_judge(own, WORSE, "a smaller prefill chunk makes the long request's own TTFT longer",
                      f"the long prompt's prefill took {own.mean_a:,.0f} ms ({name_a}) vs {own.mean_b:,.0f} ms "
                      f"({name_b}){rates}",
                      "the smaller chunks finished the prompt sooner: they ran faster per prompt token than the "
                      "larger ones, more than paying for the extra steps"
                      + ("; the machine was busy (quiet check), so the larger-chunk run may have been slowed"
                         if quiet is False else ""), quiet))
    return out


def _judge(verdict: Verdict, expected: str, expectation: str, text: str, contrary: str,
           quiet: bool | None) -> Conclusion:
    """Shown when ``verdict.label`` is ``expected``; within noise when the same; otherwise the ``contrary`` reason."""
    text = f"{text}, {verdict.describe()}"
    if verdict.label == expected:
        return Conclusion(text + ".", SHOWN, expectation)
    if verdict.label == SAME:
        return Conclusion(text + ": within the run-to-run spread" + (
            " (one run each: raise STALL_REPEATS for a measured spread)" if not verdict.spread_measured else "") + ".",
            WITHIN_NOISE, expectation)
    if verdict.shown:
        return Conclusion(f"{text}: {contrary}.", NOT_SHOWN, expectation)
    return Conclusion(f"{text}: not measured.", NOT_SHOWN, expectation)


def stall_table(runs: dict[str, list[StallResult]]) -> pd.DataFrame:
    """One row per measured run: the config, the run number and its summary (``measure_stall_configs`` output)."""
    return pd.concat({name: pd.DataFrame([r.summary() for r in results]) for name, results in runs.items()},
                     names=["config", "run"])


def stall_gaps(runs: dict[str, list[StallResult]]) -> pd.DataFrame:
    """The first run's token gaps of every config, stacked with a ``config`` column (for ``plots.prefill_stall``)."""
    return pd.concat([results[0].gaps().assign(config=name) for name, results in runs.items() if results],
                     ignore_index=True)
