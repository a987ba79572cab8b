"""A wheel of the helpers works away from the clone, with only its core dependencies.

The wheel is built from a copy of the working tree (``pip wheel --no-deps``: what ``pip install .`` and
``pip install git+URL`` build), installed with its core dependencies (pinned by requirements-client.txt) into a
fresh virtualenv, and run from an empty folder: the kit's notebooks, manifests and models travel inside it
(helpers/kit/), what it writes goes to the current folder, and a command that needs a package of an extra says
in one line what to install. The build and the install take about 15 s on a quiet 2-core machine; the wheel's
size is printed (pytest -s) for the notes. The checkout tests at the end need no build.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from helpers.cli import main as cli
from helpers.hardware import forced_isa
from helpers.core import kit_paths, settings
from helpers.lab import notebooks, workspace
from helpers.cluster import overlays

REPO = Path(__file__).resolve().parent.parent
# What a build leaves in a tree, and the environments beside it: not copied (pip builds in the copy, not here)
NOT_COPIED = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                    ".ruff_cache", ".ipynb_checkpoints", "my-notebooks")
CLIENT_PACKAGES = ("httpx", "openai", "pandas", "numpy", "nbformat", "vllm", "jupyterlab")  # none in the core install


@dataclass(frozen=True)
class Install:
    """A virtualenv holding the wheel and its core dependencies, and an empty folder to run from."""

    bin: Path
    site_packages: Path
    work: Path

    def workshop(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
        """``workshop ARGS`` as a learner runs it: from an empty folder, nothing of the checkout in reach."""
        return subprocess.run([str(self.bin / "workshop"), *args], capture_output=True, text=True, timeout=120,
                              cwd=cwd or self.work, env=_clean_env(self.bin))


def _clean_env(venv_bin: Path) -> dict[str, str]:
    """This environment without the checkout's venv, its PYTHONPATH or the workshop's own variables."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", *settings.CONTRACT_VARIABLES)
           and not k.startswith("WORKSHOP_")}
    here = Path(sys.executable).parent.resolve()
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() != here]
    return {**env, "PATH": os.pathsep.join([str(venv_bin), *path])}


def _tracked_files(folder: Path) -> list[Path]:
    """The files of a kit folder as they ship: no hidden files, no caches."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix != ".pyc" and not any(part.startswith(".") for part in p.relative_to(folder).parts))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of this tree (so the build writes no build/ or .egg-info into the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    shutil.copytree(REPO, tmp / "src", ignore=NOT_COPIED)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(tmp / "dist"),
                            str(tmp / "src")], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-3000:]
    [path] = (tmp / "dist").glob("workshop_helpers-*.whl")
    print(f"\n{path.name}: {path.stat().st_size / 1e6:.1f} MB")  # a figure for the notes, not asserted
    return path


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Install:
    """The wheel in a fresh virtualenv with its core dependencies only (pip as this machine configures it)."""
    tmp = tmp_path_factory.mktemp("wheel-venv")
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True, timeout=120)
    venv_bin = tmp / "venv" / "bin"
    done = subprocess.run([str(venv_bin / "python"), "-m", "pip", "install", "--disable-pip-version-check",
                           "--constraint", str(REPO / "requirements-client.txt"), str(wheel)],
                          capture_output=True, text=True, timeout=600, env=_clean_env(venv_bin))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    probe = subprocess.run([str(venv_bin / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                           capture_output=True, text=True, check=True, env=_clean_env(venv_bin))
    (tmp / "work").mkdir()
    return Install(venv_bin, Path(probe.stdout.strip()).resolve(), tmp / "work")


def test_the_helpers_run_from_the_venv_with_their_data_inside_and_no_extra(installed):
    probe = ("import importlib.util, helpers, helpers.core.kit_paths as k\n"
             "print(helpers.__file__); print(k.kit_root()); print(k.work_root())\n"
             f"print(sorted(m for m in {CLIENT_PACKAGES!r} if importlib.util.find_spec(m)))\n")
    done = subprocess.run([str(installed.bin / "python"), "-c", probe], capture_output=True, text=True, timeout=60,
                          cwd=installed.work, env=_clean_env(installed.bin))
    assert done.returncode == 0, done.stderr[-3000:]
    package, kit_root, work_root, extras = done.stdout.splitlines()
    assert Path(package).resolve() == installed.site_packages / "helpers" / "__init__.py", "imported from the checkout"
    assert Path(kit_root).resolve() == installed.site_packages / "helpers" / "kit"
    assert work_root == ".", "a wheel install writes into the current folder, not into site-packages"
    assert extras == "[]", f"the core install must bring no package of an extra: {extras}"


def test_help_lists_every_subcommand(installed):
    done = installed.workshop("--help")
    assert done.returncode == 0, done.stderr
    [subparsers] = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    listed = re.search(r"\{([a-z,-]+)\}", done.stdout)
    assert listed and listed.group(1).split(",") == list(subparsers.choices), done.stdout[:1000]


def test_provision_dry_run_renders_overlays_on_the_manifests_in_the_wheel(installed):
    done = installed.workshop("provision", "--participants", "2", "--dry-run", "--out", "workshop",
                              "--model-nfs", "10.0.0.5:/workshop-models", "--kube-api", "10.0.0.2/32:6443")
    assert done.returncode == 0, done.stderr
    assert "rendered 2 overlays in workshop (ws-01 ... ws-02)" in done.stdout and "kubectl apply" in done.stdout
    overlay = installed.work / "workshop" / "ws-01"
    base = yaml.safe_load((overlay / "kustomization.yaml").read_text())["resources"][0]
    assert (overlay / base).resolve() == installed.site_packages / "helpers" / "kit" / "k8s" / "base"
    assert (overlay / base / "vllm.yaml").is_file()
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl (its built-in kustomize) is not installed: the overlay was checked, not built")
    built = subprocess.run(["kubectl", "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    kinds = {(d["kind"], d["metadata"].get("namespace")) for d in yaml.safe_load_all(built.stdout) if d}
    assert {("Deployment", "ws-01"), ("Namespace", None)} <= kinds


def test_notebooks_copies_the_lessons_into_the_folder_given_and_by_default_into_the_current_one(installed):
    lessons = sorted(p.name for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")) + [workspace.START_HERE]
    done = installed.workshop("notebooks", "--dir", "mine")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (installed.work / "mine").glob("*.ipynb")) == sorted(lessons)
    assert all((installed.work / "mine" / name).stat().st_size > 0 for name in lessons)
    assert installed.workshop("notebooks").returncode == 0
    assert sorted(p.name for p in (installed.work / "my-notebooks").glob("*.ipynb")) == sorted(lessons)
    assert not (installed.site_packages / "my-notebooks").exists()


def test_memory_and_gpus_print_their_tables(installed):
    model = installed.site_packages / "helpers" / "kit" / "models" / "tiny-agent"
    done = installed.workshop("memory", str(model), "--gpu", "L4")
    assert done.returncode == 0, done.stderr
    assert "parameters" in done.stdout and "B/token" in done.stdout and "KV blocks" in done.stdout
    done = installed.workshop("gpus")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("GPU") and "H100" in done.stdout and "source:" in done.stdout


@pytest.mark.parametrize("argv, module, extra", [
    (["status"], "httpx", "client"),
    (["eval", "--suite", "smoke"], "pandas", "client"),
    (["run"], "nbformat", "client"),
    (["up"], "vllm", "cpu"),
    (["lab", "--no-browser"], "jupyterlab", "cpu"),
])
def test_a_command_without_its_packages_says_in_one_line_what_to_install(installed, argv, module, extra):
    done = installed.workshop(*argv)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"error: workshop {argv[0]} needs {module}, which is not installed: ")
    assert len(done.stderr.splitlines()) == 1 and f'pip install "workshop-helpers[{extra}]"' in done.stderr


def test_the_wheel_holds_every_package_and_the_kits_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = [p.parent for p in (REPO / "helpers").rglob("__init__.py") if "__pycache__" not in p.parts]
    modules = [p for package in packages for p in package.glob("*.py")]
    expected = {p.relative_to(REPO).as_posix() for p in modules}
    expected |= {p.relative_to(REPO).as_posix() for p in _tracked_files(REPO / "helpers" / "data")}
    expected |= {p.relative_to(REPO).as_posix() for p in _tracked_files(REPO / "helpers" / "hardware" / "forced_isa_site")}
    for folder in kit_paths.KIT_FOLDERS:
        shipped = REPO / folder
        expected |= {f"helpers/kit/{folder}/{p.relative_to(shipped).as_posix()}" for p in _tracked_files(shipped)}
    assert sorted(expected - names) == []
    assert "helpers/hardware/forced_isa_site/sitecustomize.py" in names and "helpers/kit/k8s/base/vllm.yaml" in names
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"helpers"}, \
        "the wheel installs nothing beside the helpers package (no top-level notebooks/ or k8s/ in site-packages)"


# ---------------------------------------------------------------- the checkout (no build)

def test_every_folder_of_modules_is_a_package_that_setup_py_finds():
    """setup.py finds packages (a folder with an __init__.py): a folder of modules without one would be left out."""
    from setuptools import find_packages

    folders = {p.parent for p in (REPO / "helpers").rglob("*.py") if "__pycache__" not in p.parts
               and "forced_isa_site" not in p.parts}  # forced_isa_site: package data, put on a server's PYTHONPATH
    assert sorted(str(f.relative_to(REPO)) for f in folders if not (f / "__init__.py").is_file()) == []
    found = set(find_packages(where=str(REPO), include=["helpers", "helpers.*"]))
    assert found == {".".join(f.relative_to(REPO).parts) for f in folders}
    setup_py = (REPO / "setup.py").read_text()
    assert all(f'"{name}"' in setup_py for name in kit_paths.KIT_FOLDERS), "setup.py maps every kit folder"


def test_a_clone_uses_its_own_folders(monkeypatch):
    monkeypatch.delenv("WORKSHOP_MODELS_DIR", raising=False)
    assert kit_paths.checkout_root() == REPO and kit_paths.work_root() == REPO
    assert notebooks.NOTEBOOK_DIR == workspace.NOTEBOOK_DIR == REPO / "notebooks"
    assert notebooks.DEFAULT_OUT == REPO / "build" / "executed"
    assert workspace.DEFAULT_WORKSPACE == REPO / "my-notebooks"
    assert overlays.K8S_DIR == REPO / "k8s" and settings.models_dir() == REPO / "models"
    assert (forced_isa.SITE_DIR / "sitecustomize.py").is_file() and (workspace.JUPYTERLAB_SETTINGS).is_dir()


def test_a_missing_kit_folder_is_one_line_that_says_how_to_get_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(workspace, "lesson_files", lambda source: [])  # as in a wheel built without them
    assert cli.main(["notebooks", "--dir", str(tmp_path / "ws")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "has no notebooks/ folder" in err and "every notebook is current" not in err
    monkeypatch.setattr(overlays, "K8S_DIR", tmp_path / "nothing")
    assert cli.main(["provision", "--participants", "1", "--dry-run", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"has no k8s/ folder (looked in {tmp_path / 'nothing'})" in err
    assert not (tmp_path / "out").exists()


def test_a_missing_package_is_a_hint_and_a_missing_helper_module_a_traceback(monkeypatch, capsys):
    def needs(name: str):
        def command(args):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return command

    monkeypatch.setattr(cli, "cmd_machine", needs("psutil"))  # build_parser takes the handler when it runs
    assert cli.main(["machine"]) == 2
    assert capsys.readouterr().err == ("error: workshop machine needs psutil, which is not installed: "
                                       f"{cli.install_hint('psutil')}\n")
    monkeypatch.setattr(cli, "cmd_machine", needs("helpers.nothing"))  # a bug of the helpers: shown in full
    with pytest.raises(ModuleNotFoundError):
        cli.main(["machine"])
