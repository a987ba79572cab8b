"""Notebook 06's methods: the ``--speculative-config`` of a method, the map of speculative methods (who proposes the
guesses, what each needs, whether this engine can run it) and prompt lookup (``ngram``) computed by hand."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from helpers.core.settings import models_dir


def spec_config(method: str, num_speculative_tokens: int, model: str | None = None, **options: Any) -> str:
    """The JSON for ``--speculative-config``: ``ngram`` (prompt lookup) or ``draft_model`` (a model name: on the CPU
    profile a shipped tiny model's directory, else a hub id; ``resolve_model`` refuses a tiny model on a cluster)."""
    if num_speculative_tokens < 1:
        raise ValueError("num_speculative_tokens must be >= 1")
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": num_speculative_tokens, **options}
    if method == "draft_model":
        if not model:
            raise ValueError("method draft_model needs model= (a draft sharing the target's tokenizer)")
        from helpers.core.settings import load_settings
        from helpers.engine.interface import resolve_model

        config["model"] = resolve_model(model, load_settings().profile)  # on a cluster: a hub id, never a local path
    elif method == "ngram":
        config.setdefault("prompt_lookup_max", 4)
        config.setdefault("prompt_lookup_min", 2)
    else:
        raise ValueError(f"unknown method {method!r}: use 'ngram' or 'draft_model'")
    return json.dumps(config, separators=(",", ":"))


def prompt_lookup_length(token_ids: list[int], start: int, k: int, n_min: int = 2, n_max: int = 4) -> float:
    """Mean tokens per step that ngram prompt lookup would give when the text from ``start`` on is what the model
    says (greedy, as if the target always agreed with the text): at each step the last n tokens (n from n_max
    down to n_min) are looked up earlier in the context, the k tokens after the latest match are proposed, and the
    step keeps the agreeing prefix plus one token. vLLM's ngram proposer works the same way."""
    if not 0 < start < len(token_ids):
        raise ValueError("start must fall inside the text: the prompt is token_ids[:start]")
    pos, steps = start, 0
    while pos < len(token_ids):
        proposal: list[int] = []
        for n in range(n_max, n_min - 1, -1):
            if pos < n:
                continue
            tail = token_ids[pos - n:pos]
            for i in range(pos - n - 1, -1, -1):
                if token_ids[i:i + n] == tail:
                    proposal = token_ids[i + n:i + n + k]
                    break
            if proposal:
                break
        accepted = 0
        while accepted < len(proposal) and pos + accepted < len(token_ids) and proposal[accepted] == token_ids[pos + accepted]:
            accepted += 1
        pos += accepted + 1
        steps += 1
    return (len(token_ids) - start) / steps


METHODS: tuple[dict[str, str], ...] = (  # facts: what proposes the guesses and what it needs; source per row
    {"method": "ngram", "vllm": "ngram", "proposer": "the last n tokens looked up earlier in the prompt and the "
     "text so far; the tokens after the match are the guesses", "needs": "nothing (no weights, no training)",
     "source": "vLLM docs, Speculative Decoding (n-gram / prompt lookup decoding)"},
    {"method": "suffix decoding", "vllm": "suffix", "proposer": "suffix trees over this request's prompt and "
     "earlier responses; guesses as long as the tree predicts well", "needs": "the arctic-inference package; no "
     "weights", "source": "Oliaro et al. 2024, SuffixDecoding; vLLM docs, Speculative Decoding"},
    {"method": "draft model", "vllm": "draft_model", "proposer": "a smaller model with the same tokenizer, run k "
     "steps ahead", "needs": "a draft checkpoint sharing the target's vocabulary (about 10x smaller)",
     "source": "Leviathan et al. 2023; Chen et al. 2023 (speculative sampling)"},
    {"method": "EAGLE / EAGLE-3", "vllm": "eagle / eagle3", "proposer": "a one-layer head fed the target's hidden "
     "states (EAGLE-3: from several layers), predicting the next tokens", "needs": "a head trained for this "
     "target model", "source": "Li et al. 2024, EAGLE; Li et al. 2025, EAGLE-3; vLLM docs"},
    {"method": "MTP", "vllm": "mtp", "proposer": "the model's own multi-token-prediction layers, trained with it",
     "needs": "a model pre-trained with MTP layers (DeepSeek-V3, Qwen3-Next, GLM-4.5 ...)",
     "source": "DeepSeek-V3 technical report (2024); vLLM docs, Speculative Decoding"},
    {"method": "Medusa", "vllm": "medusa", "proposer": "several extra heads on the target, head i guessing the "
     "token i positions ahead", "needs": "heads trained on the target", "source": "Cai et al. 2024, Medusa"},
)


def installed_spec_methods() -> tuple[str, ...] | None:
    """The ``--speculative-config`` method names the vLLM installed here accepts, read from its source without
    importing it; None when vLLM is not installed here."""
    import ast
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        tree = ast.parse((Path(next(iter(spec.submodule_search_locations))) / "config/speculative.py").read_text())
    except (OSError, SyntaxError):
        return None
    names = [c.value for node in tree.body if isinstance(node, ast.Assign)
             and getattr(node.targets[0], "id", "").endswith(("Method", "Types"))
             for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    return tuple(names) or None


def _heads_for(target_dir: Any, kind: str) -> bool:
    """Does a shipped model declare ``kind`` heads (eagle, medusa) or does the target have MTP layers?"""
    target = json.loads((target_dir / "config.json").read_text()) if (target_dir / "config.json").is_file() else {}
    if kind == "mtp":
        return any(k in target for k in ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers"))
    for config in models_dir().glob("*/config.json"):
        if any(kind in a.lower() for a in json.loads(config.read_text()).get("architectures", [])):
            return True
    return False


def method_map(target: str, measured: list[str], profile: str = "cpu") -> pd.DataFrame:
    """One row per method: what proposes, what it needs, vLLM's name, whether this engine can run it (the installed
    vLLM's accepted names, the packages and weights present) and whether this notebook measures it."""
    import importlib.util

    known, target_dir = installed_spec_methods(), models_dir() / target
    rows = []
    for m in METHODS:
        names = [n.strip() for n in m["vllm"].split("/")]
        if profile != "cpu":
            here = f"not probed: the engine runs on the {profile} profile"
        elif known is not None and not any(n in known for n in names):
            here = "no: this vLLM does not accept the method"
        elif m["vllm"] == "suffix":
            here = "yes" if importlib.util.find_spec("arctic_inference") else "no: the arctic_inference package is not installed"
        elif m["vllm"] in ("ngram", "draft_model"):
            here = "yes"
        elif _heads_for(target_dir, "mtp" if m["vllm"] == "mtp" else names[0]):
            here = "yes (trained weights found)"
        else:
            here = f"no: needs {m['needs']}; none is shipped for {target}"
        rows.append({**{k: m[k] for k in ("method", "proposer", "needs")}, "--speculative-config method": m["vllm"],
                     "this machine": here, "this notebook": "measured" if m["vllm"] in measured else "-",
                     "source": m["source"]})
    return pd.DataFrame(rows)


def copied_text_lookup(model: str, text: str, copies: int, k: int) -> tuple[float, str]:
    """Tokens per step ngram prompt lookup would give (``prompt_lookup_length``) on an answer that repeats
    ``text`` ``copies`` times after a prompt holding it once, tokenized with ``model``'s tokenizer."""
    if copies < 1:
        raise ValueError("copies must be >= 1 (the answer repeats the text at least once)")
    from helpers.core.models import LESSON_MODELS

    path, note = models_dir() / model / "tokenizer.json", ""
    if not path.is_file():  # a hub id: its tokenizer from the local cache, else its role's shipped stand-in's
        try:
            from transformers import AutoTokenizer

            slow = AutoTokenizer.from_pretrained(model, local_files_only=True)
            encode = lambda s: slow.encode(s, add_special_tokens=False)  # noqa: E731
        except (ImportError, OSError, ValueError):
            stand_in = next((m.cpu for m in LESSON_MODELS.values() if m.gpu == model), "tiny-agent")
            path = models_dir() / stand_in / "tokenizer.json"
            note = f" (tokenized with {stand_in}'s tokenizer: {model}'s is not on this machine)"
    if path.is_file():  # the tokenizers library reads it in milliseconds
        from tokenizers import Tokenizer

        fast = Tokenizer.from_file(str(path))
        encode = lambda s: fast.encode(s, add_special_tokens=False).ids  # noqa: E731
    prompt = encode(f"Repeat this {copies} time(s): {text}\n")
    answer = encode(" ".join([text] * copies))
    length = prompt_lookup_length(prompt + answer, len(prompt), k)
    return length, (f"{len(answer)} answer tokens in {len(answer) / length:.0f} steps = {length:.2f} tokens per step "
                    f"(k={k}){note}")


def lookup_outcome(length: float, k: int) -> str:
    """'about 1', 'between 1 and k+1' or 'about k+1' tokens per step."""
    return "about 1" if length < 1.2 else "about k+1" if length >= 0.9 * (k + 1) else "between 1 and k+1"


def draft_methods(k: int, aligned: str | None, misaligned: str | None, names: tuple[str, str, str],
                  baseline: str) -> dict[str, str | None]:
    """The method grid's methods: no speculation, the aligned and the misaligned draft at ``k`` guesses and ngram
    (``names``: their labels); a draft the room did not download (None) is left out with its sentence printed."""
    from helpers.core.models import missing_reason

    methods: dict[str, str | None] = {baseline: None}
    for name, model, role in ((names[0], aligned, "draft"), (names[1], misaligned, "misaligned-draft")):
        if model is None:
            print(missing_reason(role))
        else:
            methods[name] = spec_config("draft_model", k, model=model)
    methods[names[2]] = spec_config("ngram", k)
    return methods
