"""Keep-or-roll-back decisions and the written-out final configuration."""

import shlex

import yaml

from helpers.core.vllm_args import EngineConfig
import pytest

from fakes import RecordingEngine

from helpers.lessons.l08_tuning import Decision, Rule, TuningLog, candidate_flags, command_line, decide, manifest_patch

RULE = Rule(speed="c16_output_tok_s", latency="c16_p90_ttft_ms", max_latency_ms=1000, min_gain=0.03)
BASE = {"c16_output_tok_s": 1000.0, "c16_p90_ttft_ms": 400.0, "kv_capacity_tokens": 1000}


def test_a_faster_change_within_the_slo_is_kept():
    d = decide(BASE, {**BASE, "c16_output_tok_s": 1100.0}, RULE)
    assert d.keep and "+10.0%" in d.reasons[0]


def test_noise_is_rolled_back_unless_it_adds_kv_capacity():
    assert not decide(BASE, {**BASE, "c16_output_tok_s": 1010.0}, RULE).keep
    assert decide(BASE, {**BASE, "c16_output_tok_s": 990.0, "kv_capacity_tokens": 2000}, RULE).keep


def test_an_eval_regression_or_a_broken_slo_rolls_back_even_when_faster():
    faster = {**BASE, "c16_output_tok_s": 2000.0}
    assert not decide(BASE, faster, RULE, regressed=["tool_call"]).keep
    slow_ttft = decide(BASE, {**faster, "c16_p90_ttft_ms": 1500.0}, RULE)
    assert not slow_ttft.keep and "SLO" in slow_ttft.reasons[0]


def test_log_records_every_step():
    log = TuningLog()
    log.record("baseline", BASE, None)
    log.record("--max-num-seqs 16", {**BASE, "c16_output_tok_s": 1100.0}, decide(BASE, {**BASE, "c16_output_tok_s": 1100.0}, RULE))
    frame = log.frame()
    assert list(frame["kept"]) == [None, True] and frame.loc[0, "why"] == "baseline"


def test_final_configuration_as_command_line_and_manifest_patch():
    config = EngineConfig(model="Qwen/Qwen3-4B", served_name="Qwen/Qwen3-4B",
                          args=("--max-num-seqs", "64", "--kv-cache-dtype", "fp8"), env=(("VLLM_CPU_KVCACHE_SPACE", "2"),))
    line = command_line(config)
    assert line.startswith("VLLM_CPU_KVCACHE_SPACE=2 vllm serve Qwen/Qwen3-4B")
    assert shlex.split(line)[-4:] == ["--max-num-seqs", "64", "--kv-cache-dtype", "fp8"]
    patch = yaml.safe_load(manifest_patch(config))
    container = patch["spec"]["template"]["spec"]["containers"][0]
    assert patch["kind"] == "Deployment" and container["name"] == "vllm"
    assert container["args"][:2] == ["--model", "Qwen/Qwen3-4B"] and container["args"][-1] == "fp8"


# ---------------------------------------------------------------- thresholds from this machine, conclusions

import pandas as pd  # noqa: E402

from helpers.core.conclusion import SHOWN, WITHIN_NOISE  # noqa: E402
from helpers.core.settings import load_settings, models_dir  # noqa: E402
from helpers.lessons.l08_tuning import cluster_model, relative_rule, tuning_conclusions  # noqa: E402


def test_the_slo_and_the_margin_come_from_the_baseline():
    # a slow machine: the baseline's own p90 TTFT (2,226 ms) is past a fixed 2,000 ms SLO
    slow = {"c16_output_tok_s": 185.0, "c16_output_tok_s_runs": [180.0, 190.0], "c16_p90_ttft_ms": 2226.0,
            "kv_capacity_tokens": 1000}
    rule = relative_rule(slow, "c16_output_tok_s", "c16_p90_ttft_ms", min_gain=0.03, slo_x=1.5)
    assert rule.max_latency_ms == pytest.approx(3339.0) and rule.min_gain == pytest.approx(10 / 185)
    assert "1.5x the baseline's" in rule.describe() and "3,339 ms" in rule.describe()
    gained = {**slow, "c16_output_tok_s": 200.0, "c16_output_tok_s_runs": [199.0, 201.0], "c16_p90_ttft_ms": 2300.0}
    assert decide(slow, gained, rule).keep  # +8%: kept, where a fixed 2,000 ms SLO rolled back everything
    quiet = relative_rule({**slow, "c16_output_tok_s_runs": [185.0, 185.5]}, "c16_output_tok_s", "c16_p90_ttft_ms")
    assert quiet.min_gain == 0.03
    # one baseline run: the spread is unknown, the single-run noise is assumed and the rule says so
    single = {**slow, "c16_output_tok_s_runs": [185.0]}
    once = relative_rule(single, "c16_output_tok_s", "c16_p90_ttft_ms")
    assert once.min_gain == 0.10 and "noise is assumed" in once.describe()
    plus_4pct = decide(single, {**slow, "c16_output_tok_s": 193.0, "c16_output_tok_s_runs": [193.0]}, once)
    assert not plus_4pct.keep and plus_4pct.speed_label == "no measurable difference"


def test_a_gain_inside_the_repeats_spread_is_no_measurable_difference():
    base = {**BASE, "c16_output_tok_s_runs": [900.0, 1100.0]}
    d = decide(base, {**BASE, "c16_output_tok_s": 1080.0, "c16_output_tok_s_runs": [1000.0, 1160.0]}, RULE)
    assert not d.keep and d.speed_label == "no measurable difference" and "no measurable difference" in d.reasons[0]
    worse = decide(BASE, {**BASE, "c16_output_tok_s": 800.0}, RULE)
    assert not worse.keep and worse.speed_label == "worse"


def _scorecard(final_tok_s, kept=True):
    log = TuningLog()
    log.record("baseline", {**BASE, "all_pass_rate": 1.0}, None)
    row = {**BASE, "c16_output_tok_s": final_tok_s, "all_pass_rate": 1.0}
    log.record("--max-num-seqs (default) -> 32", row, Decision(kept, ("c16_output_tok_s +x",)))
    return log.frame()


def test_the_final_sentence_follows_the_numbers():
    faster = tuning_conclusions(_scorecard(1200.0), RULE)
    assert faster[1].text.startswith("--max-num-seqs (default) -> 32: kept (")
    assert faster[-1].verdict == SHOWN and "+20.0% vs baseline" in faster[-1].text
    none_kept = tuning_conclusions(_scorecard(1200.0, kept=False), RULE)
    assert "rolled back (" in none_kept[1].text
    assert none_kept[-1].verdict == WITHIN_NOISE and "the baseline stays" in none_kept[-1].text
    same = tuning_conclusions(_scorecard(1010.0), RULE)
    assert same[-1].verdict == WITHIN_NOISE and "no measurable speed difference" in same[-1].text


def test_the_deployed_configuration_names_the_clusters_model_not_a_local_path():
    local = EngineConfig(model=str(models_dir() / "tiny-agent"), served_name="tiny-agent", args=("--max-num-seqs", "32"))
    cpu = load_settings({"WORKSHOP_PROFILE": "cpu"})
    assert cluster_model(cpu) == "Qwen/Qwen3-4B"
    assert cluster_model(load_settings({"WORKSHOP_PROFILE": "gpu", "MODEL_NAME": "Qwen/Qwen3-8B"})) == "Qwen/Qwen3-8B"
    line = command_line(local, model=cluster_model(cpu))
    assert str(models_dir()) not in line and shlex.split(line)[2:5] == ["Qwen/Qwen3-4B", "--served-model-name",
                                                                       "Qwen/Qwen3-4B"]
    args = yaml.safe_load(manifest_patch(local, model="Qwen/Qwen3-4B"))["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:4] == ["--model", "Qwen/Qwen3-4B", "--served-model-name", "Qwen/Qwen3-4B"]
    # without a model given, a local path still never reaches the output: the served name stands in
    assert str(models_dir()) not in manifest_patch(local) and "tiny-agent" in command_line(local)


@pytest.mark.parametrize("interrupted", [True, False])
def test_the_baseline_comes_back_when_the_block_is_stopped_midway_or_not(interrupted):
    from dataclasses import replace

    from helpers.lessons.l08_tuning import baseline_restored

    base = EngineConfig(model="m", served_name="m", args=("--max-num-seqs", "16"))
    engine, said = RecordingEngine(base), []
    try:
        with baseline_restored(engine, show=said.append):
            engine.apply(replace(base, args=("--max-num-seqs", "32")))
            if interrupted:
                raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert engine.config() == base and len(engine.applied) == 2 and "--max-num-seqs 32 -> 16" in said[0]
    with baseline_restored(engine, show=said.append):  # nothing changed: no restart
        pass
    assert len(engine.applied) == 2


def test_the_rule_exercise_flips_with_the_numbers():
    from helpers.lessons.l08_tuning import hypothetical_row, rule_outcome

    base = {"c8_tok_s": 100.0, "c8_tok_s_runs": [98.0, 102.0], "c8_p90_ttft_ms": 200.0, "kv_capacity_tokens": 1000}
    rule = relative_rule(base, "c8_tok_s", "c8_p90_ttft_ms", min_gain=0.05, slo_x=1.5)
    kept, why_kept = rule_outcome(base, rule, speed_x=1.2)
    assert kept == "kept" and why_kept.startswith("every part of the rule holds")
    small, why_small = rule_outcome(base, rule, speed_x=1.02)  # inside the noise margin
    assert small == "rolled back" and why_small.startswith("a gain inside the noise margin counts as no gain")
    outcome, why = rule_outcome(base, rule, speed_x=1.2, latency_x=2.0)
    assert outcome == "rolled back" and "SLO" in why and why.startswith("a broken SLO rolls the change back")
    assert rule_outcome(base, rule, speed_x=1.2, latency_x=1.5)[0] == "kept"  # at the limit the SLO holds
    assert hypothetical_row(base, rule, 1.1)["c8_tok_s_runs"] == pytest.approx([107.8, 112.2])


def test_the_kv_check_reads_the_memory_knobs_step():
    from helpers.lessons.l08_tuning import kv_capacity_check

    card = pd.DataFrame([{"change": "baseline", "kv_capacity_tokens": 1000},
                         {"change": "--kv-cache-memory-bytes (default) -> 2147483648", "kv_capacity_tokens": 2000},
                         {"change": "--max-num-seqs 16 -> 32", "kv_capacity_tokens": 1000}])
    seen, detail = kv_capacity_check(card, "--kv-cache-memory-bytes")
    assert seen is True and "1,000 tokens at the baseline, 2,000" in detail
    assert kv_capacity_check(card.iloc[[0, 2]], "--kv-cache-memory-bytes")[0] is None
    same = card.assign(kv_capacity_tokens=1000)
    assert kv_capacity_check(same, "--kv-cache-memory-bytes")[0] is False


# ---------------------------------------------------------------- the GPU line and structured output (issue 22)

from dataclasses import replace  # noqa: E402

from helpers.core.conclusion import NOT_SHOWN  # noqa: E402
from helpers.core.vllm_args import flag_value, with_flag  # noqa: E402
from helpers.engine.interface import default_config  # noqa: E402
from helpers.lessons.l08_tuning import (gpu_configuration, gpu_line_check, structured_tpot,  # noqa: E402
                                        structured_validity)


def test_the_gpu_line_starts_from_the_gpu_baseline_with_no_cpu_workaround():
    cpu_base = default_config(load_settings({"WORKSHOP_PROFILE": "cpu"}))
    tuned = replace(cpu_base, args=with_flag(with_flag(with_flag(cpu_base.args, "--kv-cache-memory-bytes", 2 * 2**30),
                                                       "--kv-cache-dtype", "fp8"), "--max-num-seqs", 32))
    gpu, notes = gpu_configuration(cpu_base, tuned, "cpu")
    line = command_line(gpu, model="Qwen/Qwen3-4B")
    assert gpu_line_check(line)[0] is True
    for workaround in ("--enforce-eager", "--kv-cache-memory-bytes", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        assert workaround not in line and workaround not in manifest_patch(gpu, model="Qwen/Qwen3-4B")
    # the GPU profile's baseline, plus the kept changes that mean something on a GPU
    assert flag_value(gpu.args, "--gpu-memory-utilization") == "0.90" and flag_value(gpu.args, "--reasoning-parser")
    assert flag_value(gpu.args, "--kv-cache-dtype") == "fp8" and flag_value(gpu.args, "--max-num-seqs") == "32"
    text = "\n".join(notes)
    assert "--kv-cache-dtype fp8: kept on the CPU and carried over, measured only on the CPU" in text
    assert "--kv-cache-memory-bytes 2147483648: kept on the CPU, not carried over" in text
    # the check itself catches the CPU line
    seen, detail = gpu_line_check(command_line(tuned, model="Qwen/Qwen3-4B"))
    assert seen is False and "--enforce-eager" in detail and "VLLM_ENABLE_V1_MULTIPROCESSING" in detail


def test_on_a_gpu_profile_the_tuned_configuration_is_written_as_it_is():
    gpu_base = default_config(load_settings({"WORKSHOP_PROFILE": "gpu"}))
    tuned = replace(gpu_base, args=with_flag(gpu_base.args, "--max-num-seqs", 64))
    written, notes = gpu_configuration(gpu_base, tuned, "gpu")
    assert written == tuned and notes == ["- --max-num-seqs 64: kept, measured on this gpu engine"]
    assert gpu_configuration(gpu_base, gpu_base, "cpu")[1] == ["- no change kept: the GPU profile's baseline as it is"]


def _answers(schema_valid, free_valid, schema_tpot, free_tpot):
    rows = []
    for r, (st, ft) in enumerate(zip(schema_tpot, free_tpot), 1):
        for i, (sv, fv) in enumerate(zip(schema_valid, free_valid)):
            rows += [{"round": r, "id": f"t{i}", "mode": "json_schema", "valid": sv, "tpot_ms": st},
                     {"round": r, "id": f"t{i}", "mode": "free", "valid": fv, "tpot_ms": ft}]
    return pd.DataFrame(rows)


def test_structured_validity_follows_the_data_both_ways():
    shown = structured_validity(_answers([True] * 10, [False] * 10, [3.0], [3.0]))
    assert shown.verdict == SHOWN and "10/10 answers with the schema, 0/10 without" in shown.text
    same = structured_validity(_answers([True] * 10, [True] * 10, [3.0], [3.0]))
    assert same.verdict == WITHIN_NOISE and "already answers valid JSON" in same.text
    worse = structured_validity(_answers([False] * 10, [True] * 10, [3.0], [3.0]))
    assert worse.verdict == NOT_SHOWN


def test_structured_tpot_is_judged_against_the_rounds_spread():
    costly = structured_tpot(_answers([True] * 3, [False] * 3, [4.0, 4.1, 4.2], [3.0, 3.05, 3.1]))
    assert costly.verdict == SHOWN and "4.10 ms with the schema vs 3.05 ms without" in costly.text
    noise = structured_tpot(_answers([True] * 3, [False] * 3, [3.0, 3.5, 3.2], [3.1, 3.4, 3.2]))
    assert noise.verdict == WITHIN_NOISE and "no measurable cost" in noise.text
    faster = structured_tpot(_answers([True] * 3, [False] * 3, [2.0, 2.05, 2.1], [3.0, 3.05, 3.1]))
    assert faster.verdict == NOT_SHOWN


# ---------------------------------------------------------------- Go deeper's search: run here, or the room's file

def _lab_on(model: str, gpu: str):
    from types import SimpleNamespace

    from helpers.core.settings import load_settings

    settings = load_settings({"WORKSHOP_GPU": gpu})
    return SimpleNamespace(model=model, settings=settings)


def _search_frame():
    import pandas as pd

    return pd.DataFrame([{"step": 0, "change": "baseline", "kept": None, "why": "baseline", "c8_output_tok_s": 10.0,
                          "c8_output_tok_s_runs": [9.9, 10.1]},
                         {"step": 1, "change": "--max-num-seqs (default) -> 32", "kept": True, "why": "faster"},
                         {"step": 2, "change": "--kv-cache-dtype (default) -> fp8", "kept": False, "why": "slower"}])


def test_the_search_written_for_the_room_is_read_back_with_its_provenance_and_refused_elsewhere(tmp_path, monkeypatch,
                                                                                              capsys):
    from helpers.lessons import l08_tuning as l08

    monkeypatch.setenv("WORKSHOP_RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr("helpers.measure.results_file.vllm_version", lambda settings: "0.33.0")
    lab = _lab_on("Qwen/Qwen3-4B", "L4")
    l08.save_search(lab, _search_frame(), {"REPEATS": 2})
    assert f"Wrote the search to {tmp_path / '08-search.json'}: put it in" in capsys.readouterr().out
    assert (tmp_path / f"{l08.SEARCH_RESULTS}.json").is_file()
    rows = l08.load_search(lab)
    out = capsys.readouterr().out
    assert out.startswith(f"{l08.SEARCH_RESULTS}: measured ") and "on L4 serving Qwen/Qwen3-4B, vLLM 0.33.0" in out
    assert "REPEATS=2" in out and list(rows["change"]) == list(_search_frame()["change"])
    conclusion = l08.search_conclusion(rows, ran_here=False)
    assert conclusion.text == ("Every candidate, the core path's and Go deeper's search, from the instructor's results "
                               "file (its provenance printed above): 1 of 2 changes kept (--max-num-seqs (default) -> 32).")
    assert l08.load_search(_lab_on("Qwen/Qwen3-4B", "H100 SXM")) is None  # another GPU: refused, with what to do
    out = capsys.readouterr().out
    assert out.startswith("The search did not run (RUN_GO_DEEPER is False): ") and "on L4, but your engine serves" in out


def test_without_a_results_file_the_search_says_how_to_run_it(tmp_path, monkeypatch, capsys):
    from helpers.lessons import l08_tuning as l08

    monkeypatch.setenv("WORKSHOP_RESULTS_DIR", str(tmp_path))
    assert l08.load_search(_lab_on("Qwen/Qwen3-4B", "L4")) is None
    out = capsys.readouterr().out
    assert "No results file" in out and "RUN_GO_DEEPER=True" in out and out.count("\n") == 1
    assert "did not run here and no results file" in l08.search_conclusion(None, ran_here=False).text


def test_a_roll_back_that_reorders_the_flags_is_the_same_configuration_and_restarts_nothing():
    from helpers.lessons.l08_tuning import baseline_restored, resume, same_configuration

    base = EngineConfig("m", "m", ("--max-num-seqs", "8", "--max-model-len", "4096"))
    reordered = EngineConfig("m", "m", ("--max-model-len", "4096", "--max-num-seqs", "8"))
    assert same_configuration(base, reordered) and not same_configuration(base, EngineConfig("m", "m", base.args[:2]))
    engine = RecordingEngine(reordered)
    with baseline_restored(engine, base, show=lambda _: None):
        resume(engine, base)
    assert engine.applied == []
    with baseline_restored(engine, base, show=lambda _: None):
        engine.set_flag("--max-num-seqs", 16)
    assert len(engine.applied) == 2 and same_configuration(engine.config(), base)


CANDIDATES = ["MEMORY", ("--max-num-seqs", 32), ("--kv-cache-dtype", "fp8")]
MEMORY = ("--kv-cache-memory-bytes", 2 << 30)


def test_a_candidate_this_cpu_cannot_start_with_is_left_out_with_its_sentence(monkeypatch):
    said: list[str] = []
    monkeypatch.setenv("WORKSHOP_CPU_ISA", "avx2")
    assert candidate_flags(CANDIDATES, MEMORY, "cpu", show=said.append) == [MEMORY, ("--max-num-seqs", 32)]
    [line] = said
    assert line.startswith("Left out: --kv-cache-dtype fp8. This step needs x86 with AVX-512 or AMX")
    # the same list where the CPU has it, on a GPU profile, and without a profile (as the mechanism tests call it)
    monkeypatch.setenv("WORKSHOP_CPU_ISA", "avx512")
    assert candidate_flags(CANDIDATES, MEMORY, "cpu", show=said.append) == [MEMORY, *CANDIDATES[1:]]
    monkeypatch.setenv("WORKSHOP_CPU_ISA", "avx2")
    assert candidate_flags(CANDIDATES, MEMORY, "k8s", show=said.append) == [MEMORY, *CANDIDATES[1:]]
    assert candidate_flags(CANDIDATES, MEMORY, show=said.append) == [MEMORY, *CANDIDATES[1:]] and len(said) == 1
