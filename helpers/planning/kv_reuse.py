"""Hierarchical KV reuse: when loading a cached prefix's keys and values beats computing them again.

For a prefix of N tokens, recomputing its KV is a prefill: FLOPs = 2*N_active*N + 2*L*nh*hd*N^2
(``roofline.prefill_flops``) at the achievable FLOP/s (peak x MFU). Loading it moves N * kv_bytes_per_token
bytes over one tier of the memory hierarchy: the GPU's HBM, host memory over PCIe or NVLink-C2C, local
NVMe, network storage. Loading grows linearly with N, recomputing at least linearly and then
quadratically, so past a crossover length loading wins, and for most tiers it wins from the first token.

Every bandwidth sits in one table with its source (``DGX_A100_TIERS``, ``GH200_C2C``, ``PCIE_GB_S``);
model dimensions come from the published config.json files (``helpers.planning.shape``). On this machine the
same comparison is measured: the engine's prefill time (its TTFT) against reading the same bytes from RAM
and from a file.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from helpers.hardware.gpus import GPU
from helpers.planning.kv import kv_cache_bytes
from helpers.planning.shape import ModelSource, count_params, model_shape
from helpers.planning.roofline import prefill_flops


@dataclass(frozen=True)
class Tier:
    """One place a cached prefix's KV can be loaded from, with the bandwidth one GPU reads it at (GB/s, one
    direction) and the source of that figure."""

    name: str
    bandwidth_gb_s: float
    source: str


# PCIe x16, one direction: lanes x transfer rate x 128b/130b encoding / 8 bits (PCI-SIG base specifications 4.0 and 5.0)
PCIE_GB_S = {4: 16 * 16 * 128 / 130 / 8, 5: 16 * 32 * 128 / 130 / 8}
PCIE_SOURCE = ("PCI-SIG PCIe base specification: Gen4 16 GT/s, Gen5 32 GT/s per lane, 128b/130b encoding; "
               "x16 = 31.5 / 63.0 GB/s per direction (datasheets print both directions: 64 / 128 GB/s)")
# The host link of each GPU in helpers.hardware.gpus (each GPU's datasheet: "PCIe Gen4 x16" or "PCIe Gen5 x16")
GPU_PCIE_GEN = {"L4": 4, "L40S": 4, "A10G": 4, "A100 40GB SXM": 4, "A100 80GB SXM": 4, "H100 SXM": 5, "H100 PCIe": 5,
                "H200": 5, "B200": 5, "RTX 4000 Ada": 4, "RTX 4090": 4}

DGX_A100_TIERS: tuple[Tier, ...] = (
    Tier("HBM2e (A100 80GB SXM)", 2039, "NVIDIA A100 datasheet (80GB SXM): 2,039 GB/s"),
    Tier("host DRAM over PCIe Gen4 x16", PCIE_GB_S[4], "NVIDIA A100 datasheet: PCIe Gen4 64 GB/s (both directions); " + PCIE_SOURCE),
    Tier("local NVMe (4 drives, RAID 0)", 4 * 16 * 4 * 128 / 130 / 8,
         "NVIDIA DGX A100 user guide: internal storage 15 TB as 4x 3.84 TB U.2 NVMe; each drive's PCIe Gen4 x4 link "
         "carries at most 7.9 GB/s (PCI-SIG), 4 drives 31.5 GB/s: a link ceiling, real drives read less"),
    Tier("network storage (one 200 Gb/s HDR port)", 200 / 8,
         "NVIDIA DGX A100 datasheet: ConnectX-6 VPI HDR InfiniBand 200 Gb/s per port; 200 Gb/s / 8 = 25 GB/s per "
         "direction (GPUDirect Storage into one GPU through one port)"),
)
GH200_C2C = Tier("host LPDDR5X over NVLink-C2C (GH200)", 450,
                 "NVIDIA GH200 Grace Hopper Superchip datasheet: NVLink-C2C 900 GB/s bidirectional = 450 GB/s per "
                 "direction (10 links x 45 GB/s, Hot Chips 34)")


def tier_table(tiers: Sequence[Tier]) -> pd.DataFrame:
    """The tiers with their bandwidths (GB/s) and sources, one row each."""
    return pd.DataFrame([{"tier": t.name, "bandwidth_GB_s": t.bandwidth_gb_s, "source": t.source} for t in tiers])


@dataclass(frozen=True)
class PrefixModel:
    """What recompute and load cost per token for one model: active parameters, the attention FLOP
    coefficient 2*L*nh*hd (times N^2), and KV bytes per token."""

    name: str
    active_params: int
    attention_coeff: int
    kv_bytes_per_token: int

    def prefill_flops(self, tokens: int) -> float:
        """FLOPs of a prefill of ``tokens`` tokens (``roofline.prefill_flops``)."""
        return self.active_params * 2.0 * tokens + self.attention_coeff * float(tokens) ** 2


def prefix_model(source: ModelSource, kv_dtype: str = "bf16") -> PrefixModel:
    """The recompute and load costs of a model from its config.json (published, or a local model's)."""
    shape, counts = model_shape(source), count_params(source)
    coeff = round(prefill_flops(0, 1, shape.num_layers, shape.num_heads, shape.head_dim))
    return PrefixModel(shape.name, counts.active, coeff, kv_cache_bytes(shape, kv_dtype).bytes_per_token)


def recompute_s(model: PrefixModel, tokens: int, peak_flops: float, mfu: float) -> float:
    """Seconds to recompute a prefix's KV: prefill FLOPs / (peak FLOP/s x MFU)."""
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu}: it is the share of the peak a prefill achieves")
    return model.prefill_flops(tokens) / (peak_flops * mfu)


def load_s(model: PrefixModel, tokens: int, bandwidth_gb_s: float) -> float:
    """Seconds to load a prefix's KV bytes over a tier of ``bandwidth_gb_s``."""
    if bandwidth_gb_s <= 0:
        raise ValueError("bandwidth_gb_s must be positive")
    return tokens * model.kv_bytes_per_token / (bandwidth_gb_s * 1e9)


def crossover_tokens(model: PrefixModel, peak_flops: float, mfu: float, bandwidth_gb_s: float) -> int:
    """The shortest prefix (tokens) from which loading beats recomputing; 1 when loading always wins.
    load(N) < recompute(N) <=> kv/BW < (2*N_act + coeff*N) / F', solved for N."""
    achievable = peak_flops * mfu
    per_token_gap = model.kv_bytes_per_token / (bandwidth_gb_s * 1e9) - 2.0 * model.active_params / achievable
    if per_token_gap < 0:
        return 1
    return int(per_token_gap * achievable / model.attention_coeff) + 1


def reuse_curves(model: PrefixModel, peak_flops: float, mfu: float, tiers: Sequence[Tier],
                 token_counts: Sequence[int]) -> pd.DataFrame:
    """Seconds per prefix length: recompute, and load from each tier (long form: tokens, way, seconds)."""
    rows = [{"tokens": n, "way": "recompute (prefill)", "seconds": recompute_s(model, n, peak_flops, mfu)}
            for n in token_counts]
    by_bandwidth: dict[float, list[str]] = {}
    for t in tiers:  # tiers of one bandwidth draw one line: name them together
        by_bandwidth.setdefault(round(t.bandwidth_gb_s, 6), []).append(t.name)
    rows += [{"tokens": n, "way": "load from " + " = ".join(names), "seconds": load_s(model, n, bandwidth)}
             for bandwidth, names in by_bandwidth.items() for n in token_counts]
    return pd.DataFrame(rows)


def tier_verdicts(model: PrefixModel, peak_flops: float, mfu: float, tiers: Sequence[Tier], tokens: int) -> pd.DataFrame:
    """Per tier at a prefix of ``tokens``: load and recompute (ms), the ratio, and the crossover length."""
    recompute_ms = recompute_s(model, tokens, peak_flops, mfu) * 1000
    rows = []
    for t in tiers:
        load_ms = load_s(model, tokens, t.bandwidth_gb_s) * 1000
        rows.append({"tier": t.name, "bandwidth_GB_s": t.bandwidth_gb_s, "load_ms": load_ms, "recompute_ms": recompute_ms,
                     "recompute_over_load": recompute_ms / load_ms,
                     "loading_wins_from_tokens": crossover_tokens(model, peak_flops, mfu, t.bandwidth_gb_s)})
    return pd.DataFrame(rows)


def gpu_verdicts(model: PrefixModel, gpus: Sequence[GPU], mfu: float, tokens: int) -> pd.DataFrame:
    """Per GPU of the table, at a prefix of ``tokens``: recompute (BF16 peak x MFU) against loading from its HBM
    and from host memory over its PCIe link (``GPU_PCIE_GEN``)."""
    rows = []
    for gpu in gpus:
        peak, gen = gpu.peak_flops("bf16"), GPU_PCIE_GEN.get(gpu.name)
        host = PCIE_GB_S[gen] if gen else None
        rows.append({"gpu": gpu.name, "recompute_ms": recompute_s(model, tokens, peak, mfu) * 1000,
                     "load_from_HBM_ms": load_s(model, tokens, gpu.bandwidth_gb_s) * 1000,
                     "host_link": f"PCIe Gen{gen} x16" if gen else "unknown",
                     "load_from_host_ms": load_s(model, tokens, host) * 1000 if host else float("nan"),
                     "host_load_wins_from_tokens": crossover_tokens(model, peak, mfu, host) if host else None})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# This machine, measured


def measure_ram_read_s(nbytes: int, repeats: int = 5) -> float:
    """Best-of-``repeats`` seconds to copy ``nbytes`` from one place in RAM to another (numpy)."""
    import numpy as np

    if nbytes <= 0:
        raise ValueError("nbytes must be positive")
    source, target = np.ones(nbytes, dtype=np.uint8), np.empty(nbytes, dtype=np.uint8)
    best = float("inf")
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - start)
    return best


def measure_file_read_s(nbytes: int, directory: str | os.PathLike[str] | None = None, repeats: int = 5) -> float:
    """Best-of-``repeats`` seconds to read back a file of ``nbytes`` just written (and fsynced) in ``directory``.
    The file stays in the operating system's page cache, so this is a read through the kernel from RAM, not
    from the disk itself (dropping the cache needs root)."""
    if nbytes <= 0:
        raise ValueError("nbytes must be positive")
    buffer = bytearray(nbytes)
    with tempfile.NamedTemporaryFile(dir=directory, prefix="kv-", suffix=".bin", delete=False) as f:
        path = Path(f.name)
        f.write(os.urandom(min(nbytes, 1 << 20)) * (nbytes // (1 << 20)) + os.urandom(nbytes % (1 << 20)))
        f.flush()
        os.fsync(f.fileno())
    try:
        best = float("inf")
        for _ in range(max(1, repeats)):
            start = time.perf_counter()
            with open(path, "rb", buffering=0) as f:
                read = f.readinto(buffer)
            best = min(best, time.perf_counter() - start)
        if read != nbytes:
            raise OSError(f"read {read} of {nbytes} bytes back from {path.name}: is the disk full?")
    finally:
        path.unlink(missing_ok=True)
    return best


def machine_reuse(prefill: pd.DataFrame, kv_bytes_per_token: int, directory: str | os.PathLike[str] | None = None,
                  repeats: int = 5) -> pd.DataFrame:
    """Per prompt length measured in ``prefill`` (``prefill.prefill_table``): the engine's mean TTFT (the prefill,
    plus one decode step and the HTTP round trip) against reading the prompt's KV bytes from RAM and from a file."""
    rows = []
    for _, r in prefill.iterrows():
        nbytes = max(1, round(r.prompt_tokens * kv_bytes_per_token))
        rows.append({"prompt_tokens": int(round(r.prompt_tokens)), "kv_MB": nbytes / 1e6, "recompute_ttft_ms": r.mean_ttft_ms,
                     "read_from_RAM_ms": measure_ram_read_s(nbytes, repeats) * 1000,
                     "read_from_file_ms": measure_file_read_s(nbytes, directory, repeats) * 1000})
    return pd.DataFrame(rows)


def plot_reuse(curves: pd.DataFrame, title: str) -> "object":
    """Log-log seconds against prefix tokens: the recompute line and one load line per tier (``reuse_curves``)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4), constrained_layout=True)
    for way, part in curves.groupby("way", sort=False):
        recompute = way.startswith("recompute")
        ax.loglog(part["tokens"], part["seconds"] * 1000, color="black" if recompute else None,
                  linewidth=2.5 if recompute else 1.5, linestyle="-" if recompute else "--", label=way)
    ax.set_xlabel("prefix length (tokens)")
    ax.set_ylabel("time to have the prefix's KV (ms)")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    return fig


def served_kv_bytes_per_token(model_dir: str | os.PathLike[str], kv_dtype: str = "bf16") -> int | None:
    """KV bytes per token of the served model from its local config.json; None when the config is not here (an
    endpoint serving a model this checkout does not hold)."""
    if not (Path(model_dir) / "config.json").is_file():
        return None
    return kv_cache_bytes(model_dir, kv_dtype).bytes_per_token


def describe_tiers(tiers: Sequence[Tier]) -> str:
    """One line per tier: its name, bandwidth (GB/s, one direction) and the full source."""
    return "\n".join(f"- {t.name}: {t.bandwidth_gb_s:,.1f} GB/s. Source: {t.source}" for t in tiers)
