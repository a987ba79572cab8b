"""``workshop eval``: run an eval suite against the current endpoint, or compare two saved runs.

``register(subparsers)`` adds the subcommand; its handler returns an exit code: 0 done (for a
comparison: no regression), 1 a comparison flagged a regression beyond noise, 2 bad input or an
unreachable endpoint (one line on stderr).

    workshop eval                                  # agent-v1 against the current endpoint
    workshop eval --suite smoke --json run.json --csv rows.csv
    workshop eval --compare baseline.json candidate.json
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from helpers.evals import suite as evals
from helpers.cli.args import error, number_type, output_path_problem
from helpers.core.errors import WorkshopError
from helpers.engine.session import connect
from helpers.core.settings import load_settings

SHOWN_FAILURES = 10


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add the ``eval`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "eval", help="agent evals against the current endpoint: pass rates per category with 95%% intervals",
        description="Run a fixed, versioned suite of agent tasks (tool calls, answers from tool results, JSON under "
                    "structured outputs, plain answers) at temperature 0 with a fixed seed, or compare two saved "
                    "runs (exit 1 when a category regressed beyond noise: exact McNemar test on the shared tasks).")
    p.add_argument("--suite", default=evals.DEFAULT_SUITE, help=f"suite name (default {evals.DEFAULT_SUITE}; "
                                                                "also: smoke)")
    p.add_argument("--json", metavar="PATH", help="save the run (suite, model, endpoint, settings, rows, summary)")
    p.add_argument("--csv", metavar="PATH", help="save one row per task")
    p.add_argument("--seed", type=int, default=evals.DEFAULT_SEED, help="sampling seed sent with every request")
    p.add_argument("--max-tokens", type=number_type(int, 1), default=evals.DEFAULT_MAX_TOKENS, help="per answer")
    p.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"),
                   help="compare run B against baseline run A instead of running")
    p.set_defaults(func=run_eval)



def _percent(value: float | None) -> str:
    return "-" if value is None or pd.isna(value) else f"{100 * value:.1f}%"


def summary_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary as printed: pass rate and its interval in percent."""
    return pd.DataFrame({
        "n": summary["n"], "passed": summary["passed"], "pass rate": summary["pass_rate"].map(_percent),
        "95% CI": [f"{_percent(lo)} - {_percent(hi)}" for lo, hi in zip(summary["ci_low"], summary["ci_high"])],
        "errors": summary["errors"],
    })


def comparison_table(table: pd.DataFrame) -> pd.DataFrame:
    """The comparison as printed: rates, difference with its interval, flips, p-value, verdict."""
    def diff(row: pd.Series) -> str:
        if row["diff"] is None or pd.isna(row["diff"]):
            return "-"
        return f"{100 * row['diff']:+.1f} pts ({100 * row['diff_ci_low']:+.1f} .. {100 * row['diff_ci_high']:+.1f})"

    def flips(row: pd.Series) -> str:
        return "-" if row["pass_to_fail"] is None or pd.isna(row["pass_to_fail"]) else \
            f"{int(row['pass_to_fail'])} / {int(row['fail_to_pass'])}"

    return pd.DataFrame({
        "A": table["rate_a"].map(_percent), "B": table["rate_b"].map(_percent),
        "B - A (95% CI)": table.apply(diff, axis=1), "pass>fail / fail>pass": table.apply(flips, axis=1),
        "p": table["p_value"].map(lambda p: "-" if p is None or pd.isna(p) else f"{p:.3f}"),
        "verdict": table["regression"].map(lambda r: "REGRESSION" if r else "ok"),
    }, index=table.index)


def _compare(path_a: str, path_b: str) -> int:
    try:
        a, b = evals.load_run(path_a), evals.load_run(path_b)
    except OSError as err:
        return error(f"cannot read {err.filename} ({err.strerror or err}); give a file written by `workshop eval --json`")
    except (ValueError, KeyError, TypeError) as err:
        return error(str(err) if isinstance(err, ValueError) else
                      f"a run file is malformed ({type(err).__name__}: {err}); give files written by `workshop eval --json`")
    result = evals.compare(a, b)
    print(f"A: {path_a}  {a.suite} v{a.suite_version}  {a.model}")
    print(f"B: {path_b}  {b.suite} v{b.suite_version}  {b.model}")
    how = "paired: exact McNemar test on the tasks both ran" if result.paired else \
        "unpaired (no shared tasks): Newcombe 95% interval of the difference"
    print(f"regression beyond noise = {how}, p < {result.alpha}")
    print(comparison_table(result.table).to_string())
    if len(result.flipped):
        print(f"\npass -> fail ({len(result.flipped)}):")
        print(result.flipped[["id", "output_a", "output_b"]].to_string(index=False, max_colwidth=60))
    if result.regressed:
        print(f"\nregression in: {', '.join(result.regressed)}")
        return 1
    return 0


def run_eval(args: argparse.Namespace) -> int:
    """Run the suite and print the per-category table, or compare two runs."""
    if args.compare:
        return _compare(*args.compare)
    for flag, path in (("--json", args.json), ("--csv", args.csv)):
        problem = output_path_problem(flag, path)
        if problem:
            return error(problem)
    try:
        suite = evals.load_suite(args.suite)
        lab = connect(load_settings(), start=False)
        run = evals.run_suite(lab, suite, evals.EvalSettings(seed=args.seed, max_tokens=args.max_tokens),
                              progress=sys.stderr.isatty())
    except (ValueError, WorkshopError) as err:  # a bad suite file, the settings, the endpoint, MODEL_NAME not shipped
        return error(str(err))
    print(f"{run.suite} v{run.suite_version}: {len(run.rows)} tasks against {run.model} at "
          f"{evals.safe_endpoint(run.endpoint)} in {run.wall_s:.1f} s (temperature {run.settings.temperature}, "
          f"seed {run.settings.seed})")
    print(summary_table(run.summary()).to_string())
    failures = run.failures()
    if len(failures):
        print(f"\nfailed ({len(failures)}, first {min(len(failures), SHOWN_FAILURES)}):")
        shown = failures.head(SHOWN_FAILURES).assign(output=lambda f: f["error"].fillna(f["output"]))
        print(shown[["id", "output"]].to_string(index=False, max_colwidth=70))
    if args.json:
        print(f"saved {run.save(args.json)}")
    if args.csv:
        run.rows.to_csv(args.csv, index=False)
        print(f"saved {args.csv}")
    return 0
