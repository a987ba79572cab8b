"""``workshop memory`` / ``workshop gpus`` handlers: JSON output, tables and one-line errors."""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import pytest

from helpers.planning.shape import REFERENCE_CONFIGS
from helpers.hardware import gpus
from helpers.cli import planner as planner_cli

CONFIGS = REFERENCE_CONFIGS


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="workshop")
    planner_cli.register(parser.add_subparsers(required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert _run(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_memory_json_without_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, ["memory", str(CONFIGS / "Qwen3-30B-A3B.json")])
    assert (out["total_params"], out["active_params"]) == (30_532_122_624, 3_353_032_704)
    assert (out["weight_dtype"], out["weight_bytes"]) == ("bf16", 2 * 30_532_122_624)
    assert out["kv_bytes_per_token"] == 98_304
    assert out["model"] == "Qwen3-30B-A3B"
    assert "kv_cache_tokens" not in out


def test_memory_json_with_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, ["memory", str(CONFIGS / "Llama-3.1-8B.json"), "--gpu", "H100-sxm", "--kv-dtype", "fp8",
                         "--gpu-memory-utilization", "0.9", "--max-model-len", "8192", "--overhead-bytes", "2000000000"])
    kv_memory = math.ceil(81559 * 2**20 * 0.9) - 2 * 8_030_261_248 - 2_000_000_000  # nvidia-smi total (MiB)
    assert out["kv_bytes_per_token"] == 65_536
    assert out["kv_cache_bytes"] == kv_memory
    assert out["num_blocks"] == kv_memory // (16 * 65_536)
    assert out["kv_cache_tokens"] == out["num_blocks"] * 16
    assert out["max_concurrency"] == pytest.approx(out["num_blocks"] / 512)
    assert out["fits"] is True and out["gpu"] == "H100 SXM"


def test_memory_cpu_backend_matches_what_vllm_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # cpu-lab.md: the tiny Qwen3 with VLLM_CPU_KVCACHE_SPACE=1 reported 524,288 tokens in 4,096 blocks.
    tiny = {"model_type": "qwen3", "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 3536,
            "tie_word_embeddings": True, "max_position_embeddings": 4096}
    (tmp_path / "config.json").write_text(json.dumps(tiny))
    out = _json(capsys, ["memory", str(tmp_path), "--cpu-kv-cache-space-gib", "1"])
    assert (out["gpu"], out["kv_cache_bytes"], out["block_size"]) == ("cpu", 2**30, 128)
    assert (out["num_blocks"], out["vllm_kv_cache_size_tokens"], out["max_concurrency"]) == (4096, 524_288, 128.0)
    assert "overhead_bytes" not in out


def test_memory_weight_dtype_and_quantization_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert _json(capsys, ["memory", str(CONFIGS / "DeepSeek-V3.json")])["weight_dtype"] == "fp8"
    out = _json(capsys, ["memory", str(CONFIGS / "Qwen3-4B.json"), "--weight-dtype", "int4"])
    assert round(out["weight_bytes"] / 1e9, 2) == 2.67


def test_memory_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["memory", str(CONFIGS / "Qwen3-4B.json"), "--gpu", "RTX 4000 Ada", "--gpu-memory-utilization",
                 "0.4", "--max-model-len", "4096"]) == 0
    out = capsys.readouterr().out
    assert "4,022,468,096 total" in out and "147,456 B/token" in out
    assert "does not fit: 7.5 GiB of weights + 1.5 GiB of vLLM overhead fill" in out  # fit_verdict, as notebook 02
    assert "vLLM will refuse to start" in out


def test_memory_of_weights_larger_than_the_gpu_says_so_and_prints_no_negative_memory(
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["memory", str(CONFIGS / "Llama-3.3-70B.json"), "--gpu", "L4", "--weight-dtype", "bf16"]
    assert _run(argv) == 0
    out = capsys.readouterr().out
    verdict = "does not fit: the weights alone (131.4 GiB of weights) exceed the 20.7 GiB budget"
    assert verdict in out  # fit_verdict, the sentence notebook 02's explorer prints
    kv_line = next(line for line in out.splitlines() if line.startswith("KV cache memory"))
    assert "none (0 GB): the weights alone exceed the budget" in kv_line
    assert not re.search(r"(?<![\w-])-\s?\d", out), f"a negative figure:\n{out}"  # not Llama-3.3's hyphen
    assert "raise --gpu-memory-utilization" not in out  # 131 GiB of weights on a 22.5 GiB card: no setting helps
    data = _json(capsys, argv)
    assert data["kv_cache_bytes"] == 0 and data["fits"] is False and data["verdict"].startswith(verdict)
    assert all(v >= 0 for v in data.values() if isinstance(v, (int, float)))


def test_memory_whose_overhead_leaves_no_kv_cache_shows_none_not_a_negative_figure(
        capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, ["memory", str(CONFIGS / "Qwen3-4B.json"), "--gpu", "RTX 4000 Ada",
                          "--gpu-memory-utilization", "0.4", "--max-model-len", "4096"])
    assert data["kv_cache_bytes"] == 0 and "so no KV cache is left" in data["verdict"]
    assert _run(["memory", str(CONFIGS / "Qwen3-4B.json"), "--gpu", "RTX 4000 Ada", "--gpu-memory-utilization", "0.3",
                 "--max-model-len", "4096"]) == 0
    out = capsys.readouterr().out  # 7.5 GiB of weights above a 6.0 GiB budget, below the card's 20 GiB
    assert "does not fit: the weights alone" in out
    assert "vLLM will refuse to start: raise --gpu-memory-utilization" in out


@pytest.mark.parametrize("argv,message", [
    (["memory", "no/such/dir"], "no config file at no/such/dir: pass a model directory"),
    (["memory", str(CONFIGS / "Qwen3-4B.json"), "--gpu", "Z100"], "unknown GPU 'Z100': known GPUs are"),
])
def test_memory_errors_are_one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert _run(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: ") and message in captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


@pytest.mark.parametrize("flags,message", [
    (["--gpu", "L4", "--overhead-bytes", "-5"], "argument --overhead-bytes: must be >= 0 (got '-5')"),
    (["--gpu", "L4", "--overhead-bytes", "lots"], "argument --overhead-bytes: needs a whole number (got 'lots')"),
    (["--gpu", "L4", "--gpu-memory-utilization", "1.5"], "argument --gpu-memory-utilization: must be > 0 and <= 1"),
    (["--gpu", "L4", "--gpu-memory-utilization", "0"], "argument --gpu-memory-utilization: must be > 0 and <= 1"),
    (["--gpu", "L4", "--gpu-memory-utilization", "nan"], "needs a finite number (got 'nan')"),
    (["--gpu", "L4", "--block-size", "0"], "argument --block-size: must be >= 1 (got '0')"),
    (["--gpu", "L4", "--max-model-len", "-1"], "argument --max-model-len: must be >= 1 (got '-1')"),
    (["--cpu-kv-cache-space-gib", "0"], "argument --cpu-kv-cache-space-gib: must be >= 1 (got '0')"),
])
def test_memory_refuses_out_of_range_numbers_before_planning(capsys: pytest.CaptureFixture[str], flags: list[str],
                                                             message: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        _run(["memory", str(CONFIGS / "Qwen3-4B.json"), *flags])
    captured = capsys.readouterr()
    assert exit_.value.code == 2 and captured.out == ""
    assert message in captured.err and "Traceback" not in captured.err


def test_memory_overhead_bytes_reads_scientific_notation(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, ["memory", str(CONFIGS / "Qwen3-4B.json"), "--gpu", "L4", "--overhead-bytes", "2e9"])
    assert out["overhead_bytes"] == 2_000_000_000


def test_memory_says_what_it_assumed_for_an_incomplete_or_unknown_config(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    config = json.loads((CONFIGS / "Llama-3.1-8B.json").read_text())
    del config["num_key_value_heads"]
    config["model_type"] = "brand_new_arch"
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert _run(["memory", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    notes = [line for line in table.splitlines() if line.startswith("note")]
    assert len(notes) == 2
    assert "model_type 'brand_new_arch' is not an architecture the planner knows" in notes[0]
    assert "no num_key_value_heads: assumed 32, equal to num_attention_heads" in notes[1]
    out = _json(capsys, ["memory", str(tmp_path)])
    assert len(out["notes"]) == 2 and out["kv_bytes_per_token"] == 32 * 131_072 // 8
    assert _json(capsys, ["memory", str(CONFIGS / "Llama-3.1-8B.json")])["notes"] == []


def test_memory_malformed_and_incomplete_configs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text("{\"hidden_size\": 10,")
    assert _run(["memory", str(tmp_path)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    assert _run(["memory", str(tmp_path), "--json"]) == 2
    assert "lacks 'num_hidden_layers'" in capsys.readouterr().err


def test_gpus_lists_every_gpu_with_sources(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["gpus"]) == 0
    out = capsys.readouterr().out
    for gpu in gpus.GPUS:
        assert gpu.name in out and gpu.bandwidth_source in out
    rows = _json(capsys, ["gpus"])
    assert [r["name"] for r in rows] == gpus.gpu_names()
    assert rows[[r["name"] for r in rows].index("H100 SXM")]["bf16_tflops"] == 989
