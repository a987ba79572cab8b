"""The instructor's checks before and during the workshop day: ``workshop rehearse`` (the dress rehearsal) and
``workshop gpu-share`` (does the model fit a MIG slice or a time-sliced GPU, and what the day costs).

``register(subparsers)`` adds them to the ``workshop`` parser (helpers/cli/main.py). Exit codes: 0 every
participant ready (or the plan printed), 1 some participant to fix, 2 a usage or cluster error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from helpers.cluster import overlays, rehearse
from helpers.cluster.kubectl import ProvisionError
from helpers.core.errors import WorkshopError
from helpers.planning.gpu_share import WORKSHOP_DAY_HOURS


def cmd_rehearse(args: argparse.Namespace) -> int:
    """The dress rehearsal: in every participant namespace, one token from the engine and notebook 01 headless
    in the notebook pod; one table of what to fix. Each row is kept in <workshop-dir>/rehearsal.csv as it
    completes, so Ctrl-C loses nothing already checked."""
    prefix, expected = args.prefix, []
    settings = Path(args.workshop_dir) / overlays.SETTINGS_FILE
    if settings.is_file():  # what provision rendered there: its prefix, and every namespace it should have
        try:
            ws = overlays.load_workshop(args.workshop_dir)
        except ProvisionError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        if prefix in (None, ws.prefix):
            prefix, expected = ws.prefix, [ns for ns in ws.namespaces() if not args.namespace or ns in args.namespace]
    try:
        found = rehearse.participants(prefix, only=args.namespace, expected=expected)
    except ProvisionError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not found:
        print(f"no participant namespaces found{' for --prefix ' + prefix if prefix else ''}: "
              "workshop cluster-status shows what is provisioned")
        return 2
    log = rehearse.RehearsalLog(Path(args.workshop_dir) / rehearse.CSV_NAME)
    print(f"rehearsing {len(found)} namespaces ({found[0].namespace} ... {found[-1].namespace}); each result goes "
          f"to {log.path} as it completes")

    def done(row: rehearse.RehearsalRow) -> None:
        log.write(row)
        token = "-" if row.first_token_s is None else f"{row.first_token_s * 1000:.0f} ms"
        print(f"  {row.namespace}: engine {row.engine_ready}, first token {token}, notebook 01 {row.notebook}",
              flush=True)

    try:
        rows = rehearse.rehearse(found, done, parallel=args.parallel, parameters=args.param)
    except KeyboardInterrupt:
        rows = rehearse.read_log(log.path)
        print(f"\ninterrupted: {len(rows)} of {len(found)} namespaces checked, kept in {log.path}")
        for line in rehearse.table_lines(rows):
            print(line)
        print(rehearse.summary(rows, expected=len(found)))
        return 130
    print()
    for line in rehearse.table_lines(rows):
        print(line)
    print(rehearse.summary(rows, expected=len(found)))
    return 0 if all(r.ok for r in rows) else 1


def cmd_gpu_share(args: argparse.Namespace) -> int:
    """Does the lab's model fit one share of a GPU (every MIG profile, or the --gpu-share given), and what the
    day costs per participant next to one GPU each."""
    from helpers.hardware.gpu_shares import mig_profiles
    from helpers.planning import gpu_share

    gpu = overlays.GPU_PROFILES[args.gpu_type].gpu if args.gpu_type in overlays.GPU_PROFILES else args.gpu_type
    try:
        shares = args.gpu_share or [f"mig-{p.name}" for p in mig_profiles(gpu)] or ["none"]
        for share in shares:
            verdict = gpu_share.share_verdict(args.model, share, gpu)
            print(verdict.sentence)
            if args.participants:
                print("  " + gpu_share.day_cost(share, gpu, args.participants, args.hours).sentence)
            note = gpu_share.whole_gpu_lessons_note(share, gpu)
            if note and args.gpu_share:
                print("  " + note)
    except (WorkshopError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add rehearse and gpu-share to the ``workshop`` command."""
    p = subparsers.add_parser("rehearse", help=cmd_rehearse.__doc__.split(";")[0], description=cmd_rehearse.__doc__)
    p.add_argument("--prefix", default=None,
                   help="the workshop's namespace prefix (default: the one provision wrote in --workshop-dir, else "
                        "every workshop found)")
    p.add_argument("--namespace", action="append", default=[], metavar="NS",
                   help="rehearse only this participant namespace (repeatable), e.g. to check a fix")
    p.add_argument("--parallel", type=int, default=1, metavar="N",
                   help="namespaces checked at once (default 1; each runs notebook 01 against its own engine)")
    p.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                   help="a parameter for notebook 01, as for workshop run (repeatable)")
    p.add_argument("--workshop-dir", default=str(overlays.DEFAULT_OUT_DIR),
                   help="the directory provision wrote: its workshop.json names every namespace to check, and the "
                        "rehearsal's CSV goes there (default %(default)s)")
    p.set_defaults(func=cmd_rehearse)

    p = subparsers.add_parser("gpu-share", help=cmd_gpu_share.__doc__.split(",")[0], description=cmd_gpu_share.__doc__)
    p.add_argument("--model", default="Qwen/Qwen3-4B", help="a lab model (default %(default)s)")
    p.add_argument("--gpu-type", default="h100",
                   help=f"a GPU profile of provision ({', '.join(sorted(overlays.GPU_PROFILES))}) or a GPU of "
                        "the table (e.g. 'A100 80GB SXM'); default h100")
    p.add_argument("--gpu-share", action="append", default=[], metavar="SHARE",
                   help="none, mig-PROFILE or time-slicing:N (repeatable; default: every MIG profile of the GPU)")
    p.add_argument("--participants", type=int, default=None, help="also print the day's cost for this many")
    p.add_argument("--hours", type=float, default=WORKSHOP_DAY_HOURS,
                   help="hours the GPUs are rented for the day (default %(default)g, an assumption: pass yours)")
    p.set_defaults(func=cmd_gpu_share)
