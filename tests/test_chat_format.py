"""The Jinja template vLLM renders and the Python twin used for training must agree exactly."""

import itertools

import pytest

from helpers.tiny import chat_format as cf
from helpers.tiny import corpus
from helpers.core.settings import models_dir
from helpers.tiny.tools import TOOLS


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(models_dir() / "tiny-agent")


def conversations():
    yield from ((m, t) for m, t in itertools.islice(corpus.training_conversations(7), 40))
    yield [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], True
    yield [{"role": "user", "content": "hi"}], False


@pytest.mark.parametrize("messages, with_tools", list(conversations()))
def test_template_equals_training_renderer(tokenizer, messages, with_tools):
    tools = TOOLS if with_tools else None
    rendered = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    assert rendered == "".join(text for text, _ in cf.render_segments(messages, tools))


def test_generation_prompt_and_tools_line(tokenizer):
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=TOOLS, tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert "tools: get_weather(city) | calculator(expression) | convert_units(value, from_unit, to_unit) | get_time(city)" in text


def test_catalog_cities_and_numbers_are_single_tokens(tokenizer):
    for word in ["Paris", "New York", "Rio de Janeiro", "0", "7", "1999", "05"]:
        ids = tokenizer.encode(f'{{"city": "{word}"}}', add_special_tokens=False)
        assert word in [tokenizer.decode([i]) for i in ids], word
    assert tokenizer.decode(tokenizer.encode("weather in New York? 12:05, 2.5 km")) == "weather in New York? 12:05, 2.5 km"


def test_tool_call_text_is_what_the_hermes_parser_reads():
    text = cf.tool_call_text("get_weather", {"city": "Paris"})
    assert text == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
