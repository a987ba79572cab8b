"""Notebook 08 on the local path: run top to bottom against the shared real engine (tests/notebook_local.py)."""

from __future__ import annotations

import re

import pytest

from helpers.core.vllm_args import flag_value
from helpers.lab.notebooks import REPO_ROOT
from notebook_local import lab, no_silent_long_cells, printed, run_local  # noqa: F401 (fixtures)

pytestmark = pytest.mark.engine


def test_notebook_08_tunes_flags_and_writes_the_result(lab, tmp_path):
    # one candidate on the core path (the profile's memory knob, through the mechanism cell's loop) and one in Go
    # deeper's search (tune_one_flag_at_a_time): each costs a restart, a measurement and an eval; structured output at
    # the fewest tasks and rounds that still pair tasks and judge a spread
    # the load runs at the fewest requests and tokens that still give each concurrency a p90 TTFT; the agent replayed
    # at two numbers of users (one copy and four of each of three sessions) beside the synthetic workload
    run = run_local("08_tuning_and_evaluation.ipynb", tmp_path, allow_lack_of_data={
                        "the baseline's repeated runs agree within 10%": "REPEATS 1 keeps the suite's time"},
                    parameters={"CONCURRENCIES": [1, 4], "NUM_REQUESTS": 8, "INPUT_LEN": 128, "OUTPUT_LEN": 32,
                                "REPEATS": 1, "CORE_CANDIDATES": ["MEMORY"],
                                "SEARCH_CANDIDATES": [["--max-num-batched-tokens", 512]], "STRUCTURED_TASKS": 4,
                                "STRUCTURED_ROUNDS": 2, "REPLAY_COPIES": [1, 4]})
    text = printed(run)
    decisions = re.findall(r"^- (--[a-z-]+) .*: (kept|rolled back) \(", text, re.M)
    assert [d[0] for d in decisions] == ["--kv-cache-memory-bytes", "--max-num-batched-tokens"]
    slo = re.search(r"c4_p90_ttft_ms must stay <= ([\d,]+) ms \(1\.5x the baseline's\)", text)
    assert slo, text[:3000]
    baseline_p90 = float(re.search(r"^- Baseline: .* c4_p90_ttft_ms ([\d,]+) ms", text, re.M).group(1).replace(",", ""))
    assert abs(float(slo.group(1).replace(",", "")) - 1.5 * baseline_p90) <= 1.5  # rounding of the printed values
    # the written-out configuration names the cluster's model, never a directory on this machine
    assert re.search(r"vllm serve Qwen/Qwen3-4B --served-model-name Qwen/Qwen3-4B", text)
    assert re.search(r"- --model\n\s*- Qwen/Qwen3-4B\n", text) and "kind: Deployment" in text
    assert str(REPO_ROOT / "models") not in text
    assert re.search(r"^- \[(shown|not shown|within noise)\] Final: ", text, re.M)
    # the mechanism cell's loop printed its decision; the search ran here, wrote the room's results file, and the
    # summary counts both candidates
    assert re.search(r"^(KEEP    |ROLLBACK) --kv-cache-memory-bytes \d+ -> \d+: ", text, re.M)
    assert re.search(r"^(KEEP    |ROLLBACK) --max-num-batched-tokens \(default\) -> 512: ", text, re.M)
    assert re.search(r"^Wrote the search to .*08-search\.json: put it in the room's WORKSHOP_RESULTS_DIR", text, re.M)
    assert re.search(r"^- Every candidate, the core path's and Go deeper's search, from this run: [012] of 2 changes kept",
                     text, re.M)
    # the code exercise: the learner's cell asks, the worked solution passes on this run's numbers
    assert "Your turn (the SLO check): replace the None" in text
    assert re.search(r"The worked solution \(the SLO check\): On this run the limit is [\d,]+ ms \(1\.5x the baseline's\): "
                     r"--kv-cache-memory-bytes \d+ -> \d+: [\d,]+ ms, (holds|breaks)", text)
    assert all(flag_value(lab.engine.args(), f) is None for f in ("--max-num-batched-tokens", "--max-num-seqs"))
    # the manifest exercise on the local engine: the change went through the engine, the cluster's patch is shown
    assert "through the engine interface (engine.set_flag)" in text and "kubectl diff -k my-change/" in text
    assert "What you should see: the patch changes exactly one flag (--kv-cache-memory-bytes)\n  ✔" in text
    assert text.count("What you should see: ") == 10 and text.count("(made by the test run)") == 2
    # the GPU line starts from the GPU profile's baseline: none of the CPU lab's workarounds, kept changes marked
    line = re.search(r"Engine command line \(a GPU box\):\n  (.*)", text)[1]
    assert "--gpu-memory-utilization" in line and "--enforce-eager" not in line
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in line and "--kv-cache-memory-bytes" not in line
    assert "What you should see: the GPU command line carries none of the CPU lab's workarounds\n  ✔" in text
    assert re.search(r"^- (--kv-cache-memory-bytes \d+: kept on the CPU, not carried over|--max-num-batched-tokens 512: kept on "
                     r"the CPU and carried over, measured only on the CPU|no change kept)", text, re.M)
    # structured output: the schema's answers are all valid by the eval's parser; the TPOT cost is judged
    valid = re.search(r"a JSON schema makes the answers valid\n  .*valid JSON of the schema: (\d+)/(\d+) answers "
                      r"with the schema, (\d+)/\d+ without", text)
    assert valid and valid[1] == valid[2], text[-3000:]
    assert re.search(r"time per output token [\d.]+ ms with the schema vs [\d.]+ ms without", text)

    # your own agent as load: three sessions recorded with think time, replayed at 3 and 12 users beside the synthetic
    # workload; each figure printed for both, each conclusion decided, and the numbers hold together
    recorded = re.search(r"^recorded 3 sessions, (\d+) model calls: .*08-agent\.jsonl$", text, re.M)
    assert recorded and int(recorded[1]) > 3, text[-6000:]  # the agent called a tool at least once: later turns
    assert "What you should see: every later turn waited at least the tool delay (0.5 s)\n  ✔" in text
    hits = re.search(r"What you should see: the replayed agent hits the prefix cache, the synthetic workload does not"
                     r"\n  [✔✘~].*: server prefix-cache hit rate, replay vs synthetic: 3 users (\d+)% vs (\d+)%, "
                     r"12 users (\d+)% vs (\d+)%", text)
    assert hits, text[-6000:]
    assert all(0 <= int(h) <= 100 for h in hits.groups())
    later = re.search(r"What you should see: later turns start no later than the first, though their prompts are "
                      r"longer\n  [✔✘~].*: over (\d+) replayed copies, later turns' median TTFT [\d,.]+ ms vs first "
                      r"turns' [\d,.]+ ms, with prompts \+[\d,]+ tokens longer; later turn sooner in (\d+), later in "
                      r"(\d+) \(sign test p = ", text)
    assert later, text[-6000:]
    copies, sooner, slower = map(int, later.groups())
    assert 1 <= copies <= 15 and sooner + slower <= copies  # a copy per session at 3 users, four at 12
    flight = re.search(r"What you should see: at the same number of users the agent keeps fewer requests in flight"
                       r"\n  [✔✘~].*: requests in flight on average, replay vs synthetic: 3 users ([\d.]+) vs ([\d.]+) "
                       r"\([\d,]+ vs [\d,]+ output tok/s\), 12 users ([\d.]+) vs ([\d.]+)", text)
    assert flight, text[-6000:]
    r3, s3, r12, s12 = map(float, flight.groups())
    assert r3 <= 3.05 and s3 <= 3.05 and r12 <= 12.05 and s12 <= 12.05  # never more in flight than users
    assert re.search(r"^- synthetic [\d,]+ -> [\d,]+ output tok/s over 3, 12 users \((knee at \d+ users|no knee within "
                     r"these levels)\); replay [\d,]+ -> [\d,]+ output tok/s over 3, 12 users", text, re.M)
    assert re.search(r"^Replay this recording yourself: workshop bench --replay \S+08-agent\.jsonl --copies 4 ", text,
                     re.M)
    for claim in ("the replayed agent hits the prefix cache", "later turns start no later than the first",
                  "at the same number of users the agent keeps fewer requests in flight"):  # Go deeper's summary
        assert re.search(r"^- \[(shown|not shown|within noise)\] " + re.escape(claim), text, re.M), claim
