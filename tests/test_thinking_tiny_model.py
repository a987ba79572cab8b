"""tiny-qwen3, the thinking stand-in: Qwen3-4B's own template byte for byte, its tokens, and a training set rendered
by that template (helpers/tiny/qwen3.py). What it does through the real engine: test_thinking_engine.py."""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

import pytest

from helpers.core.settings import TINY_QWEN3, Settings
from helpers.tiny import corpus, qwen3
from helpers.tiny.tools import TOOLS

MODEL_DIR = Path(__file__).resolve().parents[1] / "models" / "tiny-qwen3"


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODEL_DIR)


def test_the_shipped_template_is_qwen3_4b_s_byte_for_byte_and_its_source_note_says_so():
    digest = hashlib.sha256((MODEL_DIR / "chat_template.jinja").read_bytes()).hexdigest()
    assert digest == qwen3.TEMPLATE_SHA256
    source = json.loads((MODEL_DIR / "template_source.json").read_text())
    assert source["chat_template_sha256"] == digest and source["license"] == "Apache-2.0"
    assert re.fullmatch(r"[0-9a-f]{40}", source["revision"]) and source["repository"] == "Qwen/Qwen3-4B"


def test_a_template_that_is_not_qwen3_s_is_refused(tmp_path):
    changed = tmp_path / "chat_template.jinja"
    changed.write_bytes((MODEL_DIR / "chat_template.jinja").read_bytes().replace(b"# Tools", b"# tools"))
    with pytest.raises(ValueError, match="not Qwen3-4B's template"):
        qwen3.load_template(changed)


def test_the_tokenizer_has_the_tags_the_parsers_look_up_as_single_tokens(tok):
    assert tok.chat_template == (MODEL_DIR / "chat_template.jinja").read_text()
    for tag in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                "<|im_start|>", "<|im_end|>"):
        ids = tok.encode(tag, add_special_tokens=False)
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids) == [tag], tag
    assert tok.eos_token == "<|im_end|>" and len(tok.encode("Paris 1234", add_special_tokens=False)) == 3


def _weather_conversation():
    return corpus._tool_round(random.Random(0), "weather", "What's the weather in Paris?", "get_weather",
                              {"city": "Paris"}, corpus.WEATHER_A).messages


@pytest.mark.parametrize("thinking", [True, False])
def test_a_training_turn_is_what_the_template_itself_writes_for_that_turn(tok, thinking):
    """Prompt + completion equal Qwen3's own rendering of the conversation ending in that assistant turn (with its
    reasoning as ``reasoning_content``), so the model learns the format the template and vLLM's parser expect."""
    messages = _weather_conversation()
    render = qwen3.make_renderer(tok)
    examples = qwen3.turn_examples(render, messages, True, thinking, random.Random(1))
    assert len(examples) == 2  # the tool call, then the answer from the tool's result
    for (prompt, completion), turn in zip(examples, (1, 3)):
        head = "<|im_start|>assistant\n" + ("" if thinking else "<think>\n\n</think>\n\n")
        assert prompt.endswith(head) and completion.endswith("<|im_end|>")
        assert completion.startswith("<think>\n") == thinking
        history = [qwen3._as_sent(m, random.Random(1)) for m in messages[:turn]]
        own = {**messages[turn], "reasoning_content": qwen3.reasoning_for(messages, turn) if thinking else ""}
        written = tok.apply_chat_template(history + [own], tools=TOOLS, tokenize=False)
        assert written == prompt[: -len(head)] + "<|im_start|>assistant\n" + (
            completion if thinking else "<think>\n\n</think>\n\n" + completion) + "\n"


def test_every_prompt_with_tools_starts_with_the_shared_tools_block(tok):
    prefix = qwen3.tools_prefix_ids(tok)
    assert tok.decode(prefix).startswith("<|im_start|>system\n# Tools") and tok.decode(prefix).endswith("\n")
    render = qwen3.make_renderer(tok)
    for messages, with_tools in [(m, True) for m, _ in list(zip(corpus.training_conversations(3), range(20)))]:
        for prompt, _ in qwen3.turn_examples(render, messages[0], with_tools, True, random.Random(0)):
            assert tok.encode(prompt, add_special_tokens=False)[: len(prefix)] == prefix


def test_the_shared_prefix_gives_the_same_loss_as_the_whole_rows(tok):
    import torch
    from transformers import AutoModelForCausalLM

    from helpers.tiny.build import ModelShape, model_config

    torch.manual_seed(0)
    shape = ModelShape(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=1,
                       num_key_value_heads=1)
    model = AutoModelForCausalLM.from_config(model_config(shape, 64 * (len(tok) // 64 + 1), 2, 0)).eval()
    prefix = qwen3.tools_prefix_ids(tok)
    prefix_len, ids, mask, labels = next(b for b in qwen3.batches(tok, 0, 4, pool=2) if b[0])
    with torch.no_grad():
        shared = qwen3.batch_loss(model, prefix, prefix_len, ids, mask, labels)
        whole = torch.tensor([prefix]).expand(ids.shape[0], -1)
        full = model(input_ids=torch.cat([whole, ids], 1), attention_mask=torch.cat([torch.ones_like(whole), mask], 1),
                     labels=torch.cat([torch.full_like(whole, -100), labels], 1)).loss
    assert torch.isclose(shared, full, rtol=1e-4)


def test_the_cpu_profile_serves_tiny_qwen3_with_the_reasoning_parser_and_only_it():
    from helpers.engine.interface import default_config

    def args(model):
        return default_config(Settings(profile="cpu", base_url="http://127.0.0.1:8000/v1", model=model)).args

    qwen = args(TINY_QWEN3)
    assert qwen[qwen.index("--reasoning-parser") + 1] == "qwen3" and "--tool-call-parser" in qwen
    assert "--reasoning-parser" not in args("tiny-agent")
