import json

from helpers.cli import main


def test_status_json_without_an_engine(capsys, monkeypatch):
    monkeypatch.setenv("WORKSHOP_PORT", "1")  # nothing listens there
    assert main(["status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["endpoint"] == "http://127.0.0.1:1/v1"
    assert status["ready"] is False and status["pid"] is None
    assert "--tool-call-parser" in status["args"]


def test_bad_environment_is_a_clear_error_not_a_traceback(capsys, monkeypatch):
    monkeypatch.setenv("WORKSHOP_PROFILE", "tpu")
    assert main(["status"]) == 2
    assert "WORKSHOP_PROFILE must be one of" in capsys.readouterr().err


def test_run_refuses_a_missing_notebook(capsys):
    assert main(["run", "notebooks/99_nothing.ipynb"]) == 2
    assert "no such notebook" in capsys.readouterr().err


def test_down_without_engine(capsys, monkeypatch):
    monkeypatch.setenv("WORKSHOP_PORT", "1")
    assert main(["down"]) == 0
    assert "no local engine" in capsys.readouterr().out
