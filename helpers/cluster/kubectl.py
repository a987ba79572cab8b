"""Running kubectl: one invocation's result, the default runner, and the errors that say what to check.

Everything that talks to a cluster (``helpers.cluster.namespaces``, ``helpers.engine.k8s``) builds a command
and runs it through one ``runner`` (``run_kubectl`` when None; tests pass a recorded fake). ``kubectl``
returns stdout, or raises a ``ProvisionError`` whose message says what to do next.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable, Sequence

from helpers.core.errors import WorkshopError

KUBECTL_TIMEOUT_S = 300.0


class ProvisionError(WorkshopError, RuntimeError):
    """Provisioning cannot go on; the message says what to do next."""


class KubectlNotFound(ProvisionError):
    """kubectl is not on PATH."""


class ClusterUnreachable(ProvisionError):
    """kubectl runs but finds no cluster (no kubeconfig, wrong context, network)."""


@dataclass(frozen=True)
class CommandResult:
    """What one kubectl invocation returned."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str]], CommandResult]


def run_kubectl(args: Sequence[str]) -> CommandResult:
    """Run ``kubectl ARGS`` and capture its output (the default runner)."""
    exe = shutil.which("kubectl")
    if exe is None:
        raise KubectlNotFound("kubectl is not installed or not on PATH: install it (the Kubernetes docs list "
                              "packages for every OS), then check `kubectl cluster-info` reaches your cluster.")
    try:
        proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=KUBECTL_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise ClusterUnreachable(f"kubectl {' '.join(args[:2])} did not answer within {KUBECTL_TIMEOUT_S:.0f} s: "
                                 "check `kubectl cluster-info`.") from None
    return CommandResult(tuple(args), proc.returncode, proc.stdout, proc.stderr)


_UNREACHABLE = re.compile(r"(unable to connect to the server|connection to the server .* was refused|"
                          r"couldn't get current server api group list|no configuration has been provided|"
                          r"dial tcp|no such host|i/o timeout|context deadline exceeded|"
                          r"current-context is not set|context was not found)", re.IGNORECASE)


def kubectl(args: Sequence[str], runner: Runner | None = None) -> str:
    """Run kubectl through ``runner`` (default run_kubectl); return stdout, or raise a ProvisionError."""
    result = (runner or run_kubectl)(list(args))
    if result.returncode == 0:
        return result.stdout
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    last = lines[-1] if lines else f"exit code {result.returncode}"
    if _UNREACHABLE.search(result.stderr):
        raise ClusterUnreachable(f"No Kubernetes cluster reachable ({last.strip()}). Check `kubectl config "
                                 "current-context` and `kubectl cluster-info`, or set KUBECONFIG.")
    raise ProvisionError(f"kubectl {' '.join(args[:2])} failed: {last.strip()}")
