#!/usr/bin/env bash
# Arize Phoenix, the trace store of helpers/engine/trace_store.py, in its own environment:
#
#     bash install/phoenix.sh [TARGET]        (default TARGET: .venv-phoenix in the clone)
#
# It makes TARGET with PYTHON (default python3; Phoenix takes 3.10 to 3.13) and installs requirements-phoenix.txt,
# every package pinned. Apart from the workshop's environment on purpose: vLLM pins fastapi and starlette, and Phoenix
# needs others. Run again, it only checks the pins. Once installed, Phoenix needs no network: it serves its UI, its
# REST API and OTLP on 127.0.0.1 only. The helpers find it at .venv-phoenix/bin/phoenix (or WORKSHOP_PHOENIX).
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET="${1:-.venv-phoenix}"
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(not ((3, 10) <= sys.version_info[:2] <= (3, 13)))'; then
    echo "install/phoenix.sh: Phoenix needs Python 3.10 to 3.13; $PYTHON is $("$PYTHON" --version 2>&1)." \
         "Run it with PYTHON=python3.11 (or another in that range)." >&2
    exit 1
fi
if [ ! -x "$TARGET/bin/python" ]; then
    "$PYTHON" -m venv "$TARGET"
fi
echo '*' > "$TARGET/.gitignore"  # the environment is never committed
"$TARGET/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements-phoenix.txt
"$TARGET/bin/phoenix" --help >/dev/null
echo "Phoenix $("$TARGET/bin/python" -c 'import importlib.metadata as m; print(m.version("arize-phoenix"))') is in $TARGET"
