"""The load generator against an in-process fake of vLLM's streaming chat endpoint (tests/fake_vllm.py)."""

from __future__ import annotations

import _thread
import asyncio
import signal
import statistics
import threading
import time

import pytest
from fake_vllm import MODEL, FakeVllm

from helpers.measure.bench_results import summarize
from helpers.measure.loadgen import arun_load, run_load, run_sweep
from helpers.measure.workloads import Load, LoadError, Workload, arrival_offsets
from helpers.core.settings import Settings


@pytest.fixture
def make_fake():
    servers: list[FakeVllm] = []

    def make(**kwargs) -> FakeVllm:
        server = FakeVllm(**kwargs).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


def settings_for(fake: FakeVllm) -> Settings:
    return Settings(profile="cpu", base_url=fake.base_url, model=MODEL, managed=False)


def user_contents(fake: FakeVllm) -> list[str]:
    return [p["messages"][0]["content"] for p in fake.chat_payloads]


def test_token_counts_come_from_the_servers_running_usage(make_fake):
    fake = make_fake(chunk_pattern=(1, 3, 2))
    result = run_load(settings_for(fake), Workload(input_len=80, output_len=10), Load(concurrency=2, num_requests=4))
    assert len(result.requests) == 4 and all(r.timing.ok for r in result.requests)
    for r in result.requests:
        t = r.timing
        assert t.completion_tokens == 10
        assert t.chunk_tokens == [1, 3, 2, 1, 3]  # multi-token chunks counted by the server, not as one each
        assert t.prompt_tokens == 80  # the prompt was built to the target with /tokenize
        assert t.usage == {"prompt_tokens": 80, "total_tokens": 90, "completion_tokens": 10}
        assert t.t_first_byte < t.t_first_token  # the role-only chunk is not a token
        assert t.finish_reason == "length"
    sent = fake.chat_payloads[0]
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert sent["min_tokens"] == 10 and sent["max_tokens"] == 10 and sent["ignore_eos"] is True
    assert result.prompt_len_method == "tokenize"


def test_the_request_vllm_bench_serve_sends_is_one_option_away(make_fake):
    fake = make_fake()
    run_load(settings_for(fake), Workload(input_len=80, output_len=10, min_tokens=False, usage_per_chunk=False),
             Load(concurrency=1, num_requests=1))
    sent = fake.chat_payloads[0]
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["ignore_eos"] is True and sent["max_tokens"] == 10 and "min_tokens" not in sent


def test_without_continuous_usage_the_final_count_wins_without_a_fake_chunk(make_fake):
    fake = make_fake(chunk_pattern=(1, 3, 2), continuous_usage=False)
    result = run_load(settings_for(fake), Workload(input_len=80, output_len=10), Load(concurrency=1, num_requests=1))
    t = result.requests[0].timing
    assert t.completion_tokens == 10  # from the last usage chunk
    assert len(t.chunk_times) == 5  # five token chunks arrived; none invented for the usage chunk
    assert t.tpot_s == pytest.approx((t.chunk_times[-1] - t.chunk_times[0]) / 9)


def test_a_request_ends_at_its_last_chunk_with_choices_as_in_vllm_bench_serve(make_fake):
    fake = make_fake(chunk_pattern=(1, 3, 2), chunk_gap_s=0.01, continuous_usage=False)
    result = run_load(settings_for(fake), Workload(input_len=80, output_len=10, min_tokens=False,
                                                   usage_per_chunk=False), Load(concurrency=2, num_requests=4))
    summary = summarize(result)
    for r in result.requests:
        # the fake finishes on the last token's chunk; the usage-only chunk and [DONE] come 10 ms later
        assert r.choice_times[-1] == r.timing.chunk_times[-1] < r.timing.t_done
    latencies = [r.choice_times[-1] - r.timing.t_sent for r in result.requests]
    tpots = [(e - r.timing.ttft_s) / 9 for e, r in zip(latencies, result.requests)]
    assert summary["mean_e2el_ms"] == pytest.approx(1000 * statistics.mean(latencies))
    assert summary["mean_tpot_ms"] == pytest.approx(1000 * statistics.mean(tpots))
    # ITL as vLLM's: the role-only chunk counts as a chunk, so each request has one gap more than token chunks
    for r in result.requests:
        assert len(r.choice_times) == len(r.timing.chunk_times) + 1 and r.choice_times[0] < r.timing.t_first_token
    gaps = [b - a for r in result.requests for a, b in zip(r.choice_times, r.choice_times[1:])]
    assert summary["mean_itl_ms"] == pytest.approx(1000 * statistics.mean(gaps))


def test_reasoning_tokens_count_for_ttft_but_not_ttfot(make_fake):
    fake = make_fake(reasoning_tokens=3, chunk_gap_s=0.01)
    result = run_load(settings_for(fake), Workload(input_len=60, output_len=6), Load(concurrency=1, num_requests=1))
    t = result.requests[0].timing
    assert t.ttft_s is not None and t.ttfot_s is not None
    assert t.ttfot_s - t.ttft_s >= 0.02  # three 10 ms gaps of reasoning before visible content
    assert t.tool_call_text.startswith("tok")  # the reasoning channel


def test_dropped_streams_are_kept_as_failures_and_left_out_of_the_statistics(make_fake):
    fake = make_fake(drop_every=3, drop_after_chunks=2)
    result = run_load(settings_for(fake), Workload(input_len=60, output_len=8), Load(concurrency=3, num_requests=9))
    failed = [r for r in result.requests if not r.timing.ok]
    assert len(result.requests) == 9 and len(failed) == 3
    assert all("ClientPayloadError" in r.timing.error for r in failed)  # the stream broke off
    assert all(r.timing.completion_tokens == 2 for r in failed)  # partial tokens, not counted below
    summary = summarize(result)
    assert summary["completed"] == 6 and summary["failed"] == 3
    assert summary["total_output_tokens"] == 6 * 8
    assert summary["total_input_tokens"] == 6 * 60
    assert sum(summary["error_counts"].values()) == 3
    assert not result.interrupted


def test_closed_loop_holds_the_concurrency_and_warmup_is_not_counted(make_fake):
    fake = make_fake(ttft_s=0.02)
    result = run_load(settings_for(fake), Workload(input_len=60, output_len=4),
                      Load(concurrency=3, num_requests=9, warmup_requests=2))
    assert len(result.requests) == 9 and len(result.warmup) == 2
    assert len(fake.chat_payloads) == 11
    assert fake.max_inflight == 3 and result.max_inflight == 3
    assert result.t_start >= max(r.timing.t_done for r in result.warmup)


def test_open_loop_cap_shows_up_as_client_queue_time(make_fake):
    fake = make_fake(ttft_s=0.02)
    result = run_load(settings_for(fake), Workload(input_len=60, output_len=2),
                      Load(rate=1000.0, max_concurrency=1, num_requests=5))
    assert fake.max_inflight == 1
    queue = [r.timing.client_queue_s for r in sorted(result.requests, key=lambda r: r.timing.t_scheduled)]
    e2e = [r.timing.e2e_s for r in result.requests]
    # all five arrive within a few ms; each waits for those before it to finish
    assert queue[-1] > 2 * statistics.median(e2e)
    assert queue[-1] > queue[1]
    summary = summarize(result)
    assert summary["median_e2el_including_client_queue_ms"] > summary["median_e2el_ms"]


def test_poisson_and_gamma_arrival_schedules():
    gaps = lambda offsets: [b - a for a, b in zip(offsets, offsets[1:])]  # noqa: E731
    poisson = gaps(arrival_offsets(rate=50.0, burstiness=1.0, seed=1, n=20000))
    assert statistics.mean(poisson) == pytest.approx(1 / 50, rel=0.03)
    assert statistics.stdev(poisson) / statistics.mean(poisson) == pytest.approx(1.0, rel=0.05)  # exponential
    regular = gaps(arrival_offsets(rate=50.0, burstiness=4.0, seed=1, n=20000))
    assert statistics.mean(regular) == pytest.approx(1 / 50, rel=0.03)
    assert statistics.stdev(regular) / statistics.mean(regular) == pytest.approx(0.5, rel=0.05)  # 1/sqrt(shape)
    assert arrival_offsets(rate=10.0, n=3)[0] == 0.0
    assert all(t < 1.0 for t in arrival_offsets(rate=10.0, duration_s=1.0))


def test_open_loop_sends_exactly_the_poisson_arrivals_of_its_duration(make_fake):
    fake = make_fake()
    workload = Workload(input_len=60, output_len=2, seed=7)
    result = run_load(settings_for(fake), workload, Load(rate=80.0, duration_s=0.3))
    expected = arrival_offsets(rate=80.0, burstiness=1.0, seed=7, duration_s=0.3)
    assert len(result.requests) == len(expected) > 5
    planned = sorted(r.timing.t_scheduled - result.t_start for r in result.requests)
    assert planned == pytest.approx(expected, abs=1e-9)
    by_count = run_load(settings_for(fake), workload, Load(rate=200.0, num_requests=7))
    assert len(by_count.requests) == 7


def test_prompts_hit_the_target_length_and_never_share_a_first_block(make_fake):
    fake = make_fake()
    result = run_load(settings_for(fake), Workload(input_len=(60, 120), output_len=2, seed=3),
                      Load(concurrency=4, num_requests=12))
    assert all(r.timing.prompt_tokens == r.input_len_target for r in result.requests)
    assert len({r.input_len_target for r in result.requests}) > 1  # a range was drawn
    firsts = {tuple(c.split()[:16]) for c in user_contents(fake)}
    assert len(firsts) == 12  # no two prompts share their first 16 tokens
    before = set(user_contents(fake))
    run_load(settings_for(fake), Workload(input_len=60, output_len=2, seed=3), Load(concurrency=1, num_requests=2))
    assert not before & set(user_contents(fake)[12:])  # another run, another salt


def test_shared_prefix_workload(make_fake):
    fake = make_fake()
    workload = Workload(input_len=80, output_len=2, prefix="shared", shared_prefix_len=30)
    result = run_load(settings_for(fake), workload, Load(concurrency=2, num_requests=6))
    assert all(r.timing.prompt_tokens == 80 for r in result.requests)
    contents = [c.split() for c in user_contents(fake)]
    assert len({tuple(c[:31]) for c in contents}) == 1  # marker + 30 shared tokens
    assert len({tuple(c[:40]) for c in contents}) == 6  # then each request is its own


def test_multi_turn_conversations_grow_each_turn(make_fake):
    fake = make_fake()
    workload = Workload(input_len=60, output_len=5, turns=3, turn_len=10)
    result = run_load(settings_for(fake), workload, Load(concurrency=2, num_requests=6))
    assert sorted(r.turn for r in result.requests) == [1, 1, 2, 2, 3, 3]
    assert sorted(len(p["messages"]) for p in fake.chat_payloads) == [1, 1, 3, 3, 5, 5]
    for conv in {r.conversation for r in result.requests}:
        turns = sorted((r for r in result.requests if r.conversation == conv), key=lambda r: r.turn)
        prompts = [r.timing.prompt_tokens for r in turns]
        assert prompts[0] == 60 and prompts[0] < prompts[1] < prompts[2]
        assert turns[1].input_len_target is None  # later turns are not sized exactly
    assistant = [m for p in fake.chat_payloads for m in p["messages"] if m["role"] == "assistant"]
    assert assistant and all(m["content"] == "tok " * 5 for m in assistant)  # the reply is sent back


def test_without_tokenize_the_prompt_length_is_flagged_approximate(make_fake):
    fake = make_fake(tokenize=False)
    with pytest.warns(UserWarning, match="approximate"):
        result = run_load(settings_for(fake), Workload(input_len=60, output_len=2), Load(concurrency=1, num_requests=2))
    assert result.prompt_len_method == "approx"
    assert summarize(result)["prompt_len_method"] == "approx"
    assert all(r.timing.ok for r in result.requests)


def test_cancelling_the_task_returns_partial_results(make_fake):
    fake = make_fake(chunk_gap_s=0.01)

    async def main():
        task = asyncio.ensure_future(arun_load(settings_for(fake), Workload(input_len=60, output_len=15),
                                               Load(concurrency=2, num_requests=100)))
        while fake.finished < 4:
            await asyncio.sleep(0.01)
        task.cancel()
        return await task

    result = asyncio.run(main())
    assert result.interrupted and "interrupted" in result.stop_reason
    # the server finished 4; at most 2 (the concurrency) may still have been read by the client
    assert 2 <= len(result.completed) < 100
    assert any(r.cancelled for r in result.requests)
    summary = summarize(result)
    assert summary["completed"] == len(result.completed) and summary["failed"] == 0
    assert summary["cancelled"] >= 1 and summary["interrupted"] is True


@pytest.fixture
def ctrl_c_handled():
    """Python's own Ctrl-C handler, as a terminal's or a Jupyter kernel's Python has it: a Python that a
    non-interactive shell starts in the background inherits SIGINT ignored, and interrupt_main() then does nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_in_the_sync_wrapper_returns_partial_results(make_fake, ctrl_c_handled):
    fake = make_fake(chunk_gap_s=0.01)

    def interrupt_when_some_finished():
        deadline = time.monotonic() + 60
        while fake.finished < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        _thread.interrupt_main()  # what Ctrl-C (or Jupyter's interrupt) does

    threading.Thread(target=interrupt_when_some_finished, daemon=True).start()
    # far more requests than can finish before the interrupt (about a minute of them), on a busy machine too
    result = run_load(settings_for(fake), Workload(input_len=60, output_len=15), Load(concurrency=2, num_requests=1000))
    assert result.interrupted
    assert 2 <= len(result.completed) < 1000


def test_a_dying_server_ends_the_run_with_what_was_gathered(make_fake):
    fake = make_fake(die_after=3)
    result = run_load(settings_for(fake), Workload(input_len=60, output_len=4),
                      Load(concurrency=1, num_requests=50), max_consecutive_failures=5)
    assert result.interrupted and "in a row" in result.stop_reason
    assert 2 <= len(result.completed) <= 3
    assert len(result.failed) == 5  # one at a time: exactly the five failures in a row
    assert len(result.requests) < 50


def test_sync_wrapper_works_inside_a_running_event_loop(make_fake):
    fake = make_fake()

    async def notebook_cell():  # Jupyter runs cells inside an event loop
        return run_load(settings_for(fake), Workload(input_len=60, output_len=2), Load(concurrency=1, num_requests=2))

    result = asyncio.run(notebook_cell())
    assert len(result.completed) == 2


def test_client_loop_lag_is_measured(make_fake):
    fake = make_fake(chunk_gap_s=0.01)
    result = run_load(settings_for(fake), Workload(input_len=60, output_len=5), Load(concurrency=2, num_requests=4),
                      lag_interval_s=0.005)
    assert len(result.loop_lag_s) >= 3 and min(result.loop_lag_s) >= 0
    summary = summarize(result)
    assert summary["client_loop_lag_max_ms"] >= summary["client_loop_lag_mean_ms"] >= 0


def test_sweep_runs_each_concurrency_with_its_own_prompts(make_fake):
    fake = make_fake()
    results = run_sweep(settings_for(fake), Workload(input_len=60, output_len=3), concurrencies=[1, 3],
                        load=Load(num_requests=6))
    assert [r.load.concurrency for r in results] == [1, 3]
    assert len(set(user_contents(fake))) == 12
    assert results[0].gauges is None  # no metrics asked for


def test_bad_loads_and_workloads_say_what_to_change(make_fake):
    with pytest.raises(ValueError, match="bound the run"):
        Load(concurrency=1).validate()
    with pytest.raises(ValueError, match="not both"):
        Load(concurrency=2, rate=1.0, num_requests=1).validate()
    with pytest.raises(ValueError, match="max_concurrency"):
        Load(concurrency=2, max_concurrency=2, num_requests=1).validate()
    with pytest.raises(ValueError, match="shared_prefix_len"):
        Workload(prefix="shared").validate()
    fake = make_fake()
    with pytest.raises(LoadError, match="too short"):
        run_load(settings_for(fake), Workload(input_len=12, output_len=2), Load(concurrency=1, num_requests=1))
    unreachable = Settings(profile="cpu", base_url="http://127.0.0.1:1/v1", model=MODEL, managed=False)
    with pytest.raises(LoadError, match="Cannot reach"):
        run_load(unreachable, Workload(), Load(concurrency=1, num_requests=1))


def test_given_prompts_are_sent_as_they_are_and_the_model_may_stop(make_fake):
    fake = make_fake()
    prompts = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": "weather in Paris?"}],
               [{"role": "user", "content": "time in Tokyo?"}]]
    workload = Workload(output_len=16, exact_output=False, prompts=prompts, extra_body={"tools": [{"type": "function"}]})
    result = run_load(settings_for(fake), workload, Load(concurrency=1, num_requests=4))
    assert [p["messages"] for p in fake.chat_payloads] == [prompts[0], prompts[1], prompts[0], prompts[1]]
    assert all("ignore_eos" not in p and p["max_tokens"] == 16 and p["tools"] for p in fake.chat_payloads)
    assert all(r.input_len_target is None for r in result.requests)
    with pytest.raises(ValueError, match="non-empty"):
        Workload(prompts=[]).validate()
    with pytest.raises(ValueError, match="shared prefix"):
        Workload(prompts=prompts, prefix="shared", shared_prefix_len=8).validate()
