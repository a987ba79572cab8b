"""An engine configuration and its translation to and from vLLM's command-line arguments (pure functions).

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MODEL_FLAGS = ("--model", "--served-model-name")
# vllm-router 0.1.17's --policy choices (vllm-router --help); the router module and `workshop up --router` read them
ROUTER_POLICIES = ("round_robin", "consistent_hash", "cache_aware", "power_of_two", "random")


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
