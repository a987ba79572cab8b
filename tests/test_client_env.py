"""The client install, as a notebook pod gets it: install/install.py puts the `client` profile into a
fresh virtualenv, which must hold no vLLM, import every helper module a notebook imports, and run notebooks
01-04 against a real engine reached only through VLLM_HOST (the engine runs from the suite's full environment).

The install reuses pip's cache: 75 s on a quiet 2-core machine, 170 s beside a running suite (`make test` runs the
tests without an engine, and so this install, beside the engine tests); the engine and
the notebooks add about a minute and a half. An endpoint run elsewhere (VLLM_HOST without the cluster profile)
keeps its flags and model: 03 and 04 measure what it runs and say what they could not change from here.
"""

from __future__ import annotations

import ast
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from helpers.lab.notebooks import REPO_ROOT, workshop_notebooks
from helpers.core.settings import CONTRACT_VARIABLES

INSTALL = REPO_ROOT / "install" / "install.py"


def notebook_helper_modules() -> list[str]:
    """Every ``helpers`` module the numbered notebooks import (``import helpers.x.y``, ``from helpers.x import y``)."""
    modules = set()
    for path in workshop_notebooks():
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "code":
                continue
            source = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Import):
                    modules.update(a.name for a in node.names if a.name.split(".")[0] == "helpers")
                elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "helpers":
                    modules.add(node.module)
                    base = REPO_ROOT.joinpath(*node.module.split("."))  # from helpers.lessons import plots
                    modules.update(f"{node.module}.{a.name}" for a in node.names
                                   if (base / f"{a.name}.py").is_file() or (base / a.name / "__init__.py").is_file())
    return sorted(modules)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CONTRACT_VARIABLES and k != "VIRTUAL_ENV"}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if Path(p).resolve() != Path(sys.executable).parent.resolve())
    return {**env, **extra}


SUITE_VENVS = Path(tempfile.gettempdir())  # client-venv-<suite>: one install for both runs of `make test`
OLD_VENV_S = 24 * 3600


@pytest.fixture(scope="module")
def client_python(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Path]:
    """The client install in a fresh virtualenv. Under `make test` (WORKSHOP_TEST_SUITE) both runs use one install:
    they run at once, so a lock beside it makes the second wait while the first installs; the engine run removes it
    when it is done, unless the other run is still using it. A lone pytest run installs it in its temporary folder."""
    suite = os.environ.get("WORKSHOP_TEST_SUITE")
    venv = SUITE_VENVS / f"client-venv-{suite}" if suite else tmp_path_factory.mktemp("client-venv")
    python, installed = venv / "bin" / "python", venv / ".installed-client"
    for old in SUITE_VENVS.glob("client-venv-suite-*"):  # a suite whose engine run never came
        if old != venv and old.suffix != ".lock" and time.time() - old.stat().st_mtime > OLD_VENV_S:
            shutil.rmtree(old, ignore_errors=True)
            old.with_name(old.name + ".lock").unlink(missing_ok=True)
    lock_path = venv.with_name(venv.name + ".lock")
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the suite's other run may be installing it: wait for it
        if not installed.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=120)
            # PIP_NO_COMPILE: no .pyc files written for torch's thousands of modules, a shorter install
            done = subprocess.run([str(python), str(INSTALL), "--profile", "client"], capture_output=True,
                                  text=True, timeout=900, env=_clean_env(PIP_NO_COMPILE="1"))
            assert done.returncode == 0, f"install.py client failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            assert "installed the client profile" in done.stdout and "vLLM absent" in done.stdout
            installed.touch()
        fcntl.flock(lock, fcntl.LOCK_SH)  # in use: the other run may use it too, but not remove it
        yield python
        if suite and any(item.get_closest_marker("engine") and "client_python" in item.fixturenames
                         for item in request.session.items):  # the engine run, the last of the suite to need it
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # the other run still uses it: left for the next suite's clean-up (OLD_VENV_S)
            shutil.rmtree(venv, ignore_errors=True)
            lock_path.unlink(missing_ok=True)


def test_the_install_script_refuses_bad_input_with_what_to_do(tmp_path):
    cases = [(["--profile", "tpu"], 2, "invalid choice: 'tpu'"),
             (["--profile", "client", "--source", str(tmp_path)], 2, "give the workshop repository's folder"),
             ([], 2, "the following arguments are required: --profile")]
    for args, code, message in cases:
        done = subprocess.run([sys.executable, str(INSTALL), *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == code and message in done.stderr, (args, done.stderr)


def test_the_notebooks_import_helper_modules_that_this_test_finds():
    found = notebook_helper_modules()
    assert {"helpers.engine.session", "helpers.lessons.l01_connect", "helpers.lessons.l03", "helpers.lessons.l03.attention"} <= set(found)


def test_client_env_has_no_vllm_and_imports_every_helper_module_a_notebook_uses(client_python):
    modules = [*notebook_helper_modules(), "helpers.cli.main"]  # the workshop command, too
    probe = ("import importlib, importlib.util, sys\n"
             f"for name in {modules!r}:\n"
             "    importlib.import_module(name)\n"
             "assert importlib.util.find_spec('vllm') is None, 'vllm is installed'\n"
             "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'vllm')\n"
             "assert not loaded, f'importing the helpers loaded {loaded}'\n"
             "import torch, transformers\n"
             "assert torch.version.cuda is None, torch.__version__\n"
             "print('ok')\n")
    done = subprocess.run([str(client_python), "-c", probe], capture_output=True, text=True, timeout=300,
                          env=_clean_env(), cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    listed = subprocess.run([str(client_python), "-m", "pip", "list", "--format=freeze"], capture_output=True,
                            text=True, timeout=120, check=True).stdout.lower()
    assert "vllm" not in listed and "jupyterlab==" not in listed


@pytest.fixture(scope="module")
def engine_url(shared_engine):
    """The suite's shared engine (tests/conftest.py), run from the suite's full environment on the default
    configuration: the notebooks only read from it through VLLM_HOST, which changes neither its flags nor its model."""
    with shared_engine.use() as lab:
        yield lab.settings.base_url


@pytest.mark.engine
def test_notebooks_01_to_04_run_in_the_client_env_through_vllm_host(client_python, engine_url, tmp_path):
    out = tmp_path / "executed"
    done = subprocess.run([str(client_python.parent / "workshop"), "run",
                           str(REPO_ROOT / "notebooks" / "01_connect_and_first_agent.ipynb"),
                           str(REPO_ROOT / "notebooks" / "02_units_and_memory_budget.ipynb"),
                           str(REPO_ROOT / "notebooks" / "03_prefill_decode_kv_cache.ipynb"),
                           str(REPO_ROOT / "notebooks" / "04_dense_vs_moe.ipynb"),
                           "-p", "STREAM_MAX_TOKENS=32", "-p", "PROMPT_LENGTHS=[64, 1024]", "-p", "REPEATS=2",
                           "-p", "NAIVE_NEW_TOKENS=32", "-p", "BATCHES=[1, 4]", "-p", "OUTPUT_LEN=64", "--out", str(out)],
                          capture_output=True, text=True, timeout=1200, cwd=tmp_path,
                          env=_clean_env(VLLM_HOST=engine_url, WORKSHOP_STATE_DIR=str(tmp_path / "state")))
    assert done.returncode == 0, done.stderr[-4000:]
    nb = nbformat.read(out / "01_connect_and_first_agent.ipynb", as_version=4)
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert f"'endpoint': '{engine_url}'" in text or engine_url in text
    assert "tool call parsed by vLLM: {'name': 'get_weather', 'arguments': {'city': 'Paris'}}" in text
    # 02 reads vLLM's own KV figures from /metrics; the exact prediction needs the engine's flags, not known here
    nb = nbformat.read(out / "02_units_and_memory_budget.ipynb", as_version=4)
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "No exact check here: this endpoint is not an engine the helpers started" in text
    # 03 and 04 measure what the endpoint runs and say what they could not change from here
    printed = {name: "\n".join(o.get("text", "") for c in nbformat.read(out / name, as_version=4).cells
                               if c.cell_type == "code" for o in c.outputs)
               for name in ("03_prefill_decode_kv_cache.ipynb", "04_dense_vs_moe.ipynb")}
    assert f"measuring only max-num-batched-tokens default: {engine_url} is run elsewhere" in printed["03_prefill_decode_kv_cache.ipynb"]
    assert "engine back on the flags it had before the stall section: True" in printed["03_prefill_decode_kv_cache.ipynb"]
    assert f"measuring only tiny-agent: {engine_url} is run elsewhere" in printed["04_dense_vs_moe.ipynb"]
    assert "tiny-moe was not measured (see above)" in printed["04_dense_vs_moe.ipynb"]
