"""benchmarks/notebooks_ab.py's order, parsing and arithmetic (the benchmark itself prints figures; it is not run
here: it runs every notebook four times)."""

from pathlib import Path

from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]


def _load():
    return load_script(ROOT / "benchmarks" / "notebooks_ab.py")


def test_each_notebook_runs_old_then_new_and_the_rounds_follow():
    ab = _load()
    assert ab.order(["01.ipynb", "02.ipynb"], 2) == [
        (0, "01.ipynb", "old"), (0, "01.ipynb", "new"), (0, "02.ipynb", "old"), (0, "02.ipynb", "new"),
        (1, "01.ipynb", "old"), (1, "01.ipynb", "new"), (1, "02.ipynb", "old"), (1, "02.ipynb", "new")]


def test_the_notebooks_are_this_trees_numbered_ones_or_the_prefixes_asked_for():
    ab = _load()
    every = ab.notebooks(ROOT, [])
    assert len(every) == 8 and every[0].startswith("01_") and every[-1].startswith("08_")
    assert ab.notebooks(ROOT, ["3", "05"]) == [n for n in every if n[:2] in ("03", "05")]
    assert ab.notebooks(ROOT, ["99"]) == []


def test_the_seconds_are_read_from_workshop_runs_ok_line_for_that_notebook_only():
    ab = _load()
    out = "engine ready\nok  02_units.ipynb  2.7 s  -> build/x.ipynb\nok  03_kv.ipynb  58.6 s  -> build/y.ipynb\n"
    assert ab.seconds_printed(out, "03_kv.ipynb") == 58.6
    assert ab.seconds_printed(out, "04_moe.ipynb") is None
    assert ab.seconds_printed("FAILED 03_kv.ipynb: cell 4", "03_kv.ipynb") is None


def test_the_summary_is_new_over_old_per_round_and_all_counts_only_complete_rounds():
    ab = _load()
    rows = [{"round": 0, "notebook": "a", "tree": "old", "seconds": 10.0},
            {"round": 0, "notebook": "a", "tree": "new", "seconds": 11.0},
            {"round": 0, "notebook": "b", "tree": "old", "seconds": 20.0},
            {"round": 0, "notebook": "b", "tree": "new", "seconds": 20.0},
            {"round": 1, "notebook": "a", "tree": "old", "seconds": 10.0},
            {"round": 1, "notebook": "a", "tree": "new", "seconds": 13.0},
            {"round": 1, "notebook": "b", "tree": "old", "seconds": 20.0},
            {"round": 1, "notebook": "b", "tree": "new", "seconds": None}]  # failed: no seconds
    lines = {line["notebook"]: line for line in ab.summarize(rows, ab._compare_module())}
    assert lines["a"]["rounds"] == 2 and abs(lines["a"]["ratio"] - 1.2) < 1e-9
    assert abs(lines["a"]["spread"] - 0.1) < 1e-9 and lines["a"]["verdict"] == "new +20.0%"
    assert lines["b"]["rounds"] == 1 and lines["b"]["spread"] is None
    assert lines["all"]["rounds"] == 1 and abs(lines["all"]["ratio"] - 31 / 30) < 1e-9  # round 1 is incomplete
    assert "a" in ab.format_table(list(lines.values()))


def test_a_runs_cell_seconds_split_at_the_first_go_deeper_heading(tmp_path):
    import nbformat

    ab = _load()

    def timed(source, start, end):
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["execution"] = {"iopub.execute_input": f"2026-12-03T12:00:{start:06.3f}Z",
                                      "shell.execute_reply": f"2026-12-03T12:00:{end:06.3f}Z"}
        return cell

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# 0X title"), timed("a = 1", 0, 2.5), timed("b = 2", 3, 4),
        nbformat.v4.new_markdown_cell("## Go deeper: more"), timed("c = 3", 10, 20),
        nbformat.v4.new_code_cell("never ran")])
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, path)
    assert ab.split_seconds(path) == (3.5, 10.0)
    nb.cells = [c for c in nb.cells if c.cell_type == "markdown"]  # nothing timed
    nbformat.write(nb, path)
    assert ab.split_seconds(path) is None
    assert ab.split_seconds(tmp_path / "missing.ipynb") is None


def test_the_core_path_line_sums_each_trees_core_cells_over_the_notebooks_of_a_round():
    ab = _load()
    rows = [{"round": 0, "notebook": "a", "tree": "old", "seconds": 10.0, "core_s": 9.0},
            {"round": 0, "notebook": "a", "tree": "new", "seconds": 15.0, "core_s": 8.0},
            {"round": 0, "notebook": "b", "tree": "old", "seconds": 20.0, "core_s": 19.0},
            {"round": 0, "notebook": "b", "tree": "new", "seconds": 20.0, "core_s": 10.0}]
    core = next(line for line in ab.summarize(rows, ab._compare_module()) if line["notebook"] == "core path (cells)")
    assert core["old_mean"] == 28.0 and core["new_mean"] == 18.0 and abs(core["ratio"] - 18 / 28) < 1e-9


def test_the_engines_are_stopped_in_each_tree_with_its_own_port_and_state(monkeypatch, capsys):
    ab = _load()
    calls = []

    class Done:
        returncode, stdout, stderr = 0, "engine stopped (pid 42)\n", ""

    monkeypatch.setattr(ab.subprocess, "run", lambda cmd, cwd, env, **kw: calls.append((cmd[-1], cwd, env)) or Done())
    trees = {"old": Path("/old"), "new": Path("/new")}
    envs = {tree: ab.tree_env(trees[tree], port, Path(f"/state-{tree}")) for tree, port in (("old", "1"), ("new", "2"))}
    ab.stop_engines(trees, envs)
    assert [(cmd, cwd, env["WORKSHOP_PORT"], env["WORKSHOP_STATE_DIR"]) for cmd, cwd, env in calls] == [
        ("down", Path("/old"), "1", "/state-old"), ("down", Path("/new"), "2", "/state-new")]
    assert capsys.readouterr().out.count("engine stopped (pid 42)") == 2


def test_a_terminated_run_raises_keyboard_interrupt_so_its_engines_are_stopped():
    ab = _load()
    import pytest
    with pytest.raises(KeyboardInterrupt):
        ab._interrupt(15, None)
