"""Loaded by every Python process of a vLLM server started with the speculative-sampling fix switched on
(helpers/engine/spec_sampling_fix.py); it then runs the next ``sitecustomize`` on the path, as one on it would have run."""

import os

from helpers.engine.spec_sampling_fix import FIX_VARIABLE, install_on_import, run_next_sitecustomize

if os.environ.get(FIX_VARIABLE) == "1":
    install_on_import()
run_next_sitecustomize(os.path.dirname(os.path.abspath(__file__)))
