"""Workload evals: a fixed, versioned set of agent tasks run against any endpoint, scored per task.

A suite (``helpers/data/evals/<name>.json``) holds every task's exact messages, request options and
expected values, so two runs of the same suite version send the same prompts. ``agent-v1`` is built
once by ``build_agent_v1`` from the corpus' held-out phrasings (never the training templates), with
tool results computed by the real tools at the corpus' fixed clock. Four categories:

- ``tool_call``: one question; vLLM must return a structured ``tool_calls`` entry (parsed by its tool
  parser, not text), with the right function and arguments (``toolcall_eval.arguments_match``).
- ``tool_answer``: question, the model's call and the real tool result already in the conversation;
  the final answer is plain text (no further call) and contains the result's value(s).
- ``json``: a question answered under structured outputs (``response_format`` of type ``json_schema``,
  which vLLM 0.32 turns into ``structured_outputs.json``) with the tool call as JSON,
  ``{"name": ..., "arguments": {...}}`` (``call_schema``: any of the tools); the answer must parse,
  match the schema (checked with ``jsonschema``, a vLLM dependency) and carry the right values: the
  function and the arguments the question names. (The tiny agent was never trained to answer a tool
  result in JSON: asked for that, it fills the strings with rambling; asked for the call, it is on
  familiar ground, and the grammar only guarantees the shape, not the values.)
- ``no_tool``: chit-chat or a request no tool fits; a plain answer, no tool call.

Runs are sequential (concurrency 1) at temperature 0 with a fixed seed. A failed request is one
failed task with its error; an endpoint that stops answering raises ``EndpointError``. Pass rates
come with 95% Wilson intervals. ``compare(a, b)`` flags a category as regressed when, on the tasks
both runs share, significantly more went pass -> fail than fail -> pass: an exact McNemar test
(two-sided binomial test on the discordant tasks, p < 0.05). Runs of different suites share no
tasks; they are compared unpaired: regressed when the 95% Newcombe (hybrid score) interval of the
difference lies wholly below zero.
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import jsonschema
import openai
import pandas as pd

from helpers.core.thinking import thinking_body
from helpers.tiny import corpus
from helpers.engine.session import EndpointError, Lab
from helpers.evals.toolcall import arguments_match, wilson_interval
from helpers.tiny.tools import TOOLS, UNITS

DEFAULT_SUITE = "agent-v1"
CATEGORIES = ("tool_call", "tool_answer", "json", "no_tool")
CHECKS = {  # category -> the checks a task of it must all pass
    "tool_call": ("structured_call", "right_function", "right_arguments"),
    "tool_answer": ("plain_answer", "uses_result"),
    "json": ("parses", "matches_schema", "right_values"),
    "no_tool": ("no_tool_call", "plain_answer"),
}
TOOL_KINDS = ("weather", "time", "calculator", "convert")
DEFAULT_SEED = 0
DEFAULT_MAX_TOKENS = 128
# Sent with every request: reasoning models (Qwen3 on the gpu profile) answer directly; templates
# without the variable (the tiny agent's) ignore it.
DEFAULT_EXTRA_BODY: dict[str, Any] = thinking_body(False)
EXCERPT_CHARS = 200
JSON_INSTRUCTION = "Reply with JSON only: the tool to call and its arguments."
ALPHA = 0.05
RUN_FORMAT = "workshop-eval-run"


# ---------------------------------------------------------------- suites

@dataclass
class Task:
    """One eval task: the exact request (messages, tools on/off, response format) and what to expect."""

    id: str
    category: str
    kind: str
    messages: list[dict[str, Any]]
    expect: dict[str, Any]
    tools: bool = True
    tool_choice: str | None = None
    response_format: dict[str, Any] | None = None

    @property
    def question(self) -> str:
        """The user's question (the first user message)."""
        return next(m["content"] for m in self.messages if m["role"] == "user")


@dataclass
class Suite:
    """A named, versioned list of tasks and the tool schemas they are asked with."""

    name: str
    version: int
    description: str
    tasks: list[Task]
    tools: list[dict[str, Any]] = field(default_factory=lambda: TOOLS)

    def frame(self) -> pd.DataFrame:
        """One row per task: id, category, kind, question."""
        return pd.DataFrame([{"id": t.id, "category": t.category, "kind": t.kind, "question": t.question}
                             for t in self.tasks])

    def counts(self) -> dict[str, int]:
        """Tasks per category."""
        return {c: sum(t.category == c for t in self.tasks) for c in CATEGORIES}

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "description": self.description,
                "tools": self.tools, "tasks": [asdict(t) for t in self.tasks]}


def _suites_dir() -> Any:
    return resources.files("helpers").joinpath("data/evals")


def list_suites() -> list[str]:
    """Names of the shipped suites."""
    return sorted(p.name.removesuffix(".json") for p in _suites_dir().iterdir() if p.name.endswith(".json"))


def load_suite(name: str = DEFAULT_SUITE) -> Suite:
    """A shipped suite by name; a subset suite (``"from"`` + ``"task_ids"``) takes its tasks from its parent."""
    path = _suites_dir().joinpath(f"{name}.json")
    if not path.is_file():
        raise ValueError(f"no eval suite {name!r}; shipped suites: {', '.join(list_suites())}")
    data = json.loads(path.read_text(encoding="utf-8"))
    if "from" in data:
        parent = load_suite(data["from"])
        by_id = {t.id: t for t in parent.tasks}
        tasks = [by_id[i] for i in data["task_ids"]]
        return Suite(data["name"], data["version"], data["description"], tasks, parent.tools)
    return Suite(data["name"], data["version"], data["description"], [Task(**t) for t in data["tasks"]],
                 data["tools"])


def write_suite(suite: Suite, path: str | Path) -> Path:
    """Write a suite as JSON (how ``helpers/data/evals/agent-v1.json`` was made from ``build_agent_v1``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(suite.to_dict(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def _unique_examples(rng: random.Random, kind: str, n: int) -> list[corpus.Example]:
    seen: set[str] = set()
    out: list[corpus.Example] = []
    for _ in range(200 * n):
        example = corpus.make_example(rng, kind, heldout=True)
        question = example.messages[0]["content"]
        if question not in seen:
            seen.add(question)
            out.append(example)
            if len(out) == n:
                return out
    raise ValueError(f"only {len(out)} distinct held-out {kind} questions; ask for fewer")


def call_schema(tools: list[dict[str, Any]] = TOOLS) -> dict[str, Any]:
    """JSON schema of one tool call, ``{"name": ..., "arguments": {...}}``: any of the tools, exactly its parameters."""
    options = []
    for tool in tools:
        fn = tool["function"]
        params = {**fn["parameters"], "additionalProperties": False}
        if fn["name"] == "convert_units":  # the units the tool knows, as the tool's error message lists them
            unit = {"type": "string", "enum": list(UNITS)}
            params["properties"] = {**params["properties"], "from_unit": unit, "to_unit": unit}
        options.append({"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
                        "required": ["name", "arguments"], "additionalProperties": False})
    return {"anyOf": options}


def build_agent_v1() -> Suite:
    """The ``agent-v1`` tasks, rebuilt from the corpus' held-out phrasings (seeded: the same every time)."""
    tasks: list[Task] = []
    for k, kind in enumerate(TOOL_KINDS):
        for i, ex in enumerate(_unique_examples(random.Random(5100 + k), kind, 8), 1):
            tasks.append(Task(f"tool_call-{kind}-{i:02d}", "tool_call", kind, ex.messages[:1],
                              {"call": ex.expected_call}))
    for k, kind in enumerate(TOOL_KINDS):
        for i, ex in enumerate(_unique_examples(random.Random(5200 + k), kind, 6), 1):
            tasks.append(Task(f"tool_answer-{kind}-{i:02d}", "tool_answer", kind, ex.messages[:3],
                              {"values": ex.expected_values}))
    fmt = {"type": "json_schema", "json_schema": {"name": "tool_call", "schema": call_schema(), "strict": True}}
    for k, kind in enumerate(TOOL_KINDS):
        for i, ex in enumerate(_unique_examples(random.Random(5300 + k), kind, 5), 1):
            messages = [{"role": "system", "content": JSON_INSTRUCTION}, *ex.messages[:1]]
            tasks.append(Task(f"json-{kind}-{i:02d}", "json", kind, messages, {"call": ex.expected_call},
                              tool_choice="none", response_format=fmt))
    for i, ex in enumerate(_unique_examples(random.Random(5400), "chat", 20), 1):
        tasks.append(Task(f"no_tool-chat-{i:02d}", "no_tool", "chat", ex.messages[:1], {"no_call": True}))
    description = ("Agent tasks from the held-out phrasings of helpers/tiny/corpus.py: 32 tool calls, 24 answers from a "
                   "tool result, 20 JSON answers (the call as JSON) under structured outputs, 20 plain answers where "
                   "no tool fits.")
    return Suite("agent-v1", 1, description, tasks)


# ---------------------------------------------------------------- scoring (pure)

@dataclass
class Reply:
    """What the model answered: text content and the structured tool calls vLLM parsed."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # name, arguments (dict, or raw text)

    @classmethod
    def from_message(cls, message: Any) -> "Reply":
        """From an OpenAI SDK chat message."""
        calls = []
        for tc in message.tool_calls or []:
            try:
                arguments: Any = json.loads(tc.function.arguments or "{}")
            except json.JSONDecodeError:
                arguments = tc.function.arguments
            calls.append({"name": tc.function.name, "arguments": arguments})
        return cls(message.content, calls)

    def excerpt(self) -> str:
        """The calls (name(arguments)) or the content, cut to EXCERPT_CHARS."""
        if self.tool_calls:
            text = "; ".join(f"{c['name']}({json.dumps(c['arguments'], ensure_ascii=False)})" for c in self.tool_calls)
        else:
            text = self.content or ""
        return text[:EXCERPT_CHARS]


def _is_plain(reply: Reply) -> bool:
    text = (reply.content or "").strip()
    return not reply.tool_calls and bool(text) and "<tool_call>" not in text


def contains_value(text: str, value: Any) -> bool:
    """``value`` appears in ``text``; a number only as a whole number (21 not inside 214 or 2.1)."""
    needle = str(value)
    if re.fullmatch(r"-?\d+(\.\d+)?", needle):
        return re.search(rf"(?<![\d.]){re.escape(needle)}(?!\.?\d)", text) is not None
    return needle.casefold() in text.casefold()


def score(task: Task, reply: Reply) -> dict[str, bool]:
    """The task's checks (CHECKS[task.category]) on one reply."""
    if task.category == "tool_call":
        expected = task.expect["call"]
        first = reply.tool_calls[0] if reply.tool_calls else None
        right_fn = first is not None and first["name"] == expected["name"]
        right_args = right_fn and arguments_match(expected["name"], first["arguments"], expected["arguments"])
        return {"structured_call": first is not None, "right_function": right_fn, "right_arguments": bool(right_args)}
    if task.category == "tool_answer":
        plain = _is_plain(reply)
        uses = plain and all(contains_value(reply.content or "", v) for v in task.expect["values"])
        return {"plain_answer": plain, "uses_result": uses}
    if task.category == "json":
        try:
            data = json.loads(reply.content or "")
            parses = not reply.tool_calls
        except json.JSONDecodeError:
            data, parses = None, False
        schema = (task.response_format or {}).get("json_schema", {}).get("schema", {})
        valid = parses and jsonschema.Draft202012Validator(schema).is_valid(data)
        expected = task.expect["call"]
        right = valid and data.get("name") == expected["name"] and \
            arguments_match(expected["name"], data.get("arguments"), expected["arguments"])
        return {"parses": parses, "matches_schema": bool(valid), "right_values": bool(right)}
    if task.category == "no_tool":
        return {"no_tool_call": not reply.tool_calls, "plain_answer": _is_plain(reply)}
    raise ValueError(f"unknown task category {task.category!r}; known: {', '.join(CATEGORIES)}")


# ---------------------------------------------------------------- running

@dataclass(frozen=True)
class EvalSettings:
    """Request settings of a run (deterministic by default)."""

    temperature: float = 0.0
    seed: int = DEFAULT_SEED
    max_tokens: int = DEFAULT_MAX_TOKENS
    extra_body: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_EXTRA_BODY))


def _request(task: Task, suite: Suite, settings: EvalSettings) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"temperature": settings.temperature, "seed": settings.seed,
                              "max_tokens": settings.max_tokens}
    if task.tools:
        kwargs["tools"] = suite.tools
    if task.tool_choice is not None:
        kwargs["tool_choice"] = task.tool_choice
    if task.response_format is not None:
        kwargs["response_format"] = task.response_format
    if settings.extra_body:
        kwargs["extra_body"] = settings.extra_body
    return kwargs


def run_task(lab: Lab, task: Task, suite: Suite, settings: EvalSettings | None = None) -> dict[str, Any]:
    """One task through the endpoint, scored: id, category, kind, passed, each check, error, latency_s, output."""
    settings = settings or EvalSettings()
    row: dict[str, Any] = {"id": task.id, "category": task.category, "kind": task.kind, "passed": False}
    start = time.perf_counter()
    try:
        resp = lab.chat(task.messages, **_request(task, suite, settings))
        reply = Reply.from_message(resp.choices[0].message)
        error = None
    except EndpointError as err:
        lab.check()  # the endpoint is gone: raise its EndpointError; else this request alone failed
        reply, error = None, str(err)
    except openai.APIError as err:  # 4xx/5xx for this request (e.g. a schema the backend refuses)
        reply, error = None, f"{type(err).__name__}: {getattr(err, 'message', err)}"
    row["latency_s"] = time.perf_counter() - start
    checks = score(task, reply) if reply is not None else {name: False for name in CHECKS[task.category]}
    row.update(checks)
    row["passed"] = reply is not None and all(checks.values())
    row["error"] = error
    row["output"] = reply.excerpt() if reply is not None else None
    return row


def safe_endpoint(url: str) -> str:
    """The URL without user:password, query or fragment (never a key)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


@dataclass
class EvalRun:
    """A finished run: which suite, model and endpoint, the request settings, one row per task."""

    suite: str
    suite_version: int
    model: str
    endpoint: str
    settings: EvalSettings
    rows: pd.DataFrame
    started_at: str = ""
    wall_s: float = 0.0

    def summary(self) -> pd.DataFrame:
        """Per category (and ``all``): tasks, passed, pass rate and its 95% Wilson interval, errors."""
        return summarize(self.rows)

    def failures(self) -> pd.DataFrame:
        """The failed tasks: id, category, error, output."""
        failed = self.rows[~self.rows["passed"].astype(bool)]
        return failed[["id", "category", "error", "output"]].reset_index(drop=True)

    def to_dict(self) -> dict[str, Any]:
        """Everything JSON can hold; the endpoint without credentials, no API key anywhere."""
        rows = self.rows.astype(object).where(self.rows.notna(), None).to_dict(orient="records")
        summary = self.summary().reset_index().to_dict(orient="records")
        return {"format": RUN_FORMAT, "format_version": 1, "suite": {"name": self.suite, "version": self.suite_version},
                "model": self.model, "endpoint": safe_endpoint(self.endpoint), "settings": asdict(self.settings),
                "started_at": self.started_at, "wall_s": self.wall_s, "rows": rows, "summary": summary}

    def save(self, path: str | Path) -> Path:
        """Write the run as JSON; returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        return path


def rows_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """Per-task rows as a DataFrame; check columns nullable booleans (<NA> where a check does not apply)."""
    frame = pd.DataFrame(records)
    frame["passed"] = frame["passed"].astype(bool)
    for name in dict.fromkeys(c for checks in CHECKS.values() for c in checks):
        if name in frame:
            frame[name] = frame[name].astype("boolean")
    return frame


def load_run(path: str | Path) -> EvalRun:
    """A run saved by ``EvalRun.save``; ValueError when the file is something else."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not JSON ({err.msg}); give a file written by `workshop eval --json`") from None
    if not isinstance(data, dict) or data.get("format") != RUN_FORMAT:
        raise ValueError(f"{path} is not an eval run; give a file written by `workshop eval --json`")
    return EvalRun(data["suite"]["name"], data["suite"]["version"], data["model"], data["endpoint"],
                   EvalSettings(**data["settings"]), rows_frame(data["rows"]), data.get("started_at", ""),
                   data.get("wall_s", 0.0))


def run_suite(lab: Lab, suite: str | Suite = DEFAULT_SUITE, settings: EvalSettings | None = None,
              progress: bool | None = None) -> EvalRun:
    """Run every task of a suite against ``lab`` (a ``helpers.engine.session.Lab``), one at a time, with a bar in a
    notebook (``progress`` None) or when asked."""
    suite = load_suite(suite) if isinstance(suite, str) else suite
    settings = settings or EvalSettings()
    lab.check()  # an unreachable endpoint: EndpointError before the first task
    started_at = datetime.now().isoformat(timespec="seconds")
    from helpers.core.progress import steps

    tasks = steps(suite.tasks, f"eval {suite.name}", "task", progress)
    start = time.perf_counter()
    rows = [run_task(lab, task, suite, settings) for task in tasks]
    wall_s = time.perf_counter() - start
    return EvalRun(suite.name, suite.version, lab.model, lab.settings.base_url, settings, rows_frame(rows),
                   started_at, wall_s)


# ---------------------------------------------------------------- statistics

def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """Per category in CATEGORIES order, then ``all``: n, passed, pass_rate, ci_low, ci_high, errors."""
    out = []
    present = [c for c in CATEGORIES if c in set(rows["category"])] + sorted(set(rows["category"]) - set(CATEGORIES))
    for name in [*present, "all"]:
        part = rows if name == "all" else rows[rows["category"] == name]
        n, passed = len(part), int(part["passed"].astype(bool).sum())
        low, high = wilson_interval(passed, n)
        errors = int(part["error"].notna().sum()) if "error" in part else 0
        out.append({"category": name, "n": n, "passed": passed, "pass_rate": passed / n if n else None,
                    "ci_low": low, "ci_high": high, "errors": errors})
    return pd.DataFrame(out).set_index("category")


def newcombe_interval(passed_a: int, n_a: int, passed_b: int, n_b: int, z: float = 1.96) -> tuple[float, float]:
    """95% interval for rate_b - rate_a of two independent samples (Newcombe's hybrid score, from Wilson's)."""
    p_a, p_b = passed_a / n_a, passed_b / n_b
    low_a, high_a = wilson_interval(passed_a, n_a, z)
    low_b, high_b = wilson_interval(passed_b, n_b, z)
    diff = p_b - p_a
    return (diff - math.sqrt((p_b - low_b) ** 2 + (high_a - p_a) ** 2),
            diff + math.sqrt((high_b - p_b) ** 2 + (p_a - low_a) ** 2))


def mcnemar_p(pass_to_fail: int, fail_to_pass: int) -> float:
    """Exact two-sided McNemar p-value: how surprising this split of the flipped tasks is if neither run is better."""
    n = pass_to_fail + fail_to_pass
    if n == 0:
        return 1.0
    k = min(pass_to_fail, fail_to_pass)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


@dataclass
class Comparison:
    """Two runs side by side: per category, and the tasks that went from pass to fail."""

    table: pd.DataFrame
    flipped: pd.DataFrame
    paired: bool
    alpha: float = ALPHA

    @property
    def regressed(self) -> list[str]:
        """Categories (or ``all``) flagged as a regression beyond noise."""
        return [str(c) for c in self.table.index[self.table["regression"]]]


def _as_run(run: EvalRun | str | Path) -> EvalRun:
    return run if isinstance(run, EvalRun) else load_run(run)


def compare(a: EvalRun | str | Path, b: EvalRun | str | Path, alpha: float = ALPHA) -> Comparison:
    """Run ``b`` against baseline ``a``: per category rates, difference b - a with its 95% interval,
    tasks flipped each way, the McNemar p-value (paired) and a regression flag (see module doc)."""
    a, b = _as_run(a), _as_run(b)
    rows_a, rows_b = a.rows.set_index("id"), b.rows.set_index("id")
    shared = [i for i in rows_a.index if i in rows_b.index]
    paired = bool(shared)
    if paired:
        rows_a, rows_b = rows_a.loc[shared], rows_b.loc[shared]
    categories = [c for c in [*CATEGORIES, *sorted(set(rows_a["category"]) - set(CATEGORIES))]
                  if c in set(rows_a["category"]) or c in set(rows_b["category"])]
    out = []
    for name in [*categories, "all"]:
        part_a = rows_a if name == "all" else rows_a[rows_a["category"] == name]
        part_b = rows_b if name == "all" else rows_b[rows_b["category"] == name]
        n_a, n_b = len(part_a), len(part_b)
        pass_a, pass_b = int(part_a["passed"].astype(bool).sum()), int(part_b["passed"].astype(bool).sum())
        row: dict[str, Any] = {"category": name, "n_a": n_a, "n_b": n_b,
                               "rate_a": pass_a / n_a if n_a else None, "rate_b": pass_b / n_b if n_b else None}
        if not (n_a and n_b):
            row.update(diff=None, diff_ci_low=None, diff_ci_high=None, pass_to_fail=None, fail_to_pass=None,
                       p_value=None, regression=False)
            out.append(row)
            continue
        low, high = newcombe_interval(pass_a, n_a, pass_b, n_b)
        row.update(diff=row["rate_b"] - row["rate_a"], diff_ci_low=low, diff_ci_high=high)
        if paired:
            was, now = part_a["passed"].astype(bool), part_b["passed"].astype(bool)
            down, up = int((was & ~now).sum()), int((~was & now).sum())
            p = mcnemar_p(down, up)
            row.update(pass_to_fail=down, fail_to_pass=up, p_value=p, regression=down > up and p < alpha)
        else:
            row.update(pass_to_fail=None, fail_to_pass=None, p_value=None, regression=high < 0)
        out.append(row)
    table = pd.DataFrame(out).set_index("category")
    table["regression"] = table["regression"].astype(bool)
    if paired:
        down = rows_a["passed"].astype(bool) & ~rows_b["passed"].astype(bool)
        flipped = pd.DataFrame({"category": rows_a.loc[down, "category"], "output_a": rows_a.loc[down, "output"],
                                "output_b": rows_b.loc[down, "output"], "error_b": rows_b.loc[down, "error"]})
        flipped = flipped.reset_index()
    else:
        flipped = pd.DataFrame(columns=["id", "category", "output_a", "output_b", "error_b"])
    return Comparison(table, flipped, paired, alpha)
