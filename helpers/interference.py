"""How one long prefill, arriving in a continuous batch, stalls the decodes already running.

``measure_prefill_stall`` starts ``n_streams`` long generations, waits until they decode steadily,
then sends one request with a long prompt (``max_tokens=1``: it is all prefill). Every running
stream's token arrival times are kept, so the gaps while the long prompt is prefilled can be set
against the steady gaps before it. With chunked prefill (``--max-num-batched-tokens``) the prefill is
cut into pieces that share engine steps with the decodes: more, smaller stalls instead of one long one.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from statistics import median
from typing import Any

import pandas as pd

from helpers.loadgen import prompt_factory
from helpers.stream_timing import StreamTiming, stream_chat


@dataclass
class StallResult:
    """The running streams, the long request, and when its prefill ran (perf_counter seconds)."""

    streams: list[StreamTiming]
    long_request: StreamTiming
    prefill_start: float  # the long request was sent
    prefill_end: float  # its first (and only) token arrived

    def gaps(self) -> pd.DataFrame:
        """Every inter-token gap of the running streams: when it ended, its length (ms), during the prefill?"""
        rows = []
        for number, s in enumerate(self.streams):
            for t0, t1 in zip(s.chunk_times, s.chunk_times[1:]):
                overlaps = t0 < self.prefill_end and t1 > self.prefill_start
                rows.append({"stream": number, "t_s": t1 - self.prefill_start, "gap_ms": (t1 - t0) * 1000,
                             "during_prefill": overlaps})
        return pd.DataFrame(rows)

    def summary(self) -> dict[str, Any]:
        """Median gap outside the prefill, longest gap overlapping it (ms), and the prefill's own time."""
        g = self.gaps()
        before = g.loc[~g["during_prefill"] & (g["t_s"] < 0), "gap_ms"]
        during = g.loc[g["during_prefill"], "gap_ms"]
        return {"streams": len(self.streams), "long_prompt_tokens": self.long_request.prompt_tokens,
                "prefill_ms": round((self.prefill_end - self.prefill_start) * 1000, 1),
                "median_gap_before_ms": round(float(median(before)), 2) if len(before) else None,
                "max_gap_during_prefill_ms": round(float(during.max()), 2) if len(during) else None,
                "gaps_during_prefill": int(len(during))}


def measure_prefill_stall(lab: Any, n_streams: int = 4, stream_tokens: int = 400, long_prompt_tokens: int = 3000,
                          settle_s: float = 0.5, seed: int = 0) -> StallResult:
    """Run the experiment against ``lab`` (helpers.session.Lab); raises RuntimeError if a request failed."""
    factory = prompt_factory(lab.settings, lab.model, seed=seed)
    streams: list[StreamTiming | None] = [None] * n_streams
    started = threading.Barrier(n_streams + 1)

    def decode(i: int) -> None:
        started.wait()
        streams[i] = stream_chat(lab.client, lab.model,
                                 [{"role": "user", "content": factory.first_turn_content(10 + i, 64)}],
                                 max_tokens=stream_tokens, extra_body={"ignore_eos": True, "min_tokens": stream_tokens})

    threads = [threading.Thread(target=decode, args=(i,), daemon=True) for i in range(n_streams)]
    for t in threads:
        t.start()
    started.wait()
    time.sleep(settle_s)
    long = stream_chat(lab.client, lab.model,
                       [{"role": "user", "content": factory.first_turn_content(1, long_prompt_tokens)}],
                       max_tokens=1)
    for t in threads:
        t.join()
    failed = [s.error for s in [*streams, long] if s is None or s.error]
    if failed or long.t_first_token is None:
        raise RuntimeError(f"a request of the stall experiment failed: {failed[:1] or 'no token'}; "
                           "check the engine (`workshop status`) and lower long_prompt_tokens below --max-model-len")
    return StallResult([s for s in streams if s is not None], long, long.t_sent, long.t_first_token)
