import argparse
import json
from pathlib import Path

import pytest

from helpers.cli import main as cli
from helpers.cli.main import main
from helpers.lab.notebooks import NOTEBOOK_DIR, NotebookRun


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
    import helpers.cli.main as cli

    seen = {}

    def fake_lab(args):
        seen["args"] = args.jupyter_args
        return 0

    monkeypatch.setattr(cli, "cmd_lab", fake_lab)
    assert cli.main(["lab", "--no-browser", "--port", "8890"]) == 0
    assert seen["args"] == ["--no-browser", "--port", "8890"]


def test_other_commands_refuse_unknown_arguments(capsys):
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


NB02 = str(NOTEBOOK_DIR / "02_units_and_memory_budget.ipynb")
NB03 = str(NOTEBOOK_DIR / "03_prefill_decode_kv_cache.ipynb")


def _subcommands() -> list[str]:
    parser = cli.build_parser()
    [subparsers] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(subparsers.choices)


def test_the_subcommand_walk_finds_every_registered_module():
    names = _subcommands()
    assert {"up", "run", "bench", "metrics", "memory", "gpus", "provision", "eval"} <= set(names)


@pytest.mark.parametrize("argv", [[]] + [[name] for name in _subcommands()], ids=lambda a: " ".join(a) or "workshop")
def test_help_renders_for_workshop_and_every_subcommand(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    captured = capsys.readouterr()
    assert exit_.value.code == 0, captured.err
    assert captured.out.startswith(f"usage: workshop {' '.join(argv)}".rstrip()) and len(captured.out.splitlines()) > 2


def test_a_percent_sign_in_a_docstring_does_not_break_help():
    def handler():
        """Use 95% of memory.

        Details that stay out of the one-line help."""

    parser = argparse.ArgumentParser(prog="x")
    parser.add_subparsers().add_parser("h", help=cli._summary(handler))
    assert "Use 95% of memory." in parser.format_help() and "Details" not in parser.format_help()


@pytest.fixture
def no_engine(monkeypatch):
    """cmd_run with the engine and the kernels replaced: records what would start and what each notebook gets."""
    calls = {"connect": 0, "runs": []}

    def fake_connect(settings=None, **kwargs):
        calls["connect"] += 1

    def fake_run(path, out_dir, parameters=None, timeout_s=1800, progress=None, core_only=False):
        calls["runs"].append((Path(path).name, parameters))
        return NotebookRun(Path(path), out_dir / Path(path).name, 0.1)

    monkeypatch.setattr(cli, "connect", fake_connect)
    monkeypatch.setattr("helpers.lab.notebooks.run_notebook", fake_run)
    return calls


@pytest.mark.parametrize("argv, message", [
    (["-p", "NO_SUCH_PARAM=3", NB02], "error: -p NO_SUCH_PARAM=3: NO_SUCH_PARAM is not a parameter of "
                                      "02_units_and_memory_budget.ipynb; its parameters: MODEL, WORKSHOP_GPU, "
                                      "OTHER_GPUS, GPU_MEMORY_UTILIZATION, MAX_MODEL_LEN, CONVERSATION_TOKENS\n"),
    (["-p", "max_model_len=1024"], "error: -p max_model_len=1024: max_model_len is not a parameter of any of the 8 "
                                   "notebooks to run; did you mean MAX_MODEL_LEN (02_units_and_memory_budget.ipynb)? "
                                   "Names are case-sensitive.\n"),
    (["-p", "BADPARAM"], "error: -p BADPARAM: a parameter must look like NAME=VALUE, e.g. -p MAX_MODEL_LEN=1024\n"),
    (["-p", "MAX_MODEL_LEN=abc"], "error: -p MAX_MODEL_LEN=abc: MAX_MODEL_LEN in 02_units_and_memory_budget.ipynb "
                                  "takes a whole number (its default is 8192), got 'abc'\n"),
    (["-p", "REPEATS=1", NB02], "REPEATS is not a parameter of 02_units_and_memory_budget.ipynb"),
    (["README.md"], "error: README.md is not a readable notebook (NotJSONError"),
    (["--out", "pyproject.toml", NB02], "error: --out pyproject.toml is a file: give a directory"),
])
def test_run_refuses_bad_input_before_the_engine_starts(argv, message, no_engine, capsys, monkeypatch):
    monkeypatch.chdir(NOTEBOOK_DIR.parent)
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert no_engine == {"connect": 0, "runs": []}


def test_run_gives_each_notebook_the_parameters_it_has_typed_like_its_defaults(no_engine, capsys, tmp_path):
    argv = ["run", NB02, NB03, "-p", "MAX_MODEL_LEN=1024", "-p", "REPEATS=1", "-p", "GPU_MEMORY_UTILIZATION=1",
            "--out", str(tmp_path)]
    assert main(argv) == 0
    assert no_engine["connect"] == 1
    assert no_engine["runs"] == [
        ("02_units_and_memory_budget.ipynb", {"MAX_MODEL_LEN": 1024, "GPU_MEMORY_UTILIZATION": 1.0}),
        ("03_prefill_decode_kv_cache.ipynb", {"REPEATS": 1}),
    ]
    assert type(no_engine["runs"][0][1]["GPU_MEMORY_UTILIZATION"]) is float
    out = capsys.readouterr().out
    assert "-p REPEATS goes to 03_prefill_decode_kv_cache.ipynb (the other notebooks have no such parameter)" in out


@pytest.mark.parametrize("argv, message", [
    (["run", "--cell-timeout", "0"], "argument --cell-timeout: must be >= 1 (got '0')"),
    (["heldout", "--n", "-1"], "argument --n: must be >= 1 (got '-1')"),
    (["machine", "--sample", "-1"], "argument --sample: must be > 0 and <= 60 (got '-1')"),
    (["machine", "--sample", "abc"], "argument --sample: needs a number (got 'abc')"),
    (["build-model", "--stage1-steps", "-1"], "argument --stage1-steps: must be >= 0 (got '-1')"),
    (["build-model", "--batch-size", "0"], "argument --batch-size: must be >= 1 (got '0')"),
    (["up", "--timeout", "-5"], "argument --timeout: must be > 0 (got '-5')"),
    (["eval", "--max-tokens", "-3"], "argument --max-tokens: must be >= 1 (got '-3')"),
])
def test_out_of_range_numbers_are_a_usage_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and "Traceback" not in err


def test_build_model_needs_the_agents_tokenizer_for_a_sibling(capsys, tmp_path):
    assert main(["build-model", "--kind", "draft", "--agent", str(tmp_path), "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert f"--agent {tmp_path} holds no tokenizer.json" in err and not (tmp_path / "d").exists()


def test_heldout_refuses_an_output_path_it_could_not_write_before_connecting(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(cli, "connect", lambda *a, **k: pytest.fail("connected despite a bad --json"))
    assert main(["heldout", "--json", str(tmp_path)]) == 2
    assert f"--json {tmp_path} is a directory" in capsys.readouterr().err


def test_up_says_it_is_starting_the_engine_before_the_wait(monkeypatch, capsys):
    from types import SimpleNamespace

    from helpers.engine.local import LocalEngine

    class Starting(LocalEngine):
        pid, model = 4321, "tiny-agent"

        def __init__(self):
            self.printed_before_start = None

        def is_ready(self):
            return False

        def start(self, config=None, timeout_s=None):
            self.printed_before_start = capsys.readouterr().out

        def log_path(self):
            return Path("engine.log")

    engine = Starting()
    settings = SimpleNamespace(port=8999, model="tiny-agent", base_url="http://127.0.0.1:8999/v1")
    monkeypatch.setattr(cli, "_engine_or_fail", lambda: (settings, engine))
    assert main(["up"]) == 0
    assert "starting the engine on port 8999 (tiny-agent)" in engine.printed_before_start
    assert "engine ready after" in capsys.readouterr().out


def test_up_switches_the_running_engine_to_model_name_and_refuses_a_name_not_shipped(monkeypatch, capsys):
    import socket

    from fake_engine_server import use_fake_engine

    from helpers.engine.local import LocalEngine
    from helpers.core.settings import load_settings

    use_fake_engine(monkeypatch)  # the engine's server is tests/fake_engine_server.py: no vLLM
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        monkeypatch.setenv("WORKSHOP_PORT", str(sock.getsockname()[1]))
    engine = LocalEngine(load_settings())
    try:
        assert main(["up", "--timeout", "60"]) == 0
        assert engine.served_models() == ["tiny-agent"]
        monkeypatch.setenv("MODEL_NAME", "tiny-moe")
        assert main(["up", "--timeout", "60"]) == 0
        out = capsys.readouterr().out
        assert "serving 'tiny-moe'" in out and "already running" not in out and engine.served_models() == ["tiny-moe"]
        monkeypatch.setenv("MODEL_NAME", "no-such-model")
        assert main(["up", "--timeout", "60"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: Model 'no-such-model' is neither a model shipped in models/ (tiny-agent")
        assert err.count("\n") == 1 and engine.served_models() == ["tiny-moe"]
    finally:
        engine.stop()


def test_any_error_for_a_person_is_one_line_from_the_cli(monkeypatch, capsys):
    from helpers.hardware.gpus import UnknownGPUError

    def failing(args):
        raise UnknownGPUError("No GPU named 'H900': choose one of H100, L4 (workshop gpus lists them)")

    monkeypatch.setattr(cli, "cmd_status", failing)
    assert main(["status"]) == 2
    err = capsys.readouterr().err
    assert err == "error: No GPU named 'H900': choose one of H100, L4 (workshop gpus lists them)\n"
