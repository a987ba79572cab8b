"""The honest clock (issue 42): how long a notebook's core path takes a person, by rules written here with sources.

Two columns per notebook:
- **the workshop**: the room of ROOM_SIZE on the cluster (gpu/k8s parameters). The reading, cell, exercise and
  prediction minutes are counted from the notebook; every engine restart on the core path is priced at the room's
  time (RestartPrice: a *storm* when all ROOM_SIZE engines read a model from the one export at once, *flags* or
  *back* when the node's page cache holds the weights); the compute on a GPU cannot be measured here, so it is an
  ESTIMATE, and says its source.
- **self-study**: one person on a laptop's CPU (the cpu profile), the run measured on this machine.

Everything here is a pure function of the notebooks and figures it is given; the caller reads the machine.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import nbformat

from helpers.core.restarts import GPU_START_S, GPU_START_SOURCE
from helpers.lab.notebooks import PREDICTION

# ---------------------------------------------------------------- the rules, each with its source

PROSE_WPM = 200  # words a minute of the course's prose: silent reading of English non-fiction is about 238 (Brysbaert,
# "How many words do we read per minute?", Journal of Memory and Language 109, 2019); technical prose with new terms
# is read slower, and 200 is the rate the course takes
CODE_WPM = 100  # words a minute of code: an ASSUMPTION, half the prose rate (no comparable meta-analysis exists for
# reading code to understand it)
CELL_S = 20  # seconds for each code cell beyond its compute: press run, look at its output (an assumption)
EXERCISE_MIN = 3  # a code exercise: read the task, write a few lines, run, fix: 2 to 4 minutes (an assumption)
PREDICTION_MIN = 1  # a prediction: read the choices, pick one, run (an assumption)
ROOM_SIZE = 30  # the room: every participant runs the same cell within a minute or so
EXPORT_MIB_S = 1200  # the model export's read throughput: Filestore Basic SSD as Google Cloud publishes it
EXPORT_SOURCE = ("Filestore Basic SSD, 1,200 MiB/s read (cloud.google.com/filestore/docs/performance), as k8s/README.md "
                 "'The start-up storm' computes it; Basic HDD (100 MiB/s) makes a storm 12x longer")
RULES = (f"prose at {PROSE_WPM} words a minute (Brysbaert 2019: 238 for non-fiction, slower for technical prose); code "
         f"at {CODE_WPM} (an assumption: half the prose rate); {CELL_S} s per code cell beyond its compute; "
         f"{EXERCISE_MIN} min per code exercise and {PREDICTION_MIN} min per prediction (assumptions)")

# what course-time --write generates from the record is not counted in it: the Time line and start_here's day table
_GENERATED = re.compile(r"^\*\*Time:\*\*[^\n]*|<!-- day: generated.*?<!-- day: end -->", re.M | re.S)
_WORD = re.compile(r"\S*\w\S*")  # as course_time.words: a whitespace-separated token with a letter or digit
_MODEL_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]*\w")


def _words(text: str) -> int:
    return len(_WORD.findall(text))


# ---------------------------------------------------------------- what a person does on the core path

@dataclass(frozen=True)
class CoreWork:
    """The core path's work for a person: prose and code words, code cells (the parameters cell left out), code
    exercises and predictions."""

    prose_words: int
    code_words: int
    code_cells: int
    exercises: int
    predictions: int

    @property
    def reading_min(self) -> float:
        """Minutes to read the prose and the code."""
        return self.prose_words / PROSE_WPM + self.code_words / CODE_WPM

    @property
    def cells_min(self) -> float:
        """Minutes of running and looking at the code cells, beyond their compute."""
        return self.code_cells * CELL_S / 60

    @property
    def tasks_min(self) -> float:
        """Minutes of the code exercises and predictions."""
        return self.exercises * EXERCISE_MIN + self.predictions * PREDICTION_MIN

    @property
    def person_min(self) -> float:
        """Everything a person does, compute and restarts left out."""
        return self.reading_min + self.cells_min + self.tasks_min


def core_work(nb: nbformat.NotebookNode, core: Sequence[bool]) -> CoreWork:
    """Count ``nb``'s core-path work; ``core`` says for each cell whether it is on the core path."""
    prose = code = cells = exercises = predictions = 0
    for cell, on in zip(nb.cells, core):
        if not on:
            continue
        if cell.cell_type == "markdown":
            prose += _words(_GENERATED.sub("", cell.source))
            continue
        if cell.cell_type != "code" or "parameters" in cell.get("metadata", {}).get("tags", []):
            continue
        tags = cell.get("metadata", {}).get("tags", [])
        if "solution" in tags:  # hidden: read only by who needs it, and their time is the exercise's
            continue
        code += _words(cell.source)
        cells += 1
        exercises += "exercise" in tags
        predictions += bool(PREDICTION.search(cell.source))
    return CoreWork(prose, code, cells, exercises, predictions)


# ---------------------------------------------------------------- a restart at the room's time

@dataclass(frozen=True)
class RestartPrice:
    """One core-path restart on the day: its kind, the room's seconds and why.

    - storm: the new configuration reads a model no engine read today: ROOM_SIZE engines read it from the one export
      at once (ROOM_SIZE x its bytes / EXPORT_MIB_S), then start cold (no compile cache for it);
    - flags: the same weights, held in the node's page cache; new flags, so vLLM compiles again (a cold start);
    - back: a configuration already started today: page cache and compile cache warm (a warm start)."""

    change: str
    kind: str
    seconds: float
    why: str


def price_restart(change: str, read_today: set[str], seen_changes: set[str],
                  model_bytes: Callable[[str], int | None]) -> RestartPrice:
    """Price one restart from its change (``helpers.core.vllm_args.describe_change``'s words). ``read_today``: the
    models the room's engines have read (updated); ``seen_changes``: configurations already started (updated);
    ``model_bytes``: a model id's weight bytes, None for what is not a model."""
    parts = change.split(", ")
    after = " ".join(part.split("->", 1)[1] if "->" in part else part for part in parts if not part.endswith(" removed"))
    new = [m for m in dict.fromkeys(_MODEL_ID.findall(after)) if m not in read_today and model_bytes(m)]
    # back: a rollback, or a switch back to a model read today or flags taken away (towards the baseline) with no
    # flag added or changed (a new flag set compiles again)
    new_flags = [part for part in parts if part.startswith("--") and not part.endswith(" removed")]
    back = change.startswith("back to") or (not new_flags and (any(f"-> {m}" in change for m in read_today)
                                                               or all(part.endswith(" removed") for part in parts)))
    if new:
        read_today.update(new)
        total = sum(model_bytes(m) or 0 for m in new)
        read_s = ROOM_SIZE * total / (EXPORT_MIB_S * 2**20)
        seconds = read_s + GPU_START_S["cold"]
        why = (f"{ROOM_SIZE} engines read {', '.join(new)} ({total / 1e9:.1f} GB each) from the export at once: "
               f"{read_s / 60:.1f} min, then a cold start")
        kind = "storm"
    elif back or change in seen_changes or any(undoes(change, seen) for seen in seen_changes):
        seconds, kind, why = GPU_START_S["warm"], "back", "a configuration started before: weights and compile cache warm"
    else:
        seconds, kind, why = GPU_START_S["cold"], "flags", "the same weights from the page cache; new flags compile again"
    seen_changes.add(change)
    return RestartPrice(change, kind, round(seconds, 1), why)


def _parts(change: str) -> dict[str, tuple[str | None, str | None]]:
    """A change's parts by what they change: ``{"--max-num-seqs": ("32", "4"), "--kv-cache-dtype": ("fp8", None)}``
    (None: absent; a removed flag's old value is not in the words, so it reads "?")."""
    out: dict[str, tuple[str | None, str | None]] = {}
    for part in re.sub(r" \(kubectl apply\)$", "", change).split(", "):
        if " -> " in part:
            head, after = part.split(" -> ", 1)
            name, _, before = head.partition(" ")
            out[name] = (before, after)
        elif part.endswith(" added"):
            name, _, value = part.removesuffix(" added").partition(" ")
            out[name] = (None, value or "on")
        elif part.endswith(" removed"):
            out[part.removesuffix(" removed").split(" ", 1)[0]] = ("?", None)
    return out


def undoes(change: str, earlier: str) -> bool:
    """Whether ``change`` takes back what ``earlier`` did, part for part (back to a configuration already started)."""
    now, then = _parts(change), _parts(earlier)
    if not now or now.keys() != then.keys():
        return False
    return all(now[k][1] == then[k][0] or (now[k][1] is None and then[k][0] is None) or
               (now[k][0] == "?" and then[k][0] is None) for k in now)


def price_restarts(changes: Sequence[str], baseline: str, model_bytes: Callable[[str], int | None]) -> list[RestartPrice]:
    """Price a notebook's core-path restarts in order; the room's engines read ``baseline`` at the day's start."""
    read_today, seen = {baseline}, set()
    return [price_restart(change, read_today, seen, model_bytes) for change in changes]


KINDS = ("storm", "flags", "back")


def kinds_words(kinds: Sequence[str]) -> str:
    """``"1 storm, 1 back"``: how many restarts of each kind, in KINDS' order."""
    return ", ".join(f"{kinds.count(k)} {k}" for k in KINDS if k in kinds)


RESTART_SOURCE = (f"storm: {ROOM_SIZE} x the model's bytes / {EXPORT_MIB_S:,} MiB/s ({EXPORT_SOURCE}) + a cold start; "
                  f"flags: a cold start ({GPU_START_S['cold']:.0f} s); back: a warm start ({GPU_START_S['warm']:.0f} s); "
                  f"starts from {GPU_START_SOURCE}")


# ---------------------------------------------------------------- the two columns

@dataclass(frozen=True)
class Columns:
    """One notebook's minutes in both columns, with the parts and the sources of the estimates."""

    person_min: float
    run_min: float | None  # the CPU path's core run, measured; the workshop's compute is estimated by it
    restarts: tuple[RestartPrice, ...] | None  # None: not measured
    restart_min: float | None

    @property
    def self_study_min(self) -> float | None:
        """The self-study column: a person's minutes and the CPU run (its own engine starts included)."""
        return None if self.run_min is None else round(self.person_min + self.run_min, 1)

    @property
    def workshop_min(self) -> float | None:
        """The workshop column: a person's minutes, the compute (estimated by the CPU run: WORKSHOP_RUN_SOURCE) and
        the room's restarts."""
        if self.run_min is None or self.restart_min is None:
            return None
        return round(self.person_min + self.run_min + self.restart_min, 1)


WORKSHOP_RUN_SOURCE = ("ESTIMATE, not measured (no GPU here): the CPU path's measured compute of the same cells stands "
                       "in for the GPU's; replace it with the rehearsal's measured minutes (workshop rehearse)")


def columns(work: CoreWork, self_run_s: float | None, restarts: Sequence[RestartPrice] | None) -> Columns:
    """Both columns from the counted work, the CPU path's measured core seconds and the priced restarts."""
    run_min = None if self_run_s is None else self_run_s / 60
    restart_min = None if restarts is None else sum(r.seconds for r in restarts) / 60
    return Columns(round(work.person_min, 1), None if run_min is None else round(run_min, 1),
                   None if restarts is None else tuple(restarts), None if restart_min is None else round(restart_min, 1))
