"""The agent's sessions recorded (evals/record.py) and replayed as load (measure/replay.py, ``workshop bench --replay``):
the file format and its refusals, salting, block ids, the schedule against the in-process fake of vLLM (order,
forced lengths, think time, session headers, copies at once) and a session that fails mid-replay.
(The real engine: test_replay_engine.py.)"""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import pytest
from fake_vllm import MODEL, FakeVllm, chat_tokens

from helpers.cli import bench as bench_cli
from helpers.core.settings import load_settings
from helpers.evals.record import RecordingLab, record_sessions, session_from_run, without_content
from helpers.evals.agent import run_agent
from helpers.measure import replay as rp


# ---------------------------------------------------------------- a scripted agent to record

from fakes import ToolCall, reply


class ScriptedLab:
    """Answers each chat call with the next reply of the script."""

    model = "scripted"

    def __init__(self, *replies):
        self.replies = list(replies)

    def chat(self, messages, **kwargs):
        return self.replies.pop(0)


def weather_script():
    call = ToolCall(id="call-1", function=SimpleNamespace(name="get_weather", arguments=json.dumps({"city": "Paris"})))
    return ScriptedLab(reply(calls=[call], prompt_tokens=120, completion_tokens=17),
                       reply("It is 18 C in Paris.", prompt_tokens=160, completion_tokens=9))


def recorded(tool_delay_s=0.05):
    return record_sessions(weather_script(), ["What's the weather in Paris?"], tool_delay_s=tool_delay_s)


def turn(n, think, inp, out, prompt=50, completion=5):
    return rp.Turn(n, prompt, completion, think, input=inp, output=out)


def two_sessions(think=0.2):
    system = {"role": "system", "content": "You are a helpful agent."}
    sessions = []
    for sid, question in (("a", "weather in Paris?"), ("b", "what is 2+3?")):
        sessions.append(rp.Session(sid, [
            turn(1, 0.0, [system, {"role": "user", "content": question}], {"role": "assistant", "content": "calling"},
                 completion=6),
            turn(2, think, [{"role": "tool", "content": "result"}], {"role": "assistant", "content": "done"},
                 completion=4),
            turn(3, think, [{"role": "user", "content": "thanks"}], {"role": "assistant", "content": "welcome"},
                 completion=3)],
            request={"chat_template_kwargs": {"enable_thinking": False}}))
    return rp.Recording("full", sessions, MODEL)


# ---------------------------------------------------------------- recording and the file

def test_recording_keeps_the_history_the_token_counts_and_the_think_time_and_reads_back(tmp_path):
    rec = recorded(tool_delay_s=0.05)
    (session,) = rec.sessions
    first, second = session.turns
    assert (first.prompt_tokens, first.completion_tokens, second.prompt_tokens, second.completion_tokens) == \
        (120, 17, 160, 9)
    assert first.think_time_s == 0 and second.think_time_s >= 0.05  # the injected tool delay is think time
    assert first.tool_calls == 1 and second.tool_calls == 0
    assert first.input == [{"role": "user", "content": "What's the weather in Paris?"}]
    assert first.output["tool_calls"][0]["function"]["name"] == "get_weather"
    assert second.input[0]["role"] == "tool" and json.loads(second.input[0]["content"])["city"] == "Paris"
    assert session.tools and session.tools[0]["function"]["name"] == "get_weather"
    assert session.request == {"chat_template_kwargs": {"enable_thinking": False}}
    flat, ends = session.history()
    assert ends == [1, 3] and flat[1] == first.output and flat[-1] == {"role": "assistant",
                                                                       "content": "It is 18 C in Paris."}
    path = rp.write_recording(rec, tmp_path / "s.jsonl")
    header = json.loads(path.read_text().splitlines()[0])
    assert header["format"] == rp.FORMAT and header["version"] == rp.VERSION and header["content"] == "full"
    back = rp.read_recording(path)
    assert [s.to_json() for s in back.sessions] == [s.to_json() for s in rec.sessions]


def test_the_recorder_refuses_a_run_whose_history_is_not_what_it_sent():
    lab = RecordingLab(weather_script())
    run = run_agent(lab, "What's the weather in Paris?")
    run.messages[0] = {"role": "user", "content": "something else"}
    with pytest.raises(rp.RecordingError, match="not what it sent"):
        session_from_run("s0", run, lab.calls)


def _write_lines(path, lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize("edit, message", [
    (lambda h, s: h.update(version=2), "version is 2, this kit reads version 1"),
    (lambda h, s: h.update(format="mooncake"), "format is 'mooncake'"),
    (lambda h, s: h.pop("content"), "line 1 (the header) has no 'content' field"),
    (lambda h, s: s["turns"][1].pop("completion_tokens"), "line 2 (session 's0', turn 2) has no 'completion_tokens'"),
    (lambda h, s: s["turns"][0].pop("think_time_s"), "turn 1) has no 'think_time_s'"),
    (lambda h, s: s["turns"][0].update(prompt_tokens="many"), "'prompt_tokens' is 'many'"),
    (lambda h, s: s["turns"][0].update(turn=2), "numbered 1, 2, ..."),
    (lambda h, s: s.pop("session"), "line 2 has no 'session' field"),
    (lambda h, s: (h.update(content="lengths", block_tokens=16)), "has no 'hash_ids' field"),
])
def test_a_file_from_another_version_or_with_a_field_missing_is_refused_with_the_field_named(tmp_path, edit, message):
    path = rp.write_recording(recorded(0), tmp_path / "s.jsonl")
    header, session = [json.loads(line) for line in path.read_text().splitlines()]
    edit(header, session)
    with pytest.raises(rp.RecordingError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        rp.read_recording(_write_lines(path, [header, session]))


def test_files_that_are_not_recordings_are_refused_in_one_sentence(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    for name, message in (("empty.jsonl", "is empty"), ("bad.jsonl", "line 1 is not JSON"),
                          ("missing.jsonl", "cannot read")):
        with pytest.raises(rp.RecordingError, match=message):
            rp.read_recording(tmp_path / name)
    header = rp.Recording("full", [], MODEL).header()
    with pytest.raises(rp.RecordingError, match="no session"):
        rp.read_recording(_write_lines(tmp_path / "h.jsonl", [header]))


# ---------------------------------------------------------------- block ids and the lengths-only recording

def test_block_ids_name_a_block_with_everything_before_it():
    a, b, c = rp.block_hash_ids([[1, 2, 3, 4, 5], [1, 2, 3, 4, 9, 9], [0, 2, 3, 4, 5]], block_tokens=2)
    assert a[:2] == b[:2] and a[2] != b[2]  # the same first four tokens: the same first two blocks
    assert len(a) == 3 and len(b) == 3  # a partial last block has its id too
    assert not set(c) & set(a)  # the same tokens after another first token are other blocks
    assert sorted(set(a + b + c)) == list(range(len(set(a + b + c))))  # numbered 0, 1, ... in first-seen order


def fake_tokenize(messages, tools, request):
    """Token ids for the fake: one per character of the rendered messages (a prefix stays a prefix)."""
    text = "".join(f"<{m['role']}>{m.get('content') or ''}" for m in messages) + "<assistant>"
    return [ord(ch) for ch in text]


def test_the_lengths_only_recording_keeps_no_text_but_the_shared_prefix(tmp_path):
    rec = without_content(two_sessions(), fake_tokenize, block_tokens=8)
    path = rp.write_recording(rec, tmp_path / "lengths.jsonl")
    text = path.read_text()
    for secret in ("weather", "Paris", "helpful", "thanks", "welcome"):
        assert secret not in text
    back = rp.read_recording(path)
    assert back.content == "lengths" and back.block_tokens == 8
    a, b = back.sessions
    assert a.turns[1].hash_ids[:len(a.turns[0].hash_ids) - 1] == a.turns[0].hash_ids[:-1]  # turn 2 extends turn 1
    shared = rp.shared_block_ids(back)
    assert shared and set(a.turns[0].hash_ids[:2]) <= shared  # the system prompt, shared by both sessions
    assert a.turns[0].hash_ids[-1] not in shared
    assert [t.prompt_tokens for t in a.turns] == [50, 50, 50]  # the server's counts, kept


# ---------------------------------------------------------------- salting

def test_copies_are_salted_at_the_first_message_no_other_session_shares():
    rec = two_sessions()
    assert rp.private_message_index(rec) == {"a": 1, "b": 1}  # the system message is shared; the question not
    session = rec.sessions[0]
    c0, c1 = (rp.plan_copy(rec, session, c, MODEL, run_salt=0xABC) for c in (0, 1))
    first0, first1 = c0[0].body["messages"], c1[0].body["messages"]
    assert first0[0] == first1[0] == session.turns[0].input[0]  # shared in the recording: shared in the replay
    assert first0[1]["content"] != first1[1]["content"]
    assert first0[1]["content"] == rp.salt_text(0xABC, 0) + "weather in Paris?"
    assert c0[2].body["messages"][:2] == first0  # each copy keeps its own prefix across its turns
    plain = rp.plan_copy(rec, session, 0, MODEL, run_salt=None)
    assert plain[2].body["messages"] == session.history()[0][:6]  # unsalted: the recording verbatim
    assert session.turns[0].input[1]["content"] == "weather in Paris?"  # the recording itself is untouched


def test_the_planned_requests_force_the_recorded_lengths_and_scale_the_think_time():
    rec = two_sessions(think=0.4)
    turns = rp.plan_copy(rec, rec.sessions[1], 0, MODEL, think_scale=0.5, run_salt=1)
    assert [p.turn for p in turns] == [1, 2, 3] and [p.think_s for p in turns] == [0.0, 0.2, 0.2]
    for p, n in zip(turns, (6, 4, 3)):
        assert (p.body["max_tokens"], p.body["min_tokens"], p.body["ignore_eos"]) == (n, n, True)
        assert p.body["chat_template_kwargs"] == {"enable_thinking": False} and p.body["stream"] is True
    assert [len(p.body["messages"]) for p in turns] == [2, 4, 6]


# ---------------------------------------------------------------- the replay against the fake server

@pytest.fixture
def fake(monkeypatch):
    server = FakeVllm(ttft_s=0.005, chunk_gap_s=0.001).start()
    monkeypatch.setenv("VLLM_HOST", server.base_url)
    monkeypatch.setenv("MODEL_NAME", MODEL)
    yield server
    server.stop()


def test_replay_keeps_each_sessions_order_lengths_think_time_and_session_header(fake):
    rec = two_sessions(think=0.2)
    result = rp.replay(load_settings(), rec, copies=3, think_scale=0.5, run_salt=7)
    frame = result.turns_frame()
    assert len(frame) == 2 * 3 * 3 and frame["ok"].all() and not result.failures
    for (sid, c), rows in frame.groupby(["session", "copy"]):
        assert rows["turn"].tolist() == [1, 2, 3]  # in order
        assert rows["completion_tokens"].tolist() == rows["recorded_completion_tokens"].tolist() == [6, 4, 3]
        assert rows["gap_s"].iloc[1:].ge(0.1).all()  # think time 0.2 s x 0.5 after the previous answer
    headers = [h["x-session-id"] for h in fake.chat_headers]
    assert len(set(headers)) == 6 and all(headers.count(h) == 3 for h in headers)  # one id per copy, every turn
    assert fake.max_inflight >= 6  # the copies run at once
    firsts = {json.dumps(p["messages"][:2]) for p in fake.chat_payloads if len(p["messages"]) == 2}
    assert len(firsts) == 6  # no two copies share a first question
    # the fake's prompt count of what was sent: the recorded history plus one salt per copy
    sent = [p for p in fake.chat_payloads if len(p["messages"]) == 6]
    assert all(p["messages"][2] == {"role": "assistant", "content": "calling"} for p in sent)
    summary = result.summary({"ttft_ms": 10_000})
    assert summary["completed"] == 18 and summary["replay_completed_sessions"] == 6
    assert summary["replay_good_sessions"] == 6 and summary["request_goodput"] > 0
    per_turn = result.per_turn({"ttft_ms": 10_000})
    assert per_turn["turn"].tolist() == [1, 2, 3] and per_turn["requests"].tolist() == [6, 6, 6]
    assert per_turn["median_ttft_ms"].notna().all() and (per_turn["within_slos"] == 1).all()


def test_a_session_that_fails_mid_replay_is_reported_and_the_others_go_on(monkeypatch):
    server = FakeVllm(ttft_s=0.02, drop_every=3, drop_after_chunks=1).start()  # the third request dies mid-stream
    monkeypatch.setenv("VLLM_HOST", server.base_url)
    try:
        result = rp.replay(load_settings(), two_sessions(think=0.05), copies=1, model=MODEL)
    finally:
        server.stop()
    (failure,) = result.failures
    assert "stopped at turn 2 of 3" in failure
    frame = result.turns_frame()
    counts = frame.groupby("session")["turn"].count().sort_values().tolist()
    assert counts == [2, 3]  # the failed session sent no later turn; the other finished
    summary = result.summary()
    assert summary["replay_failed_sessions"] == 1 and summary["replay_completed_sessions"] == 1


def test_a_lengths_only_recording_replays_its_prompt_lengths_and_shared_blocks(fake):
    full = two_sessions(think=0.0)
    for s in full.sessions:  # prompt lengths as the (fake) tokenizer counts them, as a real recording holds
        flat, ends = s.history()
        for t, end in zip(s.turns, ends):
            t.prompt_tokens = len(fake_tokenize(flat[:end], None, {}))
    rec = without_content(full, fake_tokenize, block_tokens=8)
    result = rp.replay(load_settings(), rec, copies=2, run_salt=3)
    frame = result.turns_frame()
    assert frame["ok"].all()
    assert (frame["prompt_tokens"] == frame["recorded_prompt_tokens"]).all()  # exact, from one-token words
    firsts = {}
    for headers, payload in zip(fake.chat_headers, fake.chat_payloads):
        firsts.setdefault(headers["x-session-id"], payload["messages"][0]["content"].split())
    assert len(firsts) == 4  # two sessions x two copies
    shared = len(rp.shared_block_ids(rec) & set(rec.sessions[0].turns[0].hash_ids)) * 8
    assert shared > 0
    assert len({tuple(w[1:1 + shared]) for w in firsts.values()}) == 1  # the blocks both sessions had: same words
    assert len({tuple(w[1 + shared:]) for w in firsts.values()}) == 4  # the rest: each copy its own


# ---------------------------------------------------------------- the command

def run_cli(argv):
    parser = argparse.ArgumentParser(prog="workshop")
    bench_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_bench_replay_prints_the_turns_and_saves_the_summary(fake, tmp_path, capsys):
    path = rp.write_recording(two_sessions(think=0.01), tmp_path / "s.jsonl")
    code = run_cli(["bench", "--replay", str(path), "--copies", "2", "--slo", "ttft_ms=10000", "--no-metrics",
                    "--json", str(tmp_path / "r.jsonl"), "--csv", str(tmp_path / "turns.csv")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "replayed 2 session(s) x 2 copies" in out and "median_ttft_ms" in out and "4 of 4 sessions" in out
    (summary,) = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert summary["mode"] == "replay" and summary["completed"] == 12 and len(summary["turns"]) == 12
    assert len((tmp_path / "turns.csv").read_text().splitlines()) == 1 + 12  # one row per request


@pytest.mark.parametrize("flags, message", [
    (["--copies", "0"], "--copies must be >= 1"),
    (["--think-scale", "-1"], "--think-scale must be >= 0"),
    (["--slo", "latency_ms=3"], "unknown SLO"),
])
def test_bench_replay_bad_flags_are_one_line_and_exit_2(tmp_path, capsys, flags, message):
    path = rp.write_recording(two_sessions(), tmp_path / "s.jsonl")
    assert run_cli(["bench", "--replay", str(path), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_bench_replay_of_a_bad_file_names_the_field_and_a_sweep_still_needs_its_lengths(tmp_path, capsys):
    path = rp.write_recording(two_sessions(), tmp_path / "s.jsonl")
    header, *sessions = [json.loads(line) for line in path.read_text().splitlines()]
    del sessions[1]["turns"][2]["prompt_tokens"]
    _write_lines(path, [header, *sessions])
    assert run_cli(["bench", "--replay", str(path)]) == 2
    err = capsys.readouterr().err
    assert "line 3 (session 'b', turn 3) has no 'prompt_tokens' field" in err and err.count("\n") == 1
    assert run_cli(["bench", "--concurrency", "1", "--output-len", "4"]) == 2
    assert "--input-len is needed with --concurrency or --rate" in capsys.readouterr().err


def test_workshop_record_writes_the_sessions_the_replay_reads(tmp_path, capsys, monkeypatch):
    from helpers.engine import session as engine_session

    monkeypatch.setattr(engine_session, "connect", lambda settings=None: weather_script())
    out = tmp_path / "sessions.jsonl"
    assert run_cli(["record", "--out", str(out), "--question", "What's the weather in Paris?",
                    "--tool-delay", "0.02"]) == 0
    assert f"saved 1 session(s) to {out}" in capsys.readouterr().out
    (session,) = rp.read_recording(out).sessions
    assert [t.completion_tokens for t in session.turns] == [17, 9] and session.turns[1].think_time_s >= 0.02
    assert run_cli(["record", "--out", str(out), "--tool-delay", "-1"]) == 2
    assert "--tool-delay must be >= 0" in capsys.readouterr().err
