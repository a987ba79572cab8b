"""vLLM's two core ideas on the live engine: continuous batching and PagedAttention.

- **Continuous batching**: the scheduler rebuilds the batch at every engine step, so a request that arrives while
  another decodes joins the running batch at the next step instead of waiting for it to finish.
  ``measure_join`` streams one long (early) request, sends a short (late) one once the early one decodes, and
  samples the server's gauges (``vllm:num_requests_running`` / ``_waiting``, ``vllm:kv_cache_usage_perc``).
  The server's ``vllm:request_queue_time_seconds`` (scheduled - queued, engine-core timestamps, observed when a
  request finishes: vllm/v1/metrics/stats.py) read around the late request alone says how long it waited for a
  step, counted in the early stream's steady gaps (it yields one token per engine step).
- **PagedAttention**: KV memory is a pool of fixed-size blocks (``block_size`` tokens, from
  ``vllm:cache_config_info``); a sequence gets a new block when it crosses a block boundary, so the pool's used
  blocks (KV usage x (blocks - 1): one block is the null block, ``get_usage`` in vllm/v1/core/block_pool.py) are
  the sum of ceil(tokens / block_size) over the running requests (``block_timeline``).
- **Preemption**: when a running request needs a block and none is free, the scheduler preempts the last running
  request: frees its blocks, sets its computed tokens to 0 and puts it back in the waiting queue to be recomputed
  (``schedule`` and ``_preempt_request`` in vllm/v1/core/sched/scheduler.py), counted by
  ``vllm:num_preemptions_total``. ``measure_preemption`` runs requests whose blocks exceed a deliberately small pool.
"""

from __future__ import annotations

import math
import secrets
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import pandas as pd

from helpers.core.conclusion import NOT_SHOWN, SHOWN, Conclusion
from helpers.measure.stream_timing import StreamTiming

if TYPE_CHECKING:  # the lesson modules take a Lab; importing it at run time would pull in the engine
    from matplotlib.figure import Figure

    from helpers.engine.session import Lab

JOIN_STEPS_MAX = 2.0  # queue time, in steady steps: the step running when it arrived, plus one of slack
PAUSE_FACTOR = 2.0  # the early stream's time per token while both run, in steady ones, still "barely paused"
MATCH_SHARE = 0.9  # share of the gauge samples that must equal the blocks the token counts need


@dataclass
class JoinResult:
    """The early and late streams (perf_counter seconds) and the gauges sampled during them."""

    early: StreamTiming
    late: StreamTiming
    gauges: pd.DataFrame  # GaugeSampler frame: t, kv_cache_usage, num_requests_running, num_requests_waiting
    late_queue_s: float | None = None  # the server's queue time of the late request alone; None: not isolated
    early_ids: list[int] | None = None  # the early request's token ids, prompt then generated (return_token_ids)
    late_ids: list[int] | None = None  # the late one's; None: the server returned none


def measure_join(lab: Lab, early_output_tokens: int = 300, late_output_tokens: int = 32, prompt_tokens: int = 96,
                 lead_tokens: int = 40, interval_s: float = 0.1, wait_s: float = 120.0) -> JoinResult:
    """Stream an early request of ``early_output_tokens``; once it has ``lead_tokens`` tokens send a late one of
    ``late_output_tokens`` (both prompts ``prompt_tokens`` long, unique); sample the gauges every ``interval_s``."""
    from helpers.lessons.l03.prefix_hash import TokenIds
    from helpers.measure.loadgen import prompt_factory
    from helpers.measure.server_metrics import GaugeSampler, scrape
    from helpers.measure.stream_timing import stream_chat

    factory = prompt_factory(lab.settings, lab.model, seed=secrets.randbits(30))
    decoding = threading.Event()
    box: dict[str, StreamTiming] = {}
    early_client, late_client = TokenIds(lab.client), TokenIds(lab.client)  # each keeps its request's token ids

    def seen(timing: StreamTiming) -> None:
        if timing.completion_tokens >= lead_tokens:
            decoding.set()

    def early() -> None:
        box["early"] = stream_chat(early_client, lab.model,
                                   [{"role": "user", "content": factory.first_turn_content(1, prompt_tokens)}],
                                   max_tokens=early_output_tokens, on_chunk=seen,
                                   extra_body={"ignore_eos": True, "min_tokens": early_output_tokens})
        decoding.set()  # ended (or failed): stop waiting

    with GaugeSampler(lab.settings.metrics_url, interval_s=interval_s, model=lab.model) as sampler:
        thread = threading.Thread(target=early, daemon=True)
        thread.start()
        decoding.wait(wait_s)
        before = scrape(lab.settings.metrics_url, model=lab.model)
        late = stream_chat(late_client, lab.model,
                           [{"role": "user", "content": factory.first_turn_content(2, prompt_tokens)}],
                           max_tokens=late_output_tokens,
                           extra_body={"ignore_eos": True, "min_tokens": late_output_tokens})
        late_queue_s = _queue_time_of_one(lab.settings.metrics_url, lab.model, before)
        thread.join()
        time.sleep(2 * interval_s)  # a sample after both ended
    failed = [s.error for s in (box.get("early"), late) if s is None or not s.ok]
    if failed:
        raise RuntimeError(f"a request of the join experiment failed: {failed[0] or 'no token'}; check the engine "
                           "(`workshop status`)")
    return JoinResult(box["early"], late, sampler.frame(), late_queue_s, _ids(early_client), _ids(late_client))


def _ids(client: Any) -> list[int] | None:
    """A request's token ids, prompt then generated, as the server returned them; None when it returned none."""
    return None if not client.prompt_ids else [*client.prompt_ids, *client.output_ids]


def _queue_time_of_one(metrics_url: str, model: str, before: Any, wait_s: float = 1.0) -> float | None:
    """The server's queue time (s) of the one request finished since ``before`` (polled up to ``wait_s``: the
    histogram is observed as the request finishes); None when none or several finished meanwhile."""
    from helpers.measure.server_metrics import window_until_finished

    served = window_until_finished(metrics_url, before, model=model, wait_s=wait_s)
    return served["queue_time_mean_s"] if served["queue_time_count"] == 1 else None


def _token_times(timing: StreamTiming) -> list[float]:
    """One arrival time per generated token (a chunk carrying n tokens counts n times)."""
    return [t for t, n in zip(timing.chunk_times, timing.chunk_tokens) for _ in range(n)]


def join_streams(result: JoinResult) -> list[Any]:
    """The join's two requests as the paged-KV picture takes them (``pictures.BlockStream``), with their token ids
    when the server returned them for every token counted."""
    from helpers.lessons.l03.pictures import BlockStream

    out = []
    for name, timing, ids in (("early request", result.early, result.early_ids),
                              ("late request", result.late, result.late_ids)):
        complete = ids is not None and len(ids) == (timing.prompt_tokens or 0) + timing.completion_tokens
        out.append(BlockStream(name, timing.t_sent, timing.t_first_token, timing.t_done, timing.prompt_tokens or 0,
                               _token_times(timing), ids if complete else None))
    return out


def join_moments(result: JoinResult) -> dict[str, float]:
    """Four moments of the join to draw (perf_counter s): the early request alone, just before the late one was sent;
    both decoding, halfway through the late one's stream; the late one ended, its blocks freed; the early one's last
    token."""
    late, early = result.late, result.early
    first, done = late.t_first_token or late.t_sent, late.t_done or late.t_sent
    last = early.t_last_token or early.t_done or done
    return {"the early request alone": late.t_sent - 1e-3, "both decoding": (first + done) / 2,
            "the late request ended": min(done + 0.05, last), "the early request's last token": last}


def join_summary(result: JoinResult) -> dict[str, Any]:
    """The join in numbers: the server's queue time of the late request (ms, and in the early stream's steady steps),
    its TTFT, the early stream's time per token before the late one arrived and while it ran (ms: the whole window
    over its tokens, so chunks delivered in bursts still average out), its longest gap around the join, and what
    was left of it."""
    early, late = _token_times(result.early), result.late
    sent, first, done = late.t_sent, late.t_first_token or late.t_sent, late.t_done or late.t_sent
    ahead = [t for t in early if t <= sent]
    steady_ms = (ahead[-1] - ahead[0]) / (len(ahead) - 1) * 1000 if len(ahead) > 1 else None
    meanwhile = [t for t in early if sent < t <= done]
    together_ms = (meanwhile[-1] - sent) / len(meanwhile) * 1000 if meanwhile else None
    gaps = [b - a for a, b in zip(early, early[1:]) if b > sent and a < first]
    queue_ms = None if result.late_queue_s is None else result.late_queue_s * 1000
    g = result.gauges
    during = g[(g["t"] > first) & (g["t"] < done)]
    before = g[g["t"] < sent]
    return {
        "queue_ms": queue_ms,  # the server's: arrival in the engine's queue to its first scheduled step
        "queue_steps": None if queue_ms is None or not steady_ms else queue_ms / steady_ms,
        "client_steps": sum(1 for t in early if sent < t <= first),  # early tokens while the late one was on its way
        "ttft_ms": (first - sent) * 1000,
        "steady_gap_ms": steady_ms,
        "gap_together_ms": together_ms,  # the early stream's time per token while the late one ran
        "longest_gap_at_join_ms": max(gaps) * 1000 if gaps else None,
        "early_tokens_after_join": sum(1 for t in early if t > first),
        "early_left_ms": ((result.early.t_done or sent) - sent) * 1000,  # what a static batch would have made it wait
        "running_before": float(before["num_requests_running"].max()) if len(before) else None,
        "running_together": float(during["num_requests_running"].max()) if len(during) else None,
        "waiting_max": float(g["num_requests_waiting"].max()) if len(g) else None,
    }


def conclude_join(summary: dict[str, Any], steps_max: float = JOIN_STEPS_MAX) -> Conclusion:
    """Did the late request join the running batch within ``steps_max`` engine steps of arriving (the server's queue
    time in steady steps), long before the early one ended, with both counted running?"""
    expectation = "a request arriving mid-decode joins the running batch at the next engine step"
    after, ttft = summary["early_tokens_after_join"], summary["ttft_ms"]
    steps = summary["queue_steps"]
    waited = ("its wait for a step is not isolated here (the server's queue-time histogram counted another "
              "request too, or is absent)" if steps is None else
              f"it waited {summary['queue_ms']:,.2f} ms in the server's queue = {steps:.1f} engine steps of "
              f"{summary['steady_gap_ms']:,.1f} ms")
    text = (f"the late request arrived while the early one decoded: {waited}; its first token came {ttft:,.0f} ms "
            f"after it was sent (HTTP, tokenizing and its prefill included), while the early request still had "
            f"{after} tokens to stream; a static batch would have held it {summary['early_left_ms']:,.0f} ms, until "
            "the early one ended")
    if summary["running_together"] is not None:
        text += (f"; the server's gauges: running {summary['running_before']:.0f} before, "
                 f"{summary['running_together']:.0f} together, waiting at most {summary['waiting_max']:.0f}")
    if after == 0:
        return Conclusion(text + ": the early request had ended, so nothing was joined (raise its output).",
                          NOT_SHOWN, expectation)
    if steps is not None and steps > steps_max:
        return Conclusion(f"{text}: more than {steps_max:g} steps, so it waited (was the engine at its "
                          "--max-num-seqs, or the machine busy?).", NOT_SHOWN, expectation)
    if summary["running_together"] is not None and summary["running_together"] < 2:
        return Conclusion(f"{text}: yet no gauge sample saw both running (a sample every 0.1 s can miss "
                          "a short overlap).", NOT_SHOWN, expectation)
    if steps is None and ttft > 0.5 * summary["early_left_ms"]:
        return Conclusion(f"{text}: without the server's queue time, a first token this late cannot be told from "
                          "waiting for the early one.", NOT_SHOWN, expectation)
    return Conclusion(text + ".", SHOWN, expectation)


def conclude_no_pause(summary: dict[str, Any], factor: float = PAUSE_FACTOR) -> Conclusion:
    """Did the early stream barely slow down while the late one joined and ran (its time per token then under
    ``factor`` x its steady time per token)?"""
    expectation = "the running request barely pauses while the new one joins"
    steady, together = summary["steady_gap_ms"], summary["gap_together_ms"]
    if steady is None or together is None:
        return Conclusion("no steady pace before the join, or no token while the late request ran: nothing to "
                          "compare.", NOT_SHOWN, expectation)
    longest = summary["longest_gap_at_join_ms"]
    text = (f"the early stream took {together:,.1f} ms per token while the late request joined and ran, against "
            f"{steady:,.1f} ms before ({together / steady:.1f}x)"
            + (f"; its longest gap at the join {longest:,.1f} ms" if longest is not None else ""))
    if together < factor * steady:
        return Conclusion(text + ": it kept streaming; a step of two requests costs little more than one.", SHOWN,
                          expectation)
    return Conclusion(f"{text}: over {factor:g}x, it slowed a lot (a long prompt's prefill, or a busy machine).",
                      NOT_SHOWN, expectation)


# ---------------------------------------------------------------- PagedAttention: blocks as sequences grow

def blocks_needed(tokens: int, block_size: int) -> int:
    """Blocks a sequence of ``tokens`` tokens holds: ceil(tokens / block_size)."""
    return math.ceil(tokens / block_size) if tokens > 0 else 0


def _tokens_at(timing: StreamTiming, t: float) -> int | None:
    """Prompt + generated tokens the client had seen at ``t``; None outside the request's decode phase."""
    if timing.t_first_token is None or t < timing.t_first_token or t >= (timing.t_done or math.inf):
        return None
    return (timing.prompt_tokens or 0) + sum(1 for s in _token_times(timing) if s <= t)


def _tokens_seen(timing: StreamTiming, t: float) -> int:
    """Prompt + generated tokens the client had seen at ``t`` (0 before its first token)."""
    if timing.t_first_token is None or t < timing.t_first_token:
        return 0
    return (timing.prompt_tokens or 0) + sum(1 for s in _token_times(timing) if s <= t)


def block_timeline(streams: list[StreamTiming], gauges: pd.DataFrame, block_size: int, num_blocks: int,
                   lag_s: float = 0.25) -> pd.DataFrame:
    """Per gauge sample taken while no request was being prefilled: the pool's used blocks (KV usage x (blocks - 1))
    against sum(ceil(tokens / block_size)) over the requests decoding. A sample is stamped when its scrape returned,
    and the server reports the engine's last recorded step: the range allowed runs from the blocks of the tokens
    seen ``lag_s`` earlier (minus 2 tokens) to those seen at the stamp (plus 2, and a request that ended within
    ``lag_s`` still counted). Columns: t_s, requests, tokens, blocks_needed, blocks_low, blocks_high, blocks_used,
    match."""
    rows = []
    t0 = min(s.t_sent for s in streams)
    for t, usage in zip(gauges["t"], gauges["kv_cache_usage"]):
        if usage != usage or any(s.t_sent <= t < (s.t_first_token or math.inf) for s in streams):
            continue  # no reading, or a request was being prefilled: its prompt's blocks are still being filled
        counts = [n for n in (_tokens_at(s, t) for s in streams) if n is not None]
        recent = [s for s in streams if (s.t_first_token or math.inf) <= t and (s.t_done or math.inf) > t - lag_s]
        if not counts:
            continue
        used = round(usage * (num_blocks - 1))
        earlier = [_tokens_at(s, t - lag_s) for s in streams if _tokens_at(s, t) is not None]  # ended ones freed
        low = sum(blocks_needed(n - 2, block_size) for n in earlier if n)
        high = sum(blocks_needed(_tokens_seen(s, t) + 2, block_size) for s in recent)
        rows.append({"t_s": t - t0, "requests": len(counts), "tokens": sum(counts),
                     "blocks_needed": sum(blocks_needed(n, block_size) for n in counts),
                     "blocks_low": low, "blocks_high": high, "blocks_used": used, "match": low <= used <= high})
    return pd.DataFrame(rows, columns=["t_s", "requests", "tokens", "blocks_needed", "blocks_low", "blocks_high",
                                       "blocks_used", "match"])


def conclude_blocks(timeline: pd.DataFrame, block_size: int, share: float = MATCH_SHARE) -> Conclusion:
    """Did the used blocks follow sum(ceil(tokens / block_size)) sample by sample, and grow as the sequences did?"""
    expectation = "KV blocks are allocated as a sequence grows, one block per block_size tokens"
    if timeline.empty:
        return Conclusion("no gauge sample fell while the requests decoded: nothing to compare.", NOT_SHOWN,
                          expectation)
    matched = int(timeline["match"].sum())
    grew = timeline["blocks_used"].nunique()
    text = (f"{matched} of {len(timeline)} samples of the KV gauge equal the sum of ceil(tokens / {block_size}) over "
            f"the running requests (to the block, allowing the sample's lag); the used blocks went from "
            f"{timeline['blocks_used'].min()} to {timeline['blocks_used'].max()} as they grew from "
            f"{timeline['tokens'].min():,} to {timeline['tokens'].max():,} tokens")
    if matched >= share * len(timeline) and grew >= 2:
        return Conclusion(text + ".", SHOWN, expectation)
    why = (f"under {share:.0%} matched (another request shared the cache, or the samples lagged the tokens)"
           if matched < share * len(timeline) else "the blocks never changed: the sequences crossed no block "
                                                      "boundary (raise the output tokens)")
    return Conclusion(f"{text}: {why}.", NOT_SHOWN, expectation)


def plot_blocks(timeline: pd.DataFrame, block_size: int) -> Figure:
    """The pool's used blocks (the gauge) against sum(ceil(tokens / block_size)), per sample (``block_timeline``)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3))
    ax.step(timeline["t_s"], timeline["blocks_needed"], where="post", label=f"sum of ceil(tokens / {block_size})")
    ax.plot(timeline["t_s"], timeline["blocks_used"], "o", label="used blocks (KV usage gauge)")
    ax.set_xlabel("seconds since the first request was sent")
    ax.set_ylabel("KV blocks")
    ax.set_title("PagedAttention: blocks allocated as the sequences grow")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- preemption: a small pool runs out

@dataclass
class PreemptionResult:
    """The requests run on the small pool, the gauges sampled meanwhile, and the server's preemption counter."""

    streams: list[StreamTiming]
    gauges: pd.DataFrame
    preemptions: float | None  # increase of vllm:num_preemptions_total during the run; None: not exposed
    block_size: int
    num_blocks: int
    output_tokens: int
    restore_s: float | None = None  # the restart back to the flags before (s); None: none was needed


def small_pool_flags(cache: dict[str, Any], pool_tokens: int, max_model_len: int | None) -> dict[str, Any]:
    """``--kv-cache-memory-bytes`` for a pool of ``pool_tokens`` tokens (at least ``max_model_len``: vLLM refuses to
    start on less), from the running pool's bytes per block (``vllm:cache_config_info``); {} when they are unknown."""
    blocks, size, total = cache.get("num_gpu_blocks"), cache.get("block_size"), cache.get("kv_cache_memory_bytes")
    if not blocks or not size or not total:
        return {}
    wanted = math.ceil(max(pool_tokens, max_model_len or 0) / size) + 1  # + the null block
    return {"--kv-cache-memory-bytes": wanted * (int(total) // int(blocks))}


def apply_flags(lab: Lab, flags: dict[str, Any]) -> bool:
    """Restart the engine with ``flags`` set (None removes one), in one restart; False when it cannot be changed from
    here (an endpoint run elsewhere). Nothing restarts when the engine already runs them."""
    from dataclasses import replace

    from helpers.core.vllm_args import flag_value, with_flag

    args = tuple(lab.engine.args())
    for flag, value in flags.items():
        args = with_flag(args, flag, value)
    if all(flag_value(args, f) == flag_value(lab.engine.args(), f) for f in flags):
        return True
    if not lab.engine.reconfigurable:
        return False
    lab.engine.apply(replace(lab.engine.config(), args=args))
    return True


def measure_preemption(lab: Lab, pool: dict[str, Any], n_requests: int, prompt_tokens: int, output_tokens: int,
                       restore: Sequence[str] | None = None, interval_s: float = 0.1) -> PreemptionResult | None:
    """``n_requests`` concurrent requests of ``prompt_tokens`` + ``output_tokens`` on the engine with the ``pool``
    flags (restarted on them unless it runs them), the gauges sampled every ``interval_s``; then the engine goes
    back to the ``restore`` flags (one restart, also when a request failed). None when the pool cannot be set here
    (an endpoint run elsewhere, or ``pool`` empty: its bytes per block unknown)."""
    from helpers.measure.loadgen import prompt_factory
    from helpers.measure.server_metrics import GaugeSampler, scrape
    from helpers.measure.stream_timing import stream_chat

    result: PreemptionResult | None = None
    try:
        if not pool or not apply_flags(lab, pool):
            return None
        cache = scrape(lab.settings.metrics_url).cache_config() or {}
        factory = prompt_factory(lab.settings, lab.model, seed=secrets.randbits(30))
        streams: list[StreamTiming | None] = [None] * n_requests

        def run(i: int) -> None:
            streams[i] = stream_chat(lab.client, lab.model,
                                     [{"role": "user", "content": factory.first_turn_content(i, prompt_tokens)}],
                                     max_tokens=output_tokens,
                                     extra_body={"ignore_eos": True, "min_tokens": output_tokens})

        with GaugeSampler(lab.settings.metrics_url, interval_s=interval_s, model=lab.model) as sampler:
            threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n_requests)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        counts = [None if snap is None else snap.counter("num_preemptions") for snap in (sampler.first, sampler.last)]
        preempted = None if None in counts else counts[1] - counts[0]
        done = [s for s in streams if s is not None]
        result = PreemptionResult(done, sampler.frame(), preempted, int(cache.get("block_size") or 0),
                                  int(cache.get("num_gpu_blocks") or 0), output_tokens)
        return result
    finally:
        if restore is not None and list(restore) != lab.engine.args() and lab.engine.reconfigurable:
            from dataclasses import replace

            started = time.perf_counter()
            lab.engine.apply(replace(lab.engine.config(), args=tuple(restore)))
            if result is not None:
                result.restore_s = time.perf_counter() - started


def conclude_preemption(result: PreemptionResult | None) -> Conclusion:
    """Did requests needing more blocks than the pool holds get preempted (and still finish, recomputed)?"""
    expectation = "when the KV blocks run out, the scheduler preempts a request and recomputes it later"
    if result is None:
        return Conclusion("not measured: the KV pool of an endpoint run elsewhere is set where it runs (the local "
                          "engine or the cluster profile can shrink it).", NOT_SHOWN, expectation)
    usable = result.num_blocks - 1
    need = sum(blocks_needed((s.prompt_tokens or 0) + result.output_tokens, result.block_size) for s in result.streams)
    complete = sum(1 for s in result.streams if s.ok and s.completion_tokens == result.output_tokens)
    g = result.gauges
    count = "an unknown number of" if result.preemptions is None else f"{result.preemptions:.0f}"
    n = len(result.streams)
    text = (f"{n} requests needing {need} blocks of {result.block_size} tokens at their longest, on a pool of "
            f"{usable} usable blocks: the engine preempted {count} time(s) (vllm:num_preemptions_total), KV usage "
            f"peaked at {g['kv_cache_usage'].max():.0%} with up to {g['num_requests_waiting'].max():.0f} request(s) "
            f"waiting, and {complete} of {n} got all {result.output_tokens} tokens")
    if result.preemptions is None:
        return Conclusion(text + ": this server does not expose the counter.",
                          NOT_SHOWN, expectation)
    if need <= usable:
        return Conclusion(text + ": they fit in the pool, so nothing had to be preempted (raise the requests).",
                          NOT_SHOWN, expectation)
    if result.preemptions == 0:
        return Conclusion(text + ": none. vLLM admits a request only when its whole prompt fits in the free blocks "
                          "(scheduler_reserve_full_isl), so only the outputs' growth can run the pool out: raise the "
                          "output tokens, or send fewer, shorter prompts that fit together.", NOT_SHOWN, expectation)
    if complete < len(result.streams):
        return Conclusion(text + ": a preempted request did not finish.", NOT_SHOWN, expectation)
    return Conclusion(text + ": a preempted request lost its blocks, waited, and was recomputed.", SHOWN, expectation)
