"""Against the real local engine: vLLM's CPU build serving the shipped tiny agent model.

The module works on the suite's shared engine (tests/conftest.py ``shared_engine``: its own port and state directory,
on the default configuration when the module begins); its tests change flags and models on it in turn.
"""

from __future__ import annotations

import os
import re
import signal
import warnings

import nbformat
import pytest

from helpers.evals.agent import run_agent
from helpers.engine.interface import EngineStartError
from helpers.core.vllm_args import flag_value
from helpers.hardware.machine import capability
from helpers.lab.notebooks import LONG_CELL_S, REPO_ROOT, run_notebook
from helpers.engine.session import EndpointError

pytestmark = pytest.mark.engine
PORT = os.environ.get("WORKSHOP_TEST_PORT", "8765")  # another port lets two suites run side by side


@pytest.fixture(scope="module")
def lab(shared_engine):
    """The shared engine on PORT, this process's environment on its port and state directory for the module (the
    notebooks' kernels connect through it); the next test that uses it finds it back on the default configuration."""
    with shared_engine.use() as lab:
        yield lab


_RUNS: list = []
BLIND_CELL_S = 6 * LONG_CELL_S


def _run_notebook(path, out_dir, **kwargs):
    """``run_notebook``, its run kept for ``_no_silent_long_cells`` to check once the test's own asserts ran."""
    run = run_notebook(path, out_dir, **kwargs)
    _RUNS.append(run)
    return run


@pytest.fixture(autouse=True)
def _no_silent_long_cells():
    """Every executed notebook: no cell ran longer than LONG_CELL_S without a progress display (issue 13)."""
    _RUNS.clear()
    yield
    silent = [(run.source.name, cell) for run in _RUNS for cell in run.silent_cells]
    if silent:  # listed in the warnings summary: over 5 s depends on the machine, so it is reported, not judged
        warnings.warn(f"cells that ran over {LONG_CELL_S:g} s without a progress display: "
                      + "; ".join(f"{name} {cell}" for name, cell in silent))
    # A cell silent for six times that is a long step without progress on any machine: that fails.
    blind = [f"{name} {cell}" for name, cell in silent if cell.seconds > BLIND_CELL_S]
    assert not blind, f"cells that ran over {BLIND_CELL_S:g} s without a progress display:\n" + "\n".join(blind)


def test_ready_means_the_model_is_listed(lab):
    assert lab.check() == ["tiny-agent"]
    status = lab.engine.status()
    assert status["ready"] is True and status["endpoint"] == f"http://127.0.0.1:{PORT}/v1"


def test_tool_call_round_trip_parsed_by_vllm(lab):
    run = run_agent(lab, "What's the weather in Paris?")
    call = run.steps[0].tool_calls[0]
    assert call["name"] == "get_weather" and call["arguments"] == {"city": "Paris"}
    assert str(call["result"]["temperature_c"]) in run.answer


def test_plain_answer_when_no_tool_fits(lab):
    run = run_agent(lab, "thanks, that helped")
    assert not run.called_tools and run.answer


def test_a_flag_vllm_rejects_shows_the_log_and_rolls_back(lab):
    before = lab.engine.args()
    with pytest.raises(EngineStartError) as info:
        lab.engine.set_flag("--max-num-seqs", "banana")
    assert "invalid int value" in str(info.value)
    assert "back on the last good" in str(info.value)
    assert lab.engine.args() == before and flag_value(before, "--max-num-seqs") is None
    assert lab.engine.is_ready()


def test_notebook_01_runs_top_to_bottom(lab, tmp_path):
    run = _run_notebook(REPO_ROOT / "notebooks" / "01_connect_and_first_agent.ipynb", tmp_path,
                       parameters={"STREAM_MAX_TOKENS": 32})
    nb = nbformat.read(run.output, as_version=4)
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "tool call parsed by vLLM: {'name': 'get_weather', 'arguments': {'city': 'Paris'}}" in text
    assert "What we learned" in "".join(c.source for c in nb.cells)
    assert re.search(r"the prompt went from \d[\d,]* to \d[\d,]* tokens", text)
    # the stream's pace is judged from the gaps as they arrived, whichever way it went
    assert re.search(r"\[(shown|not shown)\] after the first token, tokens arrive at a steady pace "
                     r"\(one decode step each\): "
                     r"(the gaps between chunks had a median|one gap of)", text)
    assert "per million output tokens, prompts included" in text  # the same unit on both sides
    assert "A CPU's tokens/s says nothing of a GPU's" in text
    # every price from the dated table, with its source; cached input and the break-even from this run's numbers
    assert re.search(r"API gpt-4\.1-mini: 0\.4 in, 0\.1 cached, 1\.6 out USD per 1M tokens \(OpenAI API pricing", text)
    assert "engine: 0.067 USD/h (Google Cloud Compute Engine VM pricing" in text
    assert "- Cached input: " in text and re.search(r"- Break-even: .* busy [\d,]+% of the day", text)


def test_planner_predicts_vllm_kv_capacity_to_the_token(lab):
    from helpers.lessons.l02_memory import compare_with_engine, predict_cpu_engine_kv
    from helpers.measure.server_metrics import scrape

    predicted = predict_cpu_engine_kv(lab.engine.config().model, lab.engine.args())
    reported = scrape(lab.settings.metrics_url).cache_config()
    assert reported["num_gpu_blocks"] == predicted.num_blocks
    assert reported["kv_cache_size_tokens"] == predicted.vllm_kv_cache_size_tokens
    table = compare_with_engine(predicted, reported)
    assert (table["predicted"] == table["vLLM reports"]).all()


def test_notebook_02_compares_prediction_with_the_engine(lab, tmp_path):
    run = _run_notebook(REPO_ROOT / "notebooks" / "02_units_and_memory_budget.ipynb", tmp_path)
    nb = nbformat.read(run.output, as_version=4)
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "(exact)" in text and "[shown] the planner predicts the CPU engine's KV capacity" in text
    assert "blocks of 128 tokens: 16 is vLLM's default on a GPU" in text
    assert re.search(r"the driver reports [\d.]+ GiB", text)
    # section 2: parameters and KV bytes per token by hand from config.json, confirmed by the planner
    assert "by hand: 147,456 bytes of KV cache per token" in text
    assert re.search(r"What you should see: the planner confirms the hand count.*\n  ✔ seen in this run: Qwen3-4B: by hand", text)


def test_a_killed_engine_is_explained_and_restart_recovers(lab):
    os.killpg(lab.engine.pid, signal.SIGKILL)
    with pytest.raises(EndpointError, match="stopped answering.*restart"):
        lab.chat([{"role": "user", "content": "hi"}], max_tokens=4)
    lab.engine.restart()
    assert lab.chat([{"role": "user", "content": "hi"}], max_tokens=4).choices[0].message is not None


def _printed(run) -> str:
    nb = nbformat.read(run.output, as_version=4)
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def test_notebook_03_measures_prefill_decode_and_the_kv_cache(lab, tmp_path):
    run = _run_notebook(REPO_ROOT / "notebooks" / "03_prefill_decode_kv_cache.ipynb", tmp_path,
                       parameters={"PROMPT_LENGTHS": [64, 1024], "REPEATS": 2, "NAIVE_NEW_TOKENS": 32,
                                   "LONG_OUTPUT_TOKENS": 300, "AGENT_TURNS": 3, "STALL_STREAMS": 2,
                                   "SHARED_PREFIX_TOKENS": 512})
    text = _printed(run)
    assert "same 32 tokens from both loops: True" in text
    assert re.search(r"What you should see: attention by hand equals the model's, and no token looks ahead\n  ✔", text)
    # break the cache: the warm request hits, the one with an early token changed hits less (the server's counter)
    cold, warm, changed = (int(n.replace(",", "")) for n in re.search(
        r"cached prompt tokens: cold ([\d,]+), warm ([\d,]+), with one token changed ([\d,]+)", text).groups())
    assert cold == 0 and warm > 0 and changed < warm
    assert re.search(r"\[shown\] loading a cached prefix beats recomputing it from every tier: DGX A100", text)
    assert re.search(r"\[(shown|not shown)\] on this machine reading a prefix's KV beats recomputing it: at [\d,]+ "
                     r"prompt tokens", text)
    assert text.count("You made no prediction") == 3  # every exercise ran and checked its outcome
    assert re.search(r"This run: (none|part of it|all of it)\. [\d,]+ cached prompt tokens", text)
    blocks, measured = map(int, re.search(r"-> (\d+) blocks of .* = (\d+) blocks;", text, re.S).groups())
    # The gauge is sampled (every 0.1 s, by a client that shares a core with the server): it may miss the
    # last blocks' few steps, but it can never exceed what the request holds.
    assert blocks // 2 < measured <= blocks
    assert "after the request ended 0.0000%" in text
    hits, queries = map(float, re.search(r"server: (\d+) of (\d+) prompt tokens served from the prefix cache",
                                         text).groups())
    assert 0 < hits < queries  # three warm requests hit, the cold one did not
    assert re.search(r"the server took [1-9][\d.]*% of [\d,]+ prompt tokens from the prefix cache", text)
    assert re.search(r"\[(shown|not shown|within noise)\] TTFT grows with the prompt: TTFT went from", text)
    assert re.search(r"\[(shown|not shown)\] TPOT hardly moves with the prompt: TPOT went from", text)
    assert re.search(r"\[(shown|within noise|not shown)\] a warm prefix cuts TTFT: TTFT [\d,]+ ms cold", text)
    for config in ("max-num-batched-tokens 2048 (default)", "max-num-batched-tokens 256"):  # both measured
        assert f"{config}: the long prefill stalls the running streams" in text
    assert re.search(r"\[(shown|not shown|within noise)\] a smaller prefill chunk makes the long request's own TTFT "
                     r"longer: the long prompt's prefill took [\d,]+ ms", text)
    assert " nan ms" not in text and "steady gap of nan" not in text
    # section 10: continuous batching, PagedAttention's blocks and preemption, each checked against this run
    assert re.search(r"section 9 preempted 0 request", text)  # the small pool held the stall runs
    assert re.search(r"\[(shown|not shown)\] a request arriving mid-decode joins the running batch at the next engine "
                     r"step: the late request arrived while the early one decoded: it waited [\d.,]+ ms in the "
                     r"server's queue = [\d.]+ engine steps", text)
    assert re.search(r"\[(shown|not shown)\] the running request barely pauses while the new one joins", text)
    matched, samples = map(int, re.search(r"\] KV blocks are allocated as a sequence grows, one block per block_size "
                                          r"tokens: (\d+) of (\d+) samples", text).groups())
    assert samples > 0 and matched <= samples
    preemptions = int(re.search(r"\[shown\] when the KV blocks run out, the scheduler preempts a request and "
                                r"recomputes it later: 4 requests needing \d+ blocks .* preempted (\d+) time", text).group(1))
    assert preemptions > 0
    assert "engine back on the flags it had before section 9: True" in text
    assert lab.engine.is_ready() and flag_value(lab.engine.args(), "--max-num-batched-tokens") is None


def test_notebook_07_finds_the_scheduler_cap_then_lifts_it(lab, tmp_path):
    run = _run_notebook(REPO_ROOT / "notebooks" / "07_saturation.ipynb", tmp_path,
                       parameters={"CONCURRENCIES": [1, 8, 32], "MIN_REQUESTS": 8, "REQUESTS_PER_USER": 1,
                                   "SMALL_MAX_NUM_SEQS": 4, "LARGE_MAX_NUM_SEQS": 32, "OUTPUT_LEN": 64,
                                   # one conversation at a time: round robin sends every turn 2 to the other replica
                                   "AGENT_CONVERSATIONS": 4, "AGENT_TURNS": 3, "AGENT_CONCURRENCY": 1,
                                   "POLICY_REPEATS": 1, "FAILURE_CONVERSATIONS": 4, "FAILURE_CONCURRENCY": 2,
                                   "KILL_AFTER_ANSWERS": 2})
    text = _printed(run)
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
    assert text.count("You made no prediction") == 3 and text.count("This run: ") == 3  # the three exercises ran
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


def test_notebook_04_serves_the_tiny_dense_and_moe_models(lab, tmp_path):
    run = _run_notebook(REPO_ROOT / "notebooks" / "04_dense_vs_moe.ipynb", tmp_path,
                       parameters={"BATCHES": [1, 4], "OUTPUT_LEN": 64, "REQUESTS_PER_STREAM": 1, "REPEATS": 2})
    text = _printed(run)
    assert text.count("You made no prediction") == 3  # every exercise ran and checked its outcome
    assert "This run: stays about the same." in text  # the MoE/dense ceiling ratio is a ratio of bytes
    assert re.search(r"What you should see: Qwen3-4B's batch-1 decode is memory-bound on RTX 4000 Ada\n  ✔", text)
    for batch in (1, 4):  # every batch judged against the repeats' spread, whichever way it went
        assert re.search(rf"\[(shown|not shown|within noise)\] the tiny MoE decodes no faster than the dense model: "
                         rf"batch {batch}: tiny-moe [\d,]+ tok/s vs tiny-agent [\d,]+ tok/s \([\d.]+x \(noise", text)
    assert "On a GPU (computed from the published configs and the datasheet, not measured here)" in text
    assert re.search(r"Qwen3-30B-A3B: 30\.5 B parameters in total but 3\.[34] B active", text)
    # the decode ceiling by hand (GPU, then this machine), and the GPU figures beside the CPU ones
    assert re.search(r"What you should see: the hand division gives the table's ceiling\n  ✔", text)
    assert re.search(r"tiny-agent on this machine: [\d.]+ GB/s / [\d.]+ MB = [\d,]+ decode steps/s at most", text)
    assert re.search(r"- This run \(measured here, CPU\): at batch 4 tiny-moe decodes [\d,]+ tok/s", text)
    assert "- Roofline on RTX 4000 Ada (computed, not measured" in text
    assert "- Published, not from this run: DeepSeek-V2" in text
    assert lab.model == "tiny-agent"


def test_notebook_05_quantized_variants_with_eval_and_load(lab, tmp_path):
    run = _run_notebook(REPO_ROOT / "notebooks" / "05_quantization.ipynb", tmp_path,
                       parameters={"VARIANTS": ["tiny-agent-w8a8"], "CONCURRENCIES": [1, 4], "NUM_REQUESTS": 8})
    text = _printed(run)
    assert "could not serve it" not in text and "refused it here" not in text
    fp8_kv = capability("fp8_kv_cache").ok  # AVX-512 or AMX (tests/test_forced_cpu_kind.py covers AVX2)
    for config in ("bf16 (baseline)", "w8a8"):
        assert re.search(rf"- {re.escape(config)}: .* eval \d+\.\d% \(95% CI", text), config
    if fp8_kv:  # the capacity is read at start-up, so it shows even when the FP8 KV step is too slow to measure
        assert re.search(r"- kv-cache fp8: (.* eval \d+\.\d% \(95% CI|skipped\. Served, but)", text)
        kv = re.search(r"an FP8 KV cache holds twice the tokens\n  ✔ seen in this run: ([\d,]+) -> ([\d,]+) KV tokens \(2\.00x", text)
        assert kv and int(kv[2].replace(",", "")) == 2 * int(kv[1].replace(",", "")), text[-4000:]
    else:
        assert "- kv-cache fp8: skipped. This step needs x86 with AVX-512 or AMX" in text
    # Online FP8 weights are measured, or, where vLLM has no fast FP8 kernel for this CPU (about 1 token/s on
    # an AMX machine through torch's generic FP8 path), probed and reported as too slow to measure
    assert re.search(r"- online fp8_per_channel: (.* eval \d+\.\d% \(95% CI|skipped\. Served, but it decodes "
                     r"[\d.]+ tokens/s against the baseline's \d+ \(\d+x slower\))", text)
    # the lesson's scaffolding ran on this run's numbers: six checks, the map, three exercises (no prediction in CI)
    assert re.search(r"What you should see: every quantized checkpoint is smaller on disk than BF16\n  ✔", text)
    assert text.count("What you should see:") == 6 and text.count("You made no prediction") == 3
    assert re.search(r"Map: \d+ schemes; this run measured [1-9]\d* of them", text)
    # a configuration too slow to measure is "not measured", never a disagreement with the probe
    assert "not measured (too slow here) although" not in text
    assert "Published, not from this run" in text and re.search(r"Roofline \(computed, not measured\)", text)
    assert lab.model == "tiny-agent" and flag_value(lab.engine.args(), "--kv-cache-dtype") is None


def test_notebook_06_aligned_draft_is_accepted_more_than_the_misaligned_one(lab, tmp_path):
    run = _run_notebook(REPO_ROOT / "notebooks" / "06_speculative_decoding.ipynb", tmp_path,
                       parameters={"K_VALUES": [1, 3], "CONCURRENCIES": [1, 4], "REQUESTS_PER_STREAM": 2,
                                   "REPEATS": 1})
    text = _printed(run)
    aligned, misaligned = map(float, re.search(r"Aligned draft acceptance ([\d.]+)% vs misaligned ([\d.]+)%", text).groups())
    assert aligned > misaligned
    # every method at every concurrency is judged against the noise, and the trend sentence follows the ratios
    # (a speculative step measured cheaper than a plain one is called a busy machine, not a measurement)
    judged = re.findall(r"^- .*k=3, concurrency (\d): .*\. (faster|slower|no measurable difference|"
                        r"Not a measurement of speculation)", text, re.M)
    assert len(judged) == 6, text[-3000:]
    for lo, hi, sentence in re.findall(r"tiny-draft k=3: ([\d.]+)x at concurrency 1 -> ([\d.]+)x at 4: (.*)", text):
        assert ("shrinks" in sentence) == (float(hi) < float(lo) and "about the same" not in sentence)
    assert re.search(r"Number of guesses: k=1 [\d.]+x .*, k=3 [\d.]+x", text) and "CPU vs GPU:" in text
    # the k check reads the conditional rates (which can fall or not), not the per-position ones (which cannot rise)
    assert re.search(r"k=3 [\d.]+x .*(At k=3, each position's acceptance given the one before was kept: [\d%, ]+ "
                     r"\(position 1 to 3\)|needs k >= 2 with drafts at every position)", text), text[-4000:]
    # the formula (1 - a^(k+1)) / (1 - a) is checked against the counters at k = 3; eight checks, two exercises
    assert re.search(r"formula [\d.]+ vs measured [\d.]+ tokens per step", text)
    assert text.count("What you should see:") == 11 and text.count("You made no prediction") == 2
    # the cost side: the talk's example, c from the untrained draft, E / (1 + k c) against the measured speed-up
    assert "4 x 20 ms = 80 ms against 4 x 5 ms + 25 ms = 45 ms: 1.78x if every guess is accepted" in text
    # (on a machine busy enough that a speculative step measured cheaper than a plain one, the sentence says so)
    assert re.search(r"concurrency 1: (a guess cost c = [\d.]+ of a target step .* so E / \(1 \+ k c\) = [\d.]+ / "
                     r"[\d.]+ = [\d.]+x predicted against [\d.]+x measured|no test of the cost model: a speculative "
                     r"step measured cheaper)", text), text[-4000:]
    assert re.search(r"batching(, concurrency 1 -> 4: c [\d.]+ -> [\d.]+ against a break-even|: no trend can be read "
                     r"from concurrency 1 to 4)", text)
    shown = "\n".join(o.get("data", {}).get(kind, "") for c in nbformat.read(run.output, as_version=4).cells
                      if c.cell_type == "code" for o in c.outputs for kind in ("text/plain", "text/html"))
    assert "not from this run: vLLM blog" in shown  # the GPU measurement beside this run's, labelled
    # losslessness at temperature 1, seeded, the same test on the stock engine and on one with vllm#55006: its power
    # shown (x1.2 told apart), a p-value at the floor printed as a bound, position 1 a control that must not differ
    value = r"(p <= 1/2001|p = [\d.e-]+)"
    found = {engine: re.search(rf"{engine}: 600 continuations each: with vs without speculation {value}; temperature "
                               rf"x1\.2 vs x1 {value}; two samples without speculation {value}; position 1 \(the control\) "
                               rf"with vs without {value}, x1\.2 vs x1 {value} \(permutation G-test, 2000 permutations", text)
             for engine in ("stock engine", "with vllm#55006")}
    assert all(found.values()), text[-5000:]
    p = {engine: [1 / 2001 if v == "p <= 1/2001" else float(v.split("= ")[1]) for v in m.groups()]
         for engine, m in found.items()}
    assert "p = 0.0005" not in text and "p = 0.0004998" not in text  # the floor 1/2001 is printed as a bound
    for same, hotter, again, first, first_hotter in p.values():
        assert hotter <= 0.01 and again > 0.01 and first > 0.01  # power, no false alarm, the control unchanged
    assert p["stock engine"][0] <= 0.01, text[-5000:]  # vllm#55005: the stock CPU engine's verified tokens differ
    assert p["with vllm#55006"][0] > 0.01, text[-5000:]  # the fix passes the same test at the same size
    for claim in ("the stock engine's verified tokens differ at temperature > 0 (https://github.com/vllm-project/vllm/"
                  "issues/55005)", "with the fix (https://github.com/vllm-project/vllm/pull/55006) the same test finds "
                  "no difference", "position 1, sampled by the target alone, does not differ in either run",
                  "drafts are accepted in both runs (the server's counters), so the fix left speculation on"):
        assert f"What you should see: {claim}\n  ✔" in text, claim
    drafts = re.search(r"drafts over the samples: stock (\d+) drafts, (\d+) draft tokens accepted \([\d.]+%\); fixed "
                       r"(\d+) drafts, (\d+) draft tokens accepted", text)
    assert drafts and all(int(d) > 0 for d in drafts.groups()), text[-3000:]
    assert "one that varies from run to run" in text  # the most-moved token is an example, not the explanation
    print("losslessness p-values (same, x1.2, again, position 1, position 1 x1.2):", p, "drafts:", drafts.groups())
    assert flag_value(lab.engine.args(), "--speculative-config") is None


def test_notebook_08_tunes_flags_and_writes_the_result(lab, tmp_path):
    # two candidates: the profile's memory knob and one plain flag (each costs a restart, a measurement and
    # an eval; the suite's time is kept under its budget)
    run = _run_notebook(REPO_ROOT / "notebooks" / "08_tuning_and_evaluation.ipynb", tmp_path,
                       parameters={"CONCURRENCIES": [1, 8], "NUM_REQUESTS": 16, "REPEATS": 1,
                                   "CANDIDATES": ["MEMORY", ["--kv-cache-dtype", "fp8"]]})
    text = _printed(run)
    decisions = re.findall(r"^- (--[a-z-]+) .*: (kept|rolled back) \(", text, re.M)
    assert [d[0] for d in decisions] == ["--kv-cache-memory-bytes", "--kv-cache-dtype"]
    slo = re.search(r"c8_p90_ttft_ms must stay <= ([\d,]+) ms \(1\.5x the baseline's\)", text)
    assert slo, text[:3000]
    baseline_p90 = float(re.search(r"^- Baseline: .* c8_p90_ttft_ms ([\d,]+) ms", text, re.M).group(1).replace(",", ""))
    assert abs(float(slo.group(1).replace(",", "")) - 1.5 * baseline_p90) <= 1.5  # rounding of the printed values
    # the written-out configuration names the cluster's model, never a directory on this machine
    assert re.search(r"vllm serve Qwen/Qwen3-4B --served-model-name Qwen/Qwen3-4B", text)
    assert re.search(r"- --model\n\s*- Qwen/Qwen3-4B\n", text) and "kind: Deployment" in text
    assert str(REPO_ROOT / "models") not in text
    assert re.search(r"^- \[(shown|not shown|within noise)\] Final: ", text, re.M)
    assert flag_value(lab.engine.args(), "--kv-cache-dtype") is None and flag_value(lab.engine.args(), "--max-num-seqs") is None
    # the manifest exercise on the local engine: the change went through the engine, the cluster's patch is shown
    assert "through the engine interface (engine.set_flag)" in text and "kubectl diff -k my-change/" in text
    assert "What you should see: the patch changes exactly one flag (--kv-cache-memory-bytes)\n  ✔" in text
    assert text.count("What you should see: ") >= 4 and text.count("You made no prediction") == 2
    # the GPU line starts from the GPU profile's baseline: none of the CPU lab's workarounds, kept changes marked
    line = re.search(r"Engine command line \(a GPU box\):\n  (.*)", text)[1]
    assert "--gpu-memory-utilization" in line and "--enforce-eager" not in line
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in line and "--kv-cache-memory-bytes" not in line
    assert "What you should see: the GPU command line carries none of the CPU lab's workarounds\n  ✔" in text
    assert re.search(r"^- (--kv-cache-memory-bytes \d+: kept on the CPU, not carried over|--kv-cache-dtype fp8: kept on "
                     r"the CPU and carried over, measured only on the CPU|no change kept)", text, re.M)
    # structured output: the schema's answers are all valid by the eval's parser; the TPOT cost is judged
    valid = re.search(r"a JSON schema makes the answers valid\n  .*valid JSON of the schema: (\d+)/(\d+) answers "
                      r"with the schema, (\d+)/\d+ without", text)
    assert valid and valid[1] == valid[2], text[-3000:]
    assert re.search(r"time per output token [\d.]+ ms with the schema vs [\d.]+ ms without", text)


def test_eval_smoke_suite_runs_through_vllm_and_scores_every_category(lab, tmp_path):
    from helpers.evals import suite as evals

    run = evals.run_suite(lab, "smoke")
    summary = run.summary()
    assert list(summary.index) == [*evals.CATEGORIES, "all"] and summary.loc["all", "n"] == 10
    assert run.rows["error"].isna().all()  # every request accepted, structured outputs included
    assert summary.loc["tool_call", "pass_rate"] > 0
    json_rows = run.rows[run.rows["category"] == "json"]
    assert json_rows["parses"].all()  # structured outputs: the answer is JSON whatever the model
    loaded = evals.load_run(run.save(tmp_path / "smoke.json"))
    assert evals.compare(loaded, run).regressed == []


def test_start_here_shows_the_running_engine_without_restarting_it(lab, tmp_path):
    pid = lab.engine.pid
    run = _run_notebook(REPO_ROOT / "notebooks" / "start_here.ipynb", tmp_path)
    assert f"The engine is ready: {lab.settings.base_url} serves {lab.model!r}" in _printed(run)
    assert lab.engine.pid == pid
