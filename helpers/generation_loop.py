"""A generation loop written by hand (transformers, greedy), with and without the KV cache.

Without the cache, every new token re-runs the whole sequence through the model, so a step costs
more the longer the context; with it, a step runs only the newest token against the stored keys and
values. ``timed_generation`` records each step's wall time so notebook 03 can plot both.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd


def load_model(model_dir: str | Path):
    """The model (float32, eval mode) and its tokenizer from a local directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


def timed_generation(model, prompt_ids: list[int], new_tokens: int, use_cache: bool) -> pd.DataFrame:
    """Greedy-decode ``new_tokens`` tokens; one row per step: context length, step time (s), token id."""
    import torch

    ids = torch.tensor([prompt_ids])
    past, rows = None, []
    with torch.inference_mode():
        for step in range(new_tokens):
            start = time.perf_counter()
            if use_cache:
                out = model(input_ids=ids if past is None else ids[:, -1:], past_key_values=past, use_cache=True)
                past = out.past_key_values
            else:
                out = model(input_ids=ids, use_cache=False)
            token = int(out.logits[0, -1].argmax())
            rows.append({"step": step, "context_tokens": ids.shape[1], "step_s": time.perf_counter() - start,
                         "token": token})
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return pd.DataFrame(rows)


def compare_loops(model, prompt_ids: list[int], new_tokens: int) -> pd.DataFrame:
    """Both loops on the same prompt, stacked with a ``cache`` column ("with KV cache" / "without")."""
    with_cache = timed_generation(model, prompt_ids, new_tokens, use_cache=True).assign(cache="with KV cache")
    without = timed_generation(model, prompt_ids, new_tokens, use_cache=False).assign(cache="without")
    return pd.concat([with_cache, without], ignore_index=True)
