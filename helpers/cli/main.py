"""The ``workshop`` command: run the engine, open the lab, execute notebooks, rebuild the models."""

# Loading this module needs only the core install (pyyaml): each command imports what it uses when it runs, a
# subcommand module that needs a package of an extra is listed anyway, and a command whose package is missing
# says in one line what to install (install_hint), without a traceback.

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from helpers.cli import args as cli_args
from helpers.core import kit_paths
from helpers.core.errors import WorkshopError
from helpers.core.settings import GPU_MODEL, load_settings
from helpers.core.vllm_args import ROUTER_POLICIES

# The subcommands other modules register, by module, in --help's order: named here so that a module that cannot
# be imported (a package of an extra is missing) still lists its subcommands, each saying what to install.
SUBCOMMAND_MODULES = {
    "helpers.cli.bench": ("bench", "record", "metrics"),
    "helpers.cli.planner": ("memory", "gpus"),
    "helpers.cli.provision": ("provision", "cluster-status", "cards", "reset", "teardown"),
    "helpers.cli.cluster_day": ("rehearse", "gpu-share"),  # the dress rehearsal; GPUs shared by plan
    "helpers.cli.eval": ("eval",),
    "helpers.cli.routing": ("routing",),  # replicas behind the router
}
# Modules that come with the cpu and gpu extras only (the engine, the router, JupyterLab); anything else a
# command misses is in the client extra.
ENGINE_EXTRA_MODULES = ("vllm", "vllm_router", "jupyterlab", "jupyterlab_server", "jupyter_server")


def install_hint(module: str) -> str:
    """What to run to get the missing third-party ``module``: its profile's install in a clone, else its extra."""
    engine = module.split(".")[0] in ENGINE_EXTRA_MODULES
    if kit_paths.checkout_root() is not None:  # install/install.py: the pinned versions, PyTorch's CPU build
        return ("make lab, or python install/install.py --profile cpu (--profile gpu on an NVIDIA GPU)" if engine
                else "python install/install.py --profile client (or cpu, with the engine)")
    extra = 'pip install "workshop-helpers[cpu]" (no GPU) or "workshop-helpers[gpu]"' if engine else \
        'pip install "workshop-helpers[client]"'
    return f"{extra} (README, \"Installing outside this repository's machines\": PyTorch's CPU index)"


def missing_package(err: ModuleNotFoundError) -> str | None:
    """The third-party module whose absence raised ``err``; None for one of the helpers (a bug, not an install)."""
    top = (err.name or "").split(".")[0]
    return None if top in ("", "helpers") else err.name


def _missing_line(command: str, module: str) -> str:
    return f"workshop {command} needs {module.split('.')[0]}, which is not installed: {install_hint(module)}"


def connect(settings: Any = None, start: bool = True) -> Any:
    """``helpers.engine.session.connect``, imported when a command first needs the engine (the core install has no httpx)."""
    from helpers.engine.session import connect as connect_lab

    return connect_lab(settings, start=start)


def _engine_or_fail():
    from helpers.engine.session import make_engine

    settings = load_settings()
    return settings, make_engine(settings)


def _vllm_missing() -> bool:
    """Whether vLLM (the cpu or gpu extra) is absent from this environment."""
    return importlib.util.find_spec("vllm") is None


def cmd_up(args: argparse.Namespace) -> int:
    """Start the engine for the profile (or find the running one) and print the endpoint."""
    if args.replicas is None and args.router is None:
        return start_engine(args.timeout, "up")
    if load_settings().managed and _vllm_missing():  # replicas are vLLM engines: say so before anything else is needed
        return cli_args.error(_missing_line("up", "vllm"))
    return _up_replicas(args.replicas, args.router, args.timeout)


def start_engine(timeout_s: float | None, command: str) -> int:
    """Start the profile's engine or find the running one (a recorded replica set is kept) and print the endpoint;
    ``command`` names the subcommand in the one-line hint when vLLM is missing."""
    if load_settings().managed and _vllm_missing():  # the local engine is vLLM: say so before anything else is needed
        return cli_args.error(_missing_line(command, "vllm"))
    from helpers.engine.local import LocalEngine
    from helpers.engine.replicas import ReplicaSet
    from helpers.engine.session import check_endpoint

    settings, engine = _engine_or_fail()
    if isinstance(engine, ReplicaSet):  # a replica set is recorded on this port: keep it
        return _up_replicas(None, None, timeout_s)
    if not isinstance(engine, LocalEngine):
        served = check_endpoint(settings, settings.model)
        print(f"external endpoint {settings.base_url} serves {served}; nothing to start")
        return 0
    start = time.monotonic()
    already = engine.is_ready() and engine.model == settings.model  # not when it serves another model: start switches
    if not already:  # the first start takes a while: say so before the phase line (shown on a terminal) begins
        print(f"starting the engine on port {settings.port} ({settings.model}); about a minute on a laptop CPU ...",
              flush=True)
    engine.start(timeout_s=timeout_s)
    verb = "already running" if already else f"ready after {time.monotonic() - start:.1f} s"
    print(f"engine {verb}: {settings.base_url} serving {engine.model!r} (pid {engine.pid})")
    print(f"log: {engine.log_path()}")
    return 0


def _up_replicas(replicas: int | None, router: str | None, timeout_s: float | None) -> int:
    """``workshop up --replicas N [--router POLICY]``: N local engines behind vllm-router on the workshop's port
    (None: as recorded for this port)."""
    from helpers.engine.replicas import ReplicaSet

    settings = load_settings()
    engine = ReplicaSet(settings, replicas, router)
    start = time.monotonic()
    engine.start(timeout_s=timeout_s)
    print(f"router ({engine.router.load().policy}) ready after {time.monotonic() - start:.1f} s: {settings.base_url} "
          f"serving {engine.model!r} (pid {engine.router.pid}); metrics {engine.router.metrics_url()}")
    for row in engine.replica_rows():
        print(f"  replica {row['replica']}: port {row['port']} pid {row['pid']} threads {row['threads']} kv {row['kv_bytes']} bytes")
    print(f"logs: {engine.router.log_path()} and engine-PORT.log beside it")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    """Stop the engine: the local server with every process it started, or the cluster Deployment (scaled to 0)."""
    from helpers.engine.local import LocalEngine
    from helpers.engine.process import describe_process, port_holder
    from helpers.engine.replicas import ReplicaSet
    from helpers.engine.session import thinking_engine

    settings, engine = _engine_or_fail()
    if isinstance(engine, ReplicaSet):  # a replica set: the router, then every replica
        stopped = engine.stop()
        print("stopped " + ", ".join(f"{name} (pid {pid})" if pid else f"{name} (was not running)"
                                     for name, pid in stopped.items()))
        return 0
    if not isinstance(engine, LocalEngine):
        engine.stop()
        print("engine stopped")
        return 0
    pid, problem = engine.pid, engine.state_problem
    engine.stop()  # also ends what is left of an engine whose server was killed
    print(f"engine stopped (pid {pid})" if pid else "no local engine was running")
    beside = thinking_engine(settings)  # the thinking stand-in, if a notebook's kernel died inside its cell
    if side_pid := beside.pid:
        beside.stop()
        print(f"the thinking stand-in on port {beside.settings.port} stopped too (pid {side_pid})")
    if problem:
        print(f"note: state file: {problem}")
    busy, holder = port_holder(settings.port)
    if busy:
        print(f"port {settings.port} is held by {describe_process(holder)}, which the helpers did not start: left alone")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Endpoint, model, flags, who holds the port and readiness, with why when not ready (no secrets)."""
    _, engine = _engine_or_fail()
    status = engine.status()
    if args.json:
        print(json.dumps(status, indent=1))
    else:
        for key, value in status.items():
            print(f"{key:>12}: {' '.join(map(str, value)) if isinstance(value, list) else value}")
    return 0


def cmd_lab(args: argparse.Namespace) -> int:
    """Start the engine if needed, then JupyterLab on your own copies of the notebooks (my-notebooks/)."""
    from helpers.lab import workspace

    if importlib.util.find_spec("jupyterlab") is None:
        return cli_args.error(_missing_line("lab", "jupyterlab"))
    try:
        report = workspace.sync(args.dir)  # before the engine starts: a bad --dir fails at once
    except workspace.WorkspaceError as err:
        return cli_args.error(str(err))
    for line in report.lines():
        print(line)
    if start_engine(None, "lab") != 0:
        return 1
    names = report.copied + report.refreshed + report.kept + report.current
    first = workspace.START_HERE if workspace.START_HERE in names else min(names, default=None)
    own_settings = any(a.startswith("--LabApp.app_settings_dir") for a in args.jupyter_args)
    own_layouts = any(a.startswith("--LabApp.workspaces_dir") for a in args.jupyter_args)
    cmd = [sys.executable, "-m", "jupyterlab", f"--notebook-dir={report.workspace}",
           *([f"--LabApp.default_url=/lab/tree/{first}"] if first else []),
           *([] if own_settings else [f"--LabApp.app_settings_dir={workspace.JUPYTERLAB_SETTINGS}"]),
           *([] if own_layouts else [f"--LabApp.workspaces_dir={workspace.seed_lab_layout(report.workspace)}"]),
           *args.jupyter_args]
    if os.geteuid() == 0 and "--allow-root" not in cmd:  # containers often run as root; JupyterLab refuses it otherwise
        cmd.append("--allow-root")
    print("starting JupyterLab:", " ".join(cmd[2:]))
    os.execv(sys.executable, cmd)
    return 0  # not reached


def cmd_notebooks(args: argparse.Namespace) -> int:
    """Copy the notebooks into your workspace (new ones, and updates to those you have not changed),
    or --reset one to the committed version (yours is kept beside it)."""
    from helpers.lab import workspace

    try:
        for name in args.reset:
            backup = workspace.reset(name, args.dir)
            print(f"reset {workspace.find_notebook(name).name}" + (f"; yours is now {backup.name}" if backup else ""))
        if not args.reset:
            report = workspace.sync(args.dir)
            for line in report.lines() or [f"{report.workspace}: every notebook is current"]:
                print(line)
    except workspace.WorkspaceError as err:
        return cli_args.error(str(err))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Execute notebooks headless against the engine; stop at the first error.

    Every -p NAME=VALUE is checked against the notebooks' parameters cells before the engine starts;
    it goes to the notebooks that have NAME and is refused only when none of them has it.
    """
    from helpers.core.restarts import table_lines as restart_table
    from helpers.lab.notebooks import (NotebookRunError, ParameterError, check_parameters, read_notebook,
                                       run_notebook, workshop_notebooks)
    from helpers.lab.restarts import restart_row

    paths = [Path(p) for p in args.notebooks] or workshop_notebooks()
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        folders = " (name the .ipynb files in a folder)" if any(Path(p).is_dir() for p in missing) else ""
        return cli_args.error(f"no such notebook: {', '.join(missing)}{folders}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        return cli_args.error(f"--out {out} is a file: give a directory for the executed copies")
    try:
        parameters = check_parameters(args.param, {p.name: read_notebook(p) for p in paths})
    except (ParameterError, NotebookRunError) as err:
        return cli_args.error(str(err))
    for name in dict.fromkeys(pair.partition("=")[0] for pair in args.param):
        having = [path.name for path in paths if name in parameters[path.name]]
        if len(paths) > 1 and len(having) < len(paths):
            print(f"-p {name} goes to {', '.join(having)} (the other notebooks have no such parameter)")
    settings = load_settings()
    connect(settings)  # start or find the engine once, before any kernel starts
    rows = []
    for path in paths:
        restart_log = restart_log_for(out, path, settings.profile)
        try:
            run = run_notebook(path, out, parameters[path.name], timeout_s=args.cell_timeout,
                               progress=True, core_only=args.core_only)  # a bar of the cells, with the section being run
        except NotebookRunError as err:
            print(f"FAILED {err}", file=sys.stderr)
            return 1
        print(f"ok  {path.name}  {run.seconds:.1f} s  -> {run.output}")
        if restart_log:
            rows.append(restart_row(run.output, restart_log))
            print(rows[-1].encode())  # for the rehearsal, which reads it back from the pod
    if rows:  # the k8s profile: every flag or model change was a rollout of the engine
        print("\n".join(["", "Engine restarts (rollouts):", *restart_table(rows)]))
    return 0


def restart_log_for(out: Path, path: Path, profile: str) -> Path | None:
    """On the k8s profile, a fresh restart log for this notebook's kernel ($WORKSHOP_RESTART_LOG); else None."""
    from helpers.core.restarts import RESTART_LOG_ENV

    if profile != "k8s":
        return None
    log = out / f"{path.stem}.restarts.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    os.environ[RESTART_LOG_ENV] = str(log)  # the kernel started next inherits it
    return log


def cmd_machine(args: argparse.Namespace) -> int:
    """This machine's CPU kind, memory and what vLLM's CPU build can do on it; is it quiet now?"""
    from helpers.hardware import machine

    settings = load_settings()
    facts = {**machine.describe(), "features": machine.capability_table(settings.profile)}
    quiet = machine.check_quiet(sample_s=args.sample)
    facts["quiet"] = {"quiet": quiet.quiet, "warnings": quiet.warnings, "busy_share": round(quiet.busy_share, 3),
                      "steal_share": round(quiet.steal_share, 3), "load_1m": quiet.load_1m,
                      "loop_lag_p99_ms": round(quiet.loop_lag_p99_ms, 2), "other_vllm": quiet.other_vllm}
    if args.json:
        print(json.dumps(facts, indent=1))
        return 0
    for key in ("cpu", "arch", "cores", "memory_gib", "isa", "vector_flags"):
        print(f"{key:>13}: {facts[key]}")
    for row in facts["features"]:
        print(f"{row['feature']:>13}: {'yes' if row['available'] else 'NO '}  {row['why']}")
    print(quiet.message())
    return 0


def cmd_course_time(args: argparse.Namespace) -> int:
    """Per notebook, by the honest clock: the core path's minutes at the workshop (an estimate, restarts at the room's
    time) and in self-study (measured on the CPU); --write records them and writes the Time lines, the facilitator
    pages' minutes, the day's timetable (docs/facilitator/day.md) and start_here's table."""
    import subprocess

    from helpers.hardware.machine import cpu_info
    from helpers.lab import course_time as ct
    from helpers.lab import day

    folder = Path(args.notebooks) if args.notebooks else kit_paths.kit_dir("notebooks")
    paths = ct.course_notebooks(folder)
    if not paths:
        return cli_args.error(f"--notebooks {folder}: no notebooks there (start_here.ipynb, NN_*.ipynb)")
    if args.restarts and not Path(args.restarts).is_dir():
        return cli_args.error(f"--restarts {args.restarts}: give the --out folder of `workshop run --core-only` on the "
                              "k8s profile, or build/k8s-path after tests/test_k8s_path_notebooks.py")
    changes = ct.restart_changes(Path(args.restarts)) if args.restarts else None
    records = (ct.executed_records(Path(args.executed), paths, f"workshop run --out {Path(args.executed).name}")
               if args.executed else None)
    rows = ct.course_times(paths, Path(args.cells), changes, model_weight_bytes, GPU_MODEL, records)
    print("\n".join(ct.table_lines(rows)))
    if changes is None:
        print("Restarts not measured: give --restarts with the --out folder of `workshop run --core-only` on the k8s "
              "profile, or build/k8s-path after tests/test_k8s_path_notebooks.py.")
    if not args.write:
        return 0
    git = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True)
    cpu = cpu_info()
    machine = {"cpu": cpu.model, "isa": cpu.isa, "cores": cpu.cores, "arch": cpu.arch}
    source = f"k8s-path run: {Path(args.restarts).name}" if args.restarts else "not measured"
    record = ct.make_record(rows, machine, git.stdout.strip() or "unknown", source)
    out = Path(args.record) if args.record else folder / ct.RECORD_NAME
    out.write_text(json.dumps(record, indent=1) + "\n")
    changed = ct.write_time_lines(paths, record)
    docs = Path(args.docs)
    changed += ct.write_facilitator_minutes(docs, record)
    if docs.is_dir():
        (docs / "day.md").write_text(day.page(record))
    changed += ct.write_start_here_day(folder / "start_here.ipynb", day.side_by_side(record))
    print(f"wrote {out.name} and the day's timetable; changed: {', '.join(p.name for p in changed) or 'nothing else'}")
    for problem in day.problems(day.plan(record)):
        print(f"The day does not fit: {problem}")
    return 0


def model_weight_bytes(model: str) -> int | None:
    """A lab model's weight bytes from its published config (helpers/data/configs), None for an unknown id."""
    from helpers.planning.gpu_share import GpuShareError, lab_model_source
    from helpers.planning.weights import weight_bytes

    try:
        source, dtype = lab_model_source(model)
    except GpuShareError:
        return None
    return None if isinstance(source, str) else weight_bytes(source, dtype or "bf16")


SIBLING_STEPS = {"moe": 250, "draft": 1200, "draft-untrained": 0}
QWEN3_STEPS = 700  # tiny-qwen3 (models/tiny-qwen3/training_record_stage1.json holds the steps it stopped at)


def cmd_build_model(args: argparse.Namespace) -> int:
    """Rebuild a tiny model from its seeds (see helpers/tiny/build.py): the agent (both stages), its MoE
    sibling, or the aligned and untrained draft models; the siblings reuse the agent's tokenizer."""
    from helpers.tiny.build import build, build_sibling

    out = Path(args.out or ("models/tiny-agent" if args.kind == "agent" else f"models/tiny-{args.kind}"))
    if out.exists() and not out.is_dir():
        return cli_args.error(f"--out {out} is a file: give a directory for the model")
    if args.kind in SIBLING_STEPS and not (Path(args.agent) / "tokenizer.json").is_file():
        return cli_args.error(f"--agent {args.agent} holds no tokenizer.json: the {args.kind} model takes the tiny agent's "
                            "tokenizer; build the agent first (workshop build-model) or point --agent at it")
    if args.kind == "agent":
        records = build(out, args.stage1_steps, args.stage2_steps, args.batch_size)
    elif args.kind == "qwen3":  # standalone: its own tokenizer, Qwen3-4B's template (helpers/tiny/qwen3.py)
        from helpers.tiny import qwen3

        records = [qwen3.train(out, QWEN3_STEPS if args.steps is None else args.steps, batch_size=32)]
    else:
        steps = SIBLING_STEPS[args.kind] if args.steps is None else args.steps
        records = [build_sibling(args.kind, out, steps, Path(args.agent), batch_size=args.batch_size)]
    seconds = sum(r["train_seconds"] for r in records)
    print(f"trained {records[0]['params']:,} parameters in {seconds:.0f} s -> {out}")
    return 0


def cmd_heldout(args: argparse.Namespace) -> int:
    """Measure the served model's tool calls on held-out phrasings."""
    import pandas as pd

    from helpers.evals.toolcall import evaluate

    for flag, path in (("--json", args.json), ("--csv", args.csv)):
        problem = cli_args.output_path_problem(flag, path)
        if problem:
            return cli_args.error(problem)
    lab = connect()
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.thinking]
    results = [evaluate(lab, n_per_kind=args.n, thinking=mode) for mode in modes]
    if len(results) == 1:
        rows, summary = results[0]
    else:  # one summary per mode; the rows of both, told apart by their "thinking" column
        summary = {f"thinking_{'on' if mode else 'off'}": s for mode, (_, s) in zip(modes, results)}
        rows = pd.concat([r.assign(thinking=mode) for mode, (r, _) in zip(modes, results)], ignore_index=True)
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")
    if args.csv:
        rows.to_csv(args.csv, index=False)
    return 0


def _summary(func: object) -> str:
    """A handler's docstring, first paragraph, as argparse help (which %-formats it: a bare % is doubled)."""
    return (getattr(func, "__doc__", None) or "").split("\n\n")[0].replace("%", "%%")


def build_parser() -> argparse.ArgumentParser:
    number = cli_args.number_type
    parser = argparse.ArgumentParser(prog="workshop", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("up", help=_summary(cmd_up))
    p.add_argument("--timeout", type=number(float, 0, above=True), default=None, help="seconds to wait for readiness")
    p.add_argument("--replicas", type=number(int, 1, 8), default=None,
                   help="run N local engines behind vllm-router on the workshop's port (replicas on the next ports)")
    p.add_argument("--router", default=None, choices=ROUTER_POLICIES, help="the router's policy (default consistent_hash)")
    p.set_defaults(func=cmd_up)
    sub.add_parser("down", help=_summary(cmd_down)).set_defaults(func=cmd_down)
    p = sub.add_parser("status", help=_summary(cmd_status))
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("lab", help=_summary(cmd_lab), epilog="Other arguments go to JupyterLab (e.g. --no-browser).")
    p.add_argument("--dir", default=None, help="your copies of the notebooks (default WORKSHOP_WORKSPACE, "
                   "else my-notebooks/ in the repository, ignored by git; in the current folder for a wheel install)")
    p.set_defaults(func=cmd_lab, jupyter_args=[])
    p = sub.add_parser("notebooks", help=_summary(cmd_notebooks), description=cmd_notebooks.__doc__)
    p.add_argument("--reset", action="append", default=[], metavar="NOTEBOOK",
                   help="put the committed version back, e.g. --reset 03 (repeatable); yours is kept as a backup")
    p.add_argument("--dir", default=None, help="your copies of the notebooks (default as for lab)")
    p.set_defaults(func=cmd_notebooks)
    p = sub.add_parser("run", help=_summary(cmd_run), description=cmd_run.__doc__)
    p.add_argument("notebooks", nargs="*", help="notebook paths (default: all numbered notebooks)")
    p.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                   help="override a parameter of the parameters cell, e.g. -p MAX_MODEL_LEN=1024 (repeatable)")
    p.add_argument("--out", default=str(Path("build") / "executed"), help="where executed copies go")
    p.add_argument("--cell-timeout", type=number(int, 1), default=1800,
                   help="seconds one cell may run (a tuning or sweep cell takes 10+ min on a slow 2-core CPU)")
    p.add_argument("--core-only", action="store_true",
                   help="run each notebook's core path alone, every Go deeper cell removed, as the workshop does")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("build-model", help=_summary(cmd_build_model))
    p.add_argument("--kind", choices=["agent", *SIBLING_STEPS, "qwen3"], default="agent")
    p.add_argument("--out", default=None, help="default: models/tiny-KIND (models/tiny-agent for the agent)")
    p.add_argument("--stage1-steps", type=number(int, 0), default=2000, help="agent only")
    p.add_argument("--stage2-steps", type=number(int, 0), default=500, help="agent only")
    p.add_argument("--steps", type=number(int, 0), default=None, help=f"siblings only (defaults: {SIBLING_STEPS})")
    p.add_argument("--agent", default="models/tiny-agent", help="siblings take this model's tokenizer")
    p.add_argument("--batch-size", type=number(int, 1), default=48)
    p.set_defaults(func=cmd_build_model)
    p = sub.add_parser("heldout", help=_summary(cmd_heldout))
    p.add_argument("--n", type=number(int, 1), default=20, help="cases per kind")
    p.add_argument("--csv", default=None, help="write per-case rows here")
    p.add_argument("--json", default=None, help="write the summary here")
    p.add_argument("--thinking", choices=["off", "on", "both"], default="off",
                   help="a thinking model (tiny-qwen3, Qwen3) asked with thinking off, on, or each in turn")
    p.set_defaults(func=cmd_heldout)
    p = sub.add_parser("machine", help=_summary(cmd_machine))
    p.add_argument("--json", action="store_true")
    p.add_argument("--sample", type=number(float, 0, 60, above=True), default=1.0,
                   help="seconds of the quiet-machine sample (at most 60)")
    p.set_defaults(func=cmd_machine)
    p = sub.add_parser("course-time", help=_summary(cmd_course_time), description=cmd_course_time.__doc__)
    p.add_argument("--cells", default=str(kit_paths.work_root() / "build" / "notebook-cells"),
                   help="the per-cell seconds the local-path tests keep (default build/notebook-cells)")
    p.add_argument("--restarts", default=None, metavar="FOLDER",
                   help="a k8s-path run's --out folder (NAME.restarts.jsonl beside NAME.ipynb), e.g. build/k8s-path")
    p.add_argument("--executed", default=None, metavar="FOLDER",
                   help="the CPU run from executed copies (`workshop run --core-only --out FOLDER` at the defaults) "
                        "instead of the tests' records")
    p.add_argument("--notebooks", default=None, help="the notebooks' folder (default the kit's notebooks/)")
    p.add_argument("--write", action="store_true", help="record into course_time.json and write the Time lines")
    p.add_argument("--record", default=None, help="where --write puts the record (default NOTEBOOKS/course_time.json)")
    p.add_argument("--docs", default=str(kit_paths.kit_root() / "docs" / "facilitator"),
                   help="the facilitator pages --write keeps current (their Minutes lines, day.md)")
    p.set_defaults(func=cmd_course_time)
    for module, commands in SUBCOMMAND_MODULES.items():
        _register(sub, module, commands)
    return parser


def _register(sub: argparse._SubParsersAction, module: str, commands: tuple[str, ...]) -> None:
    """Add the subcommands of ``module``; when it needs a package that is not installed, add each as a command that
    says what to install."""
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as err:
        missing = missing_package(err)
        if missing is None:
            raise
        for name in commands:
            p = sub.add_parser(name, help=f"(not installed here: needs {missing.split('.')[0]})",
                               description=_missing_line(name, missing))
            p.set_defaults(func=lambda args, missing=missing: cli_args.error(_missing_line(args.command, missing)),
                           takes_any_arguments=True)
        return
    loaded.register(sub)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "lab" and not getattr(args, "takes_any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.jupyter_args = extra if args.command == "lab" else []
    try:
        return args.func(args)
    except ModuleNotFoundError as err:  # a package of an extra: say which to install, no traceback
        missing = missing_package(err)
        if missing is None:
            raise
        return cli_args.error(_missing_line(args.command, missing))
    except WorkshopError as err:  # every error the helpers raise for a person to read (helpers/core/errors.py)
        return cli_args.error(str(err))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
