"""GPU specifications for planning and rooflines: one table, every figure next to its source.

Throughput figures are DENSE tensor-core peaks (datasheets also print "with sparsity" figures,
twice these). Memory comes twice: the datasheet's capacity ("80GB", read as decimal GB) and the
total the driver reports (``nvidia-smi --query-gpu=memory.total`` in MiB, the same figure as
``torch.cuda.mem_get_info()[1]``, which vLLM multiplies by ``--gpu-memory-utilization``). The planner
uses the driver's total: an "80GB" H100 reports 81,559 MiB = 79.6 GiB. Each reported total was read
from a public ``nvidia-smi`` output named in ``usable_memory_source``; pass your own measured total
(``total_memory_bytes``) when you plan for a GPU you have.
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers.core.errors import WorkshopError


@dataclass(frozen=True)
class GPU:
    """One accelerator: memory, bandwidth and dense peak throughput, each with its source."""

    name: str
    memory_bytes: int
    bandwidth_gb_s: float
    bf16_tflops: float
    fp8_tflops: float | None  # None: no FP8 tensor cores (compute capability < 8.9)
    memory_source: str
    bandwidth_source: str
    bf16_source: str
    fp8_source: str
    note: str = ""
    usable_memory_mib: int | None = None  # the driver's total (nvidia-smi memory.total, MiB); None: not known
    usable_memory_source: str = ""

    @property
    def usable_memory_bytes(self) -> int:
        """Memory the driver reports in bytes (MiB x 2**20); the datasheet figure when none is known."""
        return self.memory_bytes if self.usable_memory_mib is None else self.usable_memory_mib * _MIB

    @property
    def usable_memory_gib(self) -> float:
        """``usable_memory_bytes`` in GiB (2**30 bytes), the unit of nvidia-smi and vLLM's logs."""
        return self.usable_memory_bytes / 2**30

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Memory bandwidth in bytes per second."""
        return self.bandwidth_gb_s * 1e9

    def peak_flops(self, compute_dtype: str = "bf16") -> float:
        """Dense peak in FLOP/s for ``compute_dtype`` ("bf16" or "fp8")."""
        if compute_dtype == "bf16":
            return self.bf16_tflops * 1e12
        if compute_dtype == "fp8":
            if self.fp8_tflops is None:
                raise ValueError(f"{self.name} has no FP8 tensor cores: use compute_dtype='bf16'")
            return self.fp8_tflops * 1e12
        raise ValueError(f"unknown compute_dtype {compute_dtype!r}: use 'bf16' or 'fp8'")


_GB = 10**9
_MIB = 2**20
_SMI = "nvidia-smi memory.total"
_MODAL = "modal-labs/modal-client pull request #2797 (nvidia-smi totals of its GPU types)"

# Dense figures are half the datasheets' "with sparsity" numbers.
GPUS: tuple[GPU, ...] = (
    GPU("L4", 24 * _GB, 300, 121, 242,
        "NVIDIA L4 datasheet: 24GB GDDR6", "NVIDIA L4 datasheet: 300 GB/s",
        "NVIDIA L4 datasheet: BF16 242 TFLOPS with sparsity, 121 dense",
        "NVIDIA L4 datasheet: FP8 485 TFLOPS with sparsity, 242 dense",
        usable_memory_mib=23034,
        usable_memory_source=_SMI + " 23034 MiB: " + _MODAL),
    GPU("L40S", 48 * _GB, 864, 362, 733,
        "NVIDIA L40S datasheet: 48GB GDDR6", "NVIDIA L40S datasheet: 864 GB/s",
        "NVIDIA L40S datasheet: BF16 733 TFLOPS with sparsity, 362 dense",
        "NVIDIA L40S datasheet: FP8 1,466 TFLOPS with sparsity, 733 dense",
        usable_memory_mib=46068,
        usable_memory_source=_SMI + " 46068 MiB: " + _MODAL),
    GPU("A10G", 24 * _GB, 600, 70, None,
        "AWS EC2 G5 instance page: 24 GB per A10G", "AWS EC2 G5 instance page: 600 GB/s",
        "estimate: ~70 dense (the AWS variant of the A10; NVIDIA publishes no A10G datasheet)",
        "none: Ampere has no FP8 tensor cores", note="no FP8 (Ampere)",
        usable_memory_mib=23028,
        usable_memory_source=_SMI + " 23028 MiB: public nvidia-smi logs of NVIDIA A10G (AWS g5); the A10 shows the same in " + _MODAL),
    GPU("A100 40GB SXM", 40 * _GB, 1555, 312, None,
        "NVIDIA A100 datasheet: 40GB HBM2", "NVIDIA A100 datasheet (40GB SXM): 1,555 GB/s",
        "NVIDIA A100 datasheet: BF16 312 TFLOPS dense (624 with sparsity)",
        "none: Ampere has no FP8 tensor cores", note="INT8 624 TOPS dense",
        usable_memory_mib=40960,
        usable_memory_source=_SMI + " 40960 MiB: " + _MODAL),
    GPU("A100 80GB SXM", 80 * _GB, 2039, 312, None,
        "NVIDIA A100 datasheet: 80GB HBM2e", "NVIDIA A100 datasheet (80GB SXM): 2,039 GB/s",
        "NVIDIA A100 datasheet: BF16 312 TFLOPS dense (624 with sparsity)",
        "none: Ampere has no FP8 tensor cores",
        usable_memory_mib=81920,
        usable_memory_source=_SMI + " 81920 MiB: " + _MODAL),
    GPU("H100 SXM", 80 * _GB, 3350, 989, 1979,
        "NVIDIA H100 datasheet (SXM): 80GB", "NVIDIA H100 datasheet (SXM): 3.35 TB/s",
        "NVIDIA H100 datasheet (SXM): BF16 1,979 TFLOPS with sparsity, 989 dense",
        "NVIDIA H100 datasheet (SXM): FP8 3,958 TFLOPS with sparsity, 1,979 dense",
        usable_memory_mib=81559,
        usable_memory_source=_SMI + " 81559 MiB: NVIDIA/nccl issue #1264 (8x H100 80GB HBM3) and " + _MODAL),
    GPU("H100 PCIe", 80 * _GB, 2000, 756, 1513,
        "NVIDIA H100 datasheet (PCIe): 80GB", "NVIDIA H100 datasheet (PCIe): 2 TB/s",
        "NVIDIA H100 datasheet (PCIe): BF16 1,513 TFLOPS with sparsity, 756 dense",
        "NVIDIA H100 datasheet (PCIe): FP8 3,026 TFLOPS with sparsity, 1,513 dense",
        usable_memory_mib=81559,
        usable_memory_source=_SMI + " 81559 MiB: public nvidia-smi logs of NVIDIA H100 PCIe"),
    GPU("H200", 141 * _GB, 4800, 989, 1979,
        "NVIDIA H200 datasheet (SXM): 141GB HBM3e", "NVIDIA H200 datasheet (SXM): 4.8 TB/s",
        "NVIDIA H200 datasheet (SXM): BF16 1,979 TFLOPS with sparsity, 989 dense",
        "NVIDIA H200 datasheet (SXM): FP8 3,958 TFLOPS with sparsity, 1,979 dense",
        usable_memory_mib=143771,
        usable_memory_source=_SMI + " 143771 MiB: public nvidia-smi logs of 8x NVIDIA H200 (SXM)"),
    GPU("B200", 180 * _GB, 8000, 2250, 4500,
        "NVIDIA HGX B200 datasheet: 180GB HBM3e per GPU", "NVIDIA HGX B200 datasheet: 8 TB/s per GPU",
        "NVIDIA HGX B200 datasheet: BF16 4.5 PFLOPS with sparsity, 2,250 TFLOPS dense per GPU",
        "NVIDIA HGX B200 datasheet: FP8 9 PFLOPS with sparsity, 4,500 TFLOPS dense per GPU",
        note="FP4 9,000 TFLOPS dense",
        usable_memory_mib=183359,
        usable_memory_source=_SMI + " 183359 MiB: NVIDIA/TensorRT-LLM issue #10278 (nvidia-smi of 8x B200)"),
    GPU("RTX 4000 Ada", 20 * _GB, 360, 107, 214,
        "NVIDIA RTX 4000 Ada datasheet: 20GB GDDR6", "NVIDIA RTX 4000 Ada datasheet: 360 GB/s",
        "estimate: ~107 dense, derived (the datasheet prints no dense BF16 figure)",
        "estimate: ~214 dense, derived (twice the BF16 estimate, as on every Ada GPU)", note="the GPU of a known public workshop",
        usable_memory_mib=20475,
        usable_memory_source=_SMI + " 20475 MiB: public nvidia-smi logs of NVIDIA RTX 4000 Ada Generation"),
    GPU("RTX 4090", 24 * _GB, 1008, 165, 330,
        "NVIDIA RTX 4090 specifications: 24GB GDDR6X", "NVIDIA Ada Lovelace whitepaper (RTX 4090): 1,008 GB/s",
        "NVIDIA Ada Lovelace whitepaper (RTX 4090): BF16 with FP32 accumulate 165 TFLOPS dense",
        "NVIDIA Ada Lovelace whitepaper (RTX 4090): FP8 with FP32 accumulate 330 TFLOPS dense",
        usable_memory_mib=24564,
        usable_memory_source=_SMI + " 24564 MiB: RLinf/RLinf issue #255 (nvidia-smi of GeForce RTX 4090)"),
)


class UnknownGPUError(WorkshopError, LookupError):
    """Raised for a GPU name that is not in the table."""


def _key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def gpu_names() -> list[str]:
    """Names of the GPUs in the table, in table order."""
    return [g.name for g in GPUS]


def get_gpu(name: str) -> GPU:
    """The table entry for ``name``, ignoring case, spaces and hyphens ("h100-sxm" finds "H100 SXM")."""
    wanted = _key(name)
    for gpu in GPUS:
        if _key(gpu.name) == wanted:
            return gpu
    raise UnknownGPUError(f"unknown GPU {name!r}: known GPUs are {', '.join(gpu_names())}")


# ---------------------------------------------------------------- dated prices: renting a machine, or an API's tokens

@dataclass(frozen=True)
class HourlyPrice:
    """What one GPU (or a small VM) rents for, on demand, in USD per hour, with the page it was read from."""

    name: str  # a GPU of GPUS, or a VM
    usd_per_hour: float  # per GPU (a multi-GPU instance's price divided by its GPUs), or per VM
    source: str
    date: str = ""  # when the source was read or published (YYYY-MM or YYYY-MM-DD)


# List prices as published; they change often and differ between providers by 2x or more: pass your own
# (helpers.planning.token_price takes the price as a parameter) and keep its source beside it. Lambda's rows were read
# from two independent transcriptions of its instances page (September 2026) that agree to the cent; the AWS
# and Google Cloud rows are list prices as published in 2025, not re-checked since (a search for a current,
# first-hand e2-standard-2 price in December 2026 found none this kit could trust).
_LAMBDA = "Lambda GPU cloud on-demand instances page (September 2026)"
HOURLY_PRICES: tuple[HourlyPrice, ...] = (
    HourlyPrice("H100 SXM", 3.99, f"{_LAMBDA}: 8x NVIDIA H100 SXM, 3.99 USD per GPU-hour (1x: 4.29)", "2026-09"),
    HourlyPrice("H100 PCIe", 3.29, f"{_LAMBDA}: 1x NVIDIA H100 PCIe, 3.29 USD per GPU-hour", "2026-09"),
    HourlyPrice("A100 80GB SXM", 2.79, f"{_LAMBDA}: 8x NVIDIA A100 SXM 80 GB, 2.79 USD per GPU-hour", "2026-09"),
    HourlyPrice("A100 40GB SXM", 1.99, f"{_LAMBDA}: 8x NVIDIA A100 SXM 40 GB, 1.99 USD per GPU-hour", "2026-09"),
    HourlyPrice("B200", 6.69, f"{_LAMBDA}: 8x NVIDIA B200 SXM6, 6.69 USD per GPU-hour", "2026-09"),
    HourlyPrice("A10G", 1.006, "AWS EC2 On-Demand pricing (us-east-1, Linux): g5.xlarge, 1 A10G + 4 vCPU, 1.006 USD/h",
                "2025 (not re-checked)"),
    HourlyPrice("2-vCPU VM", 0.067, "Google Cloud Compute Engine VM pricing (us-central1, on demand): e2-standard-2, "
                                    "2 vCPU + 8 GB, 0.067 USD/h", "2025 (not re-checked)"),
)


def hourly_price(name: str) -> HourlyPrice:
    """The price row for ``name`` (a GPU of the table or "2-vCPU VM"), ignoring case, spaces and hyphens."""
    wanted = _key(name)
    for price in HOURLY_PRICES:
        if _key(price.name) == wanted:
            return price
    raise UnknownPriceError(f"no hourly price for {name!r}: priced are {', '.join(p.name for p in HOURLY_PRICES)}; "
                      "pass your own price (USD per hour) instead")


def profile_hourly_price(profile: str) -> HourlyPrice:
    """The row a profile's engine is priced at when you give no price: the 2-vCPU VM on "cpu", one H100 SXM else."""
    return hourly_price("2-vCPU VM" if profile == "cpu" else "H100 SXM")


def engine_price(profile: str, hourly_usd: float | None = None) -> tuple[float, str]:
    """(USD per hour, its source) for this engine: ``hourly_usd`` when given, else the dated table's row for the
    profile (``profile_hourly_price``: a 2-vCPU VM on "cpu", one H100 SXM otherwise)."""
    if hourly_usd is not None:
        if hourly_usd <= 0:
            raise ValueError(f"HOURLY_USD must be a positive price in USD per hour, got {hourly_usd}")
        return float(hourly_usd), "your HOURLY_USD parameter"
    row = profile_hourly_price(profile)
    return row.usd_per_hour, f"{row.source} ({row.date}); set HOURLY_USD to what you pay"


@dataclass(frozen=True)
class ApiPrice:
    """A hosted API's list price in USD per million tokens: fresh input, cached input (a prompt prefix the API
    has seen recently), output; with the page it was read from and when."""

    model: str
    usd_per_m_input: float
    usd_per_m_cached_input: float
    usd_per_m_output: float
    source: str
    date: str


# OpenAI's standard tier. OpenAI's own pricing page (developers.openai.com/api/docs/pricing) was not in reach of this
# kit's search; each row was read from a dated transcription of it, named in the row. Prices change: pass your own.
API_PRICES: tuple[ApiPrice, ...] = (
    ApiPrice("gpt-4o-mini", 0.15, 0.075, 0.60,
             "OpenAI API pricing as transcribed in the CommitBrief wiki page 'Provider OpenAI' (rates from "
             "openai.com/api/pricing; input 0.15, output 0.60, cached input 0.075 USD per 1M tokens)", "2026-05-27"),
    ApiPrice("gpt-4.1-mini", 0.40, 0.10, 1.60,
             "OpenAI API pricing as transcribed in the openai_responses 0.4.1 package (hex.pm), "
             "lib/responses/pricing.ex: source platform.openai.com/docs/pricing, last updated 2025-06-03", "2025-06-03"),
    ApiPrice("gpt-5.4-mini", 0.75, 0.075, 4.50,
             "OpenAI API pricing as transcribed in the adk-model 0.6.0 crate (docs.rs), src/openai/pricing.rs: "
             "'Token pricing for OpenAI models (March 2026)'", "2026-03"),
)


# OpenAI caches a prompt's prefix only from 1,024 repeated tokens on: "OpenAI applies automatic prompt-caching at
# >=1024-token repeated prefixes" (CommitBrief wiki, 'Provider OpenAI', 2026-05-27).
API_CACHE_MIN_PREFIX_TOKENS = 1024


def api_price(model: str) -> ApiPrice:
    """The API price row for ``model`` (ignoring case, spaces, dots and hyphens)."""
    wanted = _key(model)
    for price in API_PRICES:
        if _key(price.model) == wanted:
            return price
    raise UnknownPriceError(f"no API price for {model!r}: priced are {', '.join(p.model for p in API_PRICES)}; "
                            "pass your own prices (USD per million tokens) instead")


class UnknownPriceError(WorkshopError, LookupError):
    """Raised for a model or machine the dated price table does not hold."""
