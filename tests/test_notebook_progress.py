"""Progress displays: the check that finds long cells without one, and the bars the helpers show."""

from __future__ import annotations

import nbformat
import pytest

from helpers.core import progress
from helpers.core.comparison import interleave
from helpers.lab.notebooks import LONG_CELL_S, cell_seconds, shows_progress, silent_long_cells


def _cell(source: str, seconds: float | None, outputs: list[dict] | None = None) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    if seconds is not None:  # as nbclient records it (record_timing), seconds after 20:00:00
        cell.metadata["execution"] = {"iopub.execute_input": "2026-11-30T20:00:00.000000Z",
                                      "shell.execute_reply": f"2026-11-30T20:{int(seconds // 60):02d}:"
                                                             f"{seconds % 60:09.6f}Z"}
    cell.outputs = [nbformat.from_dict(o) for o in outputs or []]
    return cell


WIDGET_BAR = {"output_type": "display_data", "metadata": {},
              "data": {"text/plain": "concurrency 8:   0%|          | 0/16 [00:00<?, ?req/s]",
                       "application/vnd.jupyter.widget-view+json": {"version_major": 2, "version_minor": 0,
                                                                    "model_id": "3bd0"}}}
TEXT_BAR = {"output_type": "stream", "name": "stderr",
            "text": "\rsweep:  50%|#####     | 3/6 [01:02<01:02, 20.7s/run]"}
NO_TOTAL_BAR = {"output_type": "stream", "name": "stderr", "text": "eval smoke: 7task [00:02,  3.10task/s]"}
STATUS = {"output_type": "display_data", "metadata": {},  # the engine's start: phase and elapsed time
          "data": {"text/plain": "engine tiny-agent: loading weights [00:12]",
                   "application/vnd.jupyter.widget-view+json": {"version_major": 2, "version_minor": 0,
                                                                "model_id": "77aa"}}}
PRINT = {"output_type": "stream", "name": "stdout", "text": "the machine is quiet: 3% CPU busy over 1.0 s\n"}
TABLE = {"output_type": "execute_result", "execution_count": 3, "metadata": {},
         "data": {"text/plain": "   concurrency  output_throughput\n0  1  12.5"}}


def test_cell_seconds_reads_nbclient_timing_and_none_without_it():
    assert cell_seconds(_cell("x", 75.5)) == pytest.approx(75.5)
    assert cell_seconds(_cell("x", None)) is None


def test_a_tqdm_bar_widget_or_text_counts_as_progress_and_a_print_does_not():
    for bar in (WIDGET_BAR, TEXT_BAR, NO_TOTAL_BAR, STATUS):
        assert shows_progress(_cell("x", 1, [PRINT, bar, TABLE]))
    assert not shows_progress(_cell("x", 1, [PRINT, TABLE]))


def test_silent_long_cells_lists_the_long_cells_without_progress_only():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# title"),
                _cell("import pandas", 1.0),
                _cell("print(check_quiet(lab).message())\nresults = run_sweep(...)", 255.0, [PRINT, TABLE]),
                _cell("results = run_sweep(...)", 255.0, [WIDGET_BAR, TABLE]),
                _cell("never executed", None),
                _cell("plots.memory_budget(rows)", LONG_CELL_S - 0.5)]
    [silent] = silent_long_cells(nb)
    assert (silent.index, round(silent.seconds), silent.first_line) == (2, 255, "print(check_quiet(lab).message())")
    assert "cell 2 ran 255 s without progress" in str(silent)
    assert [c.index for c in silent_long_cells(nb, threshold_s=0.5)] == [1, 2, 5]


def test_the_bar_is_shown_in_a_notebook_kernel_only_unless_asked(monkeypatch, capsys):
    assert not progress.in_notebook()  # pytest is not a Jupyter kernel
    assert list(progress.steps([1, 2, 3], "quiet")) == [1, 2, 3]
    assert capsys.readouterr().err == ""
    assert list(progress.steps(["a", "b"], "asked", unit="config", progress=True, label=str.upper)) == ["a", "b"]
    err = capsys.readouterr().err
    assert "asked: 100%" in err and "2/2" in err and "B" in err
    monkeypatch.setattr(progress, "in_notebook", lambda: True)
    assert progress.wanted(None) and not progress.wanted(False)


def test_interleave_shows_each_configuration_and_round(capsys):
    assert interleave({"A": lambda: 1, "B": lambda: 2}, repeats=2, desc="configs", progress=True) == \
        {"A": [1, 1], "B": [2, 2]}
    err = capsys.readouterr().err
    assert "configs: 100%" in err and "4/4" in err and "B, round 2" in err


def test_a_headless_run_shows_a_bar_of_the_cells_with_the_section_being_run(tmp_path, capsys):
    from helpers.lab.notebooks import cell_sections, run_notebook

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# 09 · A test"), nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_markdown_cell("## 1. Where it adds up\nsome text"), nbformat.v4.new_code_cell("print(x + 1)"),
        nbformat.v4.new_code_cell("")])
    assert cell_sections(nb) == ["09 · A test", "09 · A test", "1. Where it adds up", "1. Where it adds up",
                                 "1. Where it adds up"]
    path = tmp_path / "09_test.ipynb"
    nbformat.write(nb, path)
    run_notebook(path, tmp_path / "out", timeout_s=60, progress=True)
    err = capsys.readouterr().err
    assert "09_test.ipynb" in err and "2/2" in err and "1. Where it adds up" in err
    run_notebook(path, tmp_path / "out", timeout_s=60)  # not in a notebook kernel: no bar unless asked
    assert "2/2" not in capsys.readouterr().err
