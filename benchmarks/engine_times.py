"""Benchmark: local engine cold start, restart time and single-stream decode speed (prints figures).

Usage: python benchmarks/engine_times.py [--repeats 3] [--output-len 256]
Runs on its own port and state directory; stops the engine it started.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from helpers.engine.session import connect
from helpers.core.settings import load_settings
from helpers.measure.stream_timing import stream_chat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--port", default="8799")
    args = parser.parse_args()
    os.environ.update(WORKSHOP_PORT=args.port, WORKSHOP_STATE_DIR=tempfile.mkdtemp(prefix="engine-bench-"))
    start = time.monotonic()
    lab = connect(load_settings())
    cold_start_s = time.monotonic() - start
    try:
        decode = []
        for _ in range(args.repeats + 1):  # the first run warms up and is dropped
            t = stream_chat(lab.client, lab.model, [{"role": "user", "content": "tell me a joke"}],
                            max_tokens=args.output_len, extra_body={"ignore_eos": True, "min_tokens": args.output_len})
            decode.append(1 / t.tpot_s)
            print(t.summary(), flush=True)
        start = time.monotonic()
        lab.engine.restart()
        restart_s = time.monotonic() - start
    finally:
        lab.engine.stop()
    print(json.dumps({"engine_args": lab.engine.args(), "cold_start_s": round(cold_start_s, 1),
                      "restart_s": round(restart_s, 1), "decode_tokens_per_s_concurrency_1": [round(d, 1) for d in decode[1:]],
                      "decode_tokens_per_s_median": round(statistics.median(decode[1:]), 1),
                      "output_len": args.output_len}, indent=1))


if __name__ == "__main__":
    main()
