"""Keep-or-roll-back decisions and the written-out final configuration."""

import shlex

import yaml

from helpers.engine import EngineConfig
from helpers.tuning import Rule, TuningLog, command_line, decide, manifest_patch

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
