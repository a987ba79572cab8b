"""The AVX2-only path, exercised on any x86 machine: ``WORKSHOP_CPU_ISA=avx2`` makes the probe and the
real vLLM server answer as an AVX2-only CPU does (helpers/hardware/forced_isa.py), so what fails there fails here,
and the kit must say so and go on.

An AVX2-only EPYC showed: the W4A16 and GPTQ-int4 variants start and then fail their first request
(``cpu_gemm_wna16`` missing from vLLM's AVX2 library), and ``--kv-cache-dtype fp8`` fails at start-up.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from helpers.engine.interface import EngineStartError
from helpers.core.vllm_args import flag_value
from helpers.lab.notebooks import REPO_ROOT, run_notebook
from helpers.engine.session import connect
from helpers.core.settings import CONTRACT_VARIABLES, load_settings

pytestmark = pytest.mark.engine
PORT = os.environ.get("WORKSHOP_FORCED_TEST_PORT", "8768")

if os.uname().machine not in ("x86_64", "AMD64"):
    pytest.skip("forcing an x86 CPU kind needs an x86-64 machine", allow_module_level=True)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    # An engine of its own, not the suite's shared one: it runs as another CPU kind (WORKSHOP_CPU_ISA=avx2).
    saved = dict(os.environ)
    for name in CONTRACT_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(WORKSHOP_PORT=PORT, WORKSHOP_STATE_DIR=str(tmp_path_factory.mktemp("forced-avx2")),
                      WORKSHOP_CPU_ISA="avx2")
    lab = connect(load_settings())
    yield lab
    lab.engine.stop()
    os.environ.clear()
    os.environ.update(saved)


def _mapped_libraries(pid: int) -> set[str]:
    """vLLM kernel libraries mapped by any process of the engine's session."""
    found = set()
    session = os.getsid(pid)
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if os.getsid(int(proc.name)) != session:
                continue
            found |= set(re.findall(r"vllm/(_C\w*)\.abi3\.so", (proc / "maps").read_text()))
        except (OSError, ProcessLookupError):
            continue
    return found


def test_the_engine_runs_vllms_avx2_library(lab):
    assert lab.chat([{"role": "user", "content": "hi"}], max_tokens=4).usage.completion_tokens > 0
    libraries = _mapped_libraries(lab.engine.pid)
    assert "_C_AVX2" in libraries and "_C_AVX512" not in libraries, libraries


def test_a_variant_that_starts_but_cannot_generate_is_rolled_back(lab):
    with pytest.raises(EngineStartError) as info:
        lab.engine.switch_model("tiny-agent-w4a16")
    message = str(info.value)
    assert "could not generate a token (HTTP 500" in message and "back on the last good" in message
    assert "cpu_gemm_wna16" in message  # the root cause, from the engine's log
    assert lab.model == "tiny-agent" and lab.chat([{"role": "user", "content": "hi"}], max_tokens=4).choices


def test_fp8_kv_cache_is_refused_and_rolled_back(lab):
    with pytest.raises(EngineStartError, match="FP8 KV cache on CPU requires x86 with AVX-512 or AMX"):
        lab.engine.set_flag("--kv-cache-dtype", "fp8")
    assert flag_value(lab.engine.args(), "--kv-cache-dtype") is None and lab.engine.is_ready()


def test_notebook_05_skips_what_this_cpu_lacks_and_still_compares_formats(lab, tmp_path):
    run = run_notebook(REPO_ROOT / "notebooks" / "05_quantization.ipynb", tmp_path,
                       # Without its AMX kernels vLLM computes FP8 weights through torch's reference FP8 matmul,
                       # about 0.5 tokens/s on the AMX test machine: the FP8 steps are left out here
                       parameters={"VARIANTS": ["tiny-agent-w8a8", "tiny-agent-w4a16"], "CONCURRENCIES": [1, 4],
                                   "NUM_REQUESTS": 4, "EVAL_SUITE": "smoke", "ONLINE_QUANTIZATION": None})
    import nbformat

    nb = nbformat.read(run.output, as_version=4)
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "AVX2 (forced by WORKSHOP_CPU_ISA=avx2)" in text
    assert re.search(r"- w4a16: skipped\. This step needs x86 with AVX-512", text)
    assert re.search(r"- kv-cache fp8: skipped\. This step needs x86 with AVX-512 or AMX", text)
    # the formats this CPU serves are still compared with the baseline
    assert re.search(r"- w8a8: .*speed .*eval \d+\.\d% \(95% CI", text)
    assert lab.model == "tiny-agent" and flag_value(lab.engine.args(), "--kv-cache-dtype") is None
