"""Eval suites, scoring, statistics, saved runs and ``workshop eval``, against a canned endpoint.

The canned endpoint is the real OpenAI SDK over an ``httpx.MockTransport``: requests are built and
responses parsed exactly as against vLLM, with no server.
"""

from __future__ import annotations

import argparse
import json
import re
import socket

import httpx
import openai
import pandas as pd
import pytest

from helpers.tiny import corpus
from helpers.cli import eval as eval_cli
from helpers.evals import suite as evals
from helpers.evals.suite import EvalRun, EvalSettings, Reply, Task
from helpers.engine.session import EndpointError, Lab, make_client, make_engine
from helpers.core.settings import load_settings
from helpers.evals.toolcall import wilson_interval
from helpers.tiny.tools import TOOL_NAMES, call_tool, city_catalog

SECRET = "sk-secret-eval-key"
MODEL = "fake-model"


# ---------------------------------------------------------------- a canned endpoint

class CannedLab(Lab):
    """A real Lab whose endpoint check always succeeds unless told the endpoint is gone."""

    alive = True

    def check(self) -> list[str]:
        if not self.alive:
            raise EndpointError("Cannot reach the engine (test)")
        return [self.model]


def completion(content: str | None = None, calls: list[tuple[str, dict | str]] | None = None) -> dict:
    tool_calls = [{"id": f"call_{i}", "type": "function",
                   "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
                  for i, (name, args) in enumerate(calls or [])]
    message = {"role": "assistant", "content": content, **({"tool_calls": tool_calls} if tool_calls else {})}
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


def right_answer(task: Task) -> dict:
    """What a perfect model answers."""
    if task.category == "tool_call":
        call = task.expect["call"]
        return completion(calls=[(call["name"], call["arguments"])])
    if task.category == "tool_answer":
        return completion("The answer is " + ", ".join(task.expect["values"]) + ".")
    if task.category == "json":
        return completion(json.dumps(task.expect["call"]))
    return completion("Hello! How can I help?")


def make_lab(answer=right_answer, suite: str = "agent-v1", env: dict | None = None) -> tuple[CannedLab, list[dict]]:
    """A lab whose endpoint answers each task with ``answer(task)`` (a completion dict, or an httpx.Response)."""
    by_messages = {json.dumps(t.messages, sort_keys=True): t for t in evals.load_suite(suite).tasks}
    payloads: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        payload = json.loads(request.content)
        payloads.append(payload)
        task = by_messages[json.dumps(payload["messages"], sort_keys=True)]
        out = answer(task)
        return out if isinstance(out, httpx.Response) else httpx.Response(200, json=out)

    settings = load_settings({"VLLM_HOST": "http://evals.example:8000/v1", "VLLM_API_KEY": SECRET,
                              "MODEL_NAME": MODEL, **(env or {})})
    client = openai.OpenAI(base_url=settings.base_url, api_key=SECRET, max_retries=0,
                           http_client=httpx.Client(transport=httpx.MockTransport(handler)))
    return CannedLab(settings, make_engine(settings), client), payloads


def run_from(passed: dict[str, bool], suite: str = "agent-v1") -> EvalRun:
    """An eval run with given pass/fail per task id (the rest of the suite passes)."""
    rows = [{"id": t.id, "category": t.category, "kind": t.kind, "passed": passed.get(t.id, True), "error": None,
             "latency_s": 0.01, "output": "x"} for t in evals.load_suite(suite).tasks]
    return EvalRun(suite, 1, MODEL, "http://evals.example:8000/v1", EvalSettings(), pd.DataFrame(rows))


# ---------------------------------------------------------------- suites

def test_agent_v1_has_four_categories_unique_ids_and_the_smoke_subset():
    suite = evals.load_suite()
    assert (suite.name, suite.version) == ("agent-v1", 1)
    assert suite.counts() == {"tool_call": 32, "tool_answer": 24, "json": 20, "no_tool": 20}
    ids = [t.id for t in suite.tasks]
    assert len(ids) == len(set(ids)) == 96
    for t in suite.tasks:
        assert t.messages[-1]["role"] in ("user", "tool")
        if t.category == "json":
            assert t.response_format["type"] == "json_schema" and t.tool_choice == "none"
            assert t.response_format["json_schema"]["schema"] == evals.call_schema()
            assert t.messages[0] == {"role": "system", "content": evals.JSON_INSTRUCTION}
    smoke = evals.load_suite("smoke")
    assert len(smoke.tasks) == 10 and all(n > 0 for n in smoke.counts().values())
    assert {t.id for t in smoke.tasks} <= set(ids)


def test_unknown_suite_names_the_shipped_ones():
    with pytest.raises(ValueError, match="no eval suite 'nope'.*agent-v1.*smoke"):
        evals.load_suite("nope")


def _alternatives(words) -> str:
    return "(?:" + "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)) + ")"


SLOTS = {  # what each template placeholder can stand for
    "city": _alternatives(city_catalog()), "a": r"-?\d+(?:\.\d+)?", "b": r"-?\d+(?:\.\d+)?",
    "v": r"-?\d+(?:\.\d+)?", "op": _alternatives({w for ws in corpus.CALC_OPS.values() for w in ws}),
    "u1": _alternatives({w for ws in corpus.UNIT_WORDS.values() for w in ws}),
    "u2": _alternatives({w for ws in corpus.UNIT_WORDS.values() for w in ws}), "expr": r"[\d+\-*/() ]+",
}


def _pattern(template: str) -> re.Pattern:
    parts = re.split(r"(\{\w+\})", template)
    return re.compile("".join(SLOTS[p[1:-1]] if re.fullmatch(r"\{\w+\}", p) else re.escape(p) for p in parts))


def test_every_question_is_a_heldout_phrasing_never_a_training_one():
    lists = [corpus.WEATHER_Q, corpus.TIME_Q, corpus.CALC_Q, corpus.CALC_EXPR_Q, corpus.CONVERT_Q,
             *[phrasings for phrasings, _ in corpus.CHAT]]
    heldout = [_pattern(t) for lst in lists for t in corpus.split_templates(lst, heldout=True)]
    training = [_pattern(t) for lst in lists for t in corpus.split_templates(lst, heldout=False)]
    training += [_pattern(t) for v in corpus.augmented_templates().values() for t in v]
    for task in evals.load_suite().tasks:
        assert any(p.fullmatch(task.question) for p in heldout), task.id
        assert not any(p.fullmatch(task.question) for p in training), task.id


def test_tool_results_in_the_suite_are_what_the_real_tools_return():
    for task in evals.load_suite().tasks:
        if task.category == "tool_answer" and task.kind in ("calculator", "convert"):
            call = task.messages[1]["tool_calls"][0]["function"]
            assert call_tool(call["name"], call["arguments"]) == json.loads(task.messages[2]["content"])


# ---------------------------------------------------------------- scoring

def task_of(category: str, kind: str | None = None) -> Task:
    return next(t for t in evals.load_suite().tasks if t.category == category and (kind is None or t.kind == kind))


def test_tool_call_checks():
    task = task_of("tool_call", "weather")
    city = task.expect["call"]["arguments"]["city"]
    assert evals.score(task, Reply(None, [{"name": "get_weather", "arguments": {"city": city}}])) == \
        {"structured_call": True, "right_function": True, "right_arguments": True}
    wrong_fn = evals.score(task, Reply(None, [{"name": "get_time", "arguments": {"city": city}}]))
    assert wrong_fn == {"structured_call": True, "right_function": False, "right_arguments": False}
    wrong_args = evals.score(task, Reply(None, [{"name": "get_weather", "arguments": {"city": "Atlantis"}}]))
    assert wrong_args == {"structured_call": True, "right_function": True, "right_arguments": False}
    unparsed = f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>'
    assert not any(evals.score(task, Reply(unparsed)).values())  # a call left in the text is no structured call


def test_calculator_arguments_count_by_value():
    task = task_of("tool_call", "calculator")
    expr = task.expect["call"]["arguments"]["expression"]
    spaced = {"name": "calculator", "arguments": {"expression": expr.replace(" ", "")}}
    assert evals.score(task, Reply(None, [spaced]))["right_arguments"]
    assert not evals.score(task, Reply(None, [{"name": "calculator", "arguments": {"expression": "1+"}}]))[
        "right_arguments"]
    assert not evals.score(task, Reply(None, [{"name": "calculator", "arguments": "not json"}]))["right_arguments"]


def test_tool_answer_must_be_plain_and_use_the_result():
    task = task_of("tool_answer", "weather")
    value = task.expect["values"][0]
    assert evals.score(task, Reply(f"It is {value}°C and sunny.")) == {"plain_answer": True, "uses_result": True}
    assert evals.score(task, Reply("It is 99°C and sunny.")) == {"plain_answer": True, "uses_result": False}
    again = evals.score(task, Reply(f"{value}", [{"name": "get_weather", "arguments": {"city": "Paris"}}]))
    assert again == {"plain_answer": False, "uses_result": False}
    assert evals.score(task, Reply("   ")) == {"plain_answer": False, "uses_result": False}


def test_numbers_match_only_whole():
    assert evals.contains_value("It is 21°C.", 21) and evals.contains_value("It is -3 C", "-3")
    assert not evals.contains_value("It is 214°C.", 21) and not evals.contains_value("2.1 km", 2)
    assert not evals.contains_value("It is 12.5", 12) and evals.contains_value("It is 12.", 12)
    assert evals.contains_value("at 11:29 today", "11:29") and not evals.contains_value("11:30", "11:29")


def test_json_checks_parse_schema_and_values():
    task = task_of("json", "weather")
    good = task.expect["call"]
    city = good["arguments"]["city"]
    assert evals.score(task, Reply(json.dumps(good))) == {"parses": True, "matches_schema": True, "right_values": True}
    assert evals.score(task, Reply("The weather is nice")) == \
        {"parses": False, "matches_schema": False, "right_values": False}
    assert evals.score(task, Reply('{"name": "get_weather", ')) == \
        {"parses": False, "matches_schema": False, "right_values": False}
    for bad in ({"name": "get_weather", "arguments": {"city": 7}},  # a number, not a string
                {"name": "get_weather"},  # a required field missing
                {"name": "get_weather", "arguments": {"city": city, "days": 3}},  # additionalProperties: false
                {"name": "get_news", "arguments": {"city": city}},  # no such tool
                {"name": "get_weather", "arguments": {"expression": "1 + 1"}}):  # another tool's arguments
        assert evals.score(task, Reply(json.dumps(bad))) == \
            {"parses": True, "matches_schema": False, "right_values": False}, bad
    wrong_city = {"name": "get_weather", "arguments": {"city": "Atlantis"}}
    assert evals.score(task, Reply(json.dumps(wrong_city))) == \
        {"parses": True, "matches_schema": True, "right_values": False}
    wrong_tool = {"name": "get_time", "arguments": {"city": city}}
    assert evals.score(task, Reply(json.dumps(wrong_tool))) == \
        {"parses": True, "matches_schema": True, "right_values": False}


def test_json_schema_allows_exactly_the_tools_and_their_units():
    task = task_of("json", "convert")
    call = task.expect["call"]
    assert evals.score(task, Reply(json.dumps(call)))["right_values"]
    bad_unit = {**call, "arguments": {**call["arguments"], "to_unit": "parsec"}}
    assert not evals.score(task, Reply(json.dumps(bad_unit)))["matches_schema"]
    assert [o["properties"]["name"]["const"] for o in evals.call_schema()["anyOf"]] == list(TOOL_NAMES)


def test_no_tool_checks():
    task = task_of("no_tool")
    assert evals.score(task, Reply("Hello!")) == {"no_tool_call": True, "plain_answer": True}
    assert evals.score(task, Reply(None, [{"name": "get_weather", "arguments": {"city": "Paris"}}])) == \
        {"no_tool_call": False, "plain_answer": False}
    assert evals.score(task, Reply("")) == {"no_tool_call": True, "plain_answer": False}


# ---------------------------------------------------------------- running

def test_a_perfect_endpoint_passes_every_task_with_deterministic_requests():
    lab, payloads = make_lab()
    run = evals.run_suite(lab, "smoke")
    assert run.rows["passed"].all() and run.rows["error"].isna().all()
    assert list(run.rows.columns[:4]) == ["id", "category", "kind", "passed"]
    assert {"structured_call", "uses_result", "right_values", "no_tool_call", "latency_s", "output"} <= set(run.rows)
    assert all(p["temperature"] == 0 and p["seed"] == evals.DEFAULT_SEED and p["model"] == MODEL for p in payloads)
    json_payloads = [p for p in payloads if "response_format" in p]
    assert len(json_payloads) == 2 and all(p["tool_choice"] == "none" and p["tools"] for p in json_payloads)
    assert all(p["chat_template_kwargs"] == {"enable_thinking": False} for p in payloads)
    summary = run.summary()
    assert list(summary.index) == ["tool_call", "tool_answer", "json", "no_tool", "all"]
    assert summary.loc["all", "n"] == 10 and summary.loc["all", "pass_rate"] == 1.0
    assert summary.loc["tool_call", "ci_low"] == pytest.approx(wilson_interval(4, 4)[0])


def test_a_request_error_fails_that_task_only():
    def answer(task):
        if task.category == "json":
            return httpx.Response(400, json={"error": {"message": "grammar backend refused the schema",
                                                       "type": "BadRequestError", "code": 400}})
        return right_answer(task)

    lab, _ = make_lab(answer)
    run = evals.run_suite(lab, "smoke")
    failed = run.rows[~run.rows["passed"]]
    assert set(failed["category"]) == {"json"} and len(failed) == 2
    assert failed["error"].str.contains("BadRequestError.*grammar backend refused").all()
    assert not failed[["parses", "matches_schema", "right_values"]].any(axis=None)
    assert run.summary().loc["json", "errors"] == 2 and run.summary().loc["tool_call", "pass_rate"] == 1.0


def test_a_timeout_is_one_failed_task_but_a_dead_endpoint_stops_the_run():
    def slow_json(task):
        if task.id == "json-time-01":
            raise httpx.ReadTimeout("timed out")
        return right_answer(task)

    lab, _ = make_lab(slow_json)
    run = evals.run_suite(lab, "smoke")
    row = run.rows.set_index("id").loc["json-time-01"]
    assert not row["passed"] and "stopped answering" in row["error"]
    assert run.rows["passed"].sum() == 9

    def dead(task):
        lab.alive = False
        raise httpx.ConnectError("connection refused")

    lab, _ = make_lab(dead)
    with pytest.raises(EndpointError, match="Cannot reach"):
        evals.run_suite(lab, "smoke")


def test_an_unreachable_endpoint_raises_the_sessions_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = load_settings({"VLLM_HOST": f"http://127.0.0.1:{port}/v1"})
    lab = Lab(settings, make_engine(settings), make_client(settings))
    with pytest.raises(EndpointError, match="Cannot reach the engine"):
        evals.run_suite(lab, "smoke")


# ---------------------------------------------------------------- statistics

def test_wilson_interval_known_values():
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_newcombe_interval_matches_the_published_example():
    # Newcombe (1998), Stat Med 17:873, method 10: 56/70 - 48/80 = 0.2, 95% CI 0.0524 to 0.3339
    assert evals.newcombe_interval(48, 80, 56, 70) == pytest.approx((0.0524, 0.3339), abs=1e-4)


def test_mcnemar_exact_p_values():
    assert evals.mcnemar_p(0, 0) == 1.0
    assert evals.mcnemar_p(2, 1) == 1.0
    assert evals.mcnemar_p(5, 0) == pytest.approx(0.0625)
    assert evals.mcnemar_p(6, 0) == pytest.approx(0.03125)
    assert evals.mcnemar_p(3, 10) == evals.mcnemar_p(10, 3) == pytest.approx(0.0923, abs=1e-4)


def test_compare_flags_a_real_regression_and_lists_the_flipped_tasks():
    tool_ids = [t.id for t in evals.load_suite().tasks if t.category == "tool_call"]
    before, after = run_from({}), run_from({i: False for i in tool_ids[:10]})
    result = evals.compare(before, after)
    assert result.paired and result.regressed == ["tool_call", "all"]
    row = result.table.loc["tool_call"]
    assert (row["pass_to_fail"], row["fail_to_pass"]) == (10, 0) and row["diff"] == pytest.approx(-10 / 32)
    assert row["diff_ci_high"] < 0 and row["p_value"] < 0.01
    assert sorted(result.flipped["id"]) == sorted(tool_ids[:10])
    assert not result.table.loc["json", "regression"]


def test_compare_does_not_flag_noise_or_an_improvement():
    tool_ids = [t.id for t in evals.load_suite().tasks if t.category == "tool_call"]
    before = run_from({tool_ids[0]: False})
    after = run_from({tool_ids[1]: False, tool_ids[2]: False})  # 2 pass->fail, 1 fail->pass
    result = evals.compare(before, after)
    assert result.regressed == [] and result.table.loc["tool_call", "p_value"] == 1.0
    assert len(result.flipped) == 2
    assert evals.compare(run_from({i: False for i in tool_ids[:10]}), run_from({})).regressed == []


def test_runs_without_shared_tasks_are_compared_unpaired():
    a = run_from({})
    b = run_from({})
    b.rows["id"] = b.rows["id"] + "-other"
    b.rows.loc[b.rows["category"] == "no_tool", "passed"] = [i >= 12 for i in range(20)]  # 8 of 20
    result = evals.compare(a, b)
    assert not result.paired and result.regressed == ["no_tool", "all"]
    assert pd.isna(result.table.loc["no_tool", "p_value"]) and len(result.flipped) == 0


# ---------------------------------------------------------------- saved runs

def test_a_run_round_trips_through_json_without_the_api_key(tmp_path):
    lab, _ = make_lab()
    run = evals.run_suite(lab, "smoke")
    path = run.save(tmp_path / "run.json")
    text = path.read_text()
    assert SECRET not in text
    loaded = evals.load_run(path)
    assert (loaded.suite, loaded.suite_version, loaded.model) == ("smoke", 1, MODEL)
    assert loaded.endpoint == "http://evals.example:8000/v1" and loaded.settings == run.settings
    pd.testing.assert_frame_equal(loaded.rows[run.rows.columns], run.rows, check_dtype=False)
    pd.testing.assert_frame_equal(loaded.summary(), run.summary())
    assert json.loads(text)["summary"][-1]["category"] == "all"


def test_credentials_in_the_url_never_reach_the_file(tmp_path):
    run = run_from({})
    run.endpoint = "https://user:pa55@evals.example:8443/v1?api_key=abc#x"
    data = json.loads(run.save(tmp_path / "r.json").read_text())
    assert data["endpoint"] == "https://evals.example:8443/v1"


def test_load_run_refuses_other_files(tmp_path):
    (tmp_path / "bench.json").write_text('{"output_throughput": 1}')
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not an eval run"):
        evals.load_run(tmp_path / "bench.json")
    with pytest.raises(ValueError, match="not JSON"):
        evals.load_run(tmp_path / "bad.json")


# ---------------------------------------------------------------- workshop eval

def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="workshop")
    eval_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_eval_command_runs_prints_and_saves(monkeypatch, tmp_path, capsys):
    lab, _ = make_lab()
    monkeypatch.setattr(eval_cli, "connect", lambda settings, start=False: lab)
    code = cli(["eval", "--suite", "smoke", "--json", str(tmp_path / "run.json"), "--csv", str(tmp_path / "rows.csv")])
    out = capsys.readouterr().out
    assert code == 0
    assert "smoke v1: 10 tasks" in out and "100.0%" in out and "95% CI" in out
    assert evals.load_run(tmp_path / "run.json").rows["passed"].all()
    assert len(pd.read_csv(tmp_path / "rows.csv")) == 10


def test_eval_compare_exit_codes(tmp_path, capsys):
    tool_ids = [t.id for t in evals.load_suite().tasks if t.category == "tool_call"]
    base = run_from({}).save(tmp_path / "a.json")
    worse = run_from({i: False for i in tool_ids[:10]}).save(tmp_path / "b.json")
    noisy = run_from({tool_ids[3]: False}).save(tmp_path / "c.json")
    assert cli(["eval", "--compare", str(base), str(worse)]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "regression in: tool_call, all" in out and tool_ids[0] in out
    assert cli(["eval", "--compare", str(base), str(noisy)]) == 0
    assert "REGRESSION" not in capsys.readouterr().out
    assert cli(["eval", "--compare", str(base), str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err


def test_eval_command_errors_are_one_line_exit_2(monkeypatch, capsys):
    assert cli(["eval", "--suite", "nope"]) == 2
    assert "no eval suite 'nope'" in capsys.readouterr().err
    monkeypatch.setenv("VLLM_HOST", "http://127.0.0.1:1/v1")
    assert cli(["eval", "--suite", "smoke"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Cannot reach the engine") and err.count("\n") == 1


def test_eval_is_registered_in_the_workshop_command():
    from helpers.cli.main import build_parser

    args = build_parser().parse_args(["eval", "--compare", "a.json", "b.json"])
    assert args.func is eval_cli.run_eval and args.compare == ["a.json", "b.json"]
