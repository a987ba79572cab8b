#!/usr/bin/env bash
# Create the quantize environment (build/quantize-venv) if needed, then rebuild the quantized variants
# of models/tiny-agent into models/. Extra arguments go to quantize_tiny.py (e.g. --only w8a8).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${QUANTIZE_VENV:-build/quantize-venv}"
if [ ! -f "$VENV/.installed" ] || [ quantize/requirements.txt -nt "$VENV/.installed" ]; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -r quantize/requirements.txt
    "$VENV/bin/pip" install --no-deps -e .   # helpers.tiny.corpus renders the calibration conversations
    touch "$VENV/.installed"
fi
"$VENV/bin/python" quantize/quantize_tiny.py --source models/tiny-agent --out-root models "$@"
