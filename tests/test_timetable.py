"""The suite's time table (tests/timetable.py) and the engine's start records it reads (helpers/engine/local.py)."""

from __future__ import annotations

import json
import socket

import nbformat
import pytest

import timetable
from fake_engine_server import use_fake_engine
from fakes import held_port
from helpers.core.settings import load_settings
from helpers.core.vllm_args import EngineConfig
from helpers.engine.interface import EngineError
from helpers.engine.local import START_RECORD_VARIABLE, LocalEngine, recorded_start, start_record_path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _test(nodeid, worker, began, ended, engine=False, failed=0):
    return {"nodeid": nodeid, "file": nodeid.split("::")[0], "worker": worker, "began": began, "ended": ended,
            "seconds": ended - began, "failed": failed, "engine": engine}


def _start(began, seconds=20.0, server=timetable.VLLM_SERVER):
    return {"began": began, "ended": began + seconds, "seconds": seconds, "ready": True, "server": server}


def test_an_area_comes_from_the_table_else_from_the_engine_marker():
    assert timetable.area_of("tests/test_nb03_local.py", True) == "notebooks, local path"
    assert timetable.area_of("tests/test_engine_integration.py", True) == "engine"
    assert timetable.area_of("tests/test_k8s_path_notebooks.py", False) == "notebooks, cluster path"
    assert timetable.area_of("tests/test_dashboard_prometheus.py", True) == "Prometheus"
    assert timetable.area_of("tests/test_speculative_seeded_pair.py", True) == "engine"  # a file nobody listed
    assert timetable.area_of("tests/test_thinking_model.py", False) == "unit"
    assert set(timetable.BUDGET_S) == set(timetable.AREAS)


def test_a_start_belongs_to_the_test_running_on_its_worker_when_it_began():
    tests = [_test("tests/a.py::one", "gw0", 100, 150), _test("tests/b.py::two", "gw1", 100, 200),
             _test("tests/a.py::three", "gw0", 150, 300)]
    starts = {"gw0": [_start(120), _start(160)], "gw1": [_start(190)], "main": [_start(400)]}
    owners = timetable.attribute_starts(tests, starts)
    assert [r["began"] for r in owners["tests/a.py::one"]] == [120]
    assert [r["began"] for r in owners["tests/a.py::three"]] == [160]
    assert [r["began"] for r in owners["tests/b.py::two"]] == [190]
    assert [r["began"] for r in owners[""]] == [400]  # no test ran on that worker then


def test_file_rows_count_real_starts_apart_from_fake_ones_and_name_an_unmarked_test_that_started_vllm():
    tests = [_test("tests/test_x.py::a", "main", 0, 30, engine=True), _test("tests/test_x.py::b", "main", 30, 40),
             _test("tests/test_y.py::c", "main", 40, 50, failed=1)]
    starts = {"main": [_start(1, 21.5), _start(31, 5.0), _start(41, 0.5, server="fake_engine_server")]}
    rows = timetable.file_rows(tests, starts, "run1")
    assert rows["tests/test_x.py"]["engine_starts"] == 2 and rows["tests/test_x.py"]["engine_start_s"] == 26.5
    assert rows["tests/test_x.py"]["tests"] == 2 and rows["tests/test_x.py"]["area"] == "engine"
    assert rows["tests/test_x.py"]["unmarked_starts"] == ["tests/test_x.py::b"]
    assert rows["tests/test_y.py"]["engine_starts"] == 0
    assert rows["tests/test_y.py"]["fake_starts"] == 1 and rows["tests/test_y.py"]["failed"] == 1
    assert rows["tests/test_y.py"]["area"] == "unit"


def _part(run, began, wall_s, files):
    return {"run": run, "began": began, "wall_s": wall_s, "args": ["-m", run], "workers": 1, "tests": 1,
            "exit_status": 0, "files": files}


def _row(area, seconds, starts=0, start_s=0.0):
    return {"seconds": seconds, "tests": 1, "failed": 0, "engine_starts": starts, "engine_start_s": start_s,
            "fake_starts": 0, "engine_marked": area != "unit", "unmarked_starts": [], "run": "", "area": area}


ENGINE_OVER = timetable.BUDGET_S["engine"] + 40.0  # an engine area 40 s over its budget on the faster kind


def test_the_suites_wall_time_counts_overlapping_runs_once():
    assert timetable.covered_s([(0.0, 100.0), (100.0, 250.0)]) == 250.0  # one after the other
    assert timetable.covered_s([(10.0, 1000.0), (20.0, 180.0)]) == 990.0  # the unit run beside the engine run
    assert timetable.covered_s([(50.0, 60.0), (0.0, 20.0), (15.0, 30.0)]) == 40.0
    beside = timetable.merge([_part("engine", 10.0, 990.0, {}), _part("not engine", 20.0, 160.0, {})], "AMX", 1.0)
    assert beside["wall_s"] == 990.0 and [r["wall_s"] for r in beside["runs"]] == [990.0, 160.0]


def test_the_parts_of_a_suite_merge_into_one_table_that_names_the_area_over_budget():
    unit = _part("not engine", 1.0, 100.0, {"tests/test_u.py": _row("unit", 90.0)})
    engine = _part("engine", 101.0, 900.0, {"tests/test_e.py": _row("engine", ENGINE_OVER, 3, 60.0),
                                          "tests/test_nb03_local.py": _row("notebooks, local path", 300.0, 1, 20.0)})
    table = timetable.merge([engine, unit], "AMX", 1.0)
    assert [r["args"] for r in table["runs"]] == [["-m", "not engine"], ["-m", "engine"]]
    assert table["wall_s"] == 1000.0 and table["engine_starts"] == 4 and table["engine_start_s"] == 80.0
    assert table["areas"]["engine"]["seconds"] == ENGINE_OVER and table["areas"]["engine"]["over"]
    assert not table["areas"]["unit"]["over"] and table["areas"]["browser"]["files"] == 0
    assert list(table["files"])[0] == "tests/test_e.py"  # slowest first
    assert timetable.over_budget(table) == [f"engine: {ENGINE_OVER:,.0f} s, budget {timetable.BUDGET_S['engine']} s "
                                            "(+40 s)"]
    slower = timetable.merge([engine, unit], "AVX-512", timetable.SLOWER_KIND_FACTOR)
    assert slower["areas"]["engine"]["budget_s"] == round(timetable.BUDGET_S["engine"] * 55 / 30)
    assert not slower["areas"]["engine"]["over"]  # the same seconds are within the slower kind's budget
    text = timetable.markdown(table)
    assert f"| engine | 1 | {ENGINE_OVER:,.1f} |" in text and "OVER" in text
    assert f"| tests/test_e.py | engine | 1 | 0 | {ENGINE_OVER:,.1f} | 3 | 60.0 |" in text
    split = _part("not engine", 0.5, 10.0, {"tests/test_e.py": _row("unit", 40.0)})  # its tests without the marker
    row = timetable.merge([unit, engine, split], "AMX", 1.0)["files"]["tests/test_e.py"]
    assert row["seconds"] == ENGINE_OVER + 40.0 and row["tests"] == 2 and row["engine_starts"] == 3
    assert row["area"] == "engine"


def test_the_budgets_add_to_30_minutes_and_cover_the_last_full_run_on_either_kind():
    """The split (tests/timetable.py, from the last full run on the slower kind at the faster kind's speed-up): the
    faster kind's budgets add to the suite's 30 minutes and each covers its area's last figure at that speed-up; on
    the slower kind (55/30 of each) no area of that run was over."""
    budget, last, speedup = timetable.BUDGET_S, timetable.LAST_FULL_RUN_S, timetable.FASTER_KIND_SPEEDUP
    assert sum(budget.values()) == 30 * 60 and set(last) == set(budget) == set(timetable.AREAS)
    faster = {area: seconds / speedup for area, seconds in last.items()}  # the last run's figures on the faster kind
    assert [area for area in timetable.AREAS if faster[area] > budget[area]] == []
    slower = {area: round(b * timetable.SLOWER_KIND_FACTOR) for area, b in budget.items()}
    assert [area for area in timetable.AREAS if last[area] > slower[area]] == []


CLUSTER_OVER = timetable.BUDGET_S["notebooks, cluster path"] + 20.0  # the cluster path 20 s over, on the faster kind


def test_the_summary_names_every_notebook_test_file_with_its_time_and_starts(tmp_path):
    for name in ("test_nb01_local.py", "test_nb02_local.py", "test_k8s_path_notebooks.py", "test_lesson.py"):
        (tmp_path / name).write_text("")
    files = timetable.notebook_test_files(tmp_path)
    assert files == ["tests/test_k8s_path_notebooks.py", "tests/test_nb01_local.py", "tests/test_nb02_local.py"]
    part = _part("engine", 1.0, 700.0, {
        "tests/test_e.py": _row("engine", 100.0, 2, 40.0),
        "tests/test_nb01_local.py": _row("notebooks, local path", 210.5, 1, 22.0),
        "tests/test_k8s_path_notebooks.py": _row("notebooks, cluster path", CLUSTER_OVER, 9, 190.4)})
    part["files"]["tests/test_nb01_local.py"]["failed"] = 1
    lines = timetable.summary_lines(timetable.merge([part], "AMX", 1.0), files)
    assert lines[0].startswith("1 run(s) of this suite, 700 s wall; real vLLM starts: 12 taking 252 s")
    local = lines.index("notebooks, local path:")
    assert lines[local + 1:local + 3] == ["    210.5 s   1 starts (22 s)  tests/test_nb01_local.py  [1 failed]",
                                          "        not run in this suite  tests/test_nb02_local.py"]
    cluster = lines.index("notebooks, cluster path:")
    budget = timetable.BUDGET_S["notebooks, cluster path"]
    assert lines[cluster + 1] == f"{CLUSTER_OVER:>9.1f} s   9 starts (190 s)  tests/test_k8s_path_notebooks.py"
    assert f"{CLUSTER_OVER:>9,.0f} of {budget:>5,} s   9 starts  notebooks, cluster path  OVER" in lines
    assert lines[-1] == f"over budget: notebooks, cluster path: {CLUSTER_OVER:,.0f} s, budget {budget} s (+20 s)"
    unit_only = timetable.summary_lines(timetable.merge([_part("not engine", 1.0, 9.0, {
        "tests/test_u.py": _row("unit", 9.0)})], "AMX", 1.0), files)
    assert "notebook test files: none of the 3 ran in this suite" in unit_only and "not run" not in "".join(unit_only)


def test_a_start_is_recorded_ready_or_not(tmp_path, monkeypatch):
    record = tmp_path / "starts.jsonl"
    monkeypatch.setenv(START_RECORD_VARIABLE, str(record))
    assert start_record_path() == record
    config = EngineConfig("models/tiny-agent", "tiny-agent", ("--max-num-seqs", "4"))
    with recorded_start(8765, config) as launched:
        launched()
    with pytest.raises(RuntimeError), recorded_start(8766, config) as launched:
        launched()
        raise RuntimeError("vLLM exited")
    with pytest.raises(RuntimeError), recorded_start(8767, config):
        raise RuntimeError("port 8767 is already in use")  # refused before a server was launched: no start
    with record.open("a") as fh:
        fh.write('{"began": 1, "cut off')  # a line cut off mid-write is skipped
    first, second = timetable.read_starts(record)
    assert first["ready"] is True and second["ready"] is False and second["port"] == 8766
    assert first["model"] == "tiny-agent" and first["args"] == ["--max-num-seqs", "4"]
    assert first["server"] == timetable.VLLM_SERVER and first["seconds"] >= 0
    monkeypatch.delenv(START_RECORD_VARIABLE)
    assert start_record_path().name == "engine-starts.jsonl"  # in the state directory by default


def test_a_local_engine_start_appends_one_record(tmp_path, monkeypatch):
    use_fake_engine(monkeypatch)  # tests/fake_engine_server.py, not vLLM
    record = tmp_path / "starts.jsonl"
    monkeypatch.setenv(START_RECORD_VARIABLE, str(record))
    monkeypatch.setenv("WORKSHOP_PORT", str(free_port()))
    engine = LocalEngine(load_settings())
    try:
        engine.start(timeout_s=60)
        engine.start(timeout_s=60)  # already serving this configuration: no second start
    finally:
        engine.stop()
    with held_port() as busy:  # refused before launching: no record
        monkeypatch.setenv("WORKSHOP_PORT", str(busy))
        with pytest.raises(EngineError, match="already in use"):
            LocalEngine(load_settings()).start(timeout_s=60)
    (line,) = timetable.read_starts(record)
    assert line["ready"] is True and line["server"] == "fake_engine_server" and line["model"] == "tiny-agent"
    assert line["ended"] >= line["began"]


def test_the_cells_of_an_executed_notebook_are_kept_with_their_seconds_and_parameters(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("## 1. Load"),
                nbformat.v4.new_code_cell("REPEATS = 3", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("REPEATS = 1", metadata={"tags": ["injected-parameters"]}),
                nbformat.v4.new_code_cell("\nrun(REPEATS)")]
    for cell, (start, end) in zip(nb.cells[1:], [("00.000", "00.250"), ("00.300", "00.310"), ("01.000", "03.500")]):
        cell.metadata["execution"] = {"iopub.execute_input": f"2026-01-01T00:00:{start}Z",
                                      "shell.execute_reply": f"2026-01-01T00:00:{end}Z"}
    path = tmp_path / "99_not_a_workshop_notebook.ipynb"  # a workshop notebook's name would land in build/
    nbformat.write(nb, path)
    kept = timetable.notebook_cells(path, "tests/test_x.py::t")
    assert [c["seconds"] for c in kept["cells"]] == [0.25, 0.01, 2.5] and kept["seconds"] == 2.76
    assert kept["cells"][2] == {"index": 3, "seconds": 2.5, "section": "1. Load", "first_line": "run(REPEATS)"}
    assert kept["parameters"] == "REPEATS = 1" and kept["test"] == "tests/test_x.py::t"
    (tmp_path / "cells" / "test_x").mkdir(parents=True)
    (tmp_path / "cells" / "test_x" / "99.json").write_text(json.dumps(kept))
    (tmp_path / "cells" / "test_x" / "broken.json").write_text("{")
    table = timetable.merge([], "AMX", 1.0) | {"notebooks": timetable.notebook_summaries(tmp_path / "cells")}
    assert "| 99_not_a_workshop_notebook.ipynb | t | 2.8 | 3: 1. Load | 2.5 | REPEATS = 1 |" in timetable.markdown(table)
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]), path)
    assert timetable.notebook_cells(path, "t") is None  # no timing: nothing to keep


def test_under_xdist_the_slowest_files_go_first_and_the_rest_keep_their_order():
    nodeids = ["tests/test_a.py::x", "tests/test_wheel_install.py::w", "tests/test_b.py::y",
               "tests/test_client_env.py::c1", "tests/test_client_env.py::c2"]
    order = [nodeids[i] for i in timetable.slow_files_first(nodeids)]
    assert order == ["tests/test_client_env.py::c1", "tests/test_client_env.py::c2", "tests/test_wheel_install.py::w",
                     "tests/test_a.py::x", "tests/test_b.py::y"]
