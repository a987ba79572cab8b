"""Notebook 04's thinking step (helpers/lessons/l04_thinking.py) without an engine: the request each question sends
(thinking on or off, the tools, one budget), the row made of a reply (reasoning tokens from vLLM's usage, else the
engine's tokenizer; the engine's decode time, else the client's latency), and the conclusion with numbers that go
each way: thinking slower beyond the noise (shown), within it, faster (a disturbed run), and no reasoning at all (the
cluster double's tiny-agent, which does not think)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from fakes import reply as chat_reply
from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE
from helpers.hardware.gpus import ApiPrice, api_price
from helpers.lessons import l04_thinking as l04t

API = ApiPrice("api-x", 0.4, 0.1, 2.0, "a test's price", "2026-01-01")


def rows(off: list[tuple[int, float]], on: list[tuple[int, int, float]], question: str = "q") -> pd.DataFrame:
    """Rows as measure_thinking makes them: off = (output tokens, decode s) per round, on = (reasoning tokens,
    answer tokens, decode s) per round."""
    out = []
    for r, ((tokens, off_s), (reasoning, answer, on_s)) in enumerate(zip(off, on)):
        out.append({"round": r, "question": question, "thinking": False, "output_tokens": tokens,
                    "reasoning_tokens": 0, "answer_tokens": tokens, "decode_s": off_s, "ended_in_reasoning": False,
                    "max_tokens": 256, "reasoning": "", "reply": "get_weather({})"})
        out.append({"round": r, "question": question, "thinking": True, "output_tokens": reasoning + answer,
                    "reasoning_tokens": reasoning, "answer_tokens": answer, "decode_s": on_s,
                    "ended_in_reasoning": False, "max_tokens": 256, "reasoning": "I will call get_weather." if reasoning else "",
                    "reply": "get_weather({})"})
    return pd.DataFrame(out)


def test_thinking_that_takes_longer_beyond_the_noise_is_shown_and_priced():
    runs = rows([(20, 1.00), (20, 1.04)], [(180, 20, 10.0), (180, 20, 10.3)])
    c = l04t.conclude_thinking_cost(runs, "m", API, 3.6, "a VM")
    assert c.verdict == SHOWN and c.expectation == l04t.THINKING_EXPECTATION
    assert "180 reasoning + 20 answer tokens per answer, against 20 answer tokens" in c.text and "10.0x the output" in c.text
    # per 1,000 answers: 200 tokens x 2 USD/1M = 0.4 USD against 0.04; 10.15 s at 3.6 USD/h = 10.15 mUSD x 1000 / 1000
    assert "0.4000 against 0.0400 USD" in c.text and "10.1500 against 1.0200 USD of decode time" in c.text
    assert "at 3.6 USD/h (a VM)" in c.text and "api-x's output price (2 USD per 1M tokens, 2026-01-01)" in c.text


def test_a_difference_within_the_rounds_spread_is_within_noise():
    runs = rows([(20, 1.0), (20, 1.6)], [(5, 20, 1.1), (5, 20, 1.5)])
    c = l04t.conclude_thinking_cost(runs, "m", API, 1.0)
    assert c.verdict == WITHIN_NOISE and "cannot tell them apart" in c.text


def test_thinking_that_decodes_faster_is_not_shown_and_called_disturbed():
    runs = rows([(20, 3.0), (20, 3.1)], [(30, 20, 1.0), (30, 20, 1.05)])
    c = l04t.conclude_thinking_cost(runs, "m", API, 1.0)
    assert c.verdict == NOT_SHOWN and "a disturbed run" in c.text


def test_no_reasoning_is_said_honestly_and_not_priced():
    # the cluster double: Qwen/Qwen3-4B is served by tiny-agent without a reasoning parser, so both modes answer alike
    runs = rows([(23, 1.0)], [(0, 23, 1.0)])
    c = l04t.conclude_thinking_cost(runs, "Qwen/Qwen3-4B", API, 1.0)
    assert c.verdict == NOT_SHOWN and c.text.startswith("No reasoning came back") and "USD" not in c.text
    assert "no reasoning came back" in l04t.thinking_example(runs)


def test_a_reply_cut_inside_the_reasoning_is_counted():
    runs = rows([(20, 1.0)], [(256, 0, 9.0)])
    runs.loc[runs.thinking, ["ended_in_reasoning", "reply"]] = [True, ""]
    c = l04t.conclude_thinking_cost(runs, "m", API, 1.0)
    assert "1 of 1 replies ended inside the reasoning at max_tokens 256" in c.text
    assert "nothing: it ended inside the reasoning" in l04t.thinking_example(runs)


def test_the_example_shows_a_reasoning_beside_what_came_after():
    runs = rows([(20, 1.0)], [(19, 26, 2.0)], question="What's the weather in Paris?")
    assert l04t.thinking_example(runs) == ("\"What's the weather in Paris?\", thinking on: reasoning (19 tokens) "
                                           "'I will call get_weather.', then (26 tokens) get_weather({})")


def test_a_missing_mode_is_not_measured():
    runs = rows([(20, 1.0)], [(5, 20, 1.0)])
    assert l04t.conclude_thinking_cost(runs[runs.thinking], "m", API, 1.0).verdict == NOT_SHOWN


def test_the_per_token_exercise_goes_each_way():
    same = rows([(21, 1.0)], [(180, 21, 10.0)])  # 20 and 200 decode steps after the first token
    assert l04t.per_token_outcome(same)[0] == "about the same"  # 50 ms a step either way
    assert l04t.per_token_outcome(rows([(21, 1.0)], [(180, 21, 20.0)]))[0] == "higher"
    assert l04t.per_token_outcome(rows([(21, 1.0)], [(180, 21, 5.0)]))[0] == "lower"
    assert "50.00 ms per output token with thinking on, 50.00 ms with it off" in l04t.per_token_outcome(same)[1]


def test_the_table_is_per_question_and_mode():
    table = l04t.thinking_table(rows([(21, 1.0), (21, 2.0)], [(180, 21, 10.0), (180, 21, 12.0)]))
    assert list(table["mode"]) == ["off", "on"] and list(table["decode_s"]) == [1.5, 11.0]
    assert table["decode_ms_per_token"].tolist() == pytest.approx([75.0, 55.0])  # per step: 20 and 200 of them


def test_every_price_in_the_step_comes_from_the_dated_table():
    price = api_price("gpt-4.1-mini")
    c = l04t.conclude_thinking_cost(rows([(20, 1.0)], [(180, 20, 10.0)]), "m", price, 1.0)
    assert f"({price.usd_per_m_output:g} USD per 1M tokens, {price.date})" in c.text


# ---------------------------------------------------------------- one request and its row

class Lab:
    """A Lab whose chat records each request and answers from a script; no metrics endpoint to scrape."""

    model = "m"

    def __init__(self, *replies):
        self.replies, self.requests = list(replies), []
        self.settings = SimpleNamespace(metrics_url="http://127.0.0.1:9/metrics", base_url="http://127.0.0.1:9/v1",
                                        api_key=None)

    def chat(self, messages, **kwargs):
        self.requests.append({"messages": messages, **kwargs})
        return self.replies.pop(0)


def _usage(completion, reasoning):
    details = None if reasoning is None else SimpleNamespace(reasoning_tokens=reasoning)
    return SimpleNamespace(prompt_tokens=400, completion_tokens=completion, completion_tokens_details=details)


def test_each_question_sends_its_thinking_setting_with_the_tools_and_one_budget(monkeypatch):
    on = chat_reply("It is sunny.")
    on.choices[0].message.reasoning = "Weather: call the tool."
    on.usage = _usage(30, 12)
    off = chat_reply("It is sunny.")
    off.usage = _usage(8, 0)
    lab = Lab(off, on)
    runs = l04t.measure_thinking(lab, ["What's the weather in Paris?"], max_tokens=64)
    assert [r["extra_body"] for r in lab.requests] == [{"chat_template_kwargs": {"enable_thinking": False}},
                                                       {"chat_template_kwargs": {"enable_thinking": True}}]
    assert all(r["tools"] and r["max_tokens"] == 64 for r in lab.requests)
    assert runs[["thinking", "reasoning_tokens", "answer_tokens"]].values.tolist() == [[False, 0, 8], [True, 12, 18]]
    # no metrics here: the client's latency stands in, and the row says so
    assert set(runs["decode_measured_by"]) == {"client latency (prefill included)"}
    assert runs["reasoning_counted_by"].tolist() == ["", "vLLM's usage"]


def test_reasoning_without_a_count_is_counted_by_the_engines_tokenizer(monkeypatch):
    answer = chat_reply("ok")
    answer.choices[0].message.reasoning = "one two three"
    answer.usage = _usage(10, None)
    monkeypatch.setattr(l04t, "_tokenize_count", lambda lab, text: len(text.split()))
    row = l04t.ask(Lab(answer), "q", True, 32)
    assert (row["reasoning_tokens"], row["answer_tokens"], row["reasoning_counted_by"]) == (3, 7, "the engine's tokenizer")
