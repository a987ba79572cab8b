"""``workshop cluster-status`` and ``workshop provision`` against a fake workshop (tests/fixtures/
fake_cluster_workshop.json, made up for the tests): the room's download progress from its Job's log, each
engine's readiness, and a namespace that fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import fake_kubectl_on_path

from helpers.cli.main import main
from helpers.cluster import status
from helpers.cluster.kubectl import CommandResult

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# The two flags every provisioned workshop needs (addresses made up for the tests), as tests/test_provision.py.
ROOM_FLAGS = ["--model-nfs", "10.0.0.5:/workshop-models", "--kube-api", "10.0.0.2/32:6443"]


def workshop() -> dict:
    return json.loads((FIXTURES / "fake_cluster_workshop.json").read_text())


@pytest.fixture
def fake_cluster(tmp_path, monkeypatch):
    """A `kubectl` first on PATH that is the fake workshop; call it with changes to the state, get the calls back."""
    state_path = tmp_path / "state.json"
    fake_kubectl_on_path(tmp_path, monkeypatch, state_path)

    def make(**changes) -> Path:
        cluster = workshop()
        cluster.update(changes)
        state_path.write_text(json.dumps({"cluster": cluster}))
        return Path(str(state_path) + ".calls")

    return make


def logs() -> dict[str, str]:
    return workshop()["download_logs"]


def test_the_download_log_says_how_far_it_got():
    assert status.parse_download_log(logs()["running"]) == (
        1, 3, "RedHatAI/Qwen3-4B-FP8-dynamic (model 2, attempt 1, 33%)", "")
    assert status.parse_download_log(logs()["complete"])[:3] == (3, 3, "")
    done, total, current, failure = status.parse_download_log(logs()["failed"])
    assert (done, total) == (0, 3) and "attempt 3" in current and failure.startswith("429 Client Error")
    assert status.parse_download_log("") == (0, None, "", "")


class Answers:
    """A runner answering the download's two commands."""

    def __init__(self, jobs: list[dict], log: str | None) -> None:
        self.jobs, self.log, self.calls = jobs, log, []

    def __call__(self, args):
        self.calls.append(list(args))
        if args[:2] == ["get", "jobs"]:
            return CommandResult(tuple(args), 0, json.dumps({"items": self.jobs}), "")
        if self.log is None:
            return CommandResult(tuple(args), 1, "", 'Error from server (BadRequest): container "download" in pod '
                                                     '"model-download-x" is waiting to start: ContainerCreating\n')
        return CommandResult(tuple(args), 0, self.log, "")


def job(**status_fields) -> dict:
    return {"metadata": {"name": "model-download", "namespace": "ws-models"}, "status": status_fields}


@pytest.mark.parametrize("job_status, log, words", [
    ({"active": 1}, logs()["running"], "running, 1/3 models done, now RedHatAI/Qwen3-4B-FP8-dynamic (model 2, "
                                       "attempt 1, 33%)"),
    ({"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}, logs()["complete"],
     "complete, 3/3 models in the shared cache"),
    ({"failed": 7, "conditions": [{"type": "Failed", "status": "True"}]}, logs()["failed"],
     "FAILED (429 Client Error"),
    ({"active": 1}, None, "running (no log yet"),
])
def test_the_download_progress_in_one_sentence(job_status, log, words):
    runner = Answers([job(**job_status)], log)
    [progress] = status.download_progress("ws", runner)
    assert progress.sentence.startswith("model download (ws-models, job model-download): ")
    assert words in progress.sentence
    assert runner.calls[0] == ["get", "jobs", "-n", "ws-models", "-l", "app.kubernetes.io/name=model-download",
                               "-o", "json"]
    assert runner.calls[1][:3] == ["logs", "job/model-download", "-n"]


def test_no_download_job_says_what_applies_it():
    [progress] = status.download_progress("ws", Answers([], ""))
    assert progress.state == "not found" and "workshop provision (without --dry-run)" in progress.sentence
    [anywhere] = status.download_progress(None, Answers([], ""))
    assert "any namespace" in anywhere.sentence


# ---------------------------------------------------------------- the commands, through the fake kubectl on PATH

def test_cluster_status_shows_the_download_and_the_failing_engine(fake_cluster, capsys):
    calls = fake_cluster()
    assert main(["cluster-status", "--prefix", "ws"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("model download (ws-models, job model-download): running, 1/3 models done, now "
                      "RedHatAI/Qwen3-4B-FP8-dynamic (model 2, attempt 1, 33%)")
    rows = {line.split()[0]: line.split() for line in out[2:-1]}
    assert rows["ws-01"][1:3] == ["ready", "ready"] and rows["ws-03"][1:3] == ["ready", "ready"]
    assert rows["ws-02"][1:4] == ["CrashLoopBackOff", "ready", "5"]
    assert out[-1] == "2/3 participants ready"
    called = [json.loads(c)[:2] for c in calls.read_text().splitlines()]
    assert called == [["get", "jobs"], ["logs", "job/model-download"], ["get", "pods"]]


def test_cluster_status_says_when_the_download_failed(fake_cluster, capsys):
    fake_cluster(download="failed")
    assert main(["cluster-status", "--prefix", "ws"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "FAILED (429 Client Error: Too Many Requests" in first
    assert first.endswith("kubectl -n ws-models logs job/model-download")


def test_provision_stops_at_the_namespace_the_cluster_refuses(fake_cluster, tmp_path, capsys):
    calls = fake_cluster()
    out = tmp_path / "ws"
    assert main(["provision", "--participants", "3", *ROOM_FLAGS, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "exceeded quota: gpu" in err and "Traceback" not in err
    applied = [Path(json.loads(c)[-1]).name for c in calls.read_text().splitlines() if json.loads(c)[0] == "apply"]
    assert applied[-2:] == ["ws-01", "ws-02"] and "ws-03" not in applied  # ws-01 went through; ws-02 refused
