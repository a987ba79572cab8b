"""A streaming load generator for an OpenAI-compatible chat endpoint (vLLM first).

What it does (the terms of vLLM's own `vllm bench serve`, vllm/benchmarks/serve.py):
- closed loop (``Load(concurrency=C)``: C users, each sends its next request when the last one ends) or
  open loop (``Load(rate=R)``: Poisson arrivals at R req/s, gamma-distributed gaps with ``burstiness``
  != 1, an optional ``max_concurrency`` cap); sweeps over concurrencies or rates (``run_sweep``);
- warm-up requests that are not counted; fixed or ranged input/output lengths; the output length made
  exact with ``min_tokens`` + ``ignore_eos``; prompts built to a target length in tokens with the server's
  own ``/tokenize`` (an approximation, flagged as such, when the server has none);
- a unique prefix on every request by default (prefix caching must not hide the KV cost), a shared
  prefix or multi-turn agent-like conversations on request;
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
import math
import random
import secrets
import threading
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable, Iterator, TypeVar

import aiohttp

from helpers.core.settings import Settings
from helpers.measure.stream_timing import STREAM_OPTIONS, StreamTiming

T = TypeVar("T")

MARKER = "#"  # first characters of every user message; the word tokens follow it
# Common English words (and letters) written with their leading space: in byte-level BPE tokenizers
# (Qwen, Llama 3, GPT) most of them are one token each. Which ones really are is asked of /tokenize.
CANDIDATE_WORDS = tuple(" " + w for w in (
    "the of and to in is it you that he was for on are as with his they at be this from have or by one "
    "had not but what all were when we there can an your which their said if do will each about how up "
    "out them then she many some so these would other into has more her two like him see time could no "
    "make than first been its who now people my made over did down only way find use may water long "
    "little very after words called just where most know "
    "a b c d e f g h i j k l m n o p q r s t u v w x y z").split())
MAX_PROMPT_WORDS = 64  # alphabet of the unique ids and the filler text
MIN_PROMPT_WORDS = 8
APPROX_CHAT_OVERHEAD_TOKENS = 10  # chat-template tokens assumed when the server cannot tokenize
UID_BITS = 44  # 20 bits of per-run salt + 24 bits of request index
TOKENIZE_CONCURRENCY = 16


class LoadError(RuntimeError):
    """The load run cannot start (bad settings, unreachable endpoint); the message says what to do."""


# ---------------------------------------------------------------- what to send

LengthSpec = int | tuple[int, int]


@dataclass(frozen=True)
class Workload:
    """What each request looks like.

    ``input_len``: prompt tokens as the server counts them (chat template included) for the first turn;
    an int, or a ``(low, high)`` range drawn uniformly. ``output_len``: completion tokens, likewise;
    with ``exact_output`` the server is told ``ignore_eos`` and, with ``min_tokens`` (the default),
    ``min_tokens`` = ``max_tokens`` too. ``ignore_eos`` alone already fixes the length, but past its natural
    end a small model then emits stop tokens that stream no text, so the server sends fewer, fuller chunks
    than a real answer would; ``min_tokens`` masks the stop tokens and the model writes text to the end.
    ``vllm bench serve`` sends ``ignore_eos`` only: ``min_tokens=False`` sends the same request.
    ``usage_per_chunk``: ask for ``continuous_usage_stats`` (the server's token count in every chunk,
    which per-token ITL needs); without it a chunk counts as one token and the final usage gives n_out.
    ``prefix``: ``"unique"`` (every request starts differently: no prefix-cache hits) or ``"shared"``
    (the first ``shared_prefix_len`` tokens after the chat header are the same for all requests, then a
    unique part). ``turns`` > 1: agent-like conversations; each later turn re-sends the whole
    conversation plus the last reply plus ``turn_len`` new tokens, so the prompt grows each turn.
    ``extra_body``: more request fields (e.g. ``{"chat_template_kwargs": {"enable_thinking": False}}``).
    ``prompts``: real conversations to send instead of generated text (conversation i starts with
    ``prompts[i % len(prompts)]``; ``input_len`` is then unused); with ``exact_output=False`` the model
    answers as it would (EOS ends it, ``output_len`` caps it): e.g. an agent's questions with the
    tools in ``extra_body``, for measurements whose result depends on what is said (speculative decoding).
    """

    input_len: LengthSpec = 256
    output_len: LengthSpec = 128
    exact_output: bool = True
    prefix: str = "unique"
    shared_prefix_len: int = 0
    turns: int = 1
    turn_len: LengthSpec = 64
    temperature: float = 0.0
    extra_body: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    prompts: list[list[dict[str, Any]]] | None = None
    min_tokens: bool = True
    usage_per_chunk: bool = True

    def validate(self) -> None:
        """Raise ValueError with what to change when the workload is inconsistent."""
        for name in ("input_len", "output_len", "turn_len"):
            _check_length(name, getattr(self, name))
        if self.prefix not in ("unique", "shared"):
            raise ValueError(f"prefix must be 'unique' or 'shared' (got {self.prefix!r})")
        if self.prefix == "shared" and self.shared_prefix_len <= 0:
            raise ValueError("prefix='shared' needs shared_prefix_len > 0 (tokens every request shares)")
        if self.prefix == "unique" and self.shared_prefix_len:
            raise ValueError("shared_prefix_len is only used with prefix='shared'")
        if self.turns < 1:
            raise ValueError(f"turns must be >= 1 (got {self.turns})")
        if self.prompts is not None:
            if not self.prompts or not all(isinstance(p, list) and p for p in self.prompts):
                raise ValueError("prompts must be a non-empty list of non-empty message lists")
            if self.prefix == "shared":
                raise ValueError("prompts are sent as they are: a shared prefix cannot be added to them")


def _check_length(name: str, spec: LengthSpec) -> None:
    if isinstance(spec, tuple):
        if len(spec) != 2 or not all(isinstance(v, int) for v in spec) or not 1 <= spec[0] <= spec[1]:
            raise ValueError(f"{name} range must be (low, high) with 1 <= low <= high (got {spec!r})")
    elif not isinstance(spec, int) or spec < 1:
        raise ValueError(f"{name} must be a positive number of tokens or a (low, high) range (got {spec!r})")


def _draw(spec: LengthSpec, rng: random.Random) -> int:
    return rng.randint(*spec) if isinstance(spec, tuple) else spec


@dataclass(frozen=True)
class Load:
    """How requests arrive and when the run ends.

    Closed loop: ``concurrency`` users back to back. Open loop: ``rate`` requests per second with
    gamma-distributed gaps (``burstiness`` 1 = Poisson, < 1 burstier, > 1 more regular; ``inf`` = all at
    once) and an optional ``max_concurrency`` cap. Ends after ``num_requests`` measured requests or
    ``duration_s`` seconds (no new request after it; those in flight finish), whichever comes first.
    ``warmup_requests`` run before and are not counted.
    """

    concurrency: int | None = None
    rate: float | None = None
    burstiness: float = 1.0
    max_concurrency: int | None = None
    num_requests: int | None = None
    duration_s: float | None = None
    warmup_requests: int = 0

    @property
    def mode(self) -> str:
        return "rate" if self.rate is not None else "concurrency"

    def validate(self) -> None:
        """Raise ValueError with what to change when the load is inconsistent."""
        if self.rate is not None and self.concurrency is not None:
            raise ValueError("give concurrency (closed loop) or rate (open loop), not both; "
                             "cap an open loop with max_concurrency")
        if self.rate is None and (self.concurrency is None or self.concurrency < 1):
            raise ValueError(f"concurrency must be >= 1 (got {self.concurrency!r})")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests per second (got {self.rate!r})")
        if self.rate is not None and math.isinf(self.rate) and self.num_requests is None:
            raise ValueError("rate=inf sends everything at once: bound it with num_requests")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0 (1 = Poisson; got {self.burstiness!r})")
        if self.max_concurrency is not None and (self.rate is None or self.max_concurrency < 1):
            raise ValueError("max_concurrency caps an open-loop run (rate=...) and must be >= 1")
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("bound the run: give num_requests, duration_s, or both")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1 (got {self.num_requests})")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0 (got {self.duration_s})")
        if self.warmup_requests < 0:
            raise ValueError("warmup_requests must be >= 0")


def arrival_intervals(rate: float, burstiness: float = 1.0, seed: int = 0) -> Iterator[float]:
    """Endless gaps between arrivals in seconds: gamma(shape=burstiness, mean=1/rate); Poisson at 1."""
    rng = random.Random(seed)
    while True:
        if math.isinf(rate):
            yield 0.0
        elif math.isinf(burstiness):
            yield 1.0 / rate
        else:
            yield rng.gammavariate(burstiness, 1.0 / (rate * burstiness))


def arrival_offsets(rate: float, burstiness: float = 1.0, seed: int = 0, n: int | None = None,
                    duration_s: float | None = None) -> list[float]:
    """Planned send times in seconds after the start: the first at 0, then the gaps accumulated.

    Stops after ``n`` arrivals or before the first one at or past ``duration_s``.
    """
    if n is None and duration_s is None:
        raise ValueError("give n or duration_s")
    out: list[float] = []
    t = 0.0
    for gap in arrival_intervals(rate, burstiness, seed):
        if (n is not None and len(out) >= n) or (duration_s is not None and t >= duration_s):
            break
        out.append(t)
        t += gap
    return out


# ---------------------------------------------------------------- prompts of an exact length

class PromptFactory:
    """Builds user messages whose chat prompt has an exact number of tokens, without the server.

    Every word in ``words`` is one token (checked with ``/tokenize``) and, written with its leading
    space, tokenizes independently of its neighbours, so MARKER + k words = tokens(MARKER) + k.
    ``overhead_tokens`` is the whole chat prompt (template, generation prompt) for the content MARKER.
    A request's content is MARKER + [shared prefix] + a unique id (fixed-width digits in base
    len(words), from a per-run salt and the request index) + filler; the id comes before the filler so
    no KV block of one request equals a block of another (vLLM hashes blocks as a chain).
    """

    def __init__(self, words: list[str], overhead_tokens: int, method: str, seed: int = 0,
                 max_error_tokens: int = 0) -> None:
        if len(words) < 2:
            raise ValueError("need at least two one-token words")
        self.words = list(words)
        self.overhead_tokens = overhead_tokens
        self.method = method  # "tokenize" (exact, checked) or "approx"
        self.max_error_tokens = max_error_tokens  # worst |predicted - server count| seen when checking
        self.id_digits = math.ceil(UID_BITS / math.log2(len(self.words)))
        self._rng = random.Random(seed)
        self._filler: list[str] = []
        self._shared: list[str] = []

    def _take(self, pool: list[str], n: int) -> list[str]:
        while len(pool) < n:
            pool.append(self._rng.choice(self.words))
        return pool[:n]

    def uid_words(self, uid: int) -> list[str]:
        """``uid`` as fixed-width digits in base len(words), each digit a word."""
        base = len(self.words)
        digits = []
        for _ in range(self.id_digits):
            uid, d = divmod(uid, base)
            digits.append(self.words[d])
        return digits

    def content(self, uid: int, tokens: int, shared_prefix_tokens: int = 0, unique: bool = True) -> str:
        """A user message of MARKER + ``tokens`` word tokens: shared prefix, unique id, filler."""
        head = self._take(self._shared, shared_prefix_tokens) if shared_prefix_tokens else []
        ident = self.uid_words(uid) if unique else []
        rest = tokens - len(head) - len(ident)
        if rest < 0:
            raise LoadError(f"a prompt of {tokens} content tokens cannot hold a {shared_prefix_tokens}-token shared "
                            f"prefix and a {len(ident)}-token unique id: raise input_len")
        return MARKER + "".join(head) + "".join(ident) + "".join(self._take(self._filler, rest))

    def first_turn_content(self, uid: int, input_len: int, shared_prefix_tokens: int = 0) -> str:
        """Content that makes a one-message chat prompt exactly ``input_len`` tokens long."""
        tokens = input_len - self.overhead_tokens
        minimum = shared_prefix_tokens + self.id_digits
        if tokens < minimum:
            raise LoadError(f"input_len {input_len} is too short: the chat template takes {self.overhead_tokens} "
                            f"tokens and the unique id {self.id_digits} (+ shared prefix {shared_prefix_tokens}); "
                            f"use input_len >= {self.overhead_tokens + minimum}")
        return self.content(uid, tokens, shared_prefix_tokens)


async def calibrate_prompts(http: aiohttp.ClientSession, root_url: str, model: str, headers: dict[str, str] | None = None,
                            chat_template_kwargs: dict[str, Any] | None = None, seed: int = 0) -> PromptFactory:
    """Ask the server's ``/tokenize`` which words are one token and what the chat template costs.

    Falls back to an approximation (``method="approx"``, a warning) when the server has no /tokenize;
    raises LoadError when it cannot be reached at all.
    """
    url = root_url.rstrip("/") + "/tokenize"
    sem = asyncio.Semaphore(TOKENIZE_CONCURRENCY)

    class _NoTokenize(Exception):
        pass

    async def count(payload: dict[str, Any]) -> int:
        async with sem:
            try:
                async with http.post(url, json={"model": model, **payload}, headers=headers or {}) as resp:
                    status, text = resp.status, await resp.text()
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as err:
                raise LoadError(f"Cannot reach {url} ({type(err).__name__}): is the engine running? "
                                "Check `workshop status` or VLLM_HOST.") from None
        if status == 404 and "model" in text.lower():
            raise LoadError(f"{url} answered 404: {text[:200]}. Is {model!r} the served model name "
                            "(MODEL_NAME)?")
        if status in (404, 405, 501):
            raise _NoTokenize()
        if status >= 400:
            raise LoadError(f"{url} answered HTTP {status}: {text[:200]}")
        return int(json.loads(text)["count"])

    def chat(content: str) -> dict[str, Any]:
        body: dict[str, Any] = {"messages": [{"role": "user", "content": content}], "add_generation_prompt": True}
        if chat_template_kwargs:
            body["chat_template_kwargs"] = chat_template_kwargs
        return body

    try:
        base = await count({"prompt": MARKER, "add_special_tokens": False})
        counts = await asyncio.gather(*(count({"prompt": MARKER + w, "add_special_tokens": False})
                                        for w in CANDIDATE_WORDS))
        words = [w for w, c in zip(CANDIDATE_WORDS, counts) if c - base == 1][:MAX_PROMPT_WORDS]
        if len(words) < MIN_PROMPT_WORDS:
            warnings.warn(f"only {len(words)} of the candidate words are single tokens for this tokenizer: "
                          "prompt lengths are approximate", stacklevel=2)
            return PromptFactory(list(CANDIDATE_WORDS[:MAX_PROMPT_WORDS]), APPROX_CHAT_OVERHEAD_TOKENS, "approx", seed)
        overhead = await count(chat(MARKER))
        factory = PromptFactory(words, overhead, "tokenize", seed)
        # Check the additive model on a short and a long prompt; a constant offset is folded in.
        checks = [factory.id_digits + 1, factory.id_digits + 200]
        errors = [await count(chat(factory.content(uid, n))) - (overhead + n) for uid, n in enumerate(checks)]
        if len(set(errors)) == 1:
            factory.overhead_tokens += errors[0]
        else:
            factory.max_error_tokens = max(abs(e) for e in errors)
            warnings.warn(f"this tokenizer merges words: prompt lengths may be off by up to "
                          f"{factory.max_error_tokens} tokens (the server's prompt_tokens are recorded)", stacklevel=2)
        return factory
    except _NoTokenize:
        warnings.warn(f"{url} not found: prompt lengths are approximate (one token per word, "
                      f"{APPROX_CHAT_OVERHEAD_TOKENS} template tokens assumed); the server's prompt_tokens are "
                      "recorded per request", stacklevel=2)
        return PromptFactory(list(CANDIDATE_WORDS[:MAX_PROMPT_WORDS]), APPROX_CHAT_OVERHEAD_TOKENS, "approx", seed)


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

class _Conversation:
    """The messages of one user (single request, or the turns of an agent-like conversation)."""

    def __init__(self, number: int, workload: Workload, factory: PromptFactory, salt: int, rng: random.Random,
                 uid: int) -> None:
        self.number = number
        self.turn = 0
        self.workload = workload
        self.factory = factory
        self.rng = rng
        self.uid = ((salt & 0xFFFFF) << 24) | (uid & 0xFFFFFF)  # UID_BITS = 20 + 24
        self.messages: list[dict[str, Any]] = []

    @property
    def done(self) -> bool:
        return self.turn >= self.workload.turns

    def next_request(self) -> tuple[list[dict[str, Any]], int | None, int]:
        """Messages for the next turn, the planned prompt tokens (first turn) and output tokens."""
        w = self.workload
        self.turn += 1
        if self.turn == 1 and w.prompts:
            self.messages = [dict(m) for m in w.prompts[self.number % len(w.prompts)]]
            return list(self.messages), None, _draw(w.output_len, self.rng)
        if self.turn == 1:
            input_len: int | None = _draw(w.input_len, self.rng)
            shared = w.shared_prefix_len if w.prefix == "shared" else 0
            content = self.factory.first_turn_content(self.uid, input_len, shared)
        else:
            input_len = None
            content = self.factory.content(self.uid, _draw(w.turn_len, self.rng), unique=False)
        self.messages.append({"role": "user", "content": content})
        return list(self.messages), input_len, _draw(w.output_len, self.rng)

    def add_reply(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})


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

    def _new_conversation(self) -> _Conversation:
        conv = _Conversation(self.next_conversation, self.workload, self.factory, self.salt, self.rng, self.next_uid)
        self.next_conversation += 1
        self.next_uid += 1
        return conv

    def _payload(self, messages: list[dict[str, Any]], output_len: int) -> dict[str, Any]:
        stream_options = dict(STREAM_OPTIONS) if self.workload.usage_per_chunk else {"include_usage": True}
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": output_len, "stream": True,
                                "stream_options": stream_options, "temperature": self.workload.temperature}
        if self.workload.exact_output:
            body["ignore_eos"] = True
            if self.workload.min_tokens:
                body["min_tokens"] = output_len
        body.update(self.workload.extra_body)
        return body

    # -- one request
    async def _request(self, http: aiohttp.ClientSession, conv: _Conversation, t_scheduled: float, warmup: bool,
                       sem: asyncio.Semaphore | None = None) -> RequestRecord:
        messages, input_len, output_len = conv.next_request()
        payload = self._payload(messages, output_len)
        timing = StreamTiming(t_sent=t_scheduled, t_scheduled=t_scheduled)
        rec = RequestRecord(len(self.warmup_records if warmup else self.records), timing, input_len, output_len,
                            conv.number, conv.turn, warmup)
        (self.warmup_records if warmup else self.records).append(rec)
        try:
            if sem is not None:
                async with sem:
                    await self._stream(http, payload, timing)
            else:
                await self._stream(http, payload, timing)
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

    async def _stream(self, http: aiohttp.ClientSession, payload: dict[str, Any], timing: StreamTiming) -> None:
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
                        _record_chunk(timing, chunk, now)
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
            conv: _Conversation | None = None
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

        async def conversation(conv: _Conversation, t_scheduled: float) -> None:
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


def _record_chunk(timing: StreamTiming, chunk: dict[str, Any], now: float) -> None:
    """Account one parsed SSE chunk of a chat completion stream."""
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
    while not finished.is_set():
        try:
            finished.wait(poll_s)
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
