"""Recompute against load for a cached prefix: the arithmetic, the crossover, the sourced tiers and this machine's
measured reads (the conclusions, notebook 03's, are tested in test_kv_cache.py)."""

import math

import pandas as pd
import pytest

from helpers.planning import kv_reuse
from helpers.hardware.gpus import GPUS, get_gpu
from helpers.planning.shape import REFERENCE_CONFIGS

LLAMA = kv_reuse.prefix_model(REFERENCE_CONFIGS / "Llama-3.1-8B.json")
A100 = get_gpu("A100 80GB SXM")


def test_model_dims_come_from_the_config():
    # Llama-3.1-8B: 32 layers, 32 heads of 128, 8 KV heads -> 2*32*32*128 and 2*8*128*2 bytes * 32 layers
    assert LLAMA.active_params == 8_030_261_248
    assert LLAMA.attention_coeff == 2 * 32 * 32 * 128
    assert LLAMA.kv_bytes_per_token == 131_072


def test_recompute_and_load_arithmetic():
    flops = 2 * LLAMA.active_params * 1000 + LLAMA.attention_coeff * 1000**2
    assert kv_reuse.recompute_s(LLAMA, 1000, 1e15, 0.5) == pytest.approx(flops / 5e14)
    assert kv_reuse.load_s(LLAMA, 1000, 25) == pytest.approx(1000 * 131_072 / 25e9)
    with pytest.raises(ValueError, match="share of the peak"):
        kv_reuse.recompute_s(LLAMA, 10, 1e15, 0)
    with pytest.raises(ValueError, match="positive"):
        kv_reuse.load_s(LLAMA, 10, 0)


def test_crossover_solves_load_equals_recompute():
    assert kv_reuse.crossover_tokens(LLAMA, A100.peak_flops(), 0.5, 31.5) == 1  # PCIe: loading always wins
    slow_gb_s = 0.5  # a slow network: recomputing wins for short prefixes
    n = kv_reuse.crossover_tokens(LLAMA, A100.peak_flops(), 0.5, slow_gb_s)
    assert n > 1
    assert kv_reuse.load_s(LLAMA, n, slow_gb_s) < kv_reuse.recompute_s(LLAMA, n, A100.peak_flops(), 0.5)
    assert kv_reuse.load_s(LLAMA, n - 1, slow_gb_s) >= kv_reuse.recompute_s(LLAMA, n - 1, A100.peak_flops(), 0.5)


def test_every_tier_has_a_source_and_the_datasheet_figures():
    table = kv_reuse.tier_table([*kv_reuse.DGX_A100_TIERS, kv_reuse.GH200_C2C])
    assert table["source"].str.len().min() > 20
    by = dict(zip(table["tier"], table["bandwidth_GB_s"]))
    assert by["HBM2e (A100 80GB SXM)"] == A100.bandwidth_gb_s == 2039
    assert by["host DRAM over PCIe Gen4 x16"] == pytest.approx(31.5, abs=0.01)
    assert by["host LPDDR5X over NVLink-C2C (GH200)"] == 450
    assert set(kv_reuse.GPU_PCIE_GEN) == {g.name for g in GPUS}  # every GPU of the table has its host link


def test_tier_and_gpu_tables():
    verdicts = kv_reuse.tier_verdicts(LLAMA, A100.peak_flops(), 0.5, kv_reuse.DGX_A100_TIERS, 4096)
    assert len(verdicts) == len(kv_reuse.DGX_A100_TIERS) and verdicts["recompute_ms"].nunique() == 1
    gpus = kv_reuse.gpu_verdicts(LLAMA, GPUS, 0.5, 4096)
    assert len(gpus) == len(GPUS) and (gpus["load_from_HBM_ms"] < gpus["load_from_host_ms"]).all()
    curves = kv_reuse.reuse_curves(LLAMA, A100.peak_flops(), 0.5, kv_reuse.DGX_A100_TIERS, [16, 256])
    # PCIe and the NVMe link ceiling share 31.5 GB/s: one line, both names
    assert len(curves) == 2 * len(kv_reuse.DGX_A100_TIERS)
    assert "load from host DRAM over PCIe Gen4 x16 = local NVMe (4 drives, RAID 0)" in set(curves["way"])


def test_machine_reads_are_measured(tmp_path):
    prefill = pd.DataFrame({"prompt_tokens": [64.0, 1024.0], "mean_ttft_ms": [30.0, 200.0]})
    table = kv_reuse.machine_reuse(prefill, 2048, directory=tmp_path, repeats=1)
    assert table["kv_MB"].tolist() == pytest.approx([64 * 2048 / 1e6, 1024 * 2048 / 1e6])
    assert (table[["read_from_RAM_ms", "read_from_file_ms"]] > 0).all().all()
    assert not list(tmp_path.iterdir())  # the file is removed
    assert math.isfinite(kv_reuse.measure_ram_read_s(1 << 16, repeats=1))
    with pytest.raises(ValueError, match="positive"):
        kv_reuse.measure_file_read_s(0)


def test_describe_tiers_keeps_every_source_whole():
    text = kv_reuse.describe_tiers(kv_reuse.DGX_A100_TIERS)
    assert text.count("\n") == len(kv_reuse.DGX_A100_TIERS) - 1
    assert all(t.source in text for t in kv_reuse.DGX_A100_TIERS) and "2,039.0 GB/s" in text
