"""Make the quantized variants of the tiny agent model from its BF16 weights (runs on a CPU).

Run in the quantize environment (``quantize/build.sh`` creates it and runs this):

    python quantize/quantize_tiny.py --source models/tiny-agent --out-root models [--only NAME]

Each variant is written to ``<out-root>/tiny-agent-<suffix>`` with the source's tokenizer files,
chat template and generation config, and a ``quantization_record.json`` (tool and version, scheme,
seconds, the source weights' SHA-256). Which variants vLLM's CPU build serves, and how well, is in
``quantize/README.md``.

- ``fp8-dynamic``: compressed-tensors FP8_DYNAMIC (llmcompressor, no calibration data).
- ``w8a8``: compressed-tensors INT8 W8A8, per-channel weights, dynamic per-token activations.
- ``w4a16``: compressed-tensors W4A16, int4 weights in groups of 128, packed into int32.
- ``gptq-int4``: GPTQ-format int4 (``quant_method: gptq``, group 128, symmetric) written by
  auto-round (installed with llmcompressor), tuned on conversations rendered from ``helpers.tiny.corpus``.

Every variant keeps ``lm_head`` (tied to the embeddings) and the embeddings in BF16.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import itertools
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
IGNORE = ["lm_head"]  # tied to embed_tokens, which is not a Linear layer and stays BF16 anyway
GROUP_SIZE = 128
CALIBRATION_TEXTS = 512  # auto-round keeps those at least CALIBRATION_SEQLEN tokens long
CALIBRATION_SAMPLES = 128
CALIBRATION_SEQLEN = 128
CALIBRATION_SEED = 7  # the training corpus used seeds 0 and 1; any seed gives in-distribution text
AUTOROUND_ITERS = 100
THREADS = 1  # the machine has 2 cores and other work on it


@dataclass(frozen=True)
class Variant:
    """One output: its directory suffix, the scheme written to the record, and how it is made."""

    suffix: str
    tool: str  # the distribution that writes it
    scheme: str
    make: Callable[[Path, Path], dict[str, Any]]  # (source dir, output dir) -> extra record fields


def sha256_file(path: Path) -> str:
    """The hex SHA-256 of a file."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_bf16(source: Path):
    """The source model in BF16 on the CPU, and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16)
    return model, AutoTokenizer.from_pretrained(source)


def calibration_texts(n: int = CALIBRATION_TEXTS, seed: int = CALIBRATION_SEED) -> list[str]:
    """Agent conversations rendered with the chat template, as the model saw them in training."""
    from helpers.tiny import corpus
    from helpers.tiny.build import conversation_text

    stream = corpus.training_conversations(seed)
    return [conversation_text(messages, with_tools)[0] for messages, with_tools in itertools.islice(stream, n)]


def llmcompressor_scheme(scheme: str) -> Callable[[Path, Path], dict[str, Any]]:
    """A data-free llmcompressor preset (round to nearest; activation scales, if any, are dynamic)."""

    def make(source: Path, out: Path) -> dict[str, Any]:
        from llmcompressor import oneshot
        from llmcompressor.modifiers.quantization import QuantizationModifier

        model, tokenizer = load_bf16(source)
        oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme=scheme, ignore=IGNORE))
        model.save_pretrained(out, save_compressed=True)
        return {"algorithm": "round to nearest (QuantizationModifier)", "calibration_samples": 0}

    return make


def autoround_gptq(source: Path, out: Path) -> dict[str, Any]:
    """int4 weights tuned by AutoRound on rendered agent conversations, saved in the GPTQ format."""
    from auto_round import AutoRound

    model, tokenizer = load_bf16(source)
    rounder = AutoRound(model, tokenizer, scheme="W4A16", group_size=GROUP_SIZE, sym=True, iters=AUTOROUND_ITERS,
                        dataset=calibration_texts(), nsamples=CALIBRATION_SAMPLES, seqlen=CALIBRATION_SEQLEN,
                        batch_size=8, device_map="cpu", enable_torch_compile=False,
                        layer_config={name: {"bits": 16} for name in IGNORE})
    staging = out / "staging"
    rounder.quantize_and_save(str(staging), format="auto_gptq")
    written = next(p.parent for p in staging.rglob("model.safetensors"))  # auto-round adds a subfolder
    for path in written.iterdir():
        shutil.move(path, out / path.name)
    shutil.rmtree(staging)
    return {"algorithm": f"AutoRound ({AUTOROUND_ITERS} iterations), exported as auto_gptq",
            "calibration_samples": CALIBRATION_SAMPLES, "calibration_seqlen": CALIBRATION_SEQLEN,
            "calibration_source": f"helpers.tiny.corpus.training_conversations(seed={CALIBRATION_SEED})"}


VARIANTS: dict[str, Variant] = {v.suffix: v for v in (
    Variant("fp8-dynamic", "llmcompressor", "FP8_DYNAMIC", llmcompressor_scheme("FP8_DYNAMIC")),
    Variant("w8a8", "llmcompressor", "W8A8", llmcompressor_scheme("W8A8")),
    Variant("w4a16", "llmcompressor", "W4A16", llmcompressor_scheme("W4A16")),
    Variant("gptq-int4", "auto-round", "W4A16 gptq (int4, group 128, sym)", autoround_gptq),
)}


def versions() -> dict[str, str]:
    """Versions of the packages that shape the checkpoints."""
    names = ("llmcompressor", "compressed-tensors", "auto-round", "transformers", "torch")
    return {name: importlib.metadata.version(name) for name in names}


def tidy(out: Path) -> None:
    """Drop what the writers add that the BF16 model does not ship (and that vLLM does not read)."""
    for name in ("recipe.yaml", "special_tokens_map.json"):
        (out / name).unlink(missing_ok=True)


def build_variant(variant: Variant, source: Path, out_root: Path) -> dict[str, Any]:
    """Write one variant next to the source model; returns its quantization record."""
    import torch

    torch.manual_seed(0)
    out = out_root / f"{source.name}-{variant.suffix}"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    start = time.perf_counter()
    extra = variant.make(source, out)
    seconds = time.perf_counter() - start
    for name in COPIED_FILES:
        shutil.copyfile(source / name, out / name)
    tidy(out)
    record = {
        "variant": out.name,
        "tool": variant.tool,
        "tool_version": importlib.metadata.version(variant.tool),
        "scheme": variant.scheme,
        "ignored_modules": IGNORE,
        **extra,
        "seconds": round(seconds, 1),
        "source_model": source.name,
        "source_sha256": sha256_file(source / "model.safetensors"),
        "versions": versions(),
        "threads": torch.get_num_threads(),
    }
    (out / "quantization_record.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=Path("models/tiny-agent"), help="the BF16 model directory")
    parser.add_argument("--out-root", type=Path, default=Path("models"), help="where the variant directories go")
    parser.add_argument("--only", choices=sorted(VARIANTS), action="append",
                        help="make only this variant (repeatable); default: all")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(THREADS)
    if not (args.source / "model.safetensors").is_file():
        parser.error(f"{args.source} has no model.safetensors: build it first "
                     f"(workshop build-model --out {args.source})")
    for name in args.only or list(VARIANTS):
        record = build_variant(VARIANTS[name], args.source, args.out_root)
        print(f"{record['variant']}: {record['scheme']} in {record['seconds']} s")


if __name__ == "__main__":
    main()
