"""A measurement run once for the room, kept with its provenance. On a GPU a comparison that restarts the engine many
times (06's method grid, 08's search) costs minutes per restart, so the instructor runs it once: ``write_results``
saves its rows with where they came from (model, workshop GPU, vLLM version, engine image, the kit's commit, the
parameters), and an attendee's notebook reads them with ``load_results``, which prints that provenance and refuses a
file measured on another model or GPU than the attendee's own.

The named place is a setting: ``$WORKSHOP_RESULTS_DIR`` when set, otherwise ``results/`` in the helpers' state
directory (``$WORKSHOP_STATE_DIR``, by default ``~/.cache/workshop``), one ``<name>.json`` per measurement. On a cluster the
instructor points every notebook pod's ``WORKSHOP_RESULTS_DIR`` at one read-only folder the room shares.

A notebook's Go-deeper cell calls ``measure_or_load``: with ``run`` True it measures and writes the file, else it loads
the instructor's file, printing its provenance, or says in one sentence how to get the numbers. Without the notebooks or
the ``workshop`` command, in plain Python::

    from helpers.engine.session import connect
    from helpers.measure.results_file import provenance, write_results, load_results
    lab = connect()                                   # the engine the numbers are measured on
    rows = ...                                        # a DataFrame: the measurement's rows
    write_results("06-methods", rows, provenance(lab, {"REPEATS": 2}))
    rows, prov = load_results("06-methods", lab.model, lab.settings.gpu)

and ``python -m helpers.measure.results_file [NAME ...]`` prints the folder and each file's provenance.
Takes a running engine's settings; never starts or connects one.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import httpx
import pandas as pd

from helpers.core.errors import WorkshopError
from helpers.core.settings import Settings, state_dir

if TYPE_CHECKING:
    from helpers.engine.session import Lab

FORMAT = 1  # the file's layout; a file of another layout is refused


class ResultsError(WorkshopError, ValueError):
    """A results file that is missing, unreadable or measured elsewhere; the message says what to do."""


@dataclass(frozen=True)
class Provenance:
    """Where a results file's numbers come from."""

    model: str
    gpu: str
    vllm_version: str | None
    engine_image: str | None
    commit: str | None
    parameters: dict[str, Any] = field(default_factory=dict)
    measured_utc: str = ""

    def describe(self) -> str:
        """One line: what was measured, where, with which vLLM and kit."""
        params = ", ".join(f"{k}={v!r}" for k, v in self.parameters.items()) or "none given"
        return (f"measured {self.measured_utc} on {self.gpu} serving {self.model}, vLLM {self.vllm_version or 'unknown'}"
                f", image {self.engine_image or 'unknown'}, kit commit {self.commit or 'unknown'}; parameters: {params}")


RESULTS_DIR_ENV = "WORKSHOP_RESULTS_DIR"


def results_dir() -> Path:
    """The named place results files live: ``$WORKSHOP_RESULTS_DIR``, else ``results/`` in the state directory."""
    override = os.environ.get(RESULTS_DIR_ENV)
    return Path(override) if override else state_dir() / "results"


def vllm_version(settings: Settings, timeout_s: float = 3.0) -> str | None:
    """The version the engine reports at ``/version``; None when it does not answer."""
    try:
        resp = httpx.get(settings.root_url + "/version", headers=settings.auth_headers(), timeout=timeout_s)
        resp.raise_for_status()
        return str(resp.json().get("version")) or None
    except (httpx.HTTPError, ValueError):
        return None


def kit_commit() -> str | None:
    """The commit of this checkout of the kit (short hash), or None outside a git clone."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def provenance(lab: Lab, parameters: Mapping[str, Any]) -> Provenance:
    """The provenance of a measurement on ``lab``'s engine now (the engine image from ``WORKSHOP_ENGINE_IMAGE``)."""
    return Provenance(model=lab.model, gpu=lab.settings.gpu, vllm_version=vllm_version(lab.settings),
                      engine_image=os.environ.get("WORKSHOP_ENGINE_IMAGE") or None, commit=kit_commit(),
                      parameters=dict(parameters),
                      measured_utc=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))


def write_results(name: str, rows: pd.DataFrame, prov: Provenance, directory: Path | None = None) -> Path:
    """Write ``rows`` and their provenance to ``<directory>/<name>.json``; return the path."""
    path = (directory or results_dir()) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": FORMAT, "provenance": asdict(prov), "rows": json.loads(rows.to_json(orient="records"))}
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return path


def load_results(name: str, model: str, gpu: str, directory: Path | None = None,
                 show: bool = True) -> tuple[pd.DataFrame, Provenance]:
    """The rows of ``<name>.json`` and their provenance (printed), for an engine serving ``model`` on ``gpu``;
    ResultsError when the file is missing or was measured on another model or GPU."""
    path = (directory or results_dir()) / f"{name}.json"
    if not path.is_file():
        raise ResultsError(f"No results file {path}: run this section yourself (RUN_GO_DEEPER=True) or ask your "
                           f"instructor to put {name}.json there (WORKSHOP_RESULTS_DIR names the folder).")
    try:
        data = json.loads(path.read_text())
        prov = Provenance(**data["provenance"])
        rows = pd.DataFrame(data["rows"])
    except (ValueError, KeyError, TypeError) as err:
        raise ResultsError(f"{path} is not a results file this kit wrote ({type(err).__name__}: {err}): ask your "
                           "instructor for a new one.") from None
    if data.get("format") != FORMAT:
        raise ResultsError(f"{path} has layout {data.get('format')!r}, this kit reads {FORMAT}: ask your instructor to "
                           "write it again with this kit.")
    if (prov.model, prov.gpu) != (model, gpu):
        raise ResultsError(f"{path} was measured with {prov.model} on {prov.gpu}, but your engine serves {model} on "
                           f"{gpu}: its numbers are not yours, so run this section yourself (RUN_GO_DEEPER=True) or ask "
                           f"your instructor for the file of {model} on {gpu}.")
    if show:
        print(f"{name}: {prov.describe()}")
    return rows, prov


def measure_or_load(name: str, run: bool, lab: Lab, measure: Callable[[], pd.DataFrame],
                    parameters: Mapping[str, Any], directory: Path | None = None) -> pd.DataFrame | None:
    """A Go-deeper step's rows: with ``run`` True, ``measure()`` and write them with their provenance (the path
    printed); otherwise the instructor's ``<name>.json`` for ``lab``'s model and GPU, its provenance printed. None, with
    one printed sentence that says what to do, when there is no such file or it was measured elsewhere."""
    if run:
        rows = measure()
        path = write_results(name, rows, provenance(lab, parameters), directory)
        print(f"{name}: measured here and written to {path} (with its provenance) for the room to load.")
        return rows
    try:
        rows, _ = load_results(name, lab.model, lab.settings.gpu, directory)
    except ResultsError as err:
        print(f"Not run (RUN_GO_DEEPER is False): {err}")
        return None
    print(f"{name}: the instructor's numbers, not this run's, loaded from {(directory or results_dir()) / (name + '.json')}.")
    return rows


def main(argv: list[str] | None = None) -> int:
    """``python -m helpers.measure.results_file [NAME ...]``: the folder, and each (or every) file's provenance."""
    import sys

    names = sys.argv[1:] if argv is None else argv
    folder = results_dir()
    print(f"results folder: {folder} (${RESULTS_DIR_ENV} names another)")
    paths = [folder / f"{n}.json" for n in names] if names else sorted(folder.glob("*.json"))
    if not paths:
        print("no results files there yet: a notebook's Go-deeper cell run with RUN_GO_DEEPER=True writes one.")
    status = 0
    for path in paths:
        try:
            data = json.loads(path.read_text())
            print(f"{path.stem}: {Provenance(**data['provenance']).describe()} ({len(data['rows'])} rows)")
        except (OSError, ValueError, KeyError, TypeError) as err:
            print(f"{path.stem}: not readable as a results file ({type(err).__name__}: {err})")
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
