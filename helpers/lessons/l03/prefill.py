"""Prefill against decode, measured: TTFT grows with the prompt, TPOT much less.

``measure_prefill_decode`` sends one request at a time, the prompt lengths interleaved (64, 512, ...,
64, 512, ...) so a busy spell of the machine hits every length alike, and keeps every request.
``conclude_prefill_decode`` checks the lesson's two expectations against the repeats' spread.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from helpers.core.comparison import SAME, WORSE, compare_samples, interleave
from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion

# TPOT "hardly moves" when the longest prompt's mean TPOT is within this factor of the shortest's
# (each decode step re-reads all weights; the KV cache it reads on top grows with the context).
TPOT_FLAT_FACTOR = 1.25


def measure_prefill_decode(settings: Any, prompt_lengths: list[int], decode_tokens: int, repeats: int,
                           model: str | None = None) -> pd.DataFrame:
    """One row per request (``repeats`` per prompt length, lengths interleaved, after one warm-up):
    target length, prompt tokens the server counted, TTFT and TPOT in ms."""
    from helpers.measure.bench_results import requests_frame
    from helpers.measure.loadgen import prompt_factory, run_load
    from helpers.measure.workloads import Load, Workload

    # calibrated once; every run still gets unique prompts (run_load salts each run)
    kwargs = {"model": model or settings.model, "prompts": prompt_factory(settings, model), "progress": False}

    def one(n: int, warmup: int = 0):
        return lambda: requests_frame(run_load(settings, Workload(input_len=n, output_len=decode_tokens),
                                               Load(concurrency=1, num_requests=1, warmup_requests=warmup), **kwargs))

    one(prompt_lengths[0], warmup=1)()  # warm-up: the first request after start pays one-off costs
    runs = interleave({n: one(n) for n in prompt_lengths}, repeats, desc="requests (by prompt tokens)")
    frames = [frame.assign(target_tokens=n, repeat=i) for n, results in runs.items() for i, frame in enumerate(results)]
    return pd.concat(frames, ignore_index=True)[["target_tokens", "repeat", "prompt_tokens", "ttft_ms", "tpot_ms", "ok"]]


def prefill_table(requests: pd.DataFrame) -> pd.DataFrame:
    """Per prompt length: mean prompt tokens, mean TTFT and TPOT (ms), their prefill and decode rates."""
    ok = requests[requests["ok"]]
    table = ok.groupby("target_tokens").agg(prompt_tokens=("prompt_tokens", "mean"), requests=("ok", "size"),
                                            mean_ttft_ms=("ttft_ms", "mean"), mean_tpot_ms=("tpot_ms", "mean"))
    table["failed"] = requests.groupby("target_tokens")["ok"].apply(lambda s: int((~s).sum()))
    table["prefill_tokens_per_s"] = table["prompt_tokens"] / (table["mean_ttft_ms"] / 1000)
    table["decode_tokens_per_s"] = 1000 / table["mean_tpot_ms"]
    return table.reset_index(drop=True)


def conclude_prefill_decode(requests: pd.DataFrame, quiet: bool | None = None,
                            tpot_flat_factor: float = TPOT_FLAT_FACTOR) -> list[Conclusion]:
    """The two expectations, shortest against longest prompt: TTFT grows (beyond the repeats' spread);
    TPOT hardly moves (within the spread, or within ``tpot_flat_factor``). ``quiet``: the quiet-machine
    check's answer, named as a reason when TPOT moved anyway."""
    ok = requests[requests["ok"]]
    lengths = sorted(ok["target_tokens"].unique())
    if len(lengths) < 2:
        return [Conclusion("one prompt length only: nothing to compare.", NOT_SHOWN, "TTFT grows with the prompt")]
    short, long = ok[ok.target_tokens == lengths[0]], ok[ok.target_tokens == lengths[-1]]
    n_short, n_long = short["prompt_tokens"].mean(), long["prompt_tokens"].mean()
    out = []
    ttft = compare_samples(short["ttft_ms"].tolist(), long["ttft_ms"].tolist(), higher_is_better=False)
    text = (f"TTFT went from {ttft.mean_a:,.0f} ms at {n_short:,.0f} prompt tokens to {ttft.mean_b:,.0f} ms at "
            f"{n_long:,.0f} ({ttft.describe()}; {n_long / ttft.mean_b * 1000:,.0f} prompt tokens/s)")
    if ttft.label == WORSE:
        out.append(Conclusion(text + ": prefill does work in proportion to the prompt.", SHOWN,
                              "TTFT grows with the prompt"))
    elif ttft.label == SAME:
        out.append(Conclusion(text + ": the difference is not larger than the run-to-run spread (prompts too short "
                              "to differ, or a noisy machine).", WITHIN_NOISE, "TTFT grows with the prompt"))
    else:
        out.append(Conclusion(text + ": the longer prompt was served faster, which prefill alone cannot do: the "
                              "short prompts waited for something else (a busy machine, queueing).", NOT_SHOWN,
                              "TTFT grows with the prompt"))
    tpot = compare_samples(short["tpot_ms"].tolist(), long["tpot_ms"].tolist(), higher_is_better=False)
    expectation = "TPOT hardly moves with the prompt"
    text = (f"TPOT went from {tpot.mean_a:.1f} to {tpot.mean_b:.1f} ms per token ({tpot.describe()}), "
            f"while TTFT changed {ttft.ratio:.1f}x")
    if tpot.label != WORSE or tpot.ratio <= tpot_flat_factor:
        out.append(Conclusion(text + ": each decode step reads the weights once; the longer KV cache adds little.",
                              SHOWN, expectation))
    else:
        reasons = [f"the longer context costs each step more here ({tpot.ratio:.2f}x, beyond {tpot_flat_factor:g}x: on a "
                   "CPU attention over thousands of tokens is not small next to a tiny model's weights)"]
        if quiet is False:
            reasons.insert(0, "the machine was busy during the run (see the quiet-machine check above), which "
                              "slows decode steps unevenly")
        out.append(Conclusion(text + ": " + "; or ".join(reasons) + ".", NOT_SHOWN, expectation))
    return out
