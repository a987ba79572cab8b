"""The learner's copies of the notebooks: copied once, refreshed only while untouched, reset on request,
and kept out of git, so running notebooks in the lab leaves the repository clean."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

from helpers.cli import main as cli
from helpers.lab import workspace
from helpers.lab.notebooks import NOTEBOOK_DIR, REPO_ROOT


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """Two committed notebooks in a folder of their own."""
    src = tmp_path / "notebooks"
    src.mkdir()
    for name in ("01_first.ipynb", "02_second.ipynb"):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"print('{name}')")])
        nbformat.write(nb, src / name)
    (src / "scratch.ipynb").write_text("{}")  # not a numbered lesson: never copied
    return src


def _run_in_lab(path: Path) -> None:
    """What JupyterLab saves after a run: outputs in the learner's copy."""
    nb = nbformat.read(path, as_version=4)
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", text="ran\n")]
    nb.cells[0].execution_count = 1
    nbformat.write(nb, path)


def _update_committed(path: Path, text: str) -> None:
    nb = nbformat.read(path, as_version=4)
    nb.cells[0].source = text
    nbformat.write(nb, path)


def test_first_sync_copies_the_numbered_notebooks_and_a_second_changes_nothing(source, tmp_path):
    ws = tmp_path / "work"
    report = workspace.sync(ws, source)
    assert report.copied == ["01_first.ipynb", "02_second.ipynb"]
    assert sorted(p.name for p in ws.glob("*.ipynb")) == report.copied
    again = workspace.sync(ws, source)
    assert again.current == report.copied and not (again.copied or again.refreshed or again.kept)
    assert again.lines() == []


def test_an_untouched_copy_is_refreshed_and_an_edited_one_kept(source, tmp_path):
    ws = tmp_path / "work"
    workspace.sync(ws, source)
    _run_in_lab(ws / "02_second.ipynb")
    mine = (ws / "02_second.ipynb").read_bytes()
    _update_committed(source / "01_first.ipynb", "print('fixed')")
    _update_committed(source / "02_second.ipynb", "print('fixed too')")
    report = workspace.sync(ws, source)
    assert report.refreshed == ["01_first.ipynb"] and report.kept == ["02_second.ipynb"]
    assert "fixed" in (ws / "01_first.ipynb").read_text()
    assert (ws / "02_second.ipynb").read_bytes() == mine, "the learner's run must never be overwritten"
    assert any("workshop notebooks --reset 02_second.ipynb" in line for line in report.lines())
    # kept stays kept on every later sync, until reset
    assert workspace.sync(ws, source).kept == ["02_second.ipynb"]


def test_reset_puts_the_committed_version_back_and_keeps_the_learners(source, tmp_path):
    ws = tmp_path / "work"
    workspace.sync(ws, source)
    _run_in_lab(ws / "02_second.ipynb")
    mine = (ws / "02_second.ipynb").read_bytes()
    backup = workspace.reset("2", ws, source)
    assert backup is not None and backup.read_bytes() == mine and backup.name.startswith("02_second.backup-")
    assert (ws / "02_second.ipynb").read_bytes() == (source / "02_second.ipynb").read_bytes()
    _update_committed(source / "02_second.ipynb", "print('later fix')")
    assert workspace.sync(ws, source).refreshed == ["02_second.ipynb"], "after a reset the copy is untouched again"
    assert workspace.reset("01_first.ipynb", ws, source) is None  # nothing of the learner's to keep


def test_a_damaged_record_keeps_every_existing_copy(source, tmp_path):
    ws = tmp_path / "work"
    workspace.sync(ws, source)
    (ws / workspace.RECORD).write_text("not json")
    _update_committed(source / "01_first.ipynb", "print('fixed')")
    assert workspace.sync(ws, source).kept == ["01_first.ipynb"]


def test_bad_workspaces_and_names_are_refused_with_what_to_do(source, tmp_path):
    with pytest.raises(workspace.WorkspaceError, match="committed notebooks' folder: give another directory"):
        workspace.sync(source, source)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(workspace.WorkspaceError, match="is a file: give a directory"):
        workspace.sync(tmp_path / "afile", source)
    with pytest.raises(workspace.WorkspaceError, match="no notebook '09': give its number or file name, one of "
                                                       "01_first.ipynb, 02_second.ipynb"):
        workspace.reset("09", tmp_path / "work", source)


def test_the_default_workspace_is_in_the_repository_and_ignored_by_git(monkeypatch):
    monkeypatch.delenv("WORKSHOP_WORKSPACE", raising=False)
    assert workspace.workspace_dir() == REPO_ROOT / "my-notebooks"
    monkeypatch.setenv("WORKSHOP_WORKSPACE", "/srv/elsewhere")
    assert workspace.workspace_dir() == Path("/srv/elsewhere")
    if shutil.which("git") is None or not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout: the .gitignore rule is checked in one")
    for path in ("my-notebooks/01_connect_and_first_agent.ipynb", "my-notebooks/.workshop-copies.json"):
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO_ROOT, check=False)
        assert ignored.returncode == 0, f"{path} is not ignored by git: running the lab would dirty the repository"


def test_workshop_notebooks_syncs_and_resets_from_the_command_line(tmp_path, capsys):
    ws = tmp_path / "work"
    assert cli.main(["notebooks", "--dir", str(ws)]) == 0
    committed = sorted(p.name for p in NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    assert sorted(p.name for p in ws.glob("*.ipynb")) == sorted([*committed, workspace.START_HERE])
    assert f"copied to {ws}" in capsys.readouterr().out
    _run_in_lab(ws / committed[0])
    assert cli.main(["notebooks", "--dir", str(ws), "--reset", "1"]) == 0
    assert f"reset {committed[0]}; yours is now {committed[0][:-6]}.backup-" in capsys.readouterr().out
    assert cli.main(["notebooks", "--dir", str(ws), "--reset", "99"]) == 2
    assert "error: no notebook '99': give its number or file name" in capsys.readouterr().err


def test_lab_opens_jupyterlab_on_the_copies_at_start_here_and_the_committed_ones_stay_clean(tmp_path, monkeypatch):
    before = {p.name: p.read_bytes() for p in NOTEBOOK_DIR.glob("*.ipynb")}
    started = {}
    monkeypatch.setattr(cli, "start_engine", lambda timeout_s, command: 0)
    monkeypatch.setattr(cli.os, "execv", lambda exe, cmd: started.update(cmd=cmd))
    ws = tmp_path / "work"
    assert cli.main(["lab", "--dir", str(ws), "--no-browser"]) == 0
    cmd = started["cmd"]
    assert f"--notebook-dir={ws}" in cmd and "--no-browser" in cmd
    assert "--LabApp.default_url=/lab/tree/start_here.ipynb" in cmd and (ws / "start_here.ipynb").is_file()
    settings = next(a.split("=", 1)[1] for a in cmd if a.startswith("--LabApp.app_settings_dir="))
    overrides = json.loads((Path(settings) / "overrides.json").read_text())
    assert overrides["@jupyterlab/filebrowser-extension:browser"]["showLastModifiedColumn"] is False
    layouts = Path(next(a.split("=", 1)[1] for a in cmd if a.startswith("--LabApp.workspaces_dir=")))
    assert layouts.parent == ws, "the lab's layouts live in the learner's workspace, not in the repository"
    first = json.loads(next(layouts.glob("*.jupyterlab-workspace")).read_text())["data"]["layout-restorer:data"]
    assert first["left"]["current"] == "filebrowser" and first["relativeSizes"][0] == workspace.FILE_BROWSER_SHARE
    assert str(NOTEBOOK_DIR) not in " ".join(cmd)
    _run_in_lab(ws / "01_connect_and_first_agent.ipynb")
    assert {p.name: p.read_bytes() for p in NOTEBOOK_DIR.glob("*.ipynb")} == before


def test_lab_refuses_the_committed_folder_before_the_engine_starts(monkeypatch, capsys):
    monkeypatch.setattr(cli, "start_engine", lambda timeout_s, command: pytest.fail("the engine must not start"))
    assert cli.cmd_lab(argparse.Namespace(dir=str(NOTEBOOK_DIR), jupyter_args=[])) == 2
    assert "give another directory" in capsys.readouterr().err


def test_start_here_is_copied_first_and_can_be_reset_by_name(tmp_path):
    src = tmp_path / "notebooks"
    src.mkdir()
    for name in ("01_first.ipynb", workspace.START_HERE):
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(name)]), src / name)
    assert [p.name for p in workspace.lesson_files(src)] == [workspace.START_HERE, "01_first.ipynb"]
    ws = tmp_path / "work"
    assert workspace.sync(ws, src).copied == [workspace.START_HERE, "01_first.ipynb"]
    mine = ws / workspace.START_HERE
    mine.write_text(mine.read_text().replace("start_here", "mine"))
    assert workspace.reset("start_here", ws, src) is not None
    assert (ws / workspace.START_HERE).read_bytes() == (src / workspace.START_HERE).read_bytes()


def test_lab_keeps_the_learners_own_settings_and_layouts_dirs(tmp_path, monkeypatch):
    started = {}
    monkeypatch.setattr(cli, "start_engine", lambda timeout_s, command: 0)
    monkeypatch.setattr(cli.os, "execv", lambda exe, cmd: started.update(cmd=cmd))
    assert cli.main(["lab", "--dir", str(tmp_path / "work"), "--LabApp.app_settings_dir=/mine"]) == 0
    assert [a for a in started["cmd"] if "app_settings_dir" in a] == ["--LabApp.app_settings_dir=/mine"]
    assert cli.main(["lab", "--dir", str(tmp_path / "work"), "--LabApp.workspaces_dir=/layouts"]) == 0
    assert [a for a in started["cmd"] if "workspaces_dir" in a] == ["--LabApp.workspaces_dir=/layouts"]


def test_the_first_layout_is_written_once_and_the_learners_kept(tmp_path):
    folder = workspace.seed_lab_layout(tmp_path)
    saved = next(folder.glob("*.jupyterlab-workspace"))
    saved.write_text('{"data": {}, "metadata": {"id": "default"}}')  # what JupyterLab saves of the learner's layout
    assert workspace.seed_lab_layout(tmp_path) == folder
    assert saved.read_text() == '{"data": {}, "metadata": {"id": "default"}}'
