"""A GPU shared by plan: does the lab's model fit one share (a MIG slice, or 1/N of a time-sliced GPU), what the day
costs per participant next to one GPU each, and what changes for the lessons that want a whole GPU.

The memory arithmetic is the planner's (``memory.plan_memory``, ``kv.vllm_kv_cache``); this module only says
how big a share is and what the labs ask of it:
- the cluster's ``--max-model-len`` (``LAB_MAX_MODEL_LEN``, k8s/base/vllm.yaml): vLLM refuses to start unless one
  request of that length fits the KV cache;
- the lessons' highest default concurrency, notebook 07's sweep (``TOP_CONCURRENCY`` users, each request
  ``REQUEST_TOKENS`` = INPUT_LEN + OUTPUT_LEN of its parameters cell): below that the top of the sweep preempts.
tests/test_gpu_share.py reads those three figures from k8s/ and the notebook, so they cannot drift.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from helpers.core.conclusion import plural
from helpers.core.errors import WorkshopError
from helpers.hardware.gpu_shares import MigProfile, get_mig_profile
from helpers.hardware.gpus import get_gpu, hourly_price
from helpers.planning.kv import vllm_kv_cache
from helpers.planning.memory import MemoryPlan, fit_verdict, plan_memory, plan_row
from helpers.planning.shape import GIB, REFERENCE_CONFIGS, ModelSource

LAB_MAX_MODEL_LEN = 8192  # k8s/base/vllm.yaml --max-model-len (and helpers.engine.interface.default_config)
TOP_CONCURRENCY = 64  # notebooks/07_saturation.ipynb CONCURRENCIES[-1], the highest default concurrency of the labs
REQUEST_TOKENS = 256  # notebooks/07_saturation.ipynb INPUT_LEN 128 + OUTPUT_LEN 128
LAB_GPU_MEMORY_UTILIZATION = 0.90  # k8s/base/vllm.yaml --gpu-memory-utilization
NOTEBOOK_08_UTILIZATION = 0.95  # notebooks/08_tuning_and_evaluation.ipynb MEMORY_KNOB["k8s"], the memory candidate
WORKSHOP_DAY_HOURS = 8.0  # an assumption, not a published figure: the GPUs rented for one day; pass yours
YES, PARTLY, NO = "yes", "partly", "no"


class GpuShareError(WorkshopError, ValueError):
    """Raised for a --gpu-share the planner cannot read."""


@dataclass(frozen=True)
class GpuShare:
    """How participants share GPUs: "none" (one GPU each), "mig" (one slice each) or "time-slicing" (N per GPU)."""

    kind: str
    profile: str | None = None  # MIG profile, e.g. "1g.10gb"
    replicas: int = 1  # time-slicing: engines per GPU

    def __str__(self) -> str:
        if self.kind == "mig":
            return f"mig-{self.profile}"
        return f"time-slicing:{self.replicas}" if self.kind == "time-slicing" else "none"


def parse_gpu_share(text: str) -> GpuShare:
    """``none``, ``mig-1g.10gb`` or ``time-slicing:4`` -> GpuShare."""
    value = text.strip().lower()
    if value in ("", "none"):
        return GpuShare("none")
    if m := re.fullmatch(r"mig-(\d+g\.\d+gb)", value):
        return GpuShare("mig", profile=m.group(1))
    if m := re.fullmatch(r"time-slicing:(\d+)", value):
        n = int(m.group(1))
        if n < 2:
            raise GpuShareError(f"--gpu-share {text}: time-slicing needs at least 2 engines per GPU (or use none)")
        return GpuShare("time-slicing", replicas=n)
    raise GpuShareError(f"--gpu-share {text!r}: use none, mig-PROFILE (e.g. mig-2g.20gb) or time-slicing:N "
                        "(e.g. time-slicing:4)")


def _as_share(share: str | GpuShare) -> GpuShare:
    return share if isinstance(share, GpuShare) else parse_gpu_share(share)


def participants_per_gpu(share: str | GpuShare, gpu: str) -> int:
    """How many participants one GPU serves under ``share``: 1, the slices of a MIG profile, or N."""
    s = _as_share(share)
    if s.kind == "mig":
        return get_mig_profile(gpu, s.profile or "").instances_per_gpu
    return s.replicas if s.kind == "time-slicing" else 1


def engine_gpu_memory_utilization(share: str | GpuShare, utilization: float = LAB_GPU_MEMORY_UTILIZATION) -> float:
    """The --gpu-memory-utilization each engine must run with: vLLM takes it of the memory it SEES, a MIG slice's
    own, but the whole GPU under time-slicing, so there it is divided by N (rounded down to 0.01)."""
    s = _as_share(share)
    if s.kind != "time-slicing":
        return utilization
    return math.floor(utilization / s.replicas * 100) / 100


def lab_model_source(model: str | ModelSource) -> tuple[ModelSource, str | None]:
    """A model the labs serve (``Qwen/Qwen3-4B``, ``RedHatAI/Qwen3-4B-FP8-dynamic``) as (published config.json,
    weight dtype: "fp8" for an FP8 checkpoint, else None); other sources are returned as they are."""
    if not isinstance(model, str) or Path(model).exists():
        return model, None
    stem = model.rsplit("/", 1)[-1]
    fp8 = re.search(r"-fp8(-dynamic)?$", stem, flags=re.IGNORECASE)
    base = stem[:fp8.start()] if fp8 else stem
    config = REFERENCE_CONFIGS / f"{base}.json"
    if not config.is_file():
        known = ", ".join(sorted(p.stem for p in REFERENCE_CONFIGS.glob("*.json")))
        raise GpuShareError(f"no published config.json for {model!r} in helpers/data/configs ({known}): pass the "
                            "model's directory or config.json instead")
    return config, "fp8" if fp8 else None


@dataclass(frozen=True)
class ShareVerdict:
    """Does the model fit one share? ``verdict``: yes (vLLM starts and notebook 07's top concurrency fits the KV
    cache), partly (it starts; 07's top concurrency preempts), no (vLLM does not start). Memory in GiB."""

    verdict: str
    model: str
    weight_dtype: str
    gpu: str
    share: str
    share_gib: float  # the memory the engine sees (the slice; under time-slicing, the whole GPU)
    budget_gib: float  # what the engine may use: the share x --gpu-memory-utilization
    weights_gib: float
    overhead_gib: float  # the planner's estimate of vLLM's activations, non-torch memory, CUDA graphs
    kv_gib: float  # KV cache left (0 when none)
    kv_needed_gib: float  # notebook 07's top concurrency x its request tokens
    kv_full_context_gib: float  # the same users at max_model_len each (for comparison)
    max_model_len: int
    concurrency: int
    request_tokens: int
    requests_at_max_len: int  # conversations of max_model_len at once
    concurrency_at_request_tokens: float  # how many of 07's requests the KV cache holds
    gpu_memory_utilization: float  # the flag the engine must run with on this share
    sentence: str

    @property
    def fits(self) -> bool:
        """True when the verdict is yes."""
        return self.verdict == YES


def _sm_share(profile: MigProfile) -> str:
    """'2/7 of the SMs', or 'all the SMs' for the whole-GPU profile."""
    return "all the SMs" if profile.sm_fraction == 1 else f"{profile.sm_fraction} of the SMs"


def _share_plan(source: ModelSource, gpu: str, share: GpuShare, weight_dtype: str | None, kv_dtype: str,
                max_model_len: int, utilization: float) -> tuple[MemoryPlan, str]:
    """The planner's memory plan of one engine on one share, and how the share reads in words."""
    spec = get_gpu(gpu)
    if share.kind == "mig":
        profile: MigProfile = get_mig_profile(gpu, share.profile or "")
        plan = plan_memory(source, gpu=spec, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                           gpu_memory_utilization=utilization, max_model_len=max_model_len,
                           total_memory_bytes=profile.memory_bytes)
        words = (f"a MIG {profile.name} slice of an {spec.name} ({profile.memory_gib:.2f} GiB, "
                 f"{_sm_share(profile)})")
        return plan, words
    plan = plan_memory(source, gpu=spec, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                       gpu_memory_utilization=engine_gpu_memory_utilization(share, utilization),
                       max_model_len=max_model_len)
    if share.kind == "time-slicing":
        return plan, (f"1/{share.replicas} of a time-sliced {spec.name} ({spec.usable_memory_gib / share.replicas:.2f} "
                      f"GiB, the SMs taken in turns)")
    return plan, f"a whole {spec.name} ({spec.usable_memory_gib:.2f} GiB)"


def share_verdict(model: str | ModelSource, share: str | GpuShare, gpu: str, weight_dtype: str | None = None,
                  kv_dtype: str = "bf16", max_model_len: int = LAB_MAX_MODEL_LEN, concurrency: int = TOP_CONCURRENCY,
                  request_tokens: int = REQUEST_TOKENS,
                  gpu_memory_utilization: float = LAB_GPU_MEMORY_UTILIZATION) -> ShareVerdict:
    """Does ``model`` (a lab model name or its config) fit one ``share`` of ``gpu``: weights, the planner's vLLM
    overhead, one request of ``max_model_len`` and ``concurrency`` requests of ``request_tokens`` in the KV cache?"""
    s = _as_share(share)
    source, named_dtype = lab_model_source(model)
    plan, words = _share_plan(source, gpu, s, weight_dtype or named_dtype, kv_dtype, max_model_len,
                              gpu_memory_utilization)
    row = plan_row(plan)
    cache = plan.kv_cache
    assert cache is not None and plan.overhead is not None  # a GPU plan has both
    kv_memory = max(0, cache.kv_memory_bytes)
    at_request = vllm_kv_cache(plan.kv, kv_memory, request_tokens, cache.block_size).max_concurrency
    per_token = plan.kv.bytes_per_token
    needed = concurrency * request_tokens * per_token
    head = f"{plan.model} ({plan.weight_dtype} weights) on {words}"
    at_max_len = f"{plural(int(row['requests_at_max_len']), 'conversation')} of {max_model_len:,} tokens"
    if not cache.fits:
        verdict, why = NO, fit_verdict(row)
    elif at_request < concurrency:
        verdict = PARTLY
        why = (f"starts with {kv_memory / GIB:.1f} GiB of KV cache ({at_max_len}), but notebook 07's "
               f"{concurrency} users x {request_tokens:,} tokens need {needed / GIB:.1f} GiB: the KV cache holds "
               f"{math.floor(at_request)} of them at once, so the top of the sweep preempts")
    else:
        verdict = YES
        why = (f"fits: {plan.weight_bytes / GIB:.1f} GiB of weights + {plan.overhead.total_bytes / GIB:.1f} GiB "
               f"of vLLM overhead leave {kv_memory / GIB:.1f} GiB of KV cache, room for notebook 07's "
               f"{concurrency} users x {request_tokens:,} tokens ({needed / GIB:.1f} GiB) and {at_max_len} at once")
    return ShareVerdict(
        verdict=verdict, model=plan.model, weight_dtype=plan.weight_dtype, gpu=get_gpu(gpu).name, share=str(s),
        share_gib=(plan.total_memory_bytes or 0) / GIB, budget_gib=row["budget_gib"],
        weights_gib=plan.weight_bytes / GIB, overhead_gib=plan.overhead.total_bytes / GIB, kv_gib=kv_memory / GIB,
        kv_needed_gib=needed / GIB, kv_full_context_gib=concurrency * max_model_len * per_token / GIB,
        max_model_len=max_model_len, concurrency=concurrency, request_tokens=request_tokens,
        requests_at_max_len=int(row["requests_at_max_len"]), concurrency_at_request_tokens=at_request,
        gpu_memory_utilization=plan.gpu_memory_utilization or gpu_memory_utilization,
        sentence=f"{verdict}: {head}: {why}.")


# ---------------------------------------------------------------- the cost of the day

@dataclass(frozen=True)
class DayCost:
    """The GPUs a workshop day needs and what they cost, shared and one GPU each (USD)."""

    share: str
    gpu: str
    participants: int
    hours: float
    participants_per_gpu: int
    gpus: int
    usd_per_gpu_hour: float
    price_source: str
    usd_per_participant: float
    usd_per_participant_one_gpu_each: float
    sentence: str


def day_cost(share: str | GpuShare, gpu: str, participants: int, hours: float = WORKSHOP_DAY_HOURS,
             usd_per_gpu_hour: float | None = None, price_source: str = "") -> DayCost:
    """The day's GPU cost per participant under ``share`` next to one GPU each, for ``hours`` of rental; the
    price is the kit's dated table (helpers.hardware.gpus.HOURLY_PRICES) unless ``usd_per_gpu_hour`` is given."""
    if participants < 1 or hours <= 0:
        raise ValueError("participants must be at least 1 and hours positive")
    s = _as_share(share)
    name = get_gpu(gpu).name
    if usd_per_gpu_hour is None:
        try:
            price = hourly_price(name)
        except LookupError:
            raise GpuShareError(f"the kit's price table has no hourly price for {name}: pass your own "
                                "(USD per GPU-hour)") from None
        usd_per_gpu_hour, price_source = price.usd_per_hour, price.source
    per_gpu = participants_per_gpu(s, name)
    gpus = math.ceil(participants / per_gpu)
    shared = gpus * usd_per_gpu_hour * hours / participants
    whole = usd_per_gpu_hour * hours
    sentence = (f"{participants} participants on {name} ({str(s)}: {per_gpu} per GPU) need {gpus} GPU(s): "
                f"{shared:,.2f} USD per participant for {hours:g} h, against {whole:,.2f} USD with one GPU each "
                f"({usd_per_gpu_hour:g} USD per GPU-hour; {price_source or 'price given'})")
    return DayCost(str(s), name, participants, hours, per_gpu, gpus, usd_per_gpu_hour, price_source, shared, whole,
                   sentence)


# ---------------------------------------------------------------- the lessons that want a whole GPU

def whole_gpu_lessons_note(share: str | GpuShare, gpu: str) -> str:
    """What changes, on this share, for notebook 07's saturation sweep and notebook 08's memory flag ('' for none)."""
    s = _as_share(share)
    name = get_gpu(gpu).name
    if s.kind == "none":
        return ""
    if s.kind == "mig":
        p = get_mig_profile(name, s.profile or "")
        if p.sm_fraction == 1:
            return (f"A MIG {p.name} slice is the whole {name} ({p.memory_gib:.2f} GiB as the driver reports it): "
                    "notebooks 07 and 08 run as with one GPU each.")
        return (f"On a MIG {p.name} slice ({_sm_share(p)} of the {name}, {p.memory_gib:.2f} GiB): notebook 07's "
                f"sweep finds its knee on that slice, so its throughput and its price per token are those of "
                f"{p.sm_fraction} of a GPU, not of a whole one (other slices do not disturb it); notebook 08's "
                f"--gpu-memory-utilization is a fraction of the slice's {p.memory_gib:.2f} GiB, so its candidate "
                f"{LAB_GPU_MEMORY_UTILIZATION:.2f} -> {NOTEBOOK_08_UTILIZATION:.2f} adds "
                f"{(NOTEBOOK_08_UTILIZATION - LAB_GPU_MEMORY_UTILIZATION) * p.memory_gib:.2f} GiB of KV cache, not "
                f"{(NOTEBOOK_08_UTILIZATION - LAB_GPU_MEMORY_UTILIZATION) * get_gpu(name).usable_memory_gib:.2f} GiB "
                f"as on a whole GPU.")
    util = engine_gpu_memory_utilization(s)
    return (f"On 1/{s.replicas} of a time-sliced {name}: the {s.replicas} engines take turns on all the SMs, so "
            f"notebook 07's sweep measures a GPU its neighbours are also using: its knee, throughput and TTFT "
            f"move with their load and differ between participants (run it one participant at a time, or read "
            f"it as a demonstration); notebook 08's --gpu-memory-utilization is a fraction of the WHOLE GPU: "
            f"each engine runs at {util:.2f}, and raising it (08's candidate is {NOTEBOOK_08_UTILIZATION:.2f}) "
            f"takes memory its neighbours hold, so that engine fails to start: skip that candidate on a shared GPU.")


def share_table(models: Mapping[str, str | None], gpus: tuple[str, ...]) -> list[dict[str, object]]:
    """One row per (model, GPU, MIG profile): the verdict and its numbers (GiB); ``models``: name -> weight dtype."""
    from helpers.hardware.gpu_shares import mig_profiles

    rows: list[dict[str, object]] = []
    for model, dtype in models.items():
        for gpu in gpus:
            for profile in mig_profiles(gpu):
                v = share_verdict(model, f"mig-{profile.name}", gpu, weight_dtype=dtype)
                rows.append({"model": model, "weights": v.weight_dtype, "gpu": v.gpu, "share": v.share,
                             "share_gib": round(v.share_gib, 2), "weights_gib": round(v.weights_gib, 2),
                             "overhead_gib": round(v.overhead_gib, 2), "kv_gib": round(v.kv_gib, 2),
                             "kv_needed_gib": round(v.kv_needed_gib, 2), "at_max_len": v.requests_at_max_len,
                             "verdict": v.verdict})
    return rows
