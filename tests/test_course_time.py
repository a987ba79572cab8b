"""The course-time script (issues 27 and 42): the honest clock's two columns, the restarts at the room's time, the
generated Time lines, facilitator minutes and the day's timetable, on
synthetic notebooks made with nbformat and on copies of the real ones in tmp_path (never the real ones)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from helpers.core.restarts import GPU_START_S, Restart, record
from helpers.lab import clock, day
from helpers.lab import course_time as ct

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
MACHINE = {"cpu": "Test CPU", "isa": "AVX-512", "cores": 2, "arch": "x86_64"}
md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell


def synthetic() -> nbformat.NotebookNode:
    """Title (with its Time line), parameters, a core section, a Go deeper section, then What we learned."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [md("# 09 · A lesson\n\nOne two three.\n\n**Time:** about 5 minutes (typed by hand).\n"),  # 0: 13 words
                code("N = 3  # size", metadata={"tags": ["parameters"]}),                                 # 1: 3
                md("## 1. Core\nfour words here now"),                                                    # 2: 6
                code("print(N)"),                                                                         # 3: 1
                md("## Go deeper: the rest\nsix words that are not core"),                              # 4: 10
                code("print('deep')"),                                                                    # 5: 1 deeper
                md("## What we learned\nseven"),                                                          # 6: 4
                code("print('done')")]                                                                    # 7: 1
    return nb


def cells_record(test: str, parameters: str, cells: list[tuple[int, float, str]], at: str = "2026-01-01T00:00:00Z"):
    return {"notebook": "09_lesson.ipynb", "test": test, "recorded_at": at, "parameters": parameters,
            "seconds": sum(c[1] for c in cells),
            "cells": [{"index": i, "seconds": s, "section": "", "first_line": f} for i, s, f in cells]}


def test_words_count_tokens_with_a_letter_or_a_digit():
    assert ct.words("# Title | --- | a_b 12 `x`") == 4  # "Title", "a_b", "12", "`x`"
    assert ct.words("") == 0


def test_the_core_path_ends_at_the_go_deeper_heading_and_takes_back_what_we_learned():
    nb = synthetic()
    assert ct.core_cells(nb) == [True, True, True, True, False, False, True, True]
    row = ct.course_time("09_lesson", nb, None, None)
    assert (row.core_words, row.all_words) == (13 + 3 + 6 + 1 + 4 + 1, 13 + 3 + 6 + 1 + 10 + 1 + 4 + 1)
    assert (row.prose_words, row.code_words) == (6 + 6 + 4, 1 + 1)  # not the parameters cell, nor the Time line
    assert row.reading_min == pytest.approx(16 / clock.PROSE_WPM + 2 / clock.CODE_WPM, abs=0.01)


def test_a_notebook_without_go_deeper_is_all_core_and_a_heading_inside_a_cell_is_refused():
    nb = nbformat.v4.new_notebook(cells=[md("# A\n\nwords"), code("x = 1")])
    assert ct.core_cells(nb) == [True, True]
    nb.cells.append(md("Some text first.\n\n## Go deeper: hidden"))
    with pytest.raises(ct.CourseTimeError, match="09_x: cell 2: its '## Go deeper' heading is not the cell's first"):
        ct.course_time("09_x", nb, None, None)


@pytest.mark.parametrize("source, only", [
    ("run = run_agent(lab, QUESTION)\nplots.token_timeline(run.timing);", True),
    ("print(f\"{a / b:.1f}x\")\nshould_see(\"faster\", a > b)\n%matplotlib inline", True),  # shown, not worked
    ("check_prediction(MY_PREDICTION, \"x\" if late else \"y\")\nshift = -1", True),
    ("ratio = a / b", False), ("total += 1", False), ("if late:\n    print(1)", False),
    ("rows = [r for r in runs]", False), ("for r in runs:\n    show(r)", False), ("x = a if b else c", False),
    ("print(f'{x'", False),  # does not parse: counted as work
])
def test_a_helper_only_cell_has_no_arithmetic_branch_or_loop_outside_what_it_shows(source, only):
    assert ct.only_helper_calls(source) is only


def test_helper_only_cells_leave_the_parameters_cell_out():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("N = 2 * 3", metadata={"tags": ["parameters"]}),
                                         nbformat.v4.new_code_cell("lab = connect()"),
                                         nbformat.v4.new_code_cell("x = N * 2"), nbformat.v4.new_markdown_cell("# a")])
    assert ct.helper_only_cells(nb) == (1, 2)


def test_cell_seconds_follow_the_injected_parameters_cell_and_flag_cells_of_an_older_notebook():
    nb = synthetic()
    record = cells_record("tests/test_nb09_local.py::t", "# Parameters injected by `workshop run`\nN = 1",
                          [(1, 0.5, "N = 3  # size"), (2, 0.25, "# Parameters injected by `workshop run`"),
                           (4, 10.0, "print(N)"), (6, 100.0, "print('deep')"), (8, 1.0, "print('done')"),
                           (9, 7.0, "print('gone')")])
    times = ct.split_cell_times(nb, record)
    assert (times.core_s, times.deeper_s) == (11.75, 100.0)
    assert (times.unmatched, times.unmatched_s) == (1, 7.0)
    plain = ct.split_cell_times(nb, cells_record("t", "", [(3, 2.0, "print(N)"), (5, 3.0, "print('deep')")]))
    assert (plain.core_s, plain.deeper_s, plain.unmatched) == (2.0, 3.0, 0)


def executed_run(tmp_path: Path) -> tuple[Path, float]:
    """A `workshop run --out` folder holding the synthetic notebook executed, cell 3 (core) in the first 10 s and
    cell 5 (Go deeper) from 20 to 30 s; and its start, Unix seconds."""
    run = tmp_path / "run"
    run.mkdir()
    executed = synthetic()
    for index, (start, end) in {3: ("2026-01-01T00:00:00Z", "2026-01-01T00:00:10Z"),
                                5: ("2026-01-01T00:00:20Z", "2026-01-01T00:00:30Z")}.items():
        executed.cells[index].metadata["execution"] = {"iopub.execute_input": start, "shell.execute_reply": end}
    nbformat.write(executed, run / "09_lesson.ipynb")
    return run, 1767225600.0  # 2026-01-01T00:00:00Z


def test_the_latest_local_path_record_is_taken_and_the_cluster_path_is_not(tmp_path):
    for folder, at in (("test_nb09_local", "2026-01-02T00:00:00Z"), ("test_other_local", "2026-01-01T00:00:00Z"),
                       ("test_k8s_path_notebooks", "2026-01-03T00:00:00Z")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "09_lesson.json").write_text(json.dumps(cells_record(folder, "", [(3, 1.0, "x")], at)))
    assert ct.cells_record(tmp_path, "09_lesson")["test"] == "test_nb09_local"
    assert ct.cells_record(tmp_path, "10_missing") is None


BYTES = {"org/base": 8 * 2**30, "org/big": 60 * 2**30, "org/draft": 1 * 2**30}.get


def test_the_clock_counts_code_slower_than_prose_and_prices_exercises_predictions_and_cells():
    nb = synthetic()
    nb.cells[3] = code("my_x = None  # one two\ncheck_exercise('x', my_x, check, HINT)", metadata={"tags": ["exercise"]})
    nb.cells.insert(4, code("MY_PREDICTION = None\nmeasure()"))
    nb.cells.insert(5, code("solution_x = 1", metadata={"tags": ["solution"], "jupyter": {"source_hidden": True}}))
    work = clock.core_work(nb, ct.core_cells(nb))
    assert (work.code_cells, work.exercises, work.predictions) == (3, 1, 1)  # no parameters, no solution cell
    assert work.prose_words == 6 + 6 + 4 and work.code_words == ct.words(nb.cells[3].source) + 3 + 1
    assert work.reading_min == pytest.approx(work.prose_words / 200 + work.code_words / 100)
    assert work.cells_min == pytest.approx(3 * 20 / 60) and work.tasks_min == 3 + 1


def test_a_restart_is_priced_at_the_rooms_time_storm_flags_or_back():
    prices = clock.price_restarts(["model org/base -> org/big, served name org/base -> org/big",
                                   "model org/big -> org/base", "--max-num-seqs 8 added", "--max-num-seqs 8 removed",
                                   '--speculative-config {"model": "org/draft"} added', "model org/base -> org/big",
                                   "model org/big -> org/base, --kv-cache-dtype fp8 added"],
                                  "org/base", BYTES)
    assert [p.kind for p in prices] == ["storm", "back", "flags", "back", "storm", "back", "flags"]
    storm = 30 * 60 * 2**30 / (1200 * 2**20) + GPU_START_S["cold"]
    assert prices[0].seconds == pytest.approx(storm, abs=0.1) and prices[4].seconds < prices[0].seconds
    assert prices[1].seconds == pytest.approx(GPU_START_S["warm"], abs=0.1)
    assert prices[2].seconds == pytest.approx(GPU_START_S["cold"], abs=0.1)
    # a flag change taken back is a configuration already started (warm), as is the way back to the baseline model
    flags = clock.price_restarts(["--max-num-seqs 32 -> 4", "--max-num-seqs 4 -> 32", "--gpu-memory-utilization 0.90 -> "
                                  "0.95 (kubectl apply)", "--gpu-memory-utilization 0.95 -> 0.90"], "org/base", BYTES)
    assert [p.kind for p in flags] == ["flags", "back", "flags", "back"]
    # the same model read again later in the day is in the page cache: no second storm
    assert prices[5].seconds == pytest.approx(GPU_START_S["warm"], abs=0.1)


def test_both_columns_and_what_was_not_measured():
    nb = synthetic()
    cells = cells_record("t", "", [(3, 120.0, "print(N)")])
    full = ct.course_time("09_lesson", nb, cells, ["--max-num-seqs 8 added"], BYTES, "org/base")
    assert full.restart_min == pytest.approx(GPU_START_S["cold"] / 60, abs=0.05) and full.restarts_core == 1
    assert full.self_study_min == pytest.approx(full.person_min + 2, abs=0.05)
    assert full.workshop_min == pytest.approx(full.person_min + 2 + full.restart_min, abs=0.1)
    unknown = ct.course_time("09_lesson", nb, cells, None)
    assert unknown.workshop_min is None and unknown.self_study_min is not None and unknown.missing() == ["restarts"]
    lines = ct.table_lines([full, unknown])
    assert lines[0].split()[:2] == ["notebook", "reading"] and "not measured" in lines[2]


def test_restart_changes_come_from_the_core_path_of_a_k8s_run(tmp_path):
    run, t0 = executed_run(tmp_path)
    record(run / "09_lesson.restarts.jsonl", Restart(t0 + 5, "--max-num-seqs 8 added", 30.0, "ready"))  # core
    record(run / "09_lesson.restarts.jsonl", Restart(t0 + 25, "--max-num-seqs 64", 30.0, "ready"))  # deeper
    assert ct.restart_changes(run) == {"09_lesson": ["--max-num-seqs 8 added"]}
    (run / "09_lesson.ipynb").unlink()
    with pytest.raises(ct.CourseTimeError, match="executed 09_lesson.ipynb is not beside it"):
        ct.restart_changes(run)


def _record(rows):
    return ct.make_record(rows, MACHINE, "0123456789abcdef", "not measured")


def test_the_time_line_is_generated_from_the_record_and_names_its_parts():
    nb = synthetic()
    measured = ct.course_time("09_lesson", nb, cells_record("t", "", [(3, 90.0, "print(N)")]),
                              ["model org/base -> org/big"], BYTES, "org/base")
    record = json.loads(json.dumps(_record([measured])))  # as read back from the file
    line = ct.time_line(record["notebooks"][0], record)
    assert line.startswith("**Time:** the core path takes about ")
    assert "1.5 min running on a 2-core Test CPU (AVX-512)" in line and "1 engine restart (1 storm)" in line
    assert "commit 0123456789ab" in line and "`workshop course-time --write`" in line
    bare = json.loads(json.dumps(_record([ct.course_time("09_lesson", nb, None, None)])))
    assert ct.time_line(bare["notebooks"][0], bare).count("not measured") >= 2


def _day_record(minutes: dict[str, float | None], no_engine: tuple[str, ...] = ()) -> dict:
    rows = []
    for stem, m in minutes.items():
        rows.append({"notebook": stem, "workshop_min": m, "self_study_min": 30.0, "person_min": 10.0,
                     "run_s": 0.0 if stem in no_engine else 60.0,
                     "restarts": [] if stem in no_engine else [{"kind": "storm", "seconds": 600.0}]})
    return {"notebooks": rows, "generated_by": ct.GENERATED_BY, "commit": "0123456789abcdef", "rules": clock.RULES,
            "workshop_run_source": "x", "restart_source": "y"}


def test_the_day_fits_120_minutes_with_its_buffer_and_says_what_it_cut():
    record = _day_record({"01_a": 20, "02_b": 25, "03_c": 25, "04_d": 50, "07_e": 18, "08_f": 30}, no_engine=("02_b",))
    plan = day.plan(record)
    assert plan.live_min + plan.buffer_min == 120 and plan.buffer_min >= 10 and day.problems(plan) == []
    assert plan.live == ("01_a", "03_c", "07_e")
    assert dict(plan.pre_reading).keys() == {"02_b"}  # no restart, before the last live notebook
    assert {stem for stem, _ in plan.homework} == {"04_d", "08_f"}  # 04 restarts; 08 comes after
    assert "storm" in dict(plan.homework)["04_d"]
    page = day.page(record)
    assert "| 0:00 | 10 | welcome" in page and "buffer" in page and "04_d" in page
    unmeasured = day.plan(_day_record({"01_a": None}))
    assert unmeasured.live == () and unmeasured.missing == ("01_a",)
    assert day.problems(day.Day((day.Slot(0, 115, "x"), day.Slot(115, 5, "buffer")), (), (), (), 5, ())) != []


def test_the_record_is_checked_against_the_notebooks_as_they_are(tmp_path):
    path = tmp_path / "09_lesson.ipynb"
    nb = synthetic()
    nbformat.write(nb, path)
    record = json.loads(json.dumps(_record([ct.course_time("09_lesson", nb, None, None)])))
    assert ct.record_problems([path], record) == []
    nb.cells[2].source += " and five more words here"
    nbformat.write(nb, path)
    [problem] = ct.record_problems([path], record)
    assert "prose_words" in problem


def test_writing_the_time_lines_changes_only_that_line_and_the_check_then_passes(tmp_path):
    path = tmp_path / "09_lesson.ipynb"
    nbformat.write(synthetic(), path)
    before = nbformat.read(path, as_version=4)
    record = json.loads(json.dumps(_record([ct.course_time("09_lesson", before, None, None)])))
    assert ct.time_line_problems([path], record) == [f"09_lesson.ipynb: its Time line is not the record's; run "
                                                     f"`{ct.GENERATED_BY}` (has '**Time:** about 5 minutes (typed by hand).'...)"]
    assert ct.write_time_lines([path], record) == [path]
    after = nbformat.read(path, as_version=4)
    assert ct.time_line_problems([path], record) == []
    assert [c.source for c in after.cells[1:]] == [c.source for c in before.cells[1:]]
    assert [c.get("id") for c in after.cells] == [c.get("id") for c in before.cells]
    assert after.cells[0].source.startswith("# 09 · A lesson\n\nOne two three.\n\n**Time:** the core path takes")
    assert ct.write_time_lines([path], record) == []  # already current: nothing written

    lost = tmp_path / "10_lost.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[md("# 10\nno time line"), code("x = 1")]), lost)
    record["notebooks"].append(dict(record["notebooks"][0], notebook="10_lost"))
    with pytest.raises(ct.CourseTimeError, match="no '\\*\\*Time:\\*\\*' line"):
        ct.write_time_lines([lost], record)
    assert ct.time_line_problems([lost], record) == ["10_lost.ipynb: 0 '**Time:**' lines before the first code cell, "
                                                     "expected one"]
    assert ct.time_line_problems([tmp_path / "09_lesson.ipynb"], {"notebooks": []}) == [
        f"09_lesson.ipynb: not in the record; regenerate it with `{ct.GENERATED_BY}`"]


def test_a_time_line_whose_paragraph_runs_on_is_named(tmp_path):
    # a typed Time line over two lines, regenerated: the writer replaces its first line and the second is left behind
    path = tmp_path / "09_lesson.ipynb"
    nb = synthetic()
    nb.cells[0].source = nb.cells[0].source.replace("(typed by hand).", "(typed by hand), restarting\nthe engine twice.")
    nbformat.write(nb, path)
    record = json.loads(json.dumps(_record([ct.course_time("09_lesson", nb, None, None)])))
    assert ct.write_time_lines([path], record) == [path]
    assert ct.time_line_problems([path], record) == [
        "09_lesson.ipynb: the line after its Time line continues that paragraph ('the engine twice.'); "
        f"`{ct.GENERATED_BY}` replaces one line, so this is what an older, longer Time line left: delete it or leave a "
        "blank line between"]
    fixed = nbformat.read(path, as_version=4)
    fixed.cells[0].source = fixed.cells[0].source.replace("\nthe engine twice.", "")
    nbformat.write(fixed, path)
    assert ct.time_line_problems([path], record) == []


def test_a_missing_or_damaged_record_says_how_to_make_one(tmp_path):
    with pytest.raises(ct.CourseTimeError, match="run `workshop course-time --write`"):
        ct.read_record(tmp_path / "course_time.json")
    (tmp_path / "course_time.json").write_text("{not json")
    with pytest.raises(ct.CourseTimeError, match="not JSON"):
        ct.read_record(tmp_path / "course_time.json")


def test_course_time_write_on_copies_of_the_real_notebooks(tmp_path, capsys):
    """`workshop course-time --write` on copies: every Time line becomes the record's, nothing else changes."""
    from helpers.cli.main import main

    copies, cells = tmp_path / "notebooks", tmp_path / "cells" / "test_nb01_local"
    copies.mkdir()
    cells.mkdir(parents=True)
    for path in ct.course_notebooks(NOTEBOOKS):
        shutil.copy(path, copies / path.name)
    first = nbformat.read(copies / "01_connect_and_first_agent.ipynb", as_version=4)
    code_cells = [(i, c) for i, c in enumerate(first.cells) if c.cell_type == "code"][:3]
    (cells / "01_connect_and_first_agent.json").write_text(json.dumps(
        {"notebook": "01_connect_and_first_agent.ipynb", "test": "tests/test_nb01_local.py::t", "recorded_at": "now",
         "parameters": "", "cells": [{"index": i, "seconds": 60.0, "section": "",
                                      "first_line": ct._first_line(c.source)} for i, c in code_cells]}))
    restarts = tmp_path / "k8s-path"
    restarts.mkdir()
    nbformat.write(first, restarts / "01_connect_and_first_agent.ipynb")
    (restarts / "01_connect_and_first_agent.restarts.jsonl").write_text("")
    before = {p.name: nbformat.read(p, as_version=4) for p in copies.glob("*.ipynb")}
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "01.md").write_text("# 01 · notes\n\nThe first paragraph.\n")
    assert main(["course-time", "--notebooks", str(copies), "--cells", str(tmp_path / "cells"), "--docs", str(docs),
                 "--restarts", str(restarts), "--write"]) == 0
    out = capsys.readouterr().out
    assert "01_connect_and_first_agent" in out and "wrote course_time.json" in out
    record = ct.read_record(copies / ct.RECORD_NAME)
    assert record["machine"]["cores"] >= 1 and record["restarts_source"] == "k8s-path run: k8s-path"
    entry = {e["notebook"]: e for e in record["notebooks"]}["01_connect_and_first_agent"]
    assert entry["run_s"] == 180.0 and entry["restarts_core"] == 0 and entry["run"]["test"].endswith("::t")
    paths = ct.course_notebooks(copies)
    assert ct.time_line_problems(paths, record) == [] and ct.record_problems(paths, record) == []
    assert ct.minutes_problems(docs, {**record, "notebooks": record["notebooks"][:2]}) == []  # start_here, 01
    assert (docs / "day.md").read_text() == day.page(record)
    for path in paths[1:]:  # only the Time line changed (start_here gains the day's table)
        after, old = nbformat.read(path, as_version=4), before[path.name]
        changed = [i for i, (a, b) in enumerate(zip(after.cells, old.cells)) if a.source != b.source]
        assert len(after.cells) == len(old.cells) and len(changed) <= 1
        for i in changed:
            assert [x for x in after.cells[i].source.splitlines() if not x.startswith("**Time:**")] == \
                   [x for x in old.cells[i].source.splitlines() if not x.startswith("**Time:**")]


# The real notebooks against the committed record (notebooks/course_time.json): each Time line and facilitator
# Minutes line is the one the record generates, the record counts the core paths as they are now, and the day fits;
# after a notebook's core path changes, `workshop course-time --restarts build/k8s-path --write` regenerates them.
def test_every_notebooks_time_line_matches_the_committed_record():
    record = ct.read_record(NOTEBOOKS / ct.RECORD_NAME)
    paths = ct.course_notebooks(NOTEBOOKS)
    assert ct.time_line_problems(paths, record) == []
    assert ct.record_problems(paths, record) == []
    docs = NOTEBOOKS.parent / "docs" / "facilitator"
    assert ct.minutes_problems(docs, record) == []
    assert (docs / "day.md").read_text() == day.page(record)
    assert day.problems(day.plan(record)) == [] and day.plan(record).live
    start_here = nbformat.read(NOTEBOOKS / "start_here.ipynb", as_version=4)
    assert day.side_by_side(record) in "\n".join(c.source for c in start_here.cells)


def test_the_cpu_run_from_an_executed_core_only_copy(tmp_path):
    from helpers.lab.notebooks import core_path

    nb = synthetic()
    executed = core_path(nb)
    stamps = {3: ("2026-01-01T00:00:00Z", "2026-01-01T00:01:30Z"), 5: ("2026-01-01T00:02:00Z", "2026-01-01T00:02:04Z")}
    code_cells = [i for i, c in enumerate(executed.cells) if c.cell_type == "code"]  # parameters, print(N), done
    for index, (start, end) in zip(code_cells[1:], stamps.values()):
        executed.cells[index].metadata["execution"] = {"iopub.execute_input": start, "shell.execute_reply": end}
    record = ct.executed_record(nb, executed, "workshop run --out x")
    assert [(c["index"], c["seconds"]) for c in record["cells"]] == [(3, 90.0), (7, 4.0)]  # placed on the source
    row = ct.course_time("09_lesson", nb, record, None)
    assert row.run_s == 94.0 and row.unmatched_cells == 0 and row.self_study_min == pytest.approx(
        row.person_min + 94 / 60, abs=0.05)
