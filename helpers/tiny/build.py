"""Build the tiny models this kit ships: tokenizer, Qwen3 config, training loop (runs on a CPU).

Rebuild with ``workshop build-model --out models/tiny-agent`` (or ``python -m helpers.tiny.build``).
A rebuild is reproducible: the corpus, the tokenizer and the initial weights all come from seeds.

Tokenizer: byte-level BPE trained on the corpus, plus single tokens for every catalog city and
every integer 0..1999, so that copying a city or a number from the prompt into a tool call is a
one-token identity map (probes with sub-word names and multi-digit numbers failed to copy). Other
digits are split one per token.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from helpers.tiny import chat_format as cf
from helpers.tiny import corpus
from helpers.tiny.tools import TOOLS, city_catalog

BPE_VOCAB = 1536


@dataclass(frozen=True)
class ModelShape:
    """Architecture of a tiny Qwen3 model (head_dim 64: the CPU attention kernel needs >= 32)."""

    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    max_position_embeddings: int = 4096


@dataclass(frozen=True)
class MoeShape(ModelShape):
    """A tiny Qwen3-MoE: every layer's MLP is ``num_experts`` experts of ``moe_intermediate_size``, top-k routed.

    With 8 experts of 384 and top 2, the active MLP per token equals the dense model's 768, while the
    total MLP weights are four times larger: the dense-vs-MoE lesson of notebook 04 in miniature.
    """

    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 384
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    output_router_logits: bool = True  # adds the load-balancing loss, so that all experts get used


# The draft model for speculative decoding (notebook 06): one layer, hidden 128, same tokenizer.
DRAFT_SHAPE = ModelShape(hidden_size=128, intermediate_size=384, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1)


def model_config(shape: ModelShape, vocab_size: int, eos: int, pad: int):
    """The transformers config of a shape: Qwen3 for a dense shape, Qwen3-MoE for a :class:`MoeShape`."""
    from transformers import Qwen3Config, Qwen3MoeConfig

    cls = Qwen3MoeConfig if isinstance(shape, MoeShape) else Qwen3Config
    return cls(vocab_size=vocab_size, tie_word_embeddings=True, rope_parameters={"rope_theta": 10000.0,
               "rope_type": "default"}, bos_token_id=eos, eos_token_id=eos, pad_token_id=pad, dtype="bfloat16",
               **shape.__dict__)


def conversation_text(messages: list[dict[str, Any]], with_tools: bool) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans the assistant wrote."""
    text, spans = "", []
    for piece, is_assistant in cf.render_segments(messages, TOOLS if with_tools else None):
        if is_assistant:
            spans.append((len(text), len(text) + len(piece)))
        text += piece
    return text, spans


def build_tokenizer(seed: int = 0):
    """Train the byte-level BPE and add the single-token cities, numbers and chat tags."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, special_tokens=[cf.EOT, cf.IM_START, cf.IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    texts = (conversation_text(m, t)[0] for m, t in itertools.islice(corpus.training_conversations(seed), 20000))
    tok.train_from_iterator(texts, trainer)
    tags = [cf.TOOL_CALL_START, cf.TOOL_CALL_END, cf.TOOL_RESPONSE_START, cf.TOOL_RESPONSE_END]
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in tags])
    words = list(city_catalog()) + [str(i) for i in range(corpus.NUMBER_TOKENS_MAX + 1)] + [f"0{i}" for i in range(10)]
    tok.add_tokens([AddedToken(w, single_word=True, normalized=False, special=False) for w in words])
    return tok


def save_tokenizer(tok, out: Path) -> Any:
    """Save as a transformers fast tokenizer with the chat template; returns the loaded wrapper."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=cf.IM_END, pad_token=cf.EOT,
                                   model_max_length=ModelShape.max_position_embeddings)
    fast.chat_template = cf.CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def encode_example(tok, messages: list[dict[str, Any]], with_tools: bool) -> tuple[list[int], list[int]]:
    """Token ids and labels (-100 outside the assistant's own tokens)."""
    text, spans = conversation_text(messages, with_tools)
    enc = tok.encode(text)
    labels = []
    for token_id, (start, _end) in zip(enc.ids, enc.offsets):
        inside = any(a <= start < b for a, b in spans)
        labels.append(token_id if inside else -100)
    return enc.ids, labels


def batches(tok, seed: int, batch_size: int, pool: int = 8, augment: bool = False) -> Iterator[tuple[Any, Any, Any]]:
    """Padded (input_ids, attention_mask, labels) tensors from the endless training stream.

    Conversations are drawn ``pool`` batches at a time and grouped by length, so little is padding.
    """
    import random

    pad = tok.token_to_id(cf.EOT)
    stream = corpus.training_conversations(seed, augment=augment)
    order = random.Random(seed + 1)
    while True:
        rows = sorted((encode_example(tok, m, t) for m, t in itertools.islice(stream, batch_size * pool)),
                      key=lambda r: len(r[0]))
        groups = [rows[i: i + batch_size] for i in range(0, len(rows), batch_size)]
        order.shuffle(groups)
        for group in groups:
            yield pad_batch(group, pad)


def pad_batch(group: list[tuple[list[int], list[int]]], pad: int):
    """One batch of (ids, labels) rows as right-padded tensors: ids, attention mask, labels (-100 where padded)."""
    import torch

    width = max(len(ids) for ids, _ in group)
    ids = torch.full((len(group), width), pad, dtype=torch.long)
    labels = torch.full((len(group), width), -100, dtype=torch.long)
    mask = torch.zeros((len(group), width), dtype=torch.long)
    for i, (row_ids, row_labels) in enumerate(group):
        ids[i, : len(row_ids)] = torch.tensor(row_ids)
        labels[i, : len(row_labels)] = torch.tensor(row_labels)
        mask[i, : len(row_ids)] = 1
    return ids, mask, labels


def first_call_exact_rate(model, tok, examples: list[corpus.Example]) -> float:
    """Share of held-out examples whose first assistant turn is argmax-exact under teacher forcing.

    Exact under teacher forcing means greedy decoding reproduces that turn token for token.
    """
    import torch

    hits = 0
    model.eval()
    with torch.no_grad():
        for ex in examples:
            first = next(i for i, m in enumerate(ex.messages) if m["role"] == "assistant")
            ids, labels = encode_example(tok, ex.messages[: first + 1], with_tools=True)
            logits = model(input_ids=torch.tensor([ids])).logits[0]
            pred = logits.argmax(-1)
            target = torch.tensor(labels)
            where = (target[1:] != -100)
            hits += bool((pred[:-1][where] == target[1:][where]).all())
    model.train()
    return hits / len(examples)


def train(out: Path, steps: int, batch_size: int = 48, lr: float = 2e-3, seed: int = 0,
          shape: ModelShape = ModelShape(), log_every: int = 50, eval_every: int = 250,
          checkpoint_every: int = 500, init_from: Path | None = None, augment: bool = False,
          stage: str = "stage1", tokenizer_from: Path | None = None) -> dict[str, Any]:
    """Train one stage and save model and tokenizer under ``out``; returns the training record.

    Without ``init_from``: start from random weights, with the tokenizer of ``tokenizer_from`` (so a
    second model shares the first one's vocabulary, as an MoE sibling or a draft model must) or a
    newly built one. With ``init_from``: continue from that model and its tokenizer (stage 2 trains on
    composed, noisier phrasings: ``augment``).
    """
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    tok_dir = init_from or tokenizer_from
    tok = Tokenizer.from_file(str(Path(tok_dir) / "tokenizer.json")) if tok_dir else build_tokenizer(seed)
    save_tokenizer(tok, out)
    eos, pad = tok.token_to_id(cf.IM_END), tok.token_to_id(cf.EOT)
    if init_from:
        model = AutoModelForCausalLM.from_pretrained(init_from, dtype=torch.float32)
        config = model.config
    else:
        config = model_config(shape, 64 * math.ceil(tok.get_vocab_size() / 64), eos, pad)
        model = AutoModelForCausalLM.from_config(config)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, min(200, steps // 10))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / max(steps, 1)))))
    probe = corpus.heldout_cases(n_per_kind=12)[:48]
    record: dict[str, Any] = {"stage": stage, "params": n_params, "steps": steps, "batch_size": batch_size,
                              "seed": seed, "lr": lr, "augment": augment, "init_from": init_from is not None,
                              "architecture": config.architectures or [type(model).__name__],
                              "shape": shape.__dict__, "log": []}
    start, tokens = time.monotonic(), 0
    print(f"training {n_params:,} parameters, vocab {config.vocab_size}, {steps} steps x {batch_size}", flush=True)
    if steps == 0:
        _save_model(model, out, eos, pad)
    for step, (ids, mask, labels) in enumerate(batches(tok, seed, batch_size, augment=augment) if steps else [],
                                               start=1):
        with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 matmuls, fp32 master weights
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(), sched.step(), opt.zero_grad(set_to_none=True)
        tokens += int(mask.sum())
        if step % log_every == 0 or step == steps:
            entry = {"step": step, "loss": round(loss.item(), 4), "elapsed_s": round(time.monotonic() - start, 1),
                     "tokens": tokens}
            if step % eval_every == 0 or step == steps:
                entry["heldout_first_turn_exact"] = round(first_call_exact_rate(model, tok, probe), 3)
            record["log"].append(entry)
            print(json.dumps(entry), flush=True)
        if step % checkpoint_every == 0 or step == steps:
            _save_model(model, out, eos, pad)
        if step >= steps:
            break
    record["train_seconds"] = round(time.monotonic() - start, 1)
    record["train_tokens"] = tokens
    (out / f"training_record_{stage}.json").write_text(json.dumps(record, indent=1))
    return record


def build(out: Path, stage1_steps: int = 2000, stage2_steps: int = 500, batch_size: int = 48) -> list[dict[str, Any]]:
    """The whole recipe of the shipped tiny-agent: stage 1 from scratch, stage 2 on composed phrasings."""
    first = train(out, stage1_steps, batch_size=batch_size, lr=2e-3, seed=0, stage="stage1")
    second = train(out, stage2_steps, batch_size=batch_size, lr=1e-3, seed=1, init_from=out, augment=True,
                   stage="stage2")
    return [first, second]


def build_sibling(kind: str, out: Path, steps: int, agent_dir: Path, batch_size: int = 32) -> dict[str, Any]:
    """A model that shares the tiny agent's tokenizer: ``moe`` (notebook 04), ``draft`` (notebook 06,
    trained on the same corpus, so it agrees with the agent) or ``draft-untrained`` (the misaligned
    draft: the same shape with its random initial weights, ``steps`` ignored)."""
    if kind == "moe":
        return train(out, steps, batch_size=batch_size, lr=2e-3, seed=2, shape=MoeShape(), tokenizer_from=agent_dir,
                     stage="stage1")
    if kind == "draft":
        return train(out, steps, batch_size=batch_size, lr=3e-3, seed=3, shape=DRAFT_SHAPE, tokenizer_from=agent_dir,
                     stage="stage1")
    if kind == "draft-untrained":
        return train(out, 0, batch_size=batch_size, seed=4, shape=DRAFT_SHAPE, tokenizer_from=agent_dir,
                     stage="untrained")
    raise ValueError(f"unknown model kind {kind!r}: use agent, moe, draft or draft-untrained")


def _save_model(model, out: Path, eos: int, pad: int) -> None:
    import torch
    from transformers import GenerationConfig

    state = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
    model.config.dtype = "bfloat16"  # what the weights on disk are; vLLM serves them as such
    model.save_pretrained(out, state_dict=state)
    GenerationConfig(eos_token_id=eos, pad_token_id=pad, bos_token_id=eos).save_pretrained(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Rebuild a tiny agent model from its seed.")
    parser.add_argument("--out", type=Path, default=Path("models/tiny-agent"))
    parser.add_argument("--stage1-steps", type=int, default=2000)
    parser.add_argument("--stage2-steps", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=48)
    args = parser.parse_args(argv)
    build(args.out, args.stage1_steps, args.stage2_steps, args.batch_size)


if __name__ == "__main__":
    main()
