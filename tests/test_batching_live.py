"""Continuous batching and PagedAttention on the live engine (helpers/lessons/l03/batching.py): the join, the
blocks as sequences grow, preemption on a small pool; every conclusion with numbers that go both ways."""

from types import SimpleNamespace

import pandas as pd
import pytest

from helpers.core.conclusion import NOT_SHOWN, SHOWN
from helpers.lessons.l03 import batching
from helpers.measure.stream_timing import StreamTiming


def stream(t_sent, first, gap, n, prompt=100, done=None):
    """A stream of ``n`` one-token chunks from ``first``, one every ``gap`` seconds."""
    times = [first + i * gap for i in range(n)]
    return StreamTiming(t_sent=t_sent, t_first_token=first, chunk_times=times, chunk_tokens=[1] * n,
                        prompt_tokens=prompt, completion_tokens=n, t_done=done if done is not None else times[-1])


def gauges(rows):
    return pd.DataFrame(rows, columns=["t", "kv_cache_usage", "num_requests_running", "num_requests_waiting"])


def join_result(late_first=1.02, queue_s=0.004, early_gap=0.01, late_sent=1.0):
    early = stream(0.0, 0.1, early_gap, 300)  # ends at 3.09 s
    late = stream(late_sent, late_first, early_gap, 32)
    g = gauges([[0.5, 0.01, 1, 0], [1.2, 0.02, 2, 0], [2.0, 0.01, 1, 0]])
    return batching.JoinResult(early, late, g, queue_s)


def test_a_late_request_queued_under_a_step_joins_at_the_next_step():
    summary = batching.join_summary(join_result())
    assert summary["queue_steps"] == pytest.approx(0.4) and summary["client_steps"] == 2
    assert summary["running_before"] == 1 and summary["running_together"] == 2
    finding = batching.conclude_join(summary)
    assert finding.verdict == SHOWN and "0.4 engine steps" in finding.text
    assert "static batch would have held it" in finding.text


def test_a_late_request_that_queued_many_steps_did_not_join():
    finding = batching.conclude_join(batching.join_summary(join_result(queue_s=0.05, late_first=1.06)))
    assert finding.verdict == NOT_SHOWN and "more than 2 steps" in finding.text


def test_a_late_request_after_the_early_one_ended_joins_nothing():
    result = join_result(late_sent=3.2, late_first=3.25)
    finding = batching.conclude_join(batching.join_summary(result))
    assert finding.verdict == NOT_SHOWN and "had ended" in finding.text


def test_without_the_servers_queue_time_a_first_token_long_after_arrival_is_not_a_join():
    summary = batching.join_summary(join_result(queue_s=None, late_first=2.9))
    assert summary["queue_steps"] is None
    assert batching.conclude_join(summary).verdict == NOT_SHOWN
    assert batching.conclude_join(batching.join_summary(join_result(queue_s=None))).verdict == SHOWN


def test_the_early_stream_barely_pauses_or_stalls():
    calm = batching.join_summary(join_result())
    assert batching.conclude_no_pause(calm).verdict == SHOWN
    result = join_result()
    result.early.chunk_times = [t + (0.2 if t > 1.0 else 0) for t in result.early.chunk_times]  # a 210 ms gap
    stalled = batching.conclude_no_pause(batching.join_summary(result))
    assert stalled.verdict == NOT_SHOWN and "over 2x" in stalled.text


@pytest.mark.parametrize("tokens, blocks", [(0, 0), (1, 1), (128, 1), (129, 2), (3800, 30)])
def test_blocks_needed_is_the_ceiling(tokens, blocks):
    assert batching.blocks_needed(tokens, 128) == blocks


def test_the_gauge_follows_the_blocks_to_the_block():
    early = stream(0.0, 0.1, 0.01, 300, prompt=100)  # 100 + n tokens: block 2 from 0.38 s, block 3 from 1.66 s
    samples = [[t, batching.blocks_needed(100 + round((t - 0.1) / 0.01) + 1, 128) / 99, 1, 0]
               for t in (0.05, 0.2, 0.5, 1.0, 1.5, 2.0, 2.5)]
    timeline = batching.block_timeline([early], gauges(samples), 128, 100)
    assert len(timeline) == 6  # the sample during the prefill is left out
    assert timeline["match"].all() and timeline["blocks_used"].tolist() == [1, 2, 2, 2, 3, 3]
    finding = batching.conclude_blocks(timeline, 128)
    assert finding.verdict == SHOWN and "6 of 6 samples" in finding.text and "from 1 to 3" in finding.text


def test_a_gauge_off_by_blocks_or_flat_is_not_shown():
    early = stream(0.0, 0.1, 0.01, 300, prompt=100)
    off = gauges([[t, 10 / 99, 1, 0] for t in (0.2, 0.5, 1.0, 2.0)])
    finding = batching.conclude_blocks(batching.block_timeline([early], off, 128, 100), 128)
    assert finding.verdict == NOT_SHOWN and "under 90% matched" in finding.text
    flat = gauges([[t, 2 / 99, 1, 0] for t in (0.5, 1.0)])
    finding = batching.conclude_blocks(batching.block_timeline([early], flat, 128, 100), 128)
    assert finding.verdict == NOT_SHOWN and "crossed no block boundary" in finding.text
    assert batching.conclude_blocks(batching.block_timeline([early], gauges([]), 128, 100), 128).verdict == NOT_SHOWN


def test_two_requests_add_their_blocks():
    a, b = stream(0.0, 0.1, 0.01, 300, prompt=100), stream(1.0, 1.05, 0.01, 30, prompt=100)
    t = 1.2  # a: 100 + 111 tokens (2 blocks), b: 100 + 16 (1 block)
    row = batching.block_timeline([a, b], gauges([[t, 3 / 99, 2, 0]]), 128, 100).iloc[0]
    assert row.requests == 2 and row.blocks_needed == 3 and row.match


def test_the_small_pool_is_sized_in_blocks_and_never_below_max_model_len():
    cache = {"num_gpu_blocks": 4096, "block_size": 128, "kv_cache_memory_bytes": 1 << 30}  # 256 KiB a block
    assert batching.small_pool_flags(cache, 6144, 4096) == {"--kv-cache-memory-bytes": 49 * 262144}
    assert batching.small_pool_flags(cache, 1000, 4096) == {"--kv-cache-memory-bytes": 33 * 262144}
    assert batching.small_pool_flags({**cache, "kv_cache_memory_bytes": None}, 6144, 4096) == {}


class FakeEngine:
    def __init__(self, args, reconfigurable=True):
        self._args, self.reconfigurable, self.applied = tuple(args), reconfigurable, []

    def args(self):
        return list(self._args)

    def config(self):
        return SimpleNamespace(args=self._args)

    def apply(self, config):
        self.applied.append(config.args)
        self._args = config.args


def test_apply_flags_restarts_once_and_only_when_something_changes(monkeypatch):
    import dataclasses

    monkeypatch.setattr(dataclasses, "replace", lambda config, args: SimpleNamespace(args=args))
    engine = FakeEngine(["--max-model-len", "4096", "--kv-cache-memory-bytes", "1073741824"])
    lab = SimpleNamespace(engine=engine)
    assert batching.apply_flags(lab, {"--kv-cache-memory-bytes": 1024, "--max-num-batched-tokens": 256})
    assert engine.applied == [("--max-model-len", "4096", "--kv-cache-memory-bytes", "1024",
                               "--max-num-batched-tokens", "256")]
    assert batching.apply_flags(lab, {"--max-num-batched-tokens": 256}) and len(engine.applied) == 1
    elsewhere = SimpleNamespace(engine=FakeEngine(["--max-model-len", "4096"], reconfigurable=False))
    assert not batching.apply_flags(elsewhere, {"--kv-cache-memory-bytes": 1024})


def preemption(preemptions, need_tokens=2000, n=4, output=200, complete=True, num_blocks=49):
    streams = [stream(0.0, 0.1, 0.01, output if complete or i else output - 50, prompt=need_tokens - output)
               for i in range(n)]
    g = gauges([[0.5, 0.6, 4, 0], [1.0, 1.0, 3, 1]])
    return batching.PreemptionResult(streams, g, preemptions, 128, num_blocks, output)


def test_preemption_shown_when_the_pool_ran_out_and_every_request_finished():
    finding = batching.conclude_preemption(preemption(2.0))
    assert finding.verdict == SHOWN
    assert "4 requests needing 64 blocks" in finding.text and "pool of 48 usable blocks" in finding.text
    assert "preempted 2 time(s)" in finding.text and "KV usage peaked at 100% with up to 1" in finding.text


@pytest.mark.parametrize("result, reason", [
    (preemption(0.0), "whole prompt fits"),
    (preemption(0.0, num_blocks=100), "they fit in the pool"),
    (preemption(1.0, complete=False), "did not finish"),
    (preemption(None), "does not expose the counter"),
    (None, "not measured"),
])
def test_preemption_not_shown_says_why(result, reason):
    finding = batching.conclude_preemption(result)
    assert finding.verdict == NOT_SHOWN and reason in finding.text


def test_the_stall_runs_carry_the_small_pool_on_the_restarted_config_and_can_stay_there(monkeypatch):
    import dataclasses

    from helpers.core.settings import load_settings
    from helpers.core.vllm_args import flag_value
    from helpers.lessons.l03 import interference

    monkeypatch.setattr(dataclasses, "replace", lambda config, args: SimpleNamespace(args=args))
    seen = []
    monkeypatch.setattr(interference, "measure_prefill_stall",
                        lambda lab, *a, **k: seen.append(tuple(lab.engine.args())) or "run")
    start = ["--max-model-len", "4096", "--kv-cache-memory-bytes", "1073741824"]
    lab = SimpleNamespace(settings=load_settings({}), engine=FakeEngine(start))
    pool = {"--kv-cache-memory-bytes": 12845056}
    interference.measure_stall_configs(lab, {"own": None, "small": 256}, 2, 100, rounds=2, also=pool, restore=False)
    assert [flag_value(a, "--kv-cache-memory-bytes") for a in seen] == ["1073741824", "12845056"] * 2
    assert [flag_value(a, "--max-num-batched-tokens") for a in seen] == [None, "256"] * 2
    assert flag_value(lab.engine.args(), "--kv-cache-memory-bytes") == "12845056"  # stays for the next section
    lab = SimpleNamespace(settings=load_settings({}), engine=FakeEngine(start))
    interference.measure_stall_configs(lab, {"own": None, "small": 256}, 2, 100, also=pool)
    assert lab.engine.args() == start and len(lab.engine.applied) == 2  # one restart there, one back


def test_a_request_that_just_ended_may_or_may_not_still_hold_its_blocks_in_a_lagging_sample():
    a, b = stream(0.0, 0.1, 0.01, 300, prompt=100), stream(0.2, 0.25, 0.01, 10, prompt=100)  # b ends at 0.34 s
    t = 0.45  # a: 100 + 36 tokens (2 blocks); b ended 0.11 s ago: the gauge may still count its block, or not
    for used in (2, 3):
        row = batching.block_timeline([a, b], gauges([[t, used / 99, 1, 0]]), 128, 100).iloc[0]
        assert row.match and row.blocks_low == 1 and row.blocks_high == 3  # low: a at 0.20 s, 111 tokens
    assert not batching.block_timeline([a, b], gauges([[t, 4 / 99, 1, 0]]), 128, 100).iloc[0].match
