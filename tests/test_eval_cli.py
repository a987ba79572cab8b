"""``workshop eval`` refuses unusable files in one line, before any request is sent."""

from __future__ import annotations

import pytest

from helpers.cli import eval as eval_cli
from helpers.cli.main import main


def test_compare_with_a_missing_or_folder_file_is_one_line(capsys, tmp_path):
    assert main(["eval", "--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: cannot read {tmp_path / 'a.json'} (No such file or directory); "
                   "give a file written by `workshop eval --json`\n")
    assert main(["eval", "--compare", str(tmp_path), str(tmp_path)]) == 2
    assert "(Is a directory)" in capsys.readouterr().err


def test_compare_with_a_malformed_run_is_one_line(capsys, tmp_path):
    run = tmp_path / "run.json"
    run.write_text('{"format": "%s", "suite": {"name": "x", "version": 1}, "model": "m", "endpoint": "e", '
                   '"settings": 5, "rows": []}' % eval_cli.evals.RUN_FORMAT)
    assert main(["eval", "--compare", str(run), str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: a run file is malformed (TypeError") and err.count("\n") == 1


@pytest.mark.parametrize("flag", ["--json", "--csv"])
def test_an_output_path_that_cannot_be_written_is_refused_before_connecting(flag, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(eval_cli, "connect", lambda *a, **k: pytest.fail("connected despite a bad output path"))
    assert main(["eval", flag, str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: {flag} {tmp_path} is a directory: give the path of a file (inside it, say)\n"
