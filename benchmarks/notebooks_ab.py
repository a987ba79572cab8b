"""Benchmark: the numbered notebooks at their defaults, an older tree against this one, A/B/A/B (prints figures).

Usage: python benchmarks/notebooks_ab.py [--old 6221f48] [--rounds 2] [--notebooks 03 05] [--old-port 8793]
                                         [--new-port 8794] [--json PATH] [--dry-run] [--from RUNS.jsonl]
                                         [--first-round N]

Issue 27 asks that the eight notebooks, run with their defaults, take at most 10% longer than before on the same
quiet machine. This puts the older commit in a git worktree, gives each tree its own port and state directory
(so each keeps its own engine up between its notebooks, and neither reads the other's saved results), and runs
notebook by notebook, old then new, round after round: ``workshop run notebooks/NN_*.ipynb`` with the tree on
``PYTHONPATH``, as the earlier stops timed them by hand. The figure per run is the seconds ``workshop run``
prints for the notebook (its kernel and cells; the engine was already up, but a notebook's own restarts count).

What it prints: each run as it ends, with its cells' seconds split into the core path and the Go deeper
sections (nbclient's timestamps; the older tree's notebooks have none, so they are all core); then per notebook,
in all, and for the core paths' cells alone (the older tree's whole notebooks against this tree's core paths), the
old and new means, the mean per-round ratio new / old, the rounds' spread (half the range of the ratios) and
"within noise" when the spread covers the difference (benchmarks/compare_vllm_bench.py's arithmetic, one
implementation), beside the machine's kind and load before and after. Every run is appended to ``--json`` as it
ends, so an interrupted run keeps what it has.
A figure, not a test.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TREES = ("old", "new")
WORKSHOP = [sys.executable, "-m", "helpers.cli.main"]  # each tree's own CLI (the tree is on PYTHONPATH)
OK_LINE = re.compile(r"^ok\s+(\S+)\s+([0-9.]+) s\b", re.M)


def _compare_module() -> Any:
    """benchmarks/compare_vllm_bench.py, for its ratio, spread and verdict (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("compare_vllm_bench", Path(__file__).with_name("compare_vllm_bench.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def notebooks(tree: Path, wanted: list[str]) -> list[str]:
    """The numbered notebooks' file names in ``tree`` (``wanted``: number prefixes such as 03; empty: all)."""
    names = sorted(p.name for p in (tree / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if wanted:
        names = [n for n in names if n[:2] in {w.zfill(2) for w in wanted}]
    return names


def order(names: list[str], rounds: int, first: int = 0) -> list[tuple[int, str, str]]:
    """(round, notebook, tree) in the order they run: each notebook old then new, notebook after notebook,
    then the next round; rounds numbered from ``first``."""
    return [(r, name, tree) for r in range(first, first + rounds) for name in names for tree in TREES]


def run_command(tree: Path, name: str, out: Path) -> list[str]:
    return [*WORKSHOP, "run", f"notebooks/{name}", "--out", str(out)]


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def stop_engines(trees: dict[str, Path], envs: dict[str, dict[str, str]]) -> None:
    """``workshop down`` in each tree with that tree's port and state directory, saying what each stopped."""
    for tree in TREES:
        proc = subprocess.run([*WORKSHOP, "down"], cwd=trees[tree], env=envs[tree],
                              capture_output=True, text=True)
        said = (proc.stdout.strip() or proc.stderr.strip()).splitlines()
        print(f"{tree}: workshop down: {said[-1] if said else 'nothing printed'} (rc {proc.returncode})", flush=True)


def tree_env(tree: Path, port: str, state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKSHOP_")}
    return {**env, "PYTHONPATH": str(tree), "WORKSHOP_PORT": port, "WORKSHOP_STATE_DIR": str(state)}


def seconds_printed(stdout: str, name: str) -> float | None:
    """The seconds ``workshop run`` printed on its ``ok  NAME  S s`` line, or None."""
    for found, seconds in OK_LINE.findall(stdout):
        if found == name:
            return float(seconds)
    return None


def split_seconds(executed: Path) -> tuple[float, float] | None:
    """The seconds an executed copy's code cells ran (nbclient's timestamps), on the core path and in its Go deeper
    sections (helpers.lab.course_time.core_cells: an older tree's notebook, with no Go deeper heading, is all core);
    None when the copy is missing or carries no timings."""
    from datetime import datetime

    import nbformat

    from helpers.lab.course_time import core_cells

    try:
        nb = nbformat.read(executed, as_version=4)
    except (OSError, ValueError):
        return None
    core = deeper = 0.0
    timed = False
    for cell, on_core in zip(nb.cells, core_cells(nb)):
        stamps = cell.get("metadata", {}).get("execution", {})
        if cell.cell_type != "code" or "iopub.execute_input" not in stamps or "shell.execute_reply" not in stamps:
            continue
        start, end = (datetime.fromisoformat(stamps[k].replace("Z", "+00:00"))
                      for k in ("iopub.execute_input", "shell.execute_reply"))
        seconds, timed = max(0.0, (end - start).total_seconds()), True
        core, deeper = (core + seconds, deeper) if on_core else (core, deeper + seconds)
    return (round(core, 1), round(deeper, 1)) if timed else None


def summarize(rows: list[dict[str, Any]], compare: Any) -> list[dict[str, Any]]:
    """Per notebook and in all (the rounds where every notebook ran in both trees): the old and new means, the
    per-round ratio new / old, its spread and the verdict (compare_vllm_bench's ``compare``, a round as a pair)."""
    names = list(dict.fromkeys(row["notebook"] for row in rows))
    per_round: dict[tuple[int, str], dict[str, Any]] = {}
    for row in rows:
        if row.get("seconds") is None:
            continue
        entry = per_round.setdefault((row["round"], row["tree"]), {"pair": row["round"],
                                                                   "tool": "workshop" if row["tree"] == "new" else "vllm"})
        entry[row["notebook"]] = row["seconds"]
        if row.get("core_s") is not None:
            entry.setdefault("core", {})[row["notebook"]] = row["core_s"]
    for entry in per_round.values():
        entry["all"] = sum(entry[n] for n in names) if all(n in entry for n in names) else None
        core = entry.pop("core", {})
        entry["core path (cells)"] = sum(core.values()) if all(n in core for n in names) else None
    lines = compare.compare(list(per_round.values()), tuple(names) + ("all", "core path (cells)"))
    new_core: dict[str, list[float]] = {}
    for row in rows:
        if row["tree"] == "new" and row.get("core_s") is not None:
            new_core.setdefault(row["notebook"], []).append(row["core_s"])
    return [{"notebook": line["figure"], "rounds": line["pairs"], "old_mean": line["vllm_mean"],
             "new_mean": line["workshop_mean"], "ratio": line["ratio"], "spread": line["spread"],
             "verdict": line["verdict"].replace("ours", "new"),
             "new_core_mean": (sum(new_core[line["figure"]]) / len(new_core[line["figure"]])
                               if line["figure"] in new_core else None)} for line in lines]


def format_table(lines: list[dict[str, Any]]) -> str:
    num = lambda v, f, w: format("-" if v is None else format(v, f), f">{w}")  # noqa: E731
    rows = [f"{'notebook':<36} {'rounds':>6} {'old (s)':>9} {'new (s)':>9} {'new core':>9} {'new/old':>7} "
            f"{'spread':>8}  verdict"]
    for line in lines:
        rows.append(f"{line['notebook']:<36} {line['rounds']:>6} {num(line['old_mean'], '.1f', 9)} "
                    f"{num(line['new_mean'], '.1f', 9)} {num(line.get('new_core_mean'), '.1f', 9)} "
                    f"{num(line['ratio'], '.3f', 7)} "
                    f"{'-' if line['spread'] is None else '±' + format(line['spread'], '.3f'):>8}  {line['verdict']}")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", default="6221f48", help="the older commit (issue 27's 'before')")
    parser.add_argument("--old-tree", default=None, help="use this checkout of --old instead of a new worktree")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--first-round", type=int, default=0,
                        help="number the rounds from N: finish a round an interrupted run left, into the same --json")
    parser.add_argument("--notebooks", nargs="*", default=[], help="number prefixes, e.g. 03 05 (default: all)")
    parser.add_argument("--old-port", default="8793")
    parser.add_argument("--new-port", default="8794")
    parser.add_argument("--json", default=None, help="append every run here as it ends, then the summary")
    parser.add_argument("--dry-run", action="store_true", help="print the runs in order, start nothing")
    parser.add_argument("--from", dest="saved", default=None, metavar="RUNS.jsonl",
                        help="run nothing: print the summary of a --json file's runs (the core/Go deeper split "
                             "read from each run's executed copy where the file lacks it)")
    args = parser.parse_args()
    if args.saved:
        saved = [json.loads(line) for line in Path(args.saved).read_text().splitlines() if line.strip()]
        rows = [row for row in saved if "summary" not in row]
        for row in rows:
            if row.get("core_s") is None and row.get("executed"):
                row["core_s"], row["deeper_s"] = split_seconds(Path(row["executed"])) or (None, None)
        print(format_table(summarize(rows, _compare_module())))
        return
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    names = notebooks(ROOT, args.notebooks)
    if not names:
        parser.error(f"no numbered notebook matches {args.notebooks}")
    if args.dry_run:
        for rnd, name, tree in order(names, args.rounds, args.first_round):
            where = f"a worktree of {args.old}" if tree == "old" else "this tree"
            print(f"round {rnd} {tree} ({where}): {shlex.join(run_command(ROOT, name, Path('OUT')))}")
        return

    compare = _compare_module()
    work = Path(tempfile.mkdtemp(prefix="notebooks-ab-"))
    old_tree = Path(args.old_tree) if args.old_tree else work / "old-tree"
    if not args.old_tree:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old_tree), args.old], check=True,
                       capture_output=True)
    missing = [n for n in names if not (old_tree / "notebooks" / n).is_file()]
    if missing:
        raise SystemExit(f"{args.old} has no {', '.join(missing)}: name the notebooks both trees have (--notebooks)")
    trees = {"old": old_tree, "new": ROOT}
    envs = {"old": tree_env(old_tree, args.old_port, work / "state-old"),
            "new": tree_env(ROOT, args.new_port, work / "state-new")}
    print(compare.machine_line(envs["new"]), flush=True)
    rows: list[dict[str, Any]] = []
    for signum in (signal.SIGTERM, signal.SIGHUP):  # a killed run still stops both trees' engines (finally below)
        signal.signal(signum, _interrupt)
    try:
        for rnd, name, tree in order(names, args.rounds, args.first_round):
            started = time.perf_counter()
            proc = subprocess.run(run_command(trees[tree], name, work / f"out-{tree}-{rnd}"), cwd=trees[tree],
                                  env=envs[tree], capture_output=True, text=True)
            row = {"round": rnd, "notebook": name, "tree": tree, "wall_s": round(time.perf_counter() - started, 1),
                   "seconds": seconds_printed(proc.stdout, name), "rc": proc.returncode}
            row["executed"] = str(work / f"out-{tree}-{rnd}" / name)
            split = split_seconds(Path(row["executed"])) if proc.returncode == 0 else None
            row["core_s"], row["deeper_s"] = split if split else (None, None)
            rows.append(row)
            if args.json:
                with open(args.json, "a") as fh:
                    fh.write(json.dumps(row) + "\n")
            print(f"round {rnd} {name:<36} {tree}  {row['seconds']} s  (cells: core {row['core_s']} s, Go deeper "
                  f"{row['deeper_s']} s; wall {row['wall_s']} s, rc {proc.returncode})",
                  flush=True)
            if proc.returncode != 0:
                print(f"  failed:\n{proc.stdout[-800:]}\n{proc.stderr[-800:]}", flush=True)
    except KeyboardInterrupt:
        print("interrupted: the summary below is of the runs that ended", flush=True)
    finally:
        stop_engines(trees, envs)
    print(compare.machine_line(envs["new"]))
    lines = summarize(rows, compare)
    print(format_table(lines))
    if args.json:
        with open(args.json, "a") as fh:
            fh.write(json.dumps({"summary": lines, "old": args.old}) + "\n")


if __name__ == "__main__":
    main()
