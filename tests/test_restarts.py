"""The restart budget (helpers/core/restarts.py, helpers/lab/restarts.py): counting, the core path, the table."""

from __future__ import annotations

import nbformat

from helpers.core import restarts as rs
from helpers.lab.restarts import cell_windows


def _restart(at: float, outcome: str = "ready") -> rs.Restart:
    return rs.Restart(at, "--max-num-seqs 32 -> 8", 40.0, outcome)


CELLS = [("1. Baseline", 0.0, 10.0), ("2. One flag", 10.0, 100.0), ("Go deeper: the grid", 100.0, 500.0),
         ("Go deeper: the grid", 500.0, 600.0)]


def test_a_restart_counts_on_the_core_path_only_before_the_first_go_deeper_section():
    row = rs.count("06_speculative_decoding", [_restart(5), _restart(50), _restart(150), _restart(550)], CELLS)
    assert (row.core, row.total, row.seconds_here) == (2, 4, 160.0)
    no_deeper = rs.count("03", [_restart(150)], [("1. Baseline", 0.0, 1000.0)])
    assert (no_deeper.core, no_deeper.total) == (1, 1)  # without a Go deeper section, every restart is core


def test_the_log_round_trips_and_the_rehearsal_reads_the_rows_back(tmp_path):
    log = tmp_path / "r.jsonl"
    assert rs.read_restarts(log) == []
    rs.record(log, _restart(1.0))
    rs.record(log, _restart(2.0, "rolled back"))
    assert [r.outcome for r in rs.read_restarts(log)] == ["ready", "rolled back"]
    row = rs.RestartRow("08_tuning_and_evaluation", 2, 7, 301.5)
    printed = f"ok  08.ipynb  12.0 s  -> out\n{row.encode()}\nnot a row\nrestarts {{broken"
    assert rs.decode_rows(printed) == [row]
    merged = rs.merge([row, rs.RestartRow("08_tuning_and_evaluation", 3, 5, 100.0)])
    assert merged == [rs.RestartRow("08_tuning_and_evaluation", 3, 7, 200.8)]


def test_the_table_gives_gpu_minutes_from_the_cited_start_up_and_judges_the_budget():
    rows = [rs.RestartRow("03_prefill", 2, 2, 80.0), rs.RestartRow("06_spec", 4, 11, 500.0)]
    lines = rs.table_lines(rows)
    assert lines[0].split()[:3] == ["notebook", "core", "all"]
    cold = 11 * rs.GPU_START_S["cold"] / 60
    assert f"/ {cold:.1f} min" in lines[2] and "no (over 3)" in lines[2] and lines[1].endswith("yes")
    assert "PR 32191" in lines[-1] and "not measured here" in lines[-1]


def test_cell_windows_reads_nbclients_timing():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("## 1. Baseline"),
                                         nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("y = 2")])
    nb.cells[1].metadata["execution"] = {"iopub.execute_input": "2026-12-02T01:00:00.000000Z",
                                         "shell.execute_reply": "2026-12-02T01:00:02.500000Z"}
    (section, start, end), = cell_windows(nb)  # the cell that did not run has no window
    assert section == "1. Baseline" and end - start == 2.5
