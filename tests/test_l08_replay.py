"""Notebook 08's "your own agent as load" (helpers/lessons/l08_tuning/replay.py): its pure figures (requests in flight, the
per-copy pairs, the recording's think time), each conclusion on numbers that go both ways, the command it prints
(parsed by the real CLI), and the side-by-side run against the in-process fake of vLLM."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pandas as pd
import pytest
from fake_vllm import MODEL, FakeVllm

from helpers.cli import bench as bench_cli
from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE
from helpers.core.settings import load_settings
from helpers.lessons.l08_tuning import replay as lr
from helpers.measure import replay as rp


def table(replay_hits=(0.8, 0.9), synthetic_hits=(0.0, 0.05), replay_flight=(1.5, 5.0), synthetic_flight=(3.0, 12.0),
          replay_speed=(50.0, 150.0), synthetic_speed=(60.0, 200.0), replay_ttft=(20.0, 30.0),
          synthetic_ttft=(25.0, 60.0), users=(3, 12), prompts=(55.0, 400.0), block=16, caching=True):
    rows = []
    for kind, hits, flight, speed, ttft in ((lr.REPLAY, replay_hits, replay_flight, replay_speed, replay_ttft),
                                            (lr.SYNTHETIC, synthetic_hits, synthetic_flight, synthetic_speed,
                                             synthetic_ttft)):
        for i, u in enumerate(users):
            rows.append({"workload": kind, "users": u, "requests": 2 * u, "failed": 0, "prefix_cache_hit_rate": hits[i],
                         "output_tok_s": speed[i], "median_ttft_ms": ttft[i], "first_turn_ttft_ms": ttft[i],
                         "later_turn_ttft_ms": ttft[i] if kind == lr.REPLAY else None,
                         "first_turn_prompt_tokens": 200.0, "later_turn_prompt_tokens": 260.0 if kind == lr.REPLAY
                         else None, "mean_in_flight": flight[i], "duration_s": 4.0, "min_prompt_tokens": prompts[0],
                         "max_prompt_tokens": prompts[1], "block_tokens": block, "prefix_caching": caching})
    return pd.DataFrame(rows, columns=list(lr.COLUMNS))


def pairs(first, later, grow=60.0):
    return [{"users": 3, "first_ttft_ms": f, "later_ttft_ms": l_, "first_prompt_tokens": 200.0,
             "later_prompt_tokens": 200.0 + grow} for f, l_ in zip(first, later)]


# ---------------------------------------------------------------- figures

def test_in_flight_mean_is_the_summed_latency_over_the_duration():
    assert lr.in_flight_mean([(0.0, 2.0), (1.0, 3.0), (2.0, 2.5)], 4.0) == pytest.approx(4.5 / 4)
    assert lr.in_flight_mean([(0.0, 1.0)], 0.0) is None


def test_copy_pairs_take_each_copys_first_turn_and_the_median_of_its_later_turns():
    turns = pd.DataFrame([
        {"session": "s0", "copy": 0, "turn": 1, "ok": True, "ttft_ms": 40.0, "prompt_tokens": 100},
        {"session": "s0", "copy": 0, "turn": 2, "ok": True, "ttft_ms": 10.0, "prompt_tokens": 150},
        {"session": "s0", "copy": 0, "turn": 3, "ok": True, "ttft_ms": 30.0, "prompt_tokens": 170},
        {"session": "s1", "copy": 0, "turn": 1, "ok": True, "ttft_ms": 50.0, "prompt_tokens": 90},  # one turn only
        {"session": "s2", "copy": 1, "turn": 1, "ok": True, "ttft_ms": 45.0, "prompt_tokens": 95},
        {"session": "s2", "copy": 1, "turn": 2, "ok": False, "ttft_ms": None, "prompt_tokens": None},  # failed
    ])
    (pair,) = lr.copy_pairs(turns)
    assert pair == {"first_ttft_ms": 40.0, "later_ttft_ms": 20.0, "first_prompt_tokens": 100.0,
                    "later_prompt_tokens": 160.0}


def test_think_time_check_reads_the_later_turns_against_the_tool_delay():
    frame = pd.DataFrame({"turn": [1, 2, 1, 2], "think_time_s": [0.0, 0.52, 0.0, 0.61]})
    seen, detail = lr.think_time_check(frame, 0.5)
    assert seen is True and "2 later turn(s), think time 0.52-0.61 s" in detail
    assert lr.think_time_check(frame, 0.55)[0] is False
    seen, detail = lr.think_time_check(pd.DataFrame({"turn": [1], "think_time_s": [0.0]}), 0.5)
    assert seen is None and "was not measured" in detail  # a phrase tests/should_see_checks.py reads as lack of data


def test_the_synthetic_workload_has_the_recordings_mean_lengths_and_request_fields():
    t = [rp.Turn(1, 100, 10, 0.0, input=[], output=None), rp.Turn(2, 201, 31, 0.5, input=[], output=None)]
    rec = rp.Recording("full", [rp.Session("s0", t, request={"chat_template_kwargs": {"enable_thinking": False}})])
    w = lr.synthetic_workload(rec)
    assert (w.input_len, w.output_len) == (150, 20)
    assert w.extra_body == {"chat_template_kwargs": {"enable_thinking": False}}


def test_the_printed_replay_command_is_one_the_cli_accepts():
    parser = argparse.ArgumentParser(prog="workshop")
    bench_cli.register(parser.add_subparsers(dest="command", required=True))
    words = lr.replay_command("my-agent.jsonl", copies=3).split()
    assert words[:2] == ["workshop", "bench"]
    args = parser.parse_args(words[1:])
    assert (args.replay, args.copies, args.think_scale, args.slo) == ("my-agent.jsonl", "3", "1", "ttft_ms=2000")
    assert args.func is bench_cli.run_bench


# ---------------------------------------------------------------- conclusions, both ways

def test_prefix_conclusion_shown_only_when_the_replay_is_ahead_at_every_level():
    c = lr.prefix_conclusion(table())
    assert c.verdict == SHOWN and "3 users 80% vs 0%, 12 users 90% vs 5%" in c.text
    assert lr.prefix_conclusion(table(replay_hits=(0.8, 0.1))).verdict == NOT_SHOWN  # not ahead at 12 users
    # the reason, from the engine's cache config and the prompts' lengths
    short = lr.prefix_conclusion(table(replay_hits=(0.0, 0.0), prompts=(55.0, 136.0), block=128))
    assert short.verdict == NOT_SHOWN and "prompts (55-136 tokens) span one or two KV blocks of 128 tokens" in short.text
    off = lr.prefix_conclusion(table(replay_hits=(0.0, 0.0), caching=False))
    assert off.verdict == NOT_SHOWN and "prefix caching is off" in off.text
    long = lr.prefix_conclusion(table(replay_hits=(0.02, 0.03), prompts=(300.0, 900.0), block=16))
    assert long.verdict == NOT_SHOWN and "share too little" in long.text
    missing = lr.prefix_conclusion(table(synthetic_hits=(None, 0.0)))
    assert missing.verdict == WITHIN_NOISE and "nothing to compare" in missing.text


def test_later_turn_conclusion_is_a_sign_test_over_copies():
    t = table()
    faster = lr.later_turn_conclusion(pairs([50.0] * 8, [20.0] * 8), t)
    assert faster.verdict == SHOWN and "sooner in 8, later in 0" in faster.text and "+60 tokens longer" in faster.text
    assert "it is in the cache" in faster.text  # hit rates 80-90 %
    uncached = lr.later_turn_conclusion(pairs([50.0] * 8, [20.0] * 8), table(replay_hits=(0.0, 0.0)))
    assert uncached.verdict == SHOWN and "not the cache's doing here" in uncached.text
    assert "in the cache;" not in uncached.text
    slower = lr.later_turn_conclusion(pairs([20.0] * 8, [50.0] * 8), t)
    assert slower.verdict == NOT_SHOWN and "sooner in 0, later in 8" in slower.text
    mixed = lr.later_turn_conclusion(pairs([20.0, 50.0, 20.0, 50.0], [50.0, 20.0, 50.0, 20.0]), t)
    assert mixed.verdict == WITHIN_NOISE and "no difference beyond chance" in mixed.text
    few = lr.later_turn_conclusion(pairs([50.0] * 2, [20.0] * 2), t)  # two copies: p = 0.5, no verdict either way
    assert few.verdict == WITHIN_NOISE
    none = lr.later_turn_conclusion([], t)
    assert none.verdict == WITHIN_NOISE and "were not measured" in none.text


def test_load_conclusion_compares_requests_in_flight_at_the_same_users():
    c = lr.load_conclusion(table())
    assert c.verdict == SHOWN and "3 users 1.5 vs 3.0 (50 vs 60 output tok/s), 12 users 5.0 vs 12.0" in c.text
    assert lr.load_conclusion(table(replay_flight=(1.5, 12.0))).verdict == NOT_SHOWN


def test_knee_conclusion_says_which_sweep_saturated():
    neither = lr.knee_conclusion(table())
    assert "no knee within these levels" in neither.text and "this run places no knee" in neither.text
    # the synthetic one: x4 users, +5 % throughput, TTFT x4 -> a knee at 3 users; the replay keeps growing
    one = lr.knee_conclusion(table(synthetic_speed=(100.0, 105.0), synthetic_ttft=(20.0, 80.0)))
    assert "synthetic 100 -> 105 output tok/s over 3, 12 users (knee at 3 users)" in one.text
    assert "the agent's not within these levels" in one.text
    both = lr.knee_conclusion(table(synthetic_speed=(100.0, 105.0), synthetic_ttft=(20.0, 80.0),
                                    replay_speed=(50.0, 51.0), replay_ttft=(10.0, 50.0)))
    assert "The knee lies at 3 users for the agent and 3 for the synthetic workload" in both.text


def test_replay_conclusions_without_a_table_say_it_did_not_run():
    (only,) = lr.replay_conclusions(None, [])
    assert "not run" in only.text
    assert len(lr.replay_conclusions(table(), pairs([50.0] * 3, [20.0] * 3))) == 4


def test_side_by_side_view_puts_each_figure_of_both_workloads_in_one_row_per_users():
    view = lr.side_by_side_view(table())
    assert view.index.tolist() == [3, 12]
    assert "prefix_cache_hit_rate (replay)" in view and "prefix_cache_hit_rate (synthetic)" in view
    assert "later_turn_ttft_ms (replay)" in view and "later_turn_ttft_ms (synthetic)" not in view


# ---------------------------------------------------------------- the run, against the fake server

def test_side_by_side_interleaves_replay_and_synthetic_at_the_same_users(monkeypatch):
    server = FakeVllm(ttft_s=0.005, chunk_gap_s=0.001, metrics_text="").start()
    monkeypatch.setenv("VLLM_HOST", server.base_url)
    monkeypatch.setenv("MODEL_NAME", MODEL)
    try:
        system = {"role": "system", "content": "You are a helpful agent."}
        sessions = [rp.Session(sid, [rp.Turn(1, 40, 5, 0.0, input=[system, {"role": "user", "content": q}],
                                             output={"role": "assistant", "content": "calling"}),
                                     rp.Turn(2, 50, 4, 0.05, input=[{"role": "tool", "content": "result"}],
                                             output={"role": "assistant", "content": "done"})])
                    for sid, q in (("a", "weather in Paris?"), ("b", "what is 2+3?"))]
        lab = SimpleNamespace(settings=load_settings())
        frame, copies = lr.side_by_side(lab, rp.Recording("full", sessions, MODEL), [1, 2], progress=False)
    finally:
        server.stop()
    assert frame[["workload", "users"]].values.tolist() == [["replay", 2], ["synthetic", 2], ["replay", 4],
                                                             ["synthetic", 4]]
    assert frame["requests"].tolist() == [4, 4, 8, 8] and (frame["failed"] == 0).all()
    assert (frame["mean_in_flight"] <= frame["users"] + 1e-9).all()
    assert frame.loc[frame["workload"] == "replay", "later_turn_ttft_ms"].notna().all()
    assert frame.loc[frame["workload"] == "synthetic", "later_turn_ttft_ms"].isna().all()
    assert sorted(p["users"] for p in copies) == [2, 2, 4, 4, 4, 4]  # one pair per copy with a later turn
