"""``workshop record`` then ``workshop bench --replay`` against the real engine (the suite's shared one: no start of
its own): the replay reproduces the recorded session's order, token counts and think time. The kit's tools answer
at once, so the recording holds each tool result back for TOOL_DELAY_S, or no think time would be exercised."""

from __future__ import annotations

import argparse
import json

import pytest

from helpers.cli import bench as bench_cli
from helpers.evals.record import record_sessions
from helpers.measure import replay as rp

pytestmark = pytest.mark.engine
TOOL_DELAY_S = 0.5
QUESTION = "What's the weather in Paris?"  # one tool call, then the answer: two turns (test_engine_integration)


def run_cli(argv):
    parser = argparse.ArgumentParser(prog="workshop")
    bench_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_bench_replay_reproduces_a_recorded_sessions_order_token_counts_and_think_time(shared_engine, tmp_path,
                                                                                       capsys):
    with shared_engine.use() as lab:
        recording = record_sessions(lab, [QUESTION], tool_delay_s=TOOL_DELAY_S)
        path = rp.write_recording(recording, tmp_path / "sessions.jsonl")
        (session,) = rp.read_recording(path).sessions
        assert len(session.turns) >= 2 and session.turns[0].tool_calls >= 1
        assert session.turns[1].think_time_s >= TOOL_DELAY_S
        runs = {}
        for name, flags in (("verbatim", ["--copies", "1", "--no-salt"]), ("salted", ["--copies", "2"])):
            out = tmp_path / f"{name}.jsonl"
            code = run_cli(["bench", "--replay", str(path), *flags, "--slo", "ttft_ms=60000", "--json", str(out)])
            printed = capsys.readouterr()
            assert code == 0, printed.err
            (runs[name],) = [json.loads(line) for line in out.read_text().splitlines()]
    recorded = [(t.turn, t.prompt_tokens, t.completion_tokens, t.think_time_s) for t in session.turns]
    verbatim = runs["verbatim"]["turns"]
    assert [r["turn"] for r in verbatim] == [t for t, *_ in recorded]  # the session's order
    assert [(r["prompt_tokens"], r["completion_tokens"]) for r in verbatim] == [(p, c) for _, p, c, _ in recorded]
    for row, (_, _, _, think) in zip(verbatim[1:], recorded[1:]):  # each turn after the previous answer + think time
        assert row["think_time_s"] == pytest.approx(think) and row["gap_s"] >= think
    salted = runs["salted"]["turns"]
    assert sorted(r["copy"] for r in salted) == sorted([0, 1] * len(recorded))
    for copy in (0, 1):
        rows = [r for r in salted if r["copy"] == copy]
        assert [r["turn"] for r in rows] == [t for t, *_ in recorded]
        assert [r["completion_tokens"] for r in rows] == [c for _, _, c, _ in recorded]
        extra = {r["prompt_tokens"] - p for r, (_, p, _, _) in zip(rows, recorded)}
        assert len(extra) == 1 and extra.pop() > 0  # the salt: the same few tokens on every turn of a copy
    assert runs["salted"]["replay_completed_sessions"] == 2 and runs["salted"]["replay_good_sessions"] == 2


def test_a_lengths_only_recording_keeps_no_text_and_replays_the_prompt_lengths(shared_engine, tmp_path):
    with shared_engine.use() as lab:
        recording = record_sessions(lab, [QUESTION], content="lengths", tool_delay_s=0.1, block_tokens=16)
        path = rp.write_recording(recording, tmp_path / "lengths.jsonl")
        assert "Paris" not in path.read_text() and "get_weather" not in path.read_text()
        (session,) = rp.read_recording(path).sessions
        for turn in session.turns:  # the engine's /tokenize (template and tools included) agrees with its usage
            assert len(turn.hash_ids) == -(-turn.prompt_tokens // 16)
        assert session.turns[1].hash_ids[:len(session.turns[0].hash_ids) - 1] == session.turns[0].hash_ids[:-1]
        result = rp.replay(lab.settings, path, copies=2)
    frame = result.turns_frame()
    assert frame["ok"].all() and not result.failures
    assert (frame["prompt_tokens"] == frame["recorded_prompt_tokens"]).all()
    assert (frame["completion_tokens"] == frame["recorded_completion_tokens"]).all()
