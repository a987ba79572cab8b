"""The switch that applies vllm-project/vllm#55006 to the local engine (helpers/engine/spec_sampling_fix.py).

The isolated check of vllm-project/vllm#55005 runs against the installed vLLM, no engine: a float32 output filled
with NaN goes through the rejection sampler's real expand path (the CPU platform's kernel overrides registered, then
``expand_batch_to_tokens``'s ``_expand``) with temperatures [1.0, 1.2, 0.7]. In a fresh Python without the switch it
stays NaN (the bug); in one started with the site hook on its PYTHONPATH, as the local engine starts vLLM, it holds
each request's temperature once per token. A fresh process each time: the patch is applied at import, as in a server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

torch = pytest.importorskip("torch")

from helpers.engine import spec_sampling_fix  # noqa: E402
from helpers.engine.spec_sampling_fix import (FIX_ENV, FIX_VARIABLE, SITE_DIR, engine_environment,  # noqa: E402
                                              expand_at_caller_dtype, patch)

ISOLATED_CHECK = """
import json, torch
from vllm.platforms import current_platform
from vllm.triton_utils import HAS_TRITON
current_platform.register_triton_kernel_overrides()
from vllm.v1.sample import rejection_sampler
output = torch.full((6,), float("nan"))
rejection_sampler._expand(output, torch.tensor([1.0, 1.2, 0.7]), torch.tensor([2, 5, 6], dtype=torch.int32), 0, 1)
print(json.dumps({"has_triton": HAS_TRITON, "output": [None if v != v else round(v, 4) for v in output.tolist()]}))
"""
EXPECTED = [1.0, 1.0, 1.2, 1.2, 1.2, 0.7]


def _isolated_check(switched_on: bool) -> dict:
    pytest.importorskip("vllm")
    env = {k: v for k, v in os.environ.items() if k not in (FIX_VARIABLE, "PYTHONPATH")}
    if switched_on:
        env[FIX_VARIABLE] = "1"
    env.update(engine_environment(env))
    done = subprocess.run([sys.executable, "-c", ISOLATED_CHECK], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if found["has_triton"]:
        pytest.skip("this vLLM has a Triton backend for this machine: the CPU fallback of vllm#55005 never runs")
    return found


def test_the_isolated_check_fails_without_the_switch():
    found = _isolated_check(switched_on=False)
    assert found["output"] == [None] * 6, (
        f"the stock fallback wrote {found['output']}: the installed vLLM no longer discards expand_kernel's output "
        "(vllm#55006 may have landed); the switch and notebook 06's stock-vs-fixed pair are then no longer needed")


def test_the_isolated_check_passes_with_the_switch():
    assert _isolated_check(switched_on=True)["output"] == EXPECTED


def test_the_switch_is_off_unless_the_engines_environment_turns_it_on():
    assert engine_environment({}) == {} and engine_environment({FIX_VARIABLE: "0"}) == {}
    env = engine_environment({**dict(FIX_ENV), "PYTHONPATH": "/somewhere"})
    assert env == {"PYTHONPATH": f"{SITE_DIR}:/somewhere"}
    assert (SITE_DIR / "sitecustomize.py").is_file()


def test_no_lesson_but_06_switches_the_fix_on():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    users = sorted(p.relative_to(root).as_posix() for folder in ("helpers", "notebooks") for p in (root / folder).rglob("*")
                   if p.suffix in (".py", ".ipynb") and "spec_sampling_fix" not in p.as_posix()
                   and ("FIX_ENV" in p.read_text() or FIX_VARIABLE in p.read_text()))
    assert all("l06" in user or "06_" in user for user in users), users


def test_the_fixed_expand_writes_at_the_callers_dtype_like_the_triton_kernel():
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    temperature = torch.full((6,), float("nan"))
    expand_at_caller_dtype(temperature, torch.tensor([1.0, 0.0, 0.7]), cu, 0, 1)  # greedy's 0 becomes 1
    assert temperature.tolist() == pytest.approx([1.0, 1.0, 1.0, 1.0, 1.0, 0.7])
    top_k = torch.zeros(6, dtype=torch.int32)
    expand_at_caller_dtype(top_k, torch.tensor([5, 40, 1], dtype=torch.int32), cu, 0, 0)
    assert top_k.tolist() == [5, 5, 40, 40, 40, 1] and top_k.dtype == torch.int32
    longer = torch.full((8,), -1.0)  # only the requests' tokens are written
    expand_at_caller_dtype(longer, torch.tensor([0.5, 0.9, 0.3]), cu, 0, 0)
    assert longer.tolist()[6:] == [-1.0, -1.0]


def test_the_patch_replaces_one_function_and_refuses_another_vllm():
    module = types.SimpleNamespace(__name__="vllm.utils.cpu_triton_utils", _expand_kernel_impl=None, other=print)
    patch(module)
    assert module._expand_kernel_impl is expand_at_caller_dtype and module.other is print
    with pytest.raises(RuntimeError, match=f"unset {FIX_VARIABLE}"):
        patch(types.SimpleNamespace(__name__="vllm.utils.cpu_triton_utils"))


def test_the_site_hook_patches_on_import_and_runs_the_next_sitecustomize(tmp_path):
    """With another site folder behind it (the forced CPU kind's), both hooks run in the server's processes."""
    other = tmp_path / "other_site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITE_RAN'] = '1'\n")
    fake = tmp_path / "fakes" / "vllm" / "utils"
    fake.mkdir(parents=True)
    for folder in (fake.parent, fake):
        (folder / "__init__.py").write_text("")
    (fake / "cpu_triton_utils.py").write_text("def _expand_kernel_impl(*args):\n    return 'stock'\n")
    probe = ("import os, vllm.utils.cpu_triton_utils as m; "
             "print(m._expand_kernel_impl.__name__, os.environ.get('OTHER_SITE_RAN'))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({FIX_VARIABLE: "1", "PYTHONPATH": f"{other}:{tmp_path / 'fakes'}"})
    env.update(engine_environment(env))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60,
                          cwd=tmp_path)
    assert done.stdout.split() == ["expand_at_caller_dtype", "1"], done.stderr[-2000:]
    env[FIX_VARIABLE] = "0"  # the folder alone on the path patches nothing
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60,
                          cwd=tmp_path)
    assert done.stdout.split() == ["_expand_kernel_impl", "1"], done.stderr[-2000:]
    assert spec_sampling_fix.PATCHED_MODULE == "vllm.utils.cpu_triton_utils"
