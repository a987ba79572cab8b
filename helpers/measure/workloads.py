"""What a load run sends and how the requests arrive (the terms of vLLM's own `vllm bench serve`).

- ``Workload``: what each request looks like: fixed or ranged input/output lengths, the output length made
  exact with ``min_tokens`` + ``ignore_eos``; a unique prefix on every request by default (prefix caching
  must not hide the KV cost), a shared prefix, multi-turn agent-like conversations or real conversations on
  request. ``Conversation`` builds the messages of one user, turn after turn.
- ``Load``: closed loop (``Load(concurrency=C)``: C users, each sends its next request when the last one
  ends) or open loop (``Load(rate=R)``: Poisson arrivals at R req/s, gamma-distributed gaps with
  ``burstiness`` != 1, an optional ``max_concurrency`` cap), and when the run ends.
- ``PromptFactory`` / ``calibrate_prompts``: prompts built to a target length in tokens with the server's
  own ``/tokenize`` (an approximation, flagged as such, when the server has none).

``helpers.measure.loadgen`` sends them and times every stream.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator

import aiohttp

from helpers.measure.stream_timing import STREAM_OPTIONS
from helpers.core.errors import WorkshopError
from helpers.core.thinking import with_thinking

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


class LoadError(WorkshopError, RuntimeError):
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
    ``extra_body``: more request fields (e.g. ``{"tools": [...]}``).
    ``thinking``: whether a thinking model (Qwen3) may think. Off by default: the workload then sends
    ``chat_template_kwargs: {"enable_thinking": false}`` (put in ``extra_body`` unless it names its own), so
    every measured output token is an answer token; templates without the variable ignore it. With ``True``
    nothing is sent and the model thinks first: its reasoning streams as ``delta.reasoning`` and counts as output.
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
    thinking: bool = False

    def __post_init__(self) -> None:
        if not self.thinking:
            object.__setattr__(self, "extra_body", with_thinking(self.extra_body, False))

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

    def request_body(self, model: str, messages: list[dict[str, Any]], output_len: int) -> dict[str, Any]:
        """The streamed chat-completion request of one turn, asking for ``output_len`` tokens (exactly, with
        ``exact_output``)."""
        stream_options = dict(STREAM_OPTIONS) if self.usage_per_chunk else {"include_usage": True}
        body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": output_len, "stream": True,
                                "stream_options": stream_options, "temperature": self.temperature}
        if self.exact_output:
            body["ignore_eos"] = True
            if self.min_tokens:
                body["min_tokens"] = output_len
        body.update(self.extra_body)
        return body


def _check_length(name: str, spec: LengthSpec) -> None:
    if isinstance(spec, tuple):
        if len(spec) != 2 or not all(isinstance(v, int) for v in spec) or not 1 <= spec[0] <= spec[1]:
            raise ValueError(f"{name} range must be (low, high) with 1 <= low <= high (got {spec!r})")
    elif not isinstance(spec, int) or spec < 1:
        raise ValueError(f"{name} must be a positive number of tokens or a (low, high) range (got {spec!r})")


def _draw(spec: LengthSpec, rng: random.Random) -> int:
    return rng.randint(*spec) if isinstance(spec, tuple) else spec


# ---------------------------------------------------------------- how requests arrive

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


# ---------------------------------------------------------------- one user's messages

class Conversation:
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
        """True when every turn of the conversation has been sent."""
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
        """Keep the model's reply: the next turn re-sends it."""
        self.messages.append({"role": "assistant", "content": text})
