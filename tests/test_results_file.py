"""A measurement run once for the room (helpers/measure/results_file.py): written with its provenance, loaded with
it printed, refused when the model or GPU differs, missing or foreign files told apart."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pytest

from helpers.core.settings import load_settings
from helpers.measure.results_file import (Provenance, ResultsError, load_results, provenance, results_dir,
                                          write_results)

ROWS = pd.DataFrame({"config": ["no speculation", "draft k=3"], "output_tok_s": [410.5, 655.0]})
PROV = Provenance(model="Qwen/Qwen3-4B", gpu="L4", vllm_version="0.33.0", engine_image="vllm/vllm-openai:v0.33.0",
                  commit="abc1234", parameters={"REPEATS": 2}, measured_utc="2026-12-01 10:00 UTC")


def test_a_written_file_loads_with_its_provenance_printed(tmp_path, capsys):
    path = write_results("06-methods", ROWS, PROV, tmp_path)
    rows, prov = load_results("06-methods", "Qwen/Qwen3-4B", "L4", tmp_path)
    assert path == tmp_path / "06-methods.json" and prov == PROV
    pd.testing.assert_frame_equal(rows, ROWS)
    out = capsys.readouterr().out
    assert "measured 2026-12-01 10:00 UTC on L4 serving Qwen/Qwen3-4B, vLLM 0.33.0" in out and "REPEATS=2" in out


@pytest.mark.parametrize("model, gpu", [("Qwen/Qwen3-0.6B", "L4"), ("Qwen/Qwen3-4B", "H100 SXM")])
def test_a_file_from_another_model_or_gpu_is_refused_saying_what_to_do(tmp_path, model, gpu):
    write_results("06-methods", ROWS, PROV, tmp_path)
    with pytest.raises(ResultsError, match=rf"measured with Qwen/Qwen3-4B on L4, but your engine serves {model} on "
                                           rf"{gpu}: .* run this section yourself \(RUN_GO_DEEPER=True\)"):
        load_results("06-methods", model, gpu, tmp_path)


def test_a_missing_or_foreign_file_says_what_to_do(tmp_path):
    with pytest.raises(ResultsError, match="No results file .*ask your instructor"):
        load_results("nothing", "m", "L4", tmp_path)
    (tmp_path / "bad.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(ResultsError, match="not a results file this kit wrote"):
        load_results("bad", "m", "L4", tmp_path)
    write_results("old", ROWS, PROV, tmp_path)
    data = json.loads((tmp_path / "old.json").read_text())
    (tmp_path / "old.json").write_text(json.dumps({**data, "format": 0}))
    with pytest.raises(ResultsError, match="layout 0"):
        load_results("old", "Qwen/Qwen3-4B", "L4", tmp_path)


def test_the_provenance_names_the_engine_the_gpu_and_the_parameters(monkeypatch, tmp_path):
    monkeypatch.setenv("WORKSHOP_RESULTS_DIR", str(tmp_path))
    monkeypatch.setenv("WORKSHOP_ENGINE_IMAGE", "vllm/vllm-openai:v0.33.0")
    settings = load_settings({"VLLM_HOST": "http://127.0.0.1:1/v1", "WORKSHOP_GPU": "L4"})  # nothing answers there
    prov = provenance(SimpleNamespace(settings=settings, model="Qwen/Qwen3-4B"), {"K_VALUES": [3]})
    assert (prov.model, prov.gpu, prov.engine_image, prov.vllm_version) == ("Qwen/Qwen3-4B", "L4",
                                                                           "vllm/vllm-openai:v0.33.0", None)
    assert prov.parameters == {"K_VALUES": [3]} and results_dir() == tmp_path


# ---------------------------------------------------------------- a Go-deeper cell: measure and write, or load

from helpers.measure.results_file import main, measure_or_load  # noqa: E402


def _lab(model: str = "Qwen/Qwen3-4B", gpu: str = "L4") -> SimpleNamespace:
    return SimpleNamespace(settings=load_settings({"VLLM_HOST": "http://127.0.0.1:1/v1", "WORKSHOP_GPU": gpu}),
                           model=model)


def test_run_true_measures_and_writes_run_false_loads_it(tmp_path, capsys):
    measured = []
    rows = measure_or_load("06-methods", True, _lab(), lambda: measured.append(1) or ROWS, {"REPEATS": 2}, tmp_path)
    assert measured == [1] and (tmp_path / "06-methods.json").is_file()
    pd.testing.assert_frame_equal(rows, ROWS)
    loaded = measure_or_load("06-methods", False, _lab(), lambda: measured.append(2), {}, tmp_path)
    assert measured == [1]  # loading measures nothing
    pd.testing.assert_frame_equal(loaded, ROWS)
    out = capsys.readouterr().out
    assert "measured here and written to" in out and "serving Qwen/Qwen3-4B" in out and "the instructor's numbers" in out


@pytest.mark.parametrize("lab", [_lab(gpu="H100 SXM"), _lab(model="Qwen/Qwen3-0.6B")], ids=["another GPU", "another model"])
def test_a_file_from_elsewhere_is_refused_in_one_sentence_that_says_what_to_do(tmp_path, capsys, lab):
    write_results("06-methods", ROWS, PROV, tmp_path)
    assert measure_or_load("06-methods", False, lab, lambda: ROWS, {}, tmp_path) is None
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1 and out.count(": ") >= 2, out
    assert out.startswith("Not run (RUN_GO_DEEPER is False): ")
    assert f"but your engine serves {lab.model} on {lab.settings.gpu}" in out
    assert out.endswith(f"run this section yourself (RUN_GO_DEEPER=True) or ask your instructor for the file of "
                        f"{lab.model} on {lab.settings.gpu}.")


def test_no_file_says_how_to_get_one(tmp_path, capsys):
    assert measure_or_load("07-replicas", False, _lab(), lambda: ROWS, {}, tmp_path) is None
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1 and "No results file" in out and "RUN_GO_DEEPER=True" in out


def test_plain_python_lists_the_folder_and_each_files_provenance(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("WORKSHOP_RESULTS_DIR", str(tmp_path))
    assert main([]) == 0 and "no results files there yet" in capsys.readouterr().out
    write_results("06-methods", ROWS, PROV, tmp_path)
    (tmp_path / "broken.json").write_text("{")
    assert main([]) == 1
    out = capsys.readouterr().out
    assert f"results folder: {tmp_path}" in out and "06-methods: measured 2026-12-01 10:00 UTC on L4" in out
    assert "(2 rows)" in out and "broken: not readable as a results file" in out
