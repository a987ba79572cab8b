"""The room's model download as ``workshop cluster-status`` shows it: the Job ``model-download`` in the instructor's
namespace (k8s/models), its state and how far its log says it got.

The Job's script (k8s/components/model-scripts/files/predownload.py) logs ``[predownload] model N/M: MODEL
(attempt K)`` when it starts a model, ``... ready in S s`` when one is complete, ``[predownload] done`` at the
end and ``[predownload] giving up: ...`` when it fails; huggingface_hub's progress bar adds ``NN%|`` lines.
Every kubectl call goes through one ``runner`` (``run_kubectl`` when None; tests pass a fake cluster).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

from helpers.cluster.kubectl import ProvisionError, Runner, kubectl
from helpers.cluster.room import DOWNLOAD_JOB, models_namespace

DOWNLOAD_SELECTOR = f"app.kubernetes.io/name={DOWNLOAD_JOB}"  # k8s/models/download.yaml labels its Job and pod
LOG_TAIL_LINES = 60


@dataclass(frozen=True)
class DownloadProgress:
    """Where the room's download stands: state (complete, running, failed, not found) and the log's last word."""

    namespace: str
    state: str
    models_done: int
    models_total: int | None
    current: str  # the model being downloaded, with its attempt and the progress bar's last percentage
    detail: str  # the failure, or what to do when there is no Job

    @property
    def sentence(self) -> str:
        """One line for the status: 'model download (ws-models): running, 1/3 models, now ...'."""
        where = f"model download ({self.namespace}, job {DOWNLOAD_JOB})"
        count = f"{self.models_done}/{self.models_total} models" if self.models_total else ""
        if self.state == "complete":
            return f"{where}: complete{', ' + count if count else ''} in the shared cache"
        if self.state == "running":
            now = f", now {self.current}" if self.current else ""
            return f"{where}: running{', ' + count + ' done' if count else ''}{now}"
        if self.state == "failed":
            return f"{where}: FAILED ({self.detail}); kubectl -n {self.namespace} logs job/{DOWNLOAD_JOB}"
        return f"{where}: {self.state}{'; ' + self.detail if self.detail else ''}"


_START = re.compile(r"\[predownload\] model (\d+)/(\d+): (\S+) \(attempt (\d+)\)")
_READY = re.compile(r"\[predownload\] model (\d+)/(\d+): (\S+) ready in")
_PERCENT = re.compile(r"(\d{1,3})%\|")


def parse_download_log(log: str) -> tuple[int, int | None, str, str]:
    """(models complete, models in all, the model being downloaded now, the failure) from the Job's log."""
    done, total, current, failure = 0, None, "", ""
    for line in re.split(r"[\r\n]+", log):
        if m := _READY.search(line):
            done, total, current = int(m.group(1)), int(m.group(2)), ""
        elif m := _START.search(line):
            total, current = int(m.group(2)), f"{m.group(3)} (model {m.group(1)}, attempt {m.group(4)})"
        elif "[predownload] giving up:" in line:
            failure = line.split("giving up:", 1)[1].strip()[:200]
        elif current and (m := _PERCENT.search(line)):
            current = re.sub(r"(, \d+%)?\)$", f", {m.group(1)}%)", current)
    return done, total, current, failure


def _job_state(job: Mapping[str, Any]) -> str:
    status = job.get("status", {})
    for cond in status.get("conditions", []):
        if cond.get("status") == "True" and cond.get("type") in ("Complete", "Failed"):
            return "complete" if cond["type"] == "Complete" else "failed"
    if status.get("succeeded"):
        return "complete"
    return "running" if status.get("active") else "pending"


def download_progress(prefix: str | None, runner: Runner | None = None) -> list[DownloadProgress]:
    """The room's download of workshop ``prefix`` (of every workshop found when None)."""
    if prefix is not None:
        namespace = models_namespace(prefix)
        listing = kubectl(["get", "jobs", "-n", namespace, "-l", DOWNLOAD_SELECTOR, "-o", "json"], runner)
    else:
        listing = kubectl(["get", "jobs", "--all-namespaces", "-l", DOWNLOAD_SELECTOR, "-o", "json"], runner)
    jobs = json.loads(listing).get("items", []) if listing.strip() else []
    if not jobs:
        where = models_namespace(prefix) if prefix else "any namespace"
        return [DownloadProgress(where, "not found", 0, None, "",
                                 f"no Job {DOWNLOAD_JOB} in {where}: workshop provision (without --dry-run) "
                                 "applies the room's download")]
    found = []
    for job in sorted(jobs, key=lambda j: j["metadata"]["namespace"]):
        namespace = job["metadata"]["namespace"]
        state = _job_state(job)
        try:
            log = kubectl(["logs", f"job/{job['metadata']['name']}", "-n", namespace, f"--tail={LOG_TAIL_LINES}"],
                          runner)
        except ProvisionError as err:  # no pod yet (pending), or its log is gone
            log, state = "", state if state != "running" else f"running (no log yet: {err})"
        done, total, current, failure = parse_download_log(log)
        detail = failure if state == "failed" else ""
        if state == "failed" and not detail:
            conditions = job.get("status", {}).get("conditions", [])
            detail = next((c.get("message") or c.get("reason", "") for c in conditions if c.get("type") == "Failed"),
                          "the Job failed")
        found.append(DownloadProgress(namespace, state, done, total, current, detail))
    return found
