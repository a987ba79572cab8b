"""The instructor's subcommands of ``workshop``: provision, cluster-status, cards, reset, teardown.

``register(subparsers)`` adds them to the ``workshop`` parser (helpers/cli/main.py). Each handler returns
an exit code: 0 done (also when there was nothing to do), 2 a usage or cluster error, printed as one
line without a traceback. Tokens and keys are never printed.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from helpers.cluster import cards, namespaces, overlays, room
from helpers.cluster.kubectl import ProvisionError
from helpers.core.errors import WorkshopError
from helpers.planning import gpu_share

Handler = Callable[[argparse.Namespace], int]


def _guarded(handler: Handler) -> Handler:
    """Turn ProvisionError (kubectl missing, no cluster, bad settings) into exit code 2 and one line."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except ProvisionError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2

    run.__doc__ = handler.__doc__
    return run


def _node_selector(pairs: list[str]) -> dict[str, str]:
    selector = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not value:
            raise ProvisionError(f"--node-selector needs KEY=VALUE (got {pair!r}), "
                                 "e.g. cloud.google.com/gke-accelerator=nvidia-l4")
        selector[key] = value
    return selector


def cmd_provision(args: argparse.Namespace) -> int:
    """Render one namespace per participant (and apply them unless --dry-run)."""
    rendered = overlays.render(args.participants, args.prefix, args.model, args.gpu_type, args.out,
                               with_moe=args.with_moe, domain=args.domain,
                               node_selector=_node_selector(args.node_selector), api_key=not args.no_api_key,
                               notebook_image=args.notebook_image, engine_image=args.engine_image,
                               model_nfs=args.model_nfs or "", kube_api=args.kube_api, egress_allow=args.egress_allow,
                               egress_internet=args.egress_internet, ingress_class=args.ingress_class,
                               monitoring_namespace=args.monitoring_namespace,
                               ingress_namespace=args.ingress_namespace, gpu_share=args.gpu_share)
    dirs = rendered.overlays
    print(f"rendered {len(dirs)} overlays in {args.out} ({dirs[0].name} ... {dirs[-1].name}); "
          f"secrets kept in <overlay>/{overlays.SECRETS_DIR}/ (mode 600)")
    print(f"one download for the room: Job {room.DOWNLOAD_JOB} in {room.models_namespace(args.prefix)} writes "
          f"{args.model_nfs}; every participant mounts it read-only")
    _print_gpu_share(args)
    if args.notebook_image is None:
        print(f"note: the notebooks run {overlays.BASE_NOTEBOOK_IMAGE}, which has neither the helpers nor the "
              "notebooks: build the workshop's image (make image IMAGE=registry/name:tag), push it, and pass "
              "--notebook-image")
    if rendered.removed:
        print(f"removed {len(rendered.removed)} overlays this workshop no longer has, with their tokens: "
              f"{' '.join(rendered.removed)}")
        print(f"  if applied, their namespaces stay on the cluster (kubectl delete namespace "
              f"{' '.join(rendered.removed)}); cards written before still list them (run workshop cards again)")
    for path in rendered.kept:
        print(f"kept {path}: not written by workshop provision")
    if args.dry_run:
        print("dry run: nothing applied. To apply: workshop provision (same flags) without --dry-run, or")
        for d in [rendered.room, *dirs]:
            print("  kubectl " + " ".join(namespaces.apply_command(d)))
        return 0
    for line in namespaces.apply(args.out):
        print(line)
    print(f"next: workshop cluster-status --prefix {args.prefix}; then workshop cards --workshop-dir {args.out}")
    return 0


def _print_gpu_share(args: argparse.Namespace) -> None:
    """What one participant's GPU share renders; the planner's verdict and the day's cost beside one GPU each."""
    gpu = overlays.GPU_PROFILES[args.gpu_type].gpu
    share = room.parse_gpu_share(args.gpu_share, gpu)
    if share.sharers > 1:
        print(f"GPU share {share.spec}: each engine requests {share.resource} on a time-sliced {gpu} and gets "
              f"--gpu-memory-utilization {room.gpu_memory_utilization(share, overlays.GPU_MEMORY_UTILIZATION)} "
              "(time-slicing shares memory without isolation)")
    elif share.resource != "nvidia.com/gpu":
        print(f"GPU share {share.spec}: each engine requests {share.resource} (quota: one slice, no whole GPU)")
    if share.spec == "none":
        return
    print(f"planner: {room.check_share(args.model, share, gpu).sentence}")
    try:
        print(f"cost: {gpu_share.day_cost(share.spec, gpu, args.participants, args.day_hours).sentence}")
    except WorkshopError as err:  # no price for this GPU in the kit's table
        print(f"cost: not computed ({err})")
    note = gpu_share.whole_gpu_lessons_note(share.spec, gpu)
    if note:
        print(f"lessons: {note}")


def cmd_cluster_status(args: argparse.Namespace) -> int:
    """The room's model download, then one line per participant: engine and notebook state, restarts, node."""
    from helpers.cluster.status import download_progress

    for download in download_progress(args.prefix):
        print(download.sentence)
    rows = namespaces.status(args.prefix)
    if not rows:
        print("no provisioned pods found (label " + namespaces.managed_selector(args.prefix) + ")")
        return 0
    header = ("namespace", "engine", "notebook", "restarts", "node")
    table = [header] + [(r.namespace, r.engine, r.notebook, str(r.engine_restarts), r.node) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    ready = sum(r.engine == "ready" and r.notebook == "ready" for r in rows)
    print(f"{ready}/{len(rows)} participants ready")
    return 0


def cmd_cards(args: argparse.Namespace) -> int:
    """Write access cards (URL + token per participant) to a file with mode 600."""
    path = cards.write_cards(args.workshop_dir, args.format, args.out)
    participants = len(overlays.load_workshop(args.workshop_dir).namespaces())
    print(f"wrote {participants} cards to {path} (mode 600; tokens inside)")
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    """Put one participant's engine back to the provisioned flags and restart it (files are kept)."""
    namespaces.reset(args.name, args.workshop_dir)
    print(f"{args.name}: manifests re-applied, engine restarting (watch: workshop cluster-status)")
    return 0


def cmd_teardown(args: argparse.Namespace) -> int:
    """Delete one workshop's provisioned namespaces (--prefix); lists them, and what stays and why, unless --yes."""
    plan = namespaces.teardown(args.prefix, yes=args.yes)
    for name, reason in plan.skipped.items():
        print(f"leaving {name}: {reason}")
    if args.prefix is None:
        found = ", ".join(plan.workshops) if plan.workshops else "none"
        example = plan.workshops[0] if plan.workshops else "NAME"
        print(f"teardown deletes one workshop at a time: pass --prefix. Workshops provisioned here: {found}. "
              f"To see what it would delete: workshop teardown --prefix {example}")
        return 0
    if not plan.delete:
        print(f"no namespaces of workshop {args.prefix!r} to delete (looked for {args.prefix}-NN labelled "
              f"{namespaces.managed_selector()} and annotated "
              f"{overlays.PROVISIONED_ANNOTATION}={overlays.MANAGED_BY})")
        return 0
    if not args.yes:
        print(f"would delete {len(plan.delete)} namespaces of workshop {args.prefix!r}: {' '.join(plan.delete)}")
        print("run again with --yes to delete them (their volumes go too)")
        return 0
    print(f"deleting {len(plan.delete)} namespaces of workshop {args.prefix!r}: {' '.join(plan.delete)}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add provision, cluster-status, cards, reset and teardown to the ``workshop`` command."""
    workshop_dir = dict(default=str(overlays.DEFAULT_OUT_DIR),
                        help="where provision wrote the overlays (default %(default)s)")

    p = subparsers.add_parser("provision", help=cmd_provision.__doc__, description=cmd_provision.__doc__)
    p.add_argument("--participants", type=int, required=True, help="number of participants (namespaces)")
    p.add_argument("--prefix", default="ws", help="namespace prefix: <prefix>-01, <prefix>-02, ... (default ws)")
    p.add_argument("--model", default="Qwen/Qwen3-4B", choices=sorted(overlays.LAB_MODELS), metavar="MODEL",
                   help="the engine's baseline model (default Qwen/Qwen3-4B)")
    p.add_argument("--gpu-type", default="l4", choices=sorted(overlays.GPU_PROFILES),
                   help="GPU of the nodes (default l4)")
    p.add_argument("--with-moe", action="store_true", help=f"also pre-download {overlays.MOE_MODEL} (61 GB)")
    p.add_argument("--domain", default=None, help="add an Ingress per participant at <namespace>.<DOMAIN>")
    p.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE",
                   help="GPU node label, replacing nvidia.com/gpu.present=true (repeatable)")
    p.add_argument("--no-api-key", action="store_true", help="do not protect the engines with an API key")
    p.add_argument("--notebook-image", default=None, metavar="IMAGE",
                   help="the participants' JupyterLab image, registry/name:tag (built by make image; k8s/README.md)")
    p.add_argument("--engine-image", default=None, metavar="IMAGE",
                   help=f"the engine's image instead of the pinned {overlays.BASE_ENGINE_IMAGE} (e.g. a mirror)")
    p.add_argument("--model-nfs", default=None, metavar="SERVER:/PATH",
                   help="NFS export for the room's one copy of the models (written by the instructor's namespace "
                        "only, mounted read-only by every participant; needs no storage class)")
    p.add_argument("--kube-api", action="append", default=[], metavar="ADDRESS/32:PORT",
                   help="the API server's endpoints the notebooks may reach (kubectl get endpointslices -n default "
                        "-l kubernetes.io/service-name=kubernetes); repeatable; 'none' keeps the API closed")
    p.add_argument("--egress-allow", action="append", default=[], metavar="CIDR[:PORT]",
                   help="open egress from every participant pod to this range, e.g. a package mirror (repeatable)")
    p.add_argument("--egress-internet", action="store_true",
                   help="open HTTPS/HTTP to public addresses (pip installs); never private or link-local ones")
    p.add_argument("--ingress-class", default="nginx", help="the Ingress' ingressClassName (default nginx)")
    p.add_argument("--ingress-namespace", default="ingress-nginx",
                   help="namespace of the ingress controller, let through to JupyterLab (default ingress-nginx)")
    p.add_argument("--monitoring-namespace", default="monitoring",
                   help="namespace of Prometheus, let through to the engines' metrics (default monitoring)")
    p.add_argument("--gpu-share", default="none", metavar="none|mig-PROFILE|time-slicing:N",
                   help="one whole GPU per participant (none), a MIG slice (e.g. mig-2g.20gb), or 1/N of a "
                        "time-sliced GPU")
    p.add_argument("--day-hours", type=float, default=8.0,
                   help="hours of GPU rental for the day, for the cost printed with --gpu-share (default 8)")
    p.add_argument("--dry-run", action="store_true", help="render only; print the kubectl commands")
    p.add_argument("--out", default=str(overlays.DEFAULT_OUT_DIR), help="output directory (default %(default)s)")
    p.set_defaults(func=_guarded(cmd_provision))

    p = subparsers.add_parser("cluster-status", help=cmd_cluster_status.__doc__, description=cmd_cluster_status.__doc__)
    p.add_argument("--prefix", default=None, help="only this workshop's namespaces")
    p.set_defaults(func=_guarded(cmd_cluster_status))

    p = subparsers.add_parser("cards", help=cmd_cards.__doc__, description=cmd_cards.__doc__)
    p.add_argument("--format", choices=("csv", "html"), default="csv")
    p.add_argument("--out", default=None, help="cards file (default <workshop-dir>/cards.<format>)")
    p.add_argument("--workshop-dir", **workshop_dir)
    p.set_defaults(func=_guarded(cmd_cards))

    p = subparsers.add_parser("reset", help=cmd_reset.__doc__, description=cmd_reset.__doc__)
    p.add_argument("name", help="the participant's namespace, e.g. ws-03")
    p.add_argument("--workshop-dir", **workshop_dir)
    p.set_defaults(func=_guarded(cmd_reset))

    p = subparsers.add_parser("teardown", help=cmd_teardown.__doc__, description=cmd_teardown.__doc__)
    p.add_argument("--yes", action="store_true", help="really delete (needs --prefix)")
    p.add_argument("--prefix", default=None,
                   help="the workshop to delete (<prefix>-NN); without it, list the workshops found")
    p.set_defaults(func=_guarded(cmd_teardown))


def main(argv: list[str] | None = None) -> int:
    """Run these subcommands alone (``python -m helpers.cli.provision``), e.g. before cli.py registers them."""
    parser = argparse.ArgumentParser(prog="workshop", description=__doc__)
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
