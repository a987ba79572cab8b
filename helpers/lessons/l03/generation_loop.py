"""A generation loop written by hand (transformers, greedy), with and without the KV cache.

Without the cache, every new token re-runs the whole sequence through the model, so a step costs
more the longer the context; with it, a step runs only the newest token against the stored keys and
values. ``timed_generation`` records each step's wall time so notebook 03 can plot both.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd

from helpers.core.conclusion import NOT_SHOWN, SHOWN, Conclusion


def load_model(model_dir: str | Path):
    """The model (float32, eval mode) and its tokenizer from a local directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


def timed_generation(model, prompt_ids: list[int], new_tokens: int, use_cache: bool,
                     progress: bool | None = None) -> pd.DataFrame:
    """Greedy-decode ``new_tokens`` tokens; one row per step: context length, step time (s), token id.
    A bar counts the steps (``progress`` None: in a notebook only)."""
    import torch

    from helpers.core.progress import steps

    ids = torch.tensor([prompt_ids])
    past, rows = None, []
    desc = "loop with KV cache" if use_cache else "loop without a cache"
    with torch.inference_mode():
        for step in steps(range(new_tokens), desc, "token", progress):
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


def steps_frame(with_cache: Any, without: Any) -> pd.DataFrame:
    """The two loops' steps (each a frame or a list of rows: step, context_tokens, step_s, token) stacked with a
    ``cache`` column ("with KV cache" / "without"): what the plot and the conclusions take."""
    columns = ["step", "context_tokens", "step_s", "token"]
    return pd.concat([pd.DataFrame(with_cache, columns=columns).assign(cache="with KV cache"),
                      pd.DataFrame(without, columns=columns).assign(cache="without")], ignore_index=True)


def compare_loops(model, prompt_ids: list[int], new_tokens: int) -> pd.DataFrame:
    """Both loops on the same prompt, stacked with a ``cache`` column ("with KV cache" / "without")."""
    return steps_frame(timed_generation(model, prompt_ids, new_tokens, use_cache=True),
                       timed_generation(model, prompt_ids, new_tokens, use_cache=False))


def conclude_loops(steps: pd.DataFrame, new_tokens: int) -> list[Conclusion]:
    """What the two hand-written loops showed: same tokens, and the cached loop's steps cheaper and
    flat while the uncached loop's steps grow with the context (``compare_loops`` output)."""
    with_cache, without = steps[steps.cache == "with KV cache"], steps[steps.cache == "without"]
    same = len(with_cache) == len(without) and (with_cache["token"].values == without["token"].values).all()
    out = [Conclusion(f"both loops produced the same {new_tokens} tokens" if same else
                      "the two loops produced different tokens: the cache changed the result (a bug to report)",
                      SHOWN if same else NOT_SHOWN, "the KV cache changes the speed, not the tokens")]
    total_with, total_without = with_cache["step_s"].sum(), without["step_s"].sum()
    last_with, last_without = with_cache["step_s"].iloc[-1] * 1000, without["step_s"].iloc[-1] * 1000
    text = (f"without a KV cache the loop took {total_without:.2f} s for {new_tokens} tokens, with it "
            f"{total_with:.2f} s; the last step cost {last_without:.1f} ms vs {last_with:.1f} ms")
    shown = total_with < total_without
    out.append(Conclusion(text + (": re-running the whole context every step is the work the cache saves." if shown else
                                  ": no saving here (a context this short costs little to recompute, or the machine "
                                  "was busy)."), SHOWN if shown else NOT_SHOWN, "the KV cache makes generation faster"))
    return out


def loop_summary(steps: pd.DataFrame) -> tuple[bool, pd.DataFrame]:
    """Whether both loops chose the same tokens, and per loop: total seconds, first and last step (ms)."""
    with_cache, without = steps[steps.cache == "with KV cache"], steps[steps.cache == "without"]
    same = len(with_cache) == len(without) and bool((with_cache["token"].values == without["token"].values).all())
    table = steps.groupby("cache").agg(total_s=("step_s", "sum"),
                                       first_step_ms=("step_s", lambda s: s.iloc[min(1, len(s) - 1)] * 1000),
                                       last_step_ms=("step_s", lambda s: s.iloc[-1] * 1000))
    return same, table
