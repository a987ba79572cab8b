"""tiny-qwen3: a tiny stand-in for Qwen3-4B that thinks, trained under Qwen3-4B's own chat template.

The template is Qwen/Qwen3-4B's, byte for byte (``models/tiny-qwen3/chat_template.jinja``, its sha256 is
``TEMPLATE_SHA256``; source and licence in ``models/tiny-qwen3/TEMPLATE_SOURCE.md``). Nothing here renders a
prompt by hand: every training prompt is the template rendered by transformers' ``apply_chat_template``, with
the tools as the JSON schemas the OpenAI client sends, so the model sees in training what vLLM gives it.

Each assistant turn of a corpus conversation is one example, in one of the template's two modes:
- thinking on (the template's default): the prompt ends ``<|im_start|>assistant\\n``, and the model writes
  ``<think>\\n{a short reasoning}\\n</think>\\n\\n`` and then a hermes tool call or an answer;
- thinking off (``enable_thinking=False``): the template itself closes an empty ``<think>`` block, and the
  model writes the tool call or the answer directly.
The loss is on what the model writes only. Earlier turns come back as the agent sends them (the template
drops their reasoning), with the assistant's content as vLLM may return it (none, empty, or blank lines).

Speed: the tools block is the same ~1,400 characters in front of every prompt, so a batch computes it once
(one row, with gradients) and every row attends to it through the key/value cache (``_prefix_cache``).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from pathlib import Path
from typing import Any, Iterator

from helpers.tiny import corpus
from helpers.tiny.build import ModelShape, _save_model, model_config, pad_batch
from helpers.tiny.tools import TOOLS, city_catalog

MODEL = "tiny-qwen3"
TEMPLATE_SHA256 = "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8"
THINK_START, THINK_END = "<think>", "</think>"
IM_START, IM_END, EOT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", THINK_START, THINK_END]
BPE_VOCAB = 2048  # more merges than tiny-agent's 1,536: the JSON tools block then costs fewer tokens
SHAPE = ModelShape(hidden_size=192, intermediate_size=576, num_hidden_layers=4, num_attention_heads=3,
                   num_key_value_heads=1)
THINKING_SHARE = 0.5  # of the training conversations rendered with thinking on


def template_path() -> Path:
    """The shipped copy of Qwen3-4B's chat template."""
    from helpers.core.settings import models_dir

    return models_dir() / MODEL / "chat_template.jinja"


def load_template(path: Path | None = None) -> str:
    """Qwen3-4B's chat template, refused unless its sha256 is the recorded one."""
    text = (path or template_path()).read_bytes()
    digest = hashlib.sha256(text).hexdigest()
    if digest != TEMPLATE_SHA256:
        raise ValueError(f"{path or template_path()} has sha256 {digest}, not Qwen3-4B's template "
                         f"({TEMPLATE_SHA256}): restore it from git before rebuilding tiny-qwen3.")
    return text.decode()


def reasoning_for(messages: list[dict[str, Any]], turn: int) -> str:
    """The short reasoning the model is taught to write before assistant turn ``turn`` (an index into messages)."""
    target = messages[turn]
    if target.get("tool_calls"):
        fn = target["tool_calls"][0]["function"]
        args = json.loads(fn["arguments"])
        if fn["name"] in ("get_weather", "get_time"):
            what = "weather" if fn["name"] == "get_weather" else "local time"
            return f"The user asks for the {what} in {args['city']}. I will call {fn['name']}."
        if fn["name"] == "calculator":
            return f"This is arithmetic: {args['expression']}. I will call calculator."
        return f"This converts {args['value']} {args['from_unit']} to {args['to_unit']}. I will call convert_units."
    if messages[turn - 1]["role"] == "tool":
        return "The tool has answered. I will give its result."
    return "No tool is needed. I will answer directly."


def completion_for(messages: list[dict[str, Any]], turn: int, thinking: bool) -> str:
    """What the model writes for assistant turn ``turn``, up to and including ``<|im_end|>``."""
    target = messages[turn]
    if target.get("tool_calls"):
        fn = target["tool_calls"][0]["function"]
        body = f'<tool_call>\n{{"name": "{fn["name"]}", "arguments": {fn["arguments"]}}}\n</tool_call>'
    else:
        body = target["content"]
    head = f"{THINK_START}\n{reasoning_for(messages, turn)}\n{THINK_END}\n\n" if thinking else ""
    return head + body + IM_END


def _as_sent(message: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """An earlier assistant message as a client may send it back (content none, empty or with blank lines)."""
    if message["role"] != "assistant":
        return message
    if message.get("tool_calls"):
        return {**message, "content": rng.choice([None, "", "\n\n"])}
    return {**message, "content": rng.choice(["", "\n\n"]) + message["content"]}


def turn_examples(renderer, messages: list[dict[str, Any]], with_tools: bool, thinking: bool,
                  rng: random.Random) -> list[tuple[str, str]]:
    """(prompt, completion) for every assistant turn of a conversation, prompts rendered by the real template."""
    out = []
    for turn, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        history = [_as_sent(m, rng) for m in messages[:turn]]
        prompt = renderer(history, TOOLS if with_tools else None, thinking)
        out.append((prompt, completion_for(messages, turn, thinking)))
    return out


def make_renderer(tokenizer):
    """``render(messages, tools, thinking) -> prompt`` through transformers' ``apply_chat_template``."""
    def render(messages, tools, thinking):
        kwargs = {} if thinking else {"enable_thinking": False}
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True,
                                             **kwargs)
    return render


def build_tokenizer(template: str, seed: int = 0):
    """Byte-level BPE trained on prompts rendered by the template, plus the tags, cities and numbers as tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, special_tokens=[EOT, IM_START, IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    render = make_renderer(_bare_renderer_tokenizer(template))
    rng = random.Random(seed)
    texts = []
    for messages, with_tools in _islice(corpus.training_conversations(seed), 3000):
        for prompt, completion in turn_examples(render, messages, with_tools, rng.random() < THINKING_SHARE, rng):
            texts.append(prompt + completion)
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in TAGS])
    words = list(city_catalog()) + [str(i) for i in range(corpus.NUMBER_TOKENS_MAX + 1)] + [f"0{i}" for i in range(10)]
    tok.add_tokens([AddedToken(w, single_word=True, normalized=False, special=False) for w in words])
    return tok


def _islice(it, n):
    import itertools

    return itertools.islice(it, n)


def _bare_renderer_tokenizer(template: str):
    """A throwaway fast tokenizer that only renders the template (before the real one is trained)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()))
    fast.chat_template = template
    return fast


def save_tokenizer(tok, out: Path, template: str):
    """Save as a transformers fast tokenizer with Qwen3-4B's template; returns the loaded wrapper."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=EOT,
                                   model_max_length=SHAPE.max_position_embeddings)
    fast.chat_template = template
    fast.save_pretrained(out)
    written = (out / "chat_template.jinja").read_bytes()
    if hashlib.sha256(written).hexdigest() != TEMPLATE_SHA256:
        raise RuntimeError("transformers rewrote the chat template on save: it is no longer Qwen3-4B's, byte for byte.")
    return fast


def examples(fast, seed: int, augment: bool = False) -> Iterator[tuple[bool, list[int], list[int]]]:
    """An endless stream of (with_tools, prompt ids, completion ids) in random modes."""
    render = make_renderer(fast)
    rng = random.Random(seed + 7)
    for messages, with_tools in corpus.training_conversations(seed, augment=augment):
        thinking = rng.random() < THINKING_SHARE
        for prompt, completion in turn_examples(render, messages, with_tools, thinking, rng):
            yield with_tools, fast.encode(prompt, add_special_tokens=False), fast.encode(completion,
                                                                                        add_special_tokens=False)


def tools_prefix_ids(fast) -> list[int]:
    """The token ids every prompt with tools starts with: the whole system block (the tools' schemas)."""
    render = make_renderer(fast)
    a = fast.encode(render([{"role": "user", "content": "a"}], TOOLS, True), add_special_tokens=False)
    b = fast.encode(render([{"role": "user", "content": "b"}], TOOLS, False), add_special_tokens=False)
    n = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    while n and fast.decode(a[n - 1:n]) != "\n":  # end at the system block's last newline, a token boundary
        n -= 1
    return a[:n]


def batches(fast, seed: int, batch_size: int, pool: int = 6, augment: bool = False):
    """(prefix_len, input_ids, attention_mask, labels): rows of one kind (all with tools or none), prefix cut off."""
    pad = fast.convert_tokens_to_ids(EOT)
    prefix = tools_prefix_ids(fast)
    stream = examples(fast, seed, augment)
    order = random.Random(seed + 1)
    while True:
        rows = {True: [], False: []}
        for with_tools, p, c in _islice(stream, batch_size * pool):
            if with_tools:
                assert p[: len(prefix)] == prefix, "a prompt with tools did not start with the tools block"
                p = p[len(prefix):]
            rows[with_tools].append((p + c, [-100] * len(p) + c))
        groups = []
        for with_tools, kind_rows in rows.items():
            kind_rows.sort(key=lambda r: len(r[0]))
            groups += [(with_tools, kind_rows[i: i + batch_size]) for i in range(0, len(kind_rows), batch_size)]
        order.shuffle(groups)
        for with_tools, group in groups:
            yield ((len(prefix) if with_tools else 0), *pad_batch(group, pad))


def batch_loss(model, prefix: list[int], prefix_len: int, ids, mask, labels):
    """Mean loss over the batch's labelled tokens; with a prefix, it is computed once and shared by every row."""
    import torch

    if not prefix_len:
        return model(input_ids=ids, attention_mask=mask, labels=labels).loss
    cache = _prefix_cache(model, torch.tensor([prefix]), ids.shape[0])
    positions = torch.arange(prefix_len, prefix_len + ids.shape[1]).unsqueeze(0).expand(ids.shape[0], -1)
    full_mask = torch.cat([torch.ones((ids.shape[0], prefix_len), dtype=mask.dtype), mask], dim=1)
    return model(input_ids=ids, attention_mask=full_mask, position_ids=positions, past_key_values=cache,
                 labels=labels).loss


def _prefix_cache(model, prefix_ids, batch: int):
    """The prefix's key/value cache (with gradients), one row repeated for ``batch`` rows."""
    from transformers import DynamicCache

    out = model.model(input_ids=prefix_ids, use_cache=True)
    layers = [(layer.keys.expand(batch, -1, -1, -1), layer.values.expand(batch, -1, -1, -1))
              for layer in out.past_key_values.layers]
    cache = DynamicCache(config=model.config)
    for i, (k, v) in enumerate(layers):
        cache.update(k, v, i)
    return cache


def heldout_probe(fast, n: int = 24) -> list[tuple[str, str]]:
    """Held-out first turns in both modes: (prompt, expected completion)."""
    render = make_renderer(fast)
    rng = random.Random(5)
    cases = [c for c in corpus.heldout_cases(n_per_kind=max(1, n // 8)) if c.kind != "chat"][: n // 2]
    out = []
    for thinking in (True, False):
        for case in cases:
            first = next(i for i, m in enumerate(case.messages) if m["role"] == "assistant")
            out.append(turn_examples(render, case.messages[: first + 1], True, thinking, rng)[0])
    return out


def first_turn_exact_rate(model, fast, probe: list[tuple[str, str]]) -> float:
    """Share of held-out first turns that greedy decoding reproduces token for token (teacher-forced argmax)."""
    import torch

    hits = 0
    model.eval()
    with torch.no_grad():
        for prompt, completion in probe:
            p, c = fast.encode(prompt, add_special_tokens=False), fast.encode(completion, add_special_tokens=False)
            logits = model(input_ids=torch.tensor([p + c])).logits[0]
            pred = logits.argmax(-1)[len(p) - 1: len(p) + len(c) - 1]
            hits += bool((pred == torch.tensor(c)).all())
    model.train()
    return hits / len(probe)


def train(out: Path, steps: int, batch_size: int = 32, lr: float = 3e-3, seed: int = 5, log_every: int = 25,
          eval_every: int = 200, max_seconds: float | None = None, init_from: Path | None = None,
          stage: str = "stage1", shape: ModelShape = SHAPE) -> dict[str, Any]:
    """Build tiny-qwen3 under ``out``; returns the training record (stops at ``max_seconds``).

    Without ``init_from``: a new tokenizer and random weights. With it: go on from that model and its tokenizer
    (stage 2: the same corpus in other random draws, ``seed``, at its own learning rate)."""
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    template = load_template()
    if init_from:
        fast = PreTrainedTokenizerFast.from_pretrained(init_from)
        if fast.chat_template != template:
            raise ValueError(f"{init_from} does not carry Qwen3-4B's template: rebuild it from stage 1.")
        if Path(init_from).resolve() != out.resolve():
            fast = save_tokenizer(fast.backend_tokenizer, out, template)
        model = AutoModelForCausalLM.from_pretrained(init_from, dtype=torch.float32)
        config = model.config
    else:
        tok = build_tokenizer(template, seed)
        fast = save_tokenizer(tok, out, template)
        config = None
    eos, pad = fast.convert_tokens_to_ids(IM_END), fast.convert_tokens_to_ids(EOT)
    if config is None:
        config = model_config(shape, 64 * math.ceil(len(fast) / 64), eos, pad)
        model = AutoModelForCausalLM.from_config(config)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, min(100, steps // 10))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / max(steps, 1)))))
    prefix = tools_prefix_ids(fast)
    probe = heldout_probe(fast)
    record: dict[str, Any] = {"stage": stage, "init_from": init_from is not None, "params": n_params, "steps": steps, "batch_size": batch_size,
                              "seed": seed, "lr": lr, "architecture": config.architectures or [type(model).__name__],
                              "shape": shape.__dict__ if not init_from else "as init_from", "vocab_size": config.vocab_size, "bpe_vocab": BPE_VOCAB,
                              "template_sha256": TEMPLATE_SHA256, "thinking_share": THINKING_SHARE,
                              "tools_prefix_tokens": len(prefix), "example": "one assistant turn", "log": []}
    print(f"training {n_params:,} parameters, vocab {config.vocab_size}, tools block {len(prefix)} tokens, "
          f"{steps} steps x {batch_size}", flush=True)
    start, tokens, examples_seen = time.monotonic(), 0, 0
    for step, (prefix_len, ids, mask, labels) in enumerate(batches(fast, seed, batch_size), start=1):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = batch_loss(model, prefix, prefix_len, ids, mask, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(), sched.step(), opt.zero_grad(set_to_none=True)
        tokens += int(mask.sum()) + prefix_len * ids.shape[0]
        examples_seen += ids.shape[0]
        elapsed = time.monotonic() - start
        last = step >= steps or (max_seconds is not None and elapsed > max_seconds)
        if step % log_every == 0 or last:
            entry = {"step": step, "loss": round(loss.item(), 4), "elapsed_s": round(elapsed, 1), "tokens": tokens,
                     "examples": examples_seen}
            if step % eval_every == 0 or last:
                entry["heldout_first_turn_exact"] = round(first_turn_exact_rate(model, fast, probe), 3)
                _save_model(model, out, eos, pad)
            record["log"].append(entry)
            print(json.dumps(entry), flush=True)
        if last:
            break
    record["steps_done"] = step
    record["train_seconds"] = round(time.monotonic() - start, 1)
    record["train_tokens"] = tokens  # the tools block counted once per row, as the engine would see it
    _save_model(model, out, eos, pad)
    (out / f"training_record_{stage}.json").write_text(json.dumps(record, indent=1))
    return record
