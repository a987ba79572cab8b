"""The core path's restarts on a GPU (issue 26): notebooks 05 and 06 at their gpu/k8s default parameters, driven
through a recording engine (tests/fakes.py), restart it at most 3 times; on the CPU profile they run the rest."""

from __future__ import annotations

from types import SimpleNamespace

import nbformat
import pytest

from fakes import RecordingEngine
from helpers.core.settings import load_settings
from helpers.core.vllm_args import EngineConfig
from helpers.lab.notebooks import NOTEBOOK_DIR, parameters_cell_index

K8S_ENV = {"WORKSHOP_PROFILE": "k8s", "VLLM_HOST": "http://vllm-engine:8000/v1", "NAMESPACE": "ws-01",
           "WORKSHOP_GPU": "L4"}


def _parameters(name: str, env: dict[str, str], monkeypatch) -> dict:
    for key in ("WORKSHOP_PROFILE", "VLLM_HOST", "NAMESPACE", "WORKSHOP_GPU", "WORKSHOP_EXTRA_MODELS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    values: dict = {}
    exec(compile(nb.cells[parameters_cell_index(nb)].source, name, "exec"), values)  # noqa: S102 - the shipped cell
    return values


def _lab(env: dict[str, str], model: str) -> SimpleNamespace:
    settings = load_settings(env)
    engine = RecordingEngine(EngineConfig(model=model, served_name=model, args=("--max-model-len", "8192")))
    engine.settings = settings
    lab = SimpleNamespace(settings=settings, engine=engine)
    lab.model = model
    return lab


def _follow_the_model(lab: SimpleNamespace) -> None:
    """Lab.model follows the engine's served name, as helpers.engine.session.Lab does."""
    original = lab.engine.apply

    def apply(config, timeout_s=None):
        original(config, timeout_s)
        lab.model = config.served_name
    lab.engine.apply = apply


@pytest.mark.parametrize("env, most", [(K8S_ENV, 3), ({}, None)], ids=["k8s", "cpu"])
def test_notebook_05_core_path_restarts(env, most, monkeypatch, capsys):
    from helpers.lessons import l05_quantization as l05

    params = _parameters("05_quantization.ipynb", env, monkeypatch)
    lab = _lab(env, params["BASELINE"])
    _follow_the_model(lab)
    study = l05.QuantizationStudy(lab, params["BASELINE"], "smoke", [1], 8, 8, 1, 600)
    monkeypatch.setattr(study, "measure", lambda name, model: ({}, None))
    monkeypatch.setattr(study, "too_slow", lambda name: False)
    monkeypatch.setattr(study, "_judge", lambda name, run: None)
    monkeypatch.setattr(l05, "startup_kv", lambda lab: {})
    monkeypatch.setattr(l05, "skip_reason", lambda *a, **k: None)
    study.measure_checkpoints(params["VARIANTS"], restore=False)
    study.measure_flags([("--quantization", params["ONLINE_QUANTIZATION"], "online"),
                         ("--kv-cache-dtype", params["KV_CACHE_DTYPE"], "kv")])
    restarts = len(lab.engine.applied)
    assert lab.engine.config() == study.baseline_config  # back on the baseline
    if most is not None:
        assert restarts <= most and [c.model for c in lab.engine.applied][0] == "RedHatAI/Qwen3-4B-FP8-dynamic"
    else:
        assert restarts == len(params["VARIANTS"]) + 3  # each checkpoint, the online option, the KV cache, back


@pytest.mark.parametrize("env, most", [(K8S_ENV, 3), ({}, None)], ids=["k8s", "cpu"])
def test_notebook_06_core_path_restarts(env, most, monkeypatch, capsys, tmp_path):
    """The core path (the aligned draft against no speculation, one round) and the Go-deeper steps as the notebook
    calls them, at the k8s test's quick K_VALUES [1, 3] too: on k8s RUN_GO_DEEPER is False, so the method grid and
    the other k are loaded from the instructor's file (none here: one sentence) and restart nothing."""
    from helpers.lessons.l06 import (BASELINE, complete_rounds, draft_methods, measure_or_load, run_methods,
                                     spec_config)
    from helpers.lessons.l06 import runs as runs_module

    monkeypatch.setenv("WORKSHOP_RESULTS_DIR", str(tmp_path))
    params = _parameters("06_speculative_decoding.ipynb", env, monkeypatch)
    lab = _lab(env, "Qwen/Qwen3-4B" if env else "tiny-agent")
    k, go_deeper = params["NUM_SPECULATIVE_TOKENS"], params["RUN_GO_DEEPER"]
    names = (f"draft k={k}", "misaligned", "ngram")
    monkeypatch.setattr(runs_module, "measure_speculation",
                        lambda lab, name, concurrencies, *a, **kw: [{"config": name, "concurrency": concurrencies[0]}])
    core = {BASELINE: None, names[0]: spec_config("draft_model", k, model=params["DRAFT"])}
    runs, _ = run_methods(lab, core, [1], None, 1, 1)
    core_restarts = len(lab.engine.applied)
    methods = draft_methods(k, params["DRAFT"], params["MISALIGNED_DRAFT"], names, BASELINE)
    measure_or_load("06-methods", go_deeper, lab, lambda: complete_rounds(lab, methods, runs, [1], None,
                                                                          params["REPEATS"], 1), {})
    for k_values in (params["K_VALUES"], [1, 3]):  # the notebook's and the k8s test's
        others = {f"k={v}": spec_config("draft_model", v, model=params["DRAFT"]) for v in k_values if v != k}
        measure_or_load("06-k", go_deeper, lab, lambda: run_methods(lab, others, [1], None, 1, 1)[0], {})
    restarts = len(lab.engine.applied)
    assert lab.engine.config().args == ("--max-model-len", "8192")  # back without speculation
    if most is not None:
        assert core_restarts == restarts == 2 <= most and go_deeper is False
        out = capsys.readouterr().out
        assert "Not run: a misaligned draft" in out and out.count("Not run (RUN_GO_DEEPER is False): No results file") == 3
    else:
        assert core_restarts == 2 and go_deeper is True and len(methods) == 4  # the CPU runs the whole grid and every k
        # misaligned, ngram; a second round from there, reversed (misaligned, aligned, and the baseline it measures
        # last); k=1, k=5, back; k=1, back
        assert restarts == 2 + 2 + 3 + 3 + 2
