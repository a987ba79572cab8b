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


def test_lab_passes_unknown_arguments_to_jupyterlab(monkeypatch):
    import helpers.cli as cli

    seen = {}

    def fake_lab(args):
        seen["args"] = args.jupyter_args
        return 0

    monkeypatch.setattr(cli, "cmd_lab", fake_lab)
    assert cli.main(["lab", "--no-browser", "--port", "8890"]) == 0
    assert seen["args"] == ["--no-browser", "--port", "8890"]


def test_other_commands_refuse_unknown_arguments(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["status", "--bogus"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_machine_reports_the_forced_kind_and_what_it_cannot_do(capsys, monkeypatch):
    monkeypatch.setenv("WORKSHOP_CPU_ISA", "avx2")
    assert main(["machine", "--json", "--sample", "0.2"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["isa"].startswith("AVX2 (forced")
    assert {f["feature"]: f["available"] for f in facts["features"]} == {"fp8_kv_cache": False, "int4_weights": False}
    monkeypatch.setenv("WORKSHOP_CPU_ISA", "sse4")
    assert main(["machine"]) == 2
    assert "use avx2, avx512 or amx" in capsys.readouterr().err
