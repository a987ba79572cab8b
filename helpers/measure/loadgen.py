"""A streaming load generator for an OpenAI-compatible chat endpoint (vLLM first).

What it does (the terms of vLLM's own `vllm bench serve`, vllm/benchmarks/serve.py):
- runs a ``Load`` of ``Workload`` requests (both in ``helpers.measure.workloads``: closed or open loop,
  prompts of an exact length in tokens, unique or shared prefixes, multi-turn conversations); sweeps over
  concurrencies or rates (``run_sweep``); warm-up requests that are not counted;
- per request, a :class:`~helpers.measure.stream_timing.StreamTiming`: scheduled, sent, first byte, first
  token on any channel, first content token, every token-carrying chunk with the server's token
  count (``continuous_usage_stats``), last token, usage; client queue time (sent - scheduled) apart;
  failed requests kept with their error;
- the generator's own event-loop lag (sleep overshoot of a background task): when it is large, the
  client, not the server, is the bottleneck;
- Ctrl-C, a cancelled task, or a server that stops answering (``max_consecutive_failures``) end the
  run early and return what was gathered, marked ``interrupted=True``.

Why aiohttp and not ``openai.AsyncOpenAI`` (or httpx): the SDK parses every SSE chunk into pydantic
objects and hands them over only after parsing. Reading the raw SSE lines gives the arrival time of
each line before any parsing (first byte included), costs one ``json.loads`` per chunk, and reads
vLLM's extra fields (``reasoning``, ``reasoning_content``, running usage) as they are. The Python
client is what saturates first: on a 2-core machine, httpx's pure-Python HTTP parser (h11) cost enough
per chunk that the client fell up to a second behind the stream at concurrency 8 (event-loop lag
0.6-1.7 s, TTFT inflated several times over), while aiohttp's C parser, which ``vllm bench serve``
uses too, keeps up. The connection pool is unbounded (``limit=0``) so the pool never queues requests
behind our back; with a cap, queueing happens at our own semaphore, where it is timed.

``arun_load`` / ``arun_sweep`` are coroutines; ``run_load`` / ``run_sweep`` run them on a private event
loop in a thread, so they work the same in a script and in a Jupyter cell (which already runs a loop).
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import threading
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable, TypeVar

import aiohttp

from helpers.core.settings import Settings
from helpers.measure.stream_timing import StreamTiming
from helpers.measure.workloads import (Conversation, Load, PromptFactory, Workload, arrival_intervals,
                                      calibrate_prompts)

T = TypeVar("T")


# ---------------------------------------------------------------- results

@dataclass
class RequestRecord:
    """One request of a load run: its timing plus what was asked."""

    index: int
    timing: StreamTiming
    input_len_target: int | None  # prompt tokens planned (first turns only; later turns grow)
    output_len_target: int
    conversation: int = 0
    turn: int = 1
    warmup: bool = False
    cancelled: bool = False  # still in flight when the run was interrupted
    # Arrivals of the chunks with ``choices`` (role-only and finish chunks too, not the usage-only one), as vllm
    # bench serve times a stream (vllm/benchmarks/lib/endpoint_request_func.py): its ITL is their gaps, its
    # latency (e2el, TPOT) ends at the last (helpers.measure.bench_results). Empty in a replay.
    choice_times: list[float] = field(default_factory=list)


@dataclass
class LoadResult:
    """Everything one load run measured; times are ``time.perf_counter`` seconds."""

    requests: list[RequestRecord]
    load: Load
    workload: Workload
    model: str = ""
    base_url: str = ""
    t_start: float = 0.0  # start of the measured phase (after warm-up)
    t_end: float = 0.0  # end of the measured phase
    started_at: float = 0.0  # wall clock (Unix seconds) at t_start
    warmup: list[RequestRecord] = field(default_factory=list)
    interrupted: bool = False
    stop_reason: str | None = None
    loop_lag_s: list[float] = field(default_factory=list)  # sleep overshoot samples of the client loop
    prompt_len_method: str = "tokenize"
    salt: int = 0
    max_inflight: int = 0  # most requests in flight at once, as the client saw it
    gauges: Any = None  # pandas DataFrame of sampled server gauges (set by run_sweep with metrics)
    server: dict[str, Any] | None = None  # server-side window figures (helpers.measure.server_metrics.window)

    @property
    def duration_s(self) -> float:
        return max(0.0, self.t_end - self.t_start)

    @property
    def completed(self) -> list[RequestRecord]:
        return [r for r in self.requests if r.timing.ok]

    @property
    def failed(self) -> list[RequestRecord]:
        return [r for r in self.requests if not r.timing.ok and not r.cancelled]


# ---------------------------------------------------------------- one run

class _LoadRun:
    def __init__(self, settings: Settings, workload: Workload, load: Load, model: str, factory: PromptFactory,
                 progress: bool, max_consecutive_failures: int | None, lag_interval_s: float, salt: int) -> None:
        self.settings = settings
        self.workload = workload
        self.load = load
        self.model = model
        self.factory = factory
        self.progress = progress
        self.max_failures = max_consecutive_failures
        self.lag_interval_s = lag_interval_s
        self.salt = salt
        self.url = settings.base_url.rstrip("/") + "/chat/completions"
        self.headers = settings.auth_headers()
        self.rng = random.Random(workload.seed)
        self.records: list[RequestRecord] = []
        self.warmup_records: list[RequestRecord] = []
        self.lag: list[float] = []
        self.stop = asyncio.Event()
        self.stop_reason: str | None = None
        self.inflight: set[asyncio.Task[Any]] = set()
        self.n_inflight = 0
        self.max_inflight = 0
        self.consecutive_failures = 0
        self.issued = 0
        self.budget: int | None = None
        self.deadline: float | None = None
        self.t_start = 0.0
        self.next_uid = 0
        self.next_conversation = 0
        self.bar: Any = None

    # -- bookkeeping
    def _claim(self, at: float | None = None) -> bool:
        """Take one request from the budget; False when the phase must not send more.

        ``at``: the time the request is scheduled for (open loop), checked against the deadline
        instead of now, so the number of arrivals in a duration does not depend on timer jitter.
        """
        if self.stop.is_set():
            return False
        if self.deadline is not None and (time.perf_counter() if at is None else at) >= self.deadline:
            return False
        if self.budget is not None and self.issued >= self.budget:
            return False
        self.issued += 1
        return True

    def _new_conversation(self) -> Conversation:
        conv = Conversation(self.next_conversation, self.workload, self.factory, self.salt, self.rng, self.next_uid)
        self.next_conversation += 1
        self.next_uid += 1
        return conv

    # -- one request
    async def _request(self, http: aiohttp.ClientSession, conv: Conversation, t_scheduled: float, warmup: bool,
                       sem: asyncio.Semaphore | None = None) -> RequestRecord:
        messages, input_len, output_len = conv.next_request()
        payload = self.workload.request_body(self.model, messages, output_len)
        timing = StreamTiming(t_sent=t_scheduled, t_scheduled=t_scheduled)
        rec = RequestRecord(len(self.warmup_records if warmup else self.records), timing, input_len, output_len,
                            conv.number, conv.turn, warmup)
        (self.warmup_records if warmup else self.records).append(rec)
        try:
            if sem is not None:
                async with sem:
                    await self._stream(http, payload, rec)
            else:
                await self._stream(http, payload, rec)
        except asyncio.CancelledError:
            timing.error = timing.error or "cancelled: the run was interrupted"
            timing.t_done = timing.t_done or time.perf_counter()
            rec.cancelled = True
            raise
        finally:
            if not rec.cancelled:
                self._account(rec)
        if timing.ok:
            conv.add_reply(timing.text)
        return rec

    async def _stream(self, http: aiohttp.ClientSession, payload: dict[str, Any], rec: RequestRecord) -> None:
        timing = rec.timing
        self.n_inflight += 1
        self.max_inflight = max(self.max_inflight, self.n_inflight)
        timing.t_sent = time.perf_counter()
        done = False
        try:
            async with http.post(self.url, json=payload, headers=self.headers) as resp:
                if resp.status != 200:
                    body = (await resp.read()).decode(errors="replace")
                    timing.error = f"HTTP {resp.status}: {body[:300]}"
                    return
                pending = b""
                # Whatever bytes have arrived, at once (as vllm bench serve reads): under load several SSE
                # lines come together, and one await per read instead of per line keeps the client ahead.
                async for data in resp.content.iter_any():
                    now = time.perf_counter()
                    if timing.t_first_byte is None:
                        timing.t_first_byte = now
                    *lines, pending = (pending + data).split(b"\n")
                    for raw in lines:
                        line = raw.decode(errors="replace").strip()
                        if not line.startswith("data:"):
                            continue  # blank separators and ": ping" comments
                        payload_text = line[5:].strip()
                        if payload_text == "[DONE]":
                            done = True
                            break
                        chunk = json.loads(payload_text)
                        if "error" in chunk or chunk.get("object") == "error":
                            err = chunk.get("error", chunk)
                            message = err.get("message", err) if isinstance(err, dict) else err
                            timing.error = f"server error in stream: {message}"
                            return
                        if _record_chunk(timing, chunk, now):
                            rec.choice_times.append(now)
                    if done:
                        break
            if not done and timing.error is None:
                timing.error = "stream ended before [DONE]"
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError, ValueError, KeyError,
                TypeError) as err:
            timing.error = f"{type(err).__name__}: {err}"
        finally:
            timing.t_done = time.perf_counter()
            self.n_inflight -= 1

    def _account(self, rec: RequestRecord) -> None:
        if self.bar is not None and not rec.warmup:
            self.bar.update(1)
        if rec.timing.ok:
            self.consecutive_failures = 0
            return
        self.consecutive_failures += 1
        if self.max_failures is not None and self.consecutive_failures >= self.max_failures and not self.stop.is_set():
            self.stop_reason = (f"stopped after {self.consecutive_failures} failed requests in a row; "
                                f"last error: {rec.timing.error}")
            self.stop.set()

    # -- phases
    async def _closed_phase(self, http: aiohttp.ClientSession, workers: int, warmup: bool) -> None:
        async def worker() -> None:
            conv: Conversation | None = None
            while True:
                if conv is None or conv.done:
                    conv = self._new_conversation()
                if not self._claim():
                    return
                rec = await self._request(http, conv, time.perf_counter(), warmup)
                if not rec.timing.ok:
                    conv = None  # an agent whose call failed starts over

        await self._run_tasks([worker() for _ in range(workers)])

    async def _open_phase(self, http: aiohttp.ClientSession) -> None:
        sem = asyncio.Semaphore(self.load.max_concurrency) if self.load.max_concurrency else None

        async def conversation(conv: Conversation, t_scheduled: float) -> None:
            while True:
                rec = await self._request(http, conv, t_scheduled, False, sem)
                if not rec.timing.ok or conv.done or not self._claim():
                    return
                t_scheduled = time.perf_counter()  # the agent's next call follows at once

        t0 = self.t_start
        offset = 0.0
        spawned: list[asyncio.Task[Any]] = []
        for gap in arrival_intervals(self.load.rate or 1.0, self.load.burstiness, self.workload.seed):
            t_next = t0 + offset
            if self.deadline is not None and t_next >= self.deadline:
                break
            delay = t_next - time.perf_counter()
            if delay > 0:
                try:
                    await asyncio.wait_for(self.stop.wait(), timeout=delay)
                except asyncio.TimeoutError:
                    pass
            else:
                await asyncio.sleep(0)  # behind schedule: still let the requests in flight read their streams
            if not self._claim(at=t_next):
                break
            task = asyncio.ensure_future(conversation(self._new_conversation(), t_next))
            self.inflight.add(task)
            task.add_done_callback(self.inflight.discard)
            spawned.append(task)
            offset += gap
        await self._wait_all(spawned)

    async def _run_tasks(self, coros: list[Awaitable[Any]]) -> None:
        tasks = [asyncio.ensure_future(c) for c in coros]
        for t in tasks:
            self.inflight.add(t)
            t.add_done_callback(self.inflight.discard)
        await self._wait_all(tasks)

    async def _wait_all(self, tasks: list[asyncio.Task[Any]]) -> None:
        """Wait for the tasks; when the run is stopped early, cancel what is still in flight."""
        pending = {t for t in tasks if not t.done()}
        stopper = asyncio.ensure_future(self.stop.wait())
        try:
            while pending:
                done, pending = await asyncio.wait(pending | {stopper}, return_when=asyncio.FIRST_COMPLETED)
                if stopper in done:
                    pending.discard(stopper)
                    for t in pending:
                        t.cancel()
                    await asyncio.gather(*pending, return_exceptions=True)
                    break
                pending.discard(stopper)
        finally:
            stopper.cancel()
        for t in tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise t.exception()  # a bug in the generator itself: show it

    async def _watch_lag(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.lag_interval_s)
            self.lag.append(max(0.0, time.perf_counter() - t - self.lag_interval_s))

    async def execute(self, http: aiohttp.ClientSession) -> LoadResult:
        load = self.load
        result = LoadResult([], load, self.workload, self.model, self.settings.base_url,
                            prompt_len_method=self.factory.method, salt=self.salt)
        lag_task = asyncio.ensure_future(self._watch_lag())
        interrupted = False
        try:
            if load.warmup_requests:
                self.budget = load.warmup_requests
                workers = min(load.warmup_requests, load.concurrency or load.max_concurrency or 4)
                await self._closed_phase(http, workers, warmup=True)
                if self.stop.is_set():
                    raise _Stopped()
            self.issued = 0
            self.budget = load.num_requests
            self.lag.clear()
            self.max_inflight = self.n_inflight
            result.t_start = self.t_start = time.perf_counter()
            result.started_at = time.time()
            self.deadline = None if load.duration_s is None else result.t_start + load.duration_s
            if self.progress:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=load.num_requests, desc=_label(load), unit="req", leave=False)
            if load.rate is None:
                await self._closed_phase(http, load.concurrency or 1, warmup=False)
            else:
                await self._open_phase(http)
        except _Stopped:
            pass
        except (asyncio.CancelledError, KeyboardInterrupt):
            interrupted = True
            self.stop_reason = self.stop_reason or "interrupted (Ctrl-C or task cancelled)"
            self.stop.set()
            for t in list(self.inflight):
                t.cancel()
            await asyncio.gather(*self.inflight, return_exceptions=True)
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()  # we handled it: the caller gets the partial result
        finally:
            lag_task.cancel()
            if self.bar is not None:
                self.bar.close()
        result.t_end = time.perf_counter() if result.t_start else 0.0
        if self.records and result.t_start:
            result.t_end = max(r.timing.t_done or r.timing.t_sent for r in self.records)
        result.requests = self.records
        result.warmup = self.warmup_records
        result.loop_lag_s = list(self.lag)
        result.max_inflight = self.max_inflight
        result.interrupted = interrupted or self.stop_reason is not None
        result.stop_reason = self.stop_reason
        return result


class _Stopped(Exception):
    """The warm-up already failed too often: skip the measured phase."""


def _record_chunk(timing: StreamTiming, chunk: dict[str, Any], now: float) -> bool:
    """Account one parsed SSE chunk of a chat completion stream; True when it had ``choices``."""
    usage = chunk.get("usage")
    content, other = "", ""
    choices = chunk.get("choices") or []
    if choices:
        choice = choices[0]
        delta = choice.get("delta") or {}
        content = delta.get("content") or ""
        reasoning = delta.get("reasoning") or delta.get("reasoning_content") or ""
        functions = [tc.get("function") or {} for tc in (delta.get("tool_calls") or [])]
        calls = "".join((f.get("name") or "") + (f.get("arguments") or "") for f in functions)
        other = reasoning + calls
        timing.finish_reason = choice.get("finish_reason") or timing.finish_reason
    completion = usage.get("completion_tokens") if usage else None
    if not choices and (completion is None or timing.chunk_times):
        # The usage-only last chunk carries no token. Without continuous usage stats each earlier chunk
        # was counted as one token; the server's final count wins, without inventing a chunk.
        if completion is not None and completion > timing.completion_tokens:
            timing.completion_tokens = completion
    else:
        timing.record_chunk(now, completion, content, other)
    if usage:
        timing.usage = usage
        if usage.get("prompt_tokens") is not None:
            timing.prompt_tokens = usage["prompt_tokens"]
    return bool(choices)


def _label(load: Load) -> str:
    if load.rate is None:
        return f"concurrency {load.concurrency}"
    cap = f", cap {load.max_concurrency}" if load.max_concurrency else ""
    return f"rate {load.rate:g}/s{cap}"


async def calibrate_for(settings: Settings, model: str, workload: Workload,
                        http: aiohttp.ClientSession | None = None) -> PromptFactory:
    """``calibrate_prompts`` against the settings' endpoint with the workload's template kwargs and seed,
    on ``http`` or on a short-lived session of its own."""
    if http is None:
        async with _http_client(None, 30.0) as own:
            return await calibrate_for(settings, model, workload, own)
    return await calibrate_prompts(http, settings.root_url, model, settings.auth_headers(),
                                   workload.extra_body.get("chat_template_kwargs"), workload.seed)


def _http_client(max_connections: int | None, request_timeout_s: float) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=max_connections or 0, limit_per_host=max_connections or 0)
    # No total deadline on a stream (a long generation is not an error); a silent socket is.
    timeout = aiohttp.ClientTimeout(total=None, connect=10.0, sock_read=request_timeout_s)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


async def arun_load(settings: Settings, workload: Workload, load: Load, *, model: str | None = None,
                    progress: bool | None = None, request_timeout_s: float = 300.0,
                    max_consecutive_failures: int | None = 20, lag_interval_s: float = 0.01,
                    prompts: PromptFactory | None = None, salt: int | None = None) -> LoadResult:
    """Run one load against ``settings.base_url`` and return every request's timing (coroutine).

    ``progress``: a bar of the measured requests (None: in a notebook only).
    ``prompts``: a calibrated PromptFactory to reuse (a sweep calibrates once). ``salt``: makes this
    run's prompts differ from every other run's (random by default, so a repeated run cannot hit the
    prefix cache filled by the last one).
    """
    from helpers.core.progress import wanted

    workload.validate()
    load.validate()
    model = model or settings.model
    progress = wanted(progress)
    salt = secrets.randbits(20) if salt is None else salt
    async with _http_client(None, request_timeout_s) as http:
        if prompts is None:
            prompts = await calibrate_for(settings, model, workload, http)
        run = _LoadRun(settings, workload, load, model, prompts, progress, max_consecutive_failures, lag_interval_s,
                       salt)
        return await run.execute(http)


def run_load(settings: Settings, workload: Workload, load: Load, **kwargs: Any) -> LoadResult:
    """``arun_load`` from synchronous code or a Jupyter cell; Ctrl-C returns the partial result."""
    return run_sync(lambda: arun_load(settings, workload, load, **kwargs))


# ---------------------------------------------------------------- sweeps

def sweep_loads(base: Load, concurrencies: list[int] | None = None, rates: list[float] | None = None) -> list[Load]:
    """One validated Load per concurrency (closed loop) or per rate (open loop), the rest from ``base``."""
    if (concurrencies is None) == (rates is None):
        raise ValueError("give concurrencies=[...] or rates=[...] (one of them)")
    if concurrencies is not None:
        loads = [replace(base, concurrency=c, rate=None, max_concurrency=None) for c in concurrencies]
    else:
        loads = [replace(base, rate=r, concurrency=None) for r in rates or []]
    if not loads:
        raise ValueError("a sweep needs at least one concurrency or rate")
    for one in loads:
        one.validate()
    return loads


async def arun_sweep(settings: Settings, workload: Workload, *, concurrencies: list[int] | None = None,
                     rates: list[float] | None = None, load: Load | None = None, metrics: bool = False,
                     sample_interval_s: float = 0.5, **kwargs: Any) -> list[LoadResult]:
    """One run per concurrency (closed loop) or per rate (open loop), each with ``load``'s other fields.

    With ``metrics``, each run also samples the server's gauges (``result.gauges``, a DataFrame with
    ``t_s`` since the run's start) and records the server-side window (``result.server``). Stops at the
    first interrupted run and returns the runs so far. With more than one run, a bar counts the runs
    (``progress``: None, in a notebook only), beside each run's own bar of requests.
    """
    from helpers.measure import server_metrics  # measurement of the server, only when asked
    from helpers.core.progress import steps, wanted

    loads = sweep_loads(load or Load(num_requests=64), concurrencies, rates)
    workload.validate()
    model = kwargs.pop("model", None) or settings.model
    kwargs["progress"] = wanted(kwargs.get("progress"))
    results: list[LoadResult] = []
    try:
        prompts = await calibrate_for(settings, model, workload)
        for one in steps(loads, "sweep", "run", kwargs["progress"] and len(loads) > 1, label=_label):
            sampler = server_metrics.GaugeSampler(settings.metrics_url, sample_interval_s) if metrics else None
            try:
                if sampler is not None:
                    await asyncio.to_thread(sampler.start)
                result = await arun_load(settings, workload, one, model=model, prompts=prompts, **kwargs)
            finally:
                if sampler is not None:
                    frame = sampler.stop()  # a join and one scrape: short, and must happen even when cancelled
            if sampler is not None:
                if sampler.first is None:
                    warnings.warn(f"no server gauges for this run: {sampler.last_error}", stacklevel=2)
                result.gauges = server_metrics.relative_time(frame, result.t_start)
                if sampler.first is not None and sampler.last is not None:
                    result.server = server_metrics.window(sampler.first, sampler.last)
            results.append(result)
            if result.interrupted:
                break
    except (asyncio.CancelledError, KeyboardInterrupt):
        current = asyncio.current_task()
        if current is not None:
            current.uncancel()
        warnings.warn(f"sweep interrupted between runs: {len(results)} of {len(loads)} runs done", stacklevel=2)
    return results


def run_sweep(settings: Settings, workload: Workload, **kwargs: Any) -> list[LoadResult]:
    """``arun_sweep`` from synchronous code or a Jupyter cell; Ctrl-C returns the runs so far."""
    return run_sync(lambda: arun_sweep(settings, workload, **kwargs))


# ---------------------------------------------------------------- sync bridge

def run_sync(make_coro: Callable[[], Awaitable[T]], poll_s: float = 0.1) -> T:
    """Run a coroutine on a private event loop in a thread and wait for it here.

    Works whether or not this thread already runs a loop (Jupyter does). Ctrl-C here cancels the
    coroutine, which may return a partial result; a second Ctrl-C stops waiting.
    """
    box: dict[str, Any] = {}
    ready = threading.Event()
    finished = threading.Event()

    def target() -> None:
        loop = asyncio.new_event_loop()
        try:
            box["loop"] = loop
            box["task"] = loop.create_task(make_coro())  # type: ignore[arg-type]
            ready.set()
            box["result"] = loop.run_until_complete(box["task"])
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = err
        finally:
            ready.set()
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()
                finished.set()

    thread = threading.Thread(target=target, name="loadgen", daemon=True)
    thread.start()
    cancelled = False
    while True:  # every call inside the try: a Ctrl-C between the check and the wait would escape it
        try:
            if finished.wait(poll_s):
                break
        except KeyboardInterrupt:
            if cancelled:
                raise
            cancelled = True
            ready.wait()
            if "task" in box and not finished.is_set():
                box["loop"].call_soon_threadsafe(box["task"].cancel)
    thread.join()
    if "error" in box:
        if isinstance(box["error"], asyncio.CancelledError):
            raise KeyboardInterrupt from None
        raise box["error"]
    return box["result"]


def prompt_factory(settings: Settings, model: str | None = None, seed: int = 0) -> PromptFactory:
    """A calibrated PromptFactory for one-off prompts of an exact token count (outside a load run)."""

    return run_sync(lambda: calibrate_for(settings, model or settings.model, Workload(seed=seed)))
