"""An engine configuration and its translation to and from vLLM's command-line arguments (pure functions; the CPU
translation also reads a stand-in's tokenizer files, to see whether it can take a flag).

Every backend uses this one model: the local engine builds its command line from it, the Kubernetes
engine reads and writes the container's ``args`` with it, tuning prints the ``vllm serve`` line and
the manifest patch from it, and the memory planner reads flag values with it.

Flags follow vLLM's parser (``vllm serve --help``): ``--max-num-seqs 8`` and ``--max-num-seqs=8`` are the
same flag, ``max_num_seqs`` may be written with underscores, and a boolean flag has a ``--no-`` form
(argparse's ``BooleanOptionalAction``, which vLLM's ``EngineArgs`` uses for its boolean fields):
``--no-enable-prefix-caching`` is the flag ``--enable-prefix-caching`` set to False.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODEL_FLAGS = ("--model", "--served-model-name")
# vllm-router 0.1.17's --policy choices (vllm-router --help); the router module and `workshop up --router` read them
ROUTER_POLICIES = ("round_robin", "consistent_hash", "cache_aware", "power_of_two", "random")

# ---------------------------------------------------------------- the CPU lab's flags, and a GPU line translated for a CPU

CPU_KV_CACHE_BYTES = 1 << 30  # 1 GiB of KV cache: on vLLM's CPU build this must be set explicitly
# The model runs inside the engine-core process instead of a separate worker process. With a worker,
# the engine core's main thread waits for each step in a sched_yield loop (vllm/distributed/
# device_communicators/shm_broadcast.py, SpinCondition.wait) that keeps taking the GIL back, so on a
# machine with few free cores its output thread can starve until the engine goes idle: a request's
# whole stream then arrives at once, at its end. On 2 cores that hit 2 to 18 of 32 requests in each of 4
# runs of `vllm bench serve` (TTFT ~0.5 s instead of ~17 ms); in-process, none in 5 runs (README, profiles).
CPU_ENGINE_ENV = (("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),)
# Flags the CPU profile needs and a GPU must not inherit (helpers.engine.interface.default_config)
CPU_ONLY_FLAGS = {
    "--enforce-eager": "on a GPU it turns CUDA graphs off (slower decode); the CPU lab sets it to start sooner",
    "--kv-cache-memory-bytes": "the CPU build's KV-memory knob; on a GPU what --gpu-memory-utilization leaves after "
                               "the weights becomes KV cache",
}
# The GPU baseline's memory fraction (k8s/base/vllm.yaml); on a CPU it stands for CPU_KV_CACHE_BYTES, and
# another fraction for the same share of it, so a change of the knob stays a change.
GPU_MEMORY_UTILIZATION_BASELINE = 0.90
# The room's download (k8s/base/kustomization.yaml PREDOWNLOAD_MODELS, components/with-moe) and the shipped tiny
# model (models/README.md) that stands in for each on a CPU. Qwen3-4B's stand-in is tiny-agent, whose vocabulary the
# drafts and the FP8 variant share; tiny-qwen3 (Qwen3-4B's own chat template, <think> tokens) can stand in for it
# where a caller chooses so (translate_for_cpu's stand_ins).
CPU_STAND_INS = {
    "Qwen/Qwen3-4B": "tiny-agent",
    "RedHatAI/Qwen3-4B-FP8-dynamic": "tiny-agent-fp8-dynamic",
    "Qwen/Qwen3-0.6B": "tiny-draft",
    "Qwen/Qwen3-30B-A3B": "tiny-moe",
}
CPU_MAX_MODEL_LEN = 4096  # the stand-ins' max_position_embeddings (models/README.md); the cluster's is 8,192
# GPU flags a CPU stand-in can take only when its tokenizer has these tokens, each as one token: flag -> (tokens,
# why). translate_for_cpu removes such a flag for a stand-in whose tokenizer files lack them and keeps it otherwise:
# tiny-agent's tokenizer has no <think>, tiny-qwen3's has <think> and </think> (helpers/tiny/qwen3.py).
CPU_DROPPED_FLAGS = {
    "--reasoning-parser": (("<think>", "</think>"), "vLLM's qwen3 parser looks them up by token id"),
}


@dataclass(frozen=True)
class EngineConfig:
    """What to serve and how: the model, the name clients use, and vLLM's command-line flags."""

    model: str
    served_name: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "served_name": self.served_name, "args": list(self.args), "env": dict(self.env)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "EngineConfig":
        return cls(data["model"], data["served_name"], tuple(data.get("args", ())),
                   tuple(sorted(data.get("env", {}).items())))


def flag_name(flag: str) -> str:
    """The canonical name of a flag: ``max_num_seqs``, ``--max-num-seqs=8`` and ``--no-max-num-seqs`` ->
    ``--max-num-seqs``."""
    name = flag.strip().split("=", 1)[0].replace("_", "-")
    name = name if name.startswith("--") else "--" + name.lstrip("-")
    return "--" + name[len("--no-"):] if name.startswith("--no-") else name


def split_flags(args: Sequence[str]) -> list[list[str]]:
    """Group an argument list into [flag, value?] items (``--a=b`` stays one item)."""
    items: list[list[str]] = []
    for token in args:
        if token.startswith("--") or not items:
            items.append([token])
        else:
            items[-1].append(token)
    return items


def _item_value(item: list[str]) -> str | bool:
    head = item[0]
    if head.startswith("--no-"):
        return False
    if "=" in head:
        return head.split("=", 1)[1]
    return item[1] if len(item) > 1 else True


def flag_value(args: Sequence[str], flag: str) -> str | bool | None:
    """A flag's value in an argument list: its string, True for a bare flag, False for its ``--no-`` form,
    None when absent."""
    name = flag_name(flag)
    for item in split_flags(args):
        if flag_name(item[0]) == name:
            return _item_value(item)
    return None


def with_flag(args: Sequence[str], flag: str, value: Any = True) -> tuple[str, ...]:
    """The argument list with one flag replaced or appended: True writes the bare flag, False its ``--no-``
    form, None removes it; dicts and lists (``--speculative-config``) are written as JSON."""
    name = flag_name(flag)
    kept = [item for item in split_flags(args) if flag_name(item[0]) != name]
    if value is True:
        kept.append([name])
    elif value is False:
        kept.append(["--no-" + name[2:]])
    elif value is not None:
        kept.append([name, json.dumps(value) if isinstance(value, (dict, list)) else str(value)])
    return tuple(token for item in kept for token in item)


def flags(args: Sequence[str]) -> dict[str, str | bool]:
    """Every flag of an argument list with its value, in order of first appearance."""
    names = dict.fromkeys(flag_name(item[0]) for item in split_flags(args) if item[0].startswith("--"))
    return {n: v for n in names if (v := flag_value(args, n)) is not None}


def parse_args(args: Sequence[str]) -> tuple[str | None, str | None, tuple[str, ...], bool]:
    """(model, served name, other flags, model given positionally) from a vLLM command's arguments.

    The model is ``--model M``, ``--model=M`` or a leading positional argument (``vllm serve M``);
    of several ``--served-model-name`` aliases the first is kept.
    """
    tokens = list(args)
    model: str | None = None
    served: str | None = None
    positional = bool(tokens) and not tokens[0].startswith("-")
    if positional:
        model, tokens = tokens[0], tokens[1:]
    rest: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name = token.split("=", 1)[0].replace("_", "-")
        if name not in MODEL_FLAGS:
            rest.append(token)
            i += 1
            continue
        if "=" in token:
            value, i = token.split("=", 1)[1], i + 1
        else:
            value, i = (tokens[i + 1] if i + 1 < len(tokens) else ""), i + 2
        while name == "--served-model-name" and i < len(tokens) and not tokens[i].startswith("-"):
            i += 1  # further aliases
        if name == "--model":
            model = value
        else:
            served = value
    return model, served or model, tuple(rest), positional


def config_from_args(args: Sequence[str], drop: Sequence[str] = ()) -> EngineConfig | None:
    """The configuration a vLLM command line serves (``drop``: flags to leave out, e.g. ``--host``,
    ``--port``); None when it names no model."""
    model, served, rest, _ = parse_args(args)
    if not model:
        return None
    for flag in drop:
        rest = with_flag(rest, flag, None)
    return EngineConfig(model=model, served_name=served or model, args=tuple(rest))


def server_args(config: EngineConfig, positional: bool = False) -> list[str]:
    """vLLM's arguments for a configuration: model and served name first, then the flags (``positional``:
    the model as ``vllm serve M`` takes it)."""
    head = [config.model] if positional else ["--model", config.model]
    return [*head, "--served-model-name", config.served_name, *config.args]


def describe_change(old: EngineConfig, new: EngineConfig) -> str:
    """What differs between two configurations, in words: ``--max-num-seqs 32 -> 64, --enforce-eager added``."""
    def show(name: str, value: str | bool) -> str:
        return name if value is True else ("--no-" + name[2:] if value is False else f"{name} {value}")

    parts = []
    if new.model != old.model:
        parts.append(f"model {old.model} -> {new.model}")
    if new.served_name != old.served_name:
        parts.append(f"served name {old.served_name} -> {new.served_name}")
    before, after = flags(old.args), flags(new.args)
    for name, value in after.items():
        if name not in before:
            parts.append(f"{show(name, value)} added")
        elif before[name] != value:
            parts.append(f"{name} {before[name]} -> {value}")
    parts += [f"{name} removed" for name in before if name not in after]
    env_before, env_after = dict(old.env), dict(new.env)
    parts += [f"env {k}={v}" for k, v in env_after.items() if env_before.get(k) != v]
    parts += [f"env {k} removed" for k in env_before if k not in env_after]
    return ", ".join(parts) or "a restart on the same configuration"


def _stand_in(model: str, models_root: str, stand_ins: Mapping[str, str] = CPU_STAND_INS) -> str:
    """A hub id's CPU stand-in as a directory under ``models_root``; any other name as it is."""
    return f"{models_root.rstrip('/')}/{stand_ins[model]}" if model in stand_ins else model


def tokenizer_tokens(model_dir: str | Path) -> set[str]:
    """Every token a model directory's tokenizer files hold as one token (tokenizer.json's vocabulary and added tokens,
    tokenizer_config.json's added tokens); empty when it has none of those files."""
    found: set[str] = set()
    path = Path(model_dir) / "tokenizer.json"
    if path.is_file():
        data = json.loads(path.read_text())
        vocab = (data.get("model") or {}).get("vocab") or {}
        found |= set(vocab) if isinstance(vocab, dict) else {entry[0] for entry in vocab}  # BPE's dict, Unigram's list
        found |= {t["content"] for t in data.get("added_tokens") or []}
    path = Path(model_dir) / "tokenizer_config.json"
    if path.is_file():
        found |= {t["content"] for t in (json.loads(path.read_text()).get("added_tokens_decoder") or {}).values()}
    return found


def _has_tokens(models_root: str, tiny: str, tokens: Sequence[str]) -> bool:
    return set(tokens) <= tokenizer_tokens(Path(models_root) / tiny)


def dropped_for_cpu(args: Sequence[str], models_root: str,
                    stand_ins: Mapping[str, str] = CPU_STAND_INS) -> dict[str, str]:
    """The flags of CPU_DROPPED_FLAGS that ``translate_for_cpu`` removes from these arguments, each with why: those
    whose tokens the stand-in's tokenizer files lack (a tokenizer it cannot read lacks them all)."""
    model, _, rest, _ = parse_args(args)
    local = _stand_in(model, models_root, stand_ins) if model else ""
    have = tokenizer_tokens(local) if local else set()
    dropped = {}
    for flag, (tokens, why) in CPU_DROPPED_FLAGS.items():
        missing = [t for t in tokens if t not in have]
        if flag_value(rest, flag) is not None and missing:
            name = Path(local).name or "the model"
            dropped[flag] = (f"{name}'s tokenizer has no {' or '.join(missing)} as one token: {why}" if have else
                             f"{name} has no tokenizer files here to show {' and '.join(tokens)}: {why}")
    return dropped


def translate_for_cpu(args: Sequence[str], models_root: str,
                      stand_ins: Mapping[str, str] = CPU_STAND_INS) -> list[str]:
    """A GPU engine's ``vllm serve`` arguments as vLLM's CPU build runs them (the table ``cpu_translation_table``
    prints): hub ids -> the shipped stand-ins under ``models_root`` (also inside ``--speculative-config``;
    ``stand_ins``: which, CPU_STAND_INS unless told), ``--gpu-memory-utilization`` -> ``--kv-cache-memory-bytes``
    (the same share of CPU_KV_CACHE_BYTES), ``--max-model-len`` at most CPU_MAX_MODEL_LEN, eager mode, and the flags
    of CPU_DROPPED_FLAGS removed where the stand-in's tokenizer lacks their tokens (``dropped_for_cpu``). The served
    name is kept, so clients see the hub id they asked for."""
    model, served, rest, _ = parse_args(args)
    out = list(rest)
    utilization = flag_value(out, "--gpu-memory-utilization")
    if isinstance(utilization, str):
        share = float(utilization) / GPU_MEMORY_UTILIZATION_BASELINE
        out = list(with_flag(with_flag(out, "--gpu-memory-utilization", None), "--kv-cache-memory-bytes",
                             round(share * CPU_KV_CACHE_BYTES)))
    length = flag_value(out, "--max-model-len")
    if isinstance(length, str) and length.isdigit() and int(length) > CPU_MAX_MODEL_LEN:
        out = list(with_flag(out, "--max-model-len", CPU_MAX_MODEL_LEN))
    speculative = flag_value(out, "--speculative-config")
    if isinstance(speculative, str):
        spec = json.loads(speculative)
        if isinstance(spec.get("model"), str):
            spec["model"] = _stand_in(spec["model"], models_root, stand_ins)
        out = list(with_flag(out, "--speculative-config", spec))
    for flag in dropped_for_cpu(args, models_root, stand_ins):
        out = list(with_flag(out, flag, None))
    if flag_value(out, "--enforce-eager") is None:
        out.append("--enforce-eager")
    if not model:
        return out
    return ["--model", _stand_in(model, models_root, stand_ins), "--served-model-name", served or model, *out]


def cpu_translation_table(models_root: str | None = None) -> list[tuple[str, str, str]]:
    """(on the cluster's GPU, on this CPU, why) for every rule of ``translate_for_cpu``, the stand-ins' tokenizers read
    under ``models_root`` (default: the shipped models)."""
    if models_root is None:
        from helpers.core.settings import models_dir

        models_root = str(models_dir())
    rows = [(hub, f"models/{tiny}", "the room downloads it; a CPU serves the shipped tiny stand-in")
            for hub, tiny in CPU_STAND_INS.items()]
    rows.append(("--gpu-memory-utilization U", f"--kv-cache-memory-bytes U/{GPU_MEMORY_UTILIZATION_BASELINE} x "
                 f"{CPU_KV_CACHE_BYTES:,}", "vLLM's CPU build sizes its KV cache in bytes, not as a GPU share"))
    rows.append((f"--max-model-len above {CPU_MAX_MODEL_LEN:,}", f"--max-model-len {CPU_MAX_MODEL_LEN:,}",
                 "the stand-ins' max_position_embeddings"))
    rows.append(("(CUDA graphs, torch.compile)", "--enforce-eager", CPU_ONLY_FLAGS["--enforce-eager"]))
    shipped = sorted(d.name for d in Path(models_root).iterdir() if d.is_dir()) if Path(models_root).is_dir() else []
    for flag, (tokens, why) in CPU_DROPPED_FLAGS.items():
        lacking = [tiny for tiny in dict.fromkeys(CPU_STAND_INS.values()) if not _has_tokens(models_root, tiny, tokens)]
        taking = [tiny for tiny in shipped if _has_tokens(models_root, tiny, tokens)]
        both = " and ".join(tokens)
        rows.append((f"{flag} P", f"(removed) for {', '.join(lacking) or 'none'}",
                     f"their tokenizers lack {both} as single tokens; {why}"))
        rows.append((f"{flag} P", f"kept for {', '.join(taking) or 'none'}",
                     f"its tokenizer has {both} as single tokens: served as a stand-in (CPU_STAND_INS, or "
                     "translate_for_cpu's stand_ins), it keeps the flag"))
    rows += [("(environment)", f"{name}={value}", "the CPU build's in-process engine core (CPU_ENGINE_ENV)")
             for name, value in CPU_ENGINE_ENV]
    return rows
