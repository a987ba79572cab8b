"""Notebook 07 on the local path: run top to bottom against the shared real engine (tests/notebook_local.py)."""

from __future__ import annotations

import re

import pytest

from helpers.core.vllm_args import flag_value
from notebook_local import lab, no_silent_long_cells, printed, run_local  # noqa: F401 (fixtures)

pytestmark = pytest.mark.engine


def test_notebook_07_finds_the_scheduler_cap_then_lifts_it(lab, tmp_path):
    run = run_local("07_saturation.ipynb", tmp_path,
                    parameters={"CONCURRENCIES": [1, 8, 32], "MIN_REQUESTS": 8, "REQUESTS_PER_USER": 1,
                                   "SMALL_MAX_NUM_SEQS": 4, "LARGE_MAX_NUM_SEQS": 32, "OUTPUT_LEN": 64,
                                   # one conversation at a time: round robin sends every turn 2 to the other replica
                                   "AGENT_CONVERSATIONS": 4, "AGENT_TURNS": 3, "AGENT_CONCURRENCY": 1,
                                   "POLICY_REPEATS": 1, "FAILURE_CONVERSATIONS": 4, "FAILURE_CONCURRENCY": 2,
                                   "KILL_AFTER_ANSWERS": 2})
    text = printed(run)
    small = re.search(r"- \[shown\] With --max-num-seqs 4: .*At 32 users at most (\d+) ran and (\d+) waited", text)
    assert small, text[-3000:]
    assert int(small.group(1)) <= 4 and int(small.group(2)) > 0
    # Knee or not (a short run's throughput is noisy), 28 users queued behind 4 running is the scheduler cap
    assert "limit 'scheduler'" in text.split("With --max-num-seqs 32")[0]
    # the concurrency-1 runs of both sweeps are compared as a control, whatever the machine was doing
    assert re.search(r"Control at concurrency 1 .*: [\d.]+ vs [\d.]+ output tok/s in the two sweeps", text)
    slo = re.search(r"TTFT <= 10x the median at concurrency 1 = ([\d,]+) ms, TPOT <= 4x = ([\d.]+) ms", text)
    assert slo and float(slo.group(1).replace(",", "")) > 0
    assert re.search(r"- \[(shown|not shown|within noise)\] Goodput under TTFT <=", text)
    assert "The load generator's own loop lag at 32 users" in text and "CPU vs GPU:" in text
    assert flag_value(lab.engine.args(), "--max-num-seqs") is None
    # every numbered section checks what it said you would see; the price of a token, measured and from the roofline
    assert text.count("What you should see: ") >= 6
    assert re.search(r"- \[(shown|not shown|within noise)\] Price of a token on this machine \(measured sweeps\): ", text)
    assert re.search(r"- Llama-3.3-70B bf16 on H100 SXM \(1,024 tokens in, 1,024 out\): .* at least 2 GPUs", text)
    assert re.search(r"- \[(shown|not shown|within noise)\] Llama-3.3-70B bf16 on H100 SXM \(roofline\): ", text)
    assert "this machine: 0.067 USD/h (a comparable VM's list price: Google Cloud" in text
    # the talk's curve term by term: ideal, adjusted and the talk's price at each target, every term's share
    for target, talk in ((10, "0.71"), (20, "0.50"), (30, "0.46")):
        assert re.search(rf"- <= {target} ms: ideal 0\.3\d\d.*the talk {talk}.*bandwidth [+-]\d+%", text), target
    assert re.search(r"- \[(shown|not shown)\] paying the real step's costs makes the price curve steeper", text)
    assert re.search(r"- \[(shown|not shown)\] the published costs explain the talk's prices: ", text)
    assert "  overhead: 4 ms per step; source: " in text
    # batching: this run's gain beside the GPU's roofline and one published measurement, not from this run
    assert re.search(r"a GPU gains more from batching than this CPU \(published, not from this run\)\n  \S+ (not )?seen "
                     r"in this run: Batching: here \d+x the users bought [\d.]+x the output tokens/s", text)
    assert text.count("(made by the test run)") == 3 and text.count("This run: ") == 3  # the three exercises ran
    # the code exercise's worked solution: Little's law on the small cap's top run, near the 32 users it kept sending
    little = re.search(r"The worked solution \(Little's law\): [\d.]+ req/s x [\d.]+ s = ([\d.]+) requests in flight, "
                       r"against the 32 "
                       r"users", text)
    assert little and 0 < float(little.group(1)) <= 32 * 1.1, text[-3000:]
    # the Go-deeper replicas ran here (RUN_GO_DEEPER on the CPU) and wrote their results file with its provenance
    assert "07-replicas: measured here and written to" in text
    # beyond one engine: every policy's hit rate and TTFT from the replicas' own counters; affinity beats round robin
    hit = {p: float(r) for p, r in re.findall(r"- (\w+) over 2 replicas: prefix-cache hit rate ([\d.]+)%, TTFT turn 1 "
                                              r"[\d,]+ ms, later turns [\d,]+ ms, [\d.,]+ output tok/s, 0 failed", text)}
    assert set(hit) == {"round_robin", "consistent_hash", "cache_aware"}, text[-4000:]
    assert hit["consistent_hash"] > hit["round_robin"] + 15, hit
    # a replica killed under load: every request accounted for, none lost, the killed one restarted and back
    killed = re.search(r"(\d+) sent, (\d+) completed, (\d+) failed \(the client saw an error\), (\d+) lost", text)
    assert killed and int(killed.group(4)) == 0 and int(killed.group(1)) == sum(map(int, killed.group(2, 3)))
    assert re.search(r"Killed replica \d \(SIGKILL\) [\d.]+ s into the run.*\nRestarted in [\d.]+ s", text)
    assert not lab.engine.status().get("replicas")  # the replicas beside the engine were stopped
