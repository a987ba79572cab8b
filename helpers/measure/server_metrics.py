"""What the server says about itself: vLLM's Prometheus ``/metrics``, under stable names.

- ``scrape(url)`` / ``parse_metrics(text)``: one snapshot, parsed with prometheus_client's own parser.
- ``normalized(snapshot)``: gauges, counters, histogram means and quantiles since the server started,
  the prefix-cache hit rate, spec-decode acceptance and the cache config, under the names of
  ``GAUGES``, ``COUNTERS`` and ``HISTOGRAMS``. Each name lists vLLM's metric names newest first, so
  a renamed metric (``gpu_cache_usage_perc`` -> ``kv_cache_usage_perc``) still reads; a metric this
  server does not expose reads as None, never as an error.
- ``window(before, after)``: what happened between two snapshots: counter increases, histogram
  means from d(sum)/d(count) and quantiles from the bucket increases (Prometheus' histogram_quantile),
  prefix hit rate d(hits)/d(queries), spec acceptance rate d(accepted)/d(draft tokens), mean
  acceptance length 1 + d(accepted)/d(drafts).
- ``GaugeSampler``: a thread that samples KV usage, running, waiting and preemptions during a run. Between its
  first and last scrape (whole snapshots, for ``window``) it parses only those samples' lines: vLLM renders every
  metric on each GET (its /metrics route ignores prometheus_client's ``name[]`` filter), and parsing all of them
  every half second held the client's GIL for about 17 ms a time, which delayed a load generator's stream reads
  on 2 cores (issue 32: ``workshop bench`` read 6% less throughput than ``vllm bench serve`` with the full parse,
  within 1% without sampling).

``kv_cache_usage`` is a FRACTION (0..1) despite vLLM's ``_perc`` name. Several engines (data
parallel) are summed, except KV usage, which reports the fullest engine. Definitions: the metric
names and help texts vLLM registers (vllm/v1/metrics/loggers.py).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

from helpers.core.errors import WorkshopError

GAUGES: dict[str, tuple[str, ...]] = {
    "num_requests_running": ("vllm:num_requests_running",),
    "num_requests_waiting": ("vllm:num_requests_waiting",),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),  # fraction 0..1
}
COUNTERS: dict[str, tuple[str, ...]] = {  # family names (prometheus_client drops the ``_total``)
    "prompt_tokens": ("vllm:prompt_tokens",),
    "generation_tokens": ("vllm:generation_tokens",),
    "request_success": ("vllm:request_success",),
    "num_preemptions": ("vllm:num_preemptions",),
    "prefix_cache_queries": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),  # tokens
    "prefix_cache_hits": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),  # tokens
    "spec_decode_num_drafts": ("vllm:spec_decode_num_drafts",),
    "spec_decode_num_draft_tokens": ("vllm:spec_decode_num_draft_tokens",),
    "spec_decode_num_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens",),
}
PER_POSITION = ("vllm:spec_decode_num_accepted_tokens_per_pos",)
HISTOGRAMS: dict[str, tuple[tuple[str, ...], str]] = {  # name -> (vLLM names, unit suffix of our fields)
    "ttft": (("vllm:time_to_first_token_seconds",), "_s"),  # from arrival at the server
    "itl": (("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"), "_s"),  # per engine step
    "e2e": (("vllm:e2e_request_latency_seconds",), "_s"),
    "queue_time": (("vllm:request_queue_time_seconds",), "_s"),
    "prefill_time": (("vllm:request_prefill_time_seconds",), "_s"),
    "decode_time": (("vllm:request_decode_time_seconds",), "_s"),
    "inference_time": (("vllm:request_inference_time_seconds",), "_s"),
    "request_prompt_tokens": (("vllm:request_prompt_tokens",), ""),
    "request_generation_tokens": (("vllm:request_generation_tokens",), ""),
    "iteration_tokens": (("vllm:iteration_tokens_total",), ""),  # a histogram despite its name
}
CACHE_CONFIG = ("vllm:cache_config_info",)
QUANTILES = (0.5, 0.9, 0.99)
MAX_AGGREGATED = {"kv_cache_usage"}  # one value per engine: report the fullest, do not add fractions


class MetricsError(WorkshopError, RuntimeError):
    """/metrics could not be read; the message says what to check."""


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram: cumulative counts per upper bound ``le`` (the last is +Inf)."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: linear inside the bucket; the top finite bound past it."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.buckets[-1][1]
        lower_le, lower_count = 0.0, 0.0
        for le, cum in self.buckets:
            if cum >= rank:
                if math.isinf(le):
                    return lower_le  # the largest finite bound: the quantile is somewhere above it
                if cum == lower_count:
                    return le
                return lower_le + (le - lower_le) * (rank - lower_count) / (cum - lower_count)
            lower_le, lower_count = le, cum
        return lower_le

    def minus(self, earlier: "Histogram") -> "Histogram":
        """The observations made since ``earlier`` (a reset server: everything in self)."""
        if self.count < earlier.count or [le for le, _ in self.buckets] != [le for le, _ in earlier.buckets]:
            return self
        return Histogram(tuple((le, c - e) for (le, c), (_, e) in zip(self.buckets, earlier.buckets)),
                         self.sum - earlier.sum, self.count - earlier.count)


@dataclass
class MetricsSnapshot:
    """One scrape: metric families by name, and when (``time.perf_counter`` and wall clock)."""

    families: dict[str, Any]
    t: float
    t_wall: float
    model: str | None = None  # keep only samples with this model_name label (None: all)

    def _family(self, names: tuple[str, ...]) -> tuple[str, Any] | None:
        for name in names:
            for key in (name, name.removesuffix("_total"), name + "_total"):
                if key in self.families:
                    return name, self.families[key]
        return None

    def _samples(self, family: Any, suffixes: tuple[str, ...]) -> list[Any]:
        wanted = {family.name + s for s in suffixes}
        return [s for s in family.samples if s.name in wanted
                and (self.model is None or s.labels.get("model_name", self.model) == self.model)]

    def name_of(self, key: str) -> str | None:
        """The vLLM metric name this server uses for a normalized name (None: not exposed)."""
        names = GAUGES.get(key) or COUNTERS.get(key) or (HISTOGRAMS[key][0] if key in HISTOGRAMS else None)
        found = self._family(names) if names else None
        return None if found is None else found[0]

    def gauge(self, key: str) -> float | None:
        """A normalized gauge (summed over engines; KV usage: the fullest engine), None when absent."""
        found = self._family(GAUGES[key])
        if found is None:
            return None
        values = [s.value for s in self._samples(found[1], ("",))]
        if not values:
            return None
        return max(values) if key in MAX_AGGREGATED else sum(values)

    def counter(self, key: str) -> float | None:
        """A normalized counter's total since the server started, None when absent."""
        found = self._family(COUNTERS[key])
        if found is None:
            return None
        values = [s.value for s in self._samples(found[1], ("_total", ""))]
        return sum(values) if values else None

    def per_position(self) -> dict[int, float]:
        """Spec decode: accepted tokens per draft position (empty without speculative decoding)."""
        found = self._family(PER_POSITION)
        out: dict[int, float] = {}
        if found is not None:
            for s in self._samples(found[1], ("_total", "")):
                pos = int(s.labels.get("position", -1))
                out[pos] = out.get(pos, 0.0) + s.value
        return out

    def histogram(self, key: str) -> Histogram | None:
        """A normalized histogram (buckets summed over engines), None when absent."""
        found = self._family(HISTOGRAMS[key][0])
        if found is None:
            return None
        family = found[1]
        by_le: dict[float, float] = {}
        for s in self._samples(family, ("_bucket",)):
            le = float(s.labels["le"])
            by_le[le] = by_le.get(le, 0.0) + s.value
        total = sum(s.value for s in self._samples(family, ("_sum",)))
        count = sum(s.value for s in self._samples(family, ("_count",)))
        if not by_le and not count:
            return None
        return Histogram(tuple(sorted(by_le.items())), total, count)

    def cache_config(self) -> dict[str, Any] | None:
        """vLLM's cache config from ``vllm:cache_config_info`` labels, values typed; None when absent."""
        found = self._family(CACHE_CONFIG)
        if found is None or not found[1].samples:
            return None
        labels = dict(found[1].samples[0].labels)
        labels.pop("engine", None)
        return {k: _typed(v) for k, v in labels.items()}


def _typed(text: str) -> Any:
    if text == "None":
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


# The sample names GaugeSampler reads between its first and last scrape (a counter's sample carries ``_total``)
SAMPLED = frozenset([*(name for names in GAUGES.values() for name in names),
                     *(f"{name}_total" for name in COUNTERS["num_preemptions"])])


def only_samples(text: str, names: frozenset[str] = SAMPLED) -> str:
    """The lines of a /metrics text whose sample (or ``# HELP`` / ``# TYPE``) names one of ``names``: what
    prometheus_client's ``name[]`` filter would have sent, cut on the client."""
    kept = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(maxsplit=3)
            name = parts[2] if len(parts) > 2 and parts[1] in ("HELP", "TYPE") else ""
        else:
            name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            kept.append(line)
    return "\n".join(kept) + "\n"


def parse_metrics(text: str, model: str | None = None, t: float | None = None,
                  only: frozenset[str] | None = None) -> MetricsSnapshot:
    """Parse a /metrics text (Prometheus exposition format) into a snapshot; with ``only``, just those samples'
    lines (``only_samples``)."""
    if only is not None:
        text = only_samples(text, only)
    try:
        families = {f.name: f for f in text_string_to_metric_families(text)}
    except ValueError as err:
        raise MetricsError(f"/metrics text is not in the Prometheus format: {err}") from None
    return MetricsSnapshot(families, time.perf_counter() if t is None else t, time.time(), model)


def scrape(url: str, timeout_s: float = 5.0, model: str | None = None,
           client: httpx.Client | None = None, only: frozenset[str] | None = None) -> MetricsSnapshot:
    """GET ``url`` (e.g. ``settings.metrics_url``) and parse it (``only``: just those samples); MetricsError when
    unreachable."""
    try:
        resp = (client or httpx).get(url, timeout=timeout_s)
    except httpx.HTTPError as err:
        raise MetricsError(f"Cannot read {url} ({type(err).__name__}): is the engine running, and is this its "
                           "root URL plus /metrics?") from None
    if resp.status_code >= 400:
        raise MetricsError(f"{url} answered HTTP {resp.status_code}: {resp.text[:200]}")
    return parse_metrics(resp.text, model, only=only)


# ---------------------------------------------------------------- derived figures

def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else num / den


def _histogram_fields(key: str, hist: Histogram | None) -> dict[str, float | None]:
    unit = HISTOGRAMS[key][1]
    out: dict[str, float | None] = {f"{key}_mean{unit}": None if hist is None else hist.mean}
    for q in QUANTILES:
        out[f"{key}_p{int(q * 100)}{unit}"] = None if hist is None else hist.quantile(q)
    out[f"{key}_count"] = None if hist is None else hist.count
    return out


def _spec_fields(drafts: float | None, draft_tokens: float | None, accepted: float | None,
                 per_pos: dict[int, float]) -> dict[str, Any]:
    per_draft = _ratio(accepted, drafts)
    return {
        "spec_decode_acceptance_rate": _ratio(accepted, draft_tokens),  # fraction 0..1
        "spec_decode_mean_acceptance_length": None if per_draft is None else 1 + per_draft,
        "spec_decode_per_position_acceptance_rate": ([per_pos[p] / drafts for p in sorted(per_pos)]
                                                     if per_pos and drafts else None),
    }


def normalized(snap: MetricsSnapshot) -> dict[str, Any]:
    """Everything we read from one snapshot, cumulative since the server started; absent = None."""
    out: dict[str, Any] = {key: snap.gauge(key) for key in GAUGES}
    out.update({key: snap.counter(key) for key in COUNTERS})
    out["prefix_cache_hit_rate"] = _ratio(out["prefix_cache_hits"], out["prefix_cache_queries"])
    out.update(_spec_fields(out["spec_decode_num_drafts"], out["spec_decode_num_draft_tokens"],
                            out["spec_decode_num_accepted_tokens"], snap.per_position()))
    for key in HISTOGRAMS:
        out.update(_histogram_fields(key, snap.histogram(key)))
    out["cache_config"] = snap.cache_config()
    out["names_used"] = {key: snap.name_of(key) for key in [*GAUGES, *COUNTERS, *HISTOGRAMS]}
    return out


def _increase(after: float | None, before: float | None) -> float | None:
    if after is None or before is None:
        return None
    return after - before if after >= before else after  # a restarted server counts from zero


def window(before: MetricsSnapshot, after: MetricsSnapshot) -> dict[str, Any]:
    """What the server did between two snapshots; gauges are those of ``after``; absent = None."""
    out: dict[str, Any] = {"window_s": after.t - before.t}
    out.update({key: after.gauge(key) for key in GAUGES})
    for key in COUNTERS:
        out[key] = _increase(after.counter(key), before.counter(key))
    out["prefix_cache_hit_rate"] = _ratio(out["prefix_cache_hits"], out["prefix_cache_queries"])
    pos_before = before.per_position()
    per_pos = {p: v - pos_before.get(p, 0.0) for p, v in after.per_position().items()}
    out.update(_spec_fields(out["spec_decode_num_drafts"], out["spec_decode_num_draft_tokens"],
                            out["spec_decode_num_accepted_tokens"], per_pos))
    gen = out["generation_tokens"]
    out["generation_tokens_per_s"] = None if gen is None or out["window_s"] <= 0 else gen / out["window_s"]
    for key in HISTOGRAMS:
        h_after, h_before = after.histogram(key), before.histogram(key)
        delta = None if h_after is None else (h_after if h_before is None else h_after.minus(h_before))
        out.update(_histogram_fields(key, delta))
    return out



def window_until_finished(url: str, before: MetricsSnapshot, model: str | None = None,
                          wait_s: float = 1.0) -> dict[str, Any]:
    """``window(before, now)`` once a request has finished since ``before`` (its histograms are observed as it
    finishes: polled every 20 ms up to ``wait_s``); the last window read when none finished by then."""
    deadline = time.monotonic() + wait_s
    while True:
        served = window(before, scrape(url, model=model))
        if served.get("queue_time_count") or time.monotonic() > deadline:
            return served
        time.sleep(0.02)

def prefix_cache_hit_rate(before: MetricsSnapshot, after: MetricsSnapshot | None = None) -> float | None:
    """Hit rate in tokens: d(hits)/d(queries) between two snapshots, or since start with one."""
    return (window(before, after) if after is not None else normalized(before))["prefix_cache_hit_rate"]


def spec_decode_stats(before: MetricsSnapshot, after: MetricsSnapshot | None = None) -> dict[str, Any]:
    """Acceptance rate (fraction), mean acceptance length and per-position rates; None without spec decode."""
    src = window(before, after) if after is not None else normalized(before)
    return {k: v for k, v in src.items() if k.startswith("spec_decode_")}


# ---------------------------------------------------------------- sampling during a run

SAMPLE_COLUMNS = ("t", "t_wall", "kv_cache_usage", "num_requests_running", "num_requests_waiting", "num_preemptions")


class GaugeSampler:
    """Samples KV usage, running, waiting and preemptions every ``interval_s`` in a thread.

    ``start()`` scrapes once (``first``), ``stop()`` scrapes once more (``last``), both whole snapshots, and
    returns the samples as a DataFrame (``t`` in perf_counter seconds); the samples between parse only ``SAMPLED``
    (see the module's note). A failed scrape is counted in ``errors`` (the last message in ``last_error``), never
    raised: the run it watches goes on.
    """

    def __init__(self, url: str, interval_s: float = 0.5, timeout_s: float = 2.0, model: str | None = None) -> None:
        self.url = url
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.model = model
        self.rows: list[dict[str, Any]] = []
        self.first: MetricsSnapshot | None = None
        self.last: MetricsSnapshot | None = None
        self.errors = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: httpx.Client | None = None

    def _sample(self, whole: bool = True) -> None:
        try:
            snap = scrape(self.url, self.timeout_s, self.model, self._client, None if whole else SAMPLED)
        except MetricsError as err:
            self.errors += 1
            self.last_error = str(err)
            return
        if whole:
            self.first = self.first or snap
            self.last = snap
        row: dict[str, Any] = {"t": snap.t, "t_wall": snap.t_wall}
        row.update({key: snap.gauge(key) for key in GAUGES})
        row["num_preemptions"] = snap.counter("num_preemptions")
        self.rows.append(row)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample(whole=self.first is None)  # whole until one scrape has given the run's start

    def start(self) -> "GaugeSampler":
        """Scrape once, then keep sampling in a thread until ``stop()`` (a sampler is used once)."""
        self._client = httpx.Client()
        self._sample()
        if not self._stop.is_set():  # stop() may already have been called from another thread
            self._thread = threading.Thread(target=self._loop, name="gauge-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> pd.DataFrame:
        """Stop sampling, scrape a last time, and return all samples."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._sample()
        if self._client is not None:
            self._client.close()
            self._client = None
        return self.frame()

    def frame(self) -> pd.DataFrame:
        """The samples so far, one row per scrape, columns SAMPLE_COLUMNS (absent gauges: NaN)."""
        return pd.DataFrame(self.rows, columns=list(SAMPLE_COLUMNS)).astype(float)

    def __enter__(self) -> "GaugeSampler":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def relative_time(frame: pd.DataFrame, t0: float) -> pd.DataFrame:
    """The samples with ``t_s``: seconds since ``t0`` (a run's ``t_start``)."""
    out = frame.copy()
    out.insert(0, "t_s", out["t"] - t0)
    return out
