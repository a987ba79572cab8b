"""The learner's own copies of the notebooks: the lab opens these, never the committed ones.

``sync`` copies each numbered notebook of ``notebooks/``, and ``start_here.ipynb`` (the lab's first screen),
into the workspace (``my-notebooks/`` in the repository, ignored by git, or in the current folder when the
helpers run from a wheel; ``WORKSHOP_WORKSPACE`` or ``--dir`` elsewhere, e.g. ``~/work`` in the notebook
image). A small record (``.workshop-copies.json``) holds the hash of what was copied: a copy whose bytes
still match it is untouched and is refreshed when the committed notebook changes; a copy the learner
edited or ran (JupyterLab saves outputs into it) is kept. ``reset`` puts the committed version back and
keeps the learner's as ``NAME.backup-<time>.ipynb``. So running notebooks never dirties the repository,
and ``git pull`` always works.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from helpers.core import kit_paths
from helpers.core.errors import WorkshopError

NOTEBOOK_DIR = kit_paths.kit_dir("notebooks")  # the committed notebooks: the clone's, or a wheel's copies
DEFAULT_WORKSPACE = kit_paths.work_root() / "my-notebooks"  # in the clone; for a wheel, in the current folder
RECORD = ".workshop-copies.json"
START_HERE = "start_here.ipynb"  # the lab's first screen: the path through the workshop and the engine's status
REFERENCE_PAGES = ("glossary.md", "cheatsheet.md")  # the course's glossary and cheat sheet, linked from start_here
# JupyterLab's default settings for the lab (its documented overrides.json): the file browser without its
# "last modified" column, so the notebooks' full names fit in the left panel; no news pop-up (the lab is offline)
JUPYTERLAB_SETTINGS = kit_paths.package_path("data", "jupyterlab")


class WorkspaceError(WorkshopError, ValueError):
    """The workspace cannot be used as asked; the message says what to do."""


@dataclass
class SyncReport:
    """What one sync did to each notebook, by name."""

    workspace: Path
    copied: list[str] = field(default_factory=list)  # new in the workspace
    refreshed: list[str] = field(default_factory=list)  # untouched copies brought up to date
    kept: list[str] = field(default_factory=list)  # edited or run by the learner: left alone, though newer exists
    current: list[str] = field(default_factory=list)  # already the committed version

    def lines(self) -> list[str]:
        """One line per kind of change, for the terminal (nothing for notebooks already current)."""
        out = []
        if self.copied:
            out.append(f"copied to {self.workspace}: {', '.join(self.copied)}")
        if self.refreshed:
            out.append(f"updated (you had not changed them): {', '.join(self.refreshed)}")
        for name in self.kept:
            out.append(f"kept your {name}; a newer version exists: `workshop notebooks --reset {name}` "
                       "takes it (yours is saved beside it)")
        return out


LAB_LAYOUTS = ".jupyterlab-workspaces"  # JupyterLab's saved layouts for this workspace (hidden in its file browser)
FILE_BROWSER_SHARE = 0.27  # of the window's width: the file browser, wide enough for the notebooks' full names


def seed_lab_layout(workspace: Path) -> Path:
    """The folder of JupyterLab's layouts for the lab on ``workspace``, with a first layout when there is none: the
    file browser open and wide enough for full names. JupyterLab saves the learner's own layout over it later."""
    from jupyterlab_server.workspaces_handler import WORKSPACE_EXTENSION, slugify  # installed with JupyterLab

    folder = Path(workspace) / LAB_LAYOUTS
    path = folder / (slugify("default") + WORKSPACE_EXTENSION)
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        left = {"collapsed": False, "visible": True, "current": "filebrowser", "widgets": ["filebrowser"]}
        layout = {"left": left, "relativeSizes": [FILE_BROWSER_SHARE, 1 - FILE_BROWSER_SHARE, 0]}
        path.write_text(json.dumps({"data": {"layout-restorer:data": layout}, "metadata": {"id": "default"}}, indent=1))
    return folder


def workspace_dir(path: Path | str | None = None) -> Path:
    """The workspace: ``path``, else ``WORKSHOP_WORKSPACE``, else ``my-notebooks/`` in the clone (in the current folder
    when the helpers run from a wheel)."""
    chosen = path or os.environ.get("WORKSHOP_WORKSPACE") or DEFAULT_WORKSPACE
    return Path(chosen).expanduser().resolve()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _record(workspace: Path) -> dict[str, str]:
    try:
        data = json.loads((workspace / RECORD).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {}  # a damaged record: every existing copy then counts as the learner's, and is kept
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(data, dict) else {}


def _save_record(workspace: Path, record: dict[str, str]) -> None:
    tmp = workspace / (RECORD + ".tmp")
    tmp.write_text(json.dumps(dict(sorted(record.items())), indent=1) + "\n")
    tmp.replace(workspace / RECORD)


def _check_workspace(workspace: Path, source: Path) -> None:
    if workspace.exists() and not workspace.is_dir():
        raise WorkspaceError(f"the workspace {workspace} is a file: give a directory (--dir or WORKSHOP_WORKSPACE)")
    if workspace == source.resolve():
        raise WorkspaceError(f"the workspace {workspace} is the committed notebooks' folder: give another directory, "
                             "so running a notebook never edits the repository")


def lesson_files(source: Path = NOTEBOOK_DIR) -> list[Path]:
    """The notebooks a workspace gets: ``start_here.ipynb`` (when there is one), then the numbered ones in order."""
    start = [Path(source) / START_HERE] if (Path(source) / START_HERE).is_file() else []
    return start + sorted(Path(source).glob("[0-9][0-9]_*.ipynb"))


def reference_files(source: Path = NOTEBOOK_DIR) -> list[Path]:
    """The pages the notebooks link to beside them (glossary, cheat sheet), those present in ``source``."""
    return [Path(source) / name for name in REFERENCE_PAGES if (Path(source) / name).is_file()]


def sync(workspace: Path | str | None = None, source: Path = NOTEBOOK_DIR) -> SyncReport:
    """Copy new notebooks (and the pages they link to) into the workspace and refresh the untouched ones; never
    overwrite the learner's."""
    ws = workspace_dir(workspace)
    _check_workspace(ws, source)
    lessons = lesson_files(source)
    if not lessons:  # never "every notebook is current" when there was nothing to copy
        raise WorkspaceError(kit_paths.missing_kit_message("notebooks", source) if Path(source) == NOTEBOOK_DIR
                             else f"no notebooks to copy in {source}: give the folder of the workshop's notebooks")
    ws.mkdir(parents=True, exist_ok=True)
    record = _record(ws)
    report = SyncReport(ws)
    for src in [*lessons, *reference_files(source)]:
        dest, name, new_hash = ws / src.name, src.name, _sha256(src)
        if not dest.exists():
            shutil.copyfile(src, dest)
            report.copied.append(name)
        else:
            have = _sha256(dest)
            if have == new_hash:
                report.current.append(name)
            elif record.get(name) == have:  # still exactly what we copied: the learner has not touched it
                shutil.copyfile(src, dest)
                report.refreshed.append(name)
            else:
                report.kept.append(name)
                continue
        record[name] = new_hash
    _save_record(ws, record)
    return report


def find_notebook(name: str, source: Path = NOTEBOOK_DIR) -> Path:
    """A committed notebook by file name or number (``03``, ``3``, ``03_prefill_decode_kv_cache.ipynb`` or
    ``start_here``)."""
    notebooks = lesson_files(source)
    key = Path(name).name
    matches = [p for p in notebooks if p.name == key or p.stem == key
               or (key.isdigit() and p.name[:2] == f"{int(key):02d}")]
    if len(matches) != 1:
        raise WorkspaceError(f"no notebook {name!r}: give its number or file name, one of "
                             f"{', '.join(p.name for p in notebooks)}")
    return matches[0]


def reset(name: str, workspace: Path | str | None = None, source: Path = NOTEBOOK_DIR) -> Path | None:
    """Put the committed version of one notebook back in the workspace; return where the learner's went (or None)."""
    ws = workspace_dir(workspace)
    _check_workspace(ws, source)
    src = find_notebook(name, source)
    ws.mkdir(parents=True, exist_ok=True)
    dest, backup = ws / src.name, None
    if dest.exists() and _sha256(dest) != _sha256(src):
        backup = ws / f"{src.stem}.backup-{time.strftime('%Y%m%d-%H%M%S')}.ipynb"
        dest.replace(backup)
    shutil.copyfile(src, dest)
    record = _record(ws)
    record[src.name] = _sha256(src)
    _save_record(ws, record)
    return backup
