"""helpers.provision and its CLI with a recorded fake kubectl: no cluster, no kubectl needed."""

from __future__ import annotations

import csv
import io
import json
import stat
from pathlib import Path
from typing import Sequence

import pytest

from helpers import provision as pv
from helpers.provision_cli import main

FIXTURES = Path(__file__).resolve().parent / "fixtures"


class FakeKubectl:
    """Answers kubectl commands from recorded outputs (matched by argument prefix) and records every call."""

    def __init__(self, answers: dict[tuple[str, ...], pv.CommandResult | str] | None = None) -> None:
        self.answers = answers or {}
        self.calls: list[list[str]] = []

    def __call__(self, args: Sequence[str]) -> pv.CommandResult:
        self.calls.append(list(args))
        for prefix, answer in self.answers.items():
            if tuple(args[:len(prefix)]) == prefix:
                if isinstance(answer, pv.CommandResult):
                    return answer
                return pv.CommandResult(tuple(args), 0, answer, "")
        return pv.CommandResult(tuple(args), 0, "", "")


# What kubectl printed here with no cluster configured (stderr, exit code 1).
UNREACHABLE = pv.CommandResult((), 1, "", (
    'E1129 memcache.go:265] "Unhandled Error" err="couldn\'t get current server API group list: '
    'dial tcp 127.0.0.1:8080: connect: connection refused"\n'
    "The connection to the server localhost:8080 was refused - did you specify the right host or port?\n"))


@pytest.fixture
def workshop(tmp_path: Path) -> Path:
    pv.render(3, "ws", out_dir=tmp_path / "ws")
    return tmp_path / "ws"


# ---------------------------------------------------------------- rendering

def test_render_writes_one_overlay_per_participant_with_private_secrets(workshop):
    assert sorted(p.name for p in workshop.iterdir() if p.is_dir()) == ["ws-01", "ws-02", "ws-03"]
    tokens = set()
    for ns in ("ws-01", "ws-02", "ws-03"):
        secrets_dir = workshop / ns / pv.SECRETS_DIR
        assert stat.S_IMODE(secrets_dir.stat().st_mode) == 0o700
        for name in ("notebook-token", "vllm-api-key"):
            assert stat.S_IMODE((secrets_dir / name).stat().st_mode) == 0o600
        tokens.add((secrets_dir / "notebook-token").read_text())
        kustomization = (workshop / ns / "kustomization.yaml").read_text()
        assert f"namespace: {ns}" in kustomization and "workshop-provision" in kustomization
    assert len(tokens) == 3 and all(len(t) == 48 for t in tokens)
    assert "*/.secrets/" in (workshop / ".gitignore").read_text()
    assert pv.load_workshop(workshop).namespaces() == ["ws-01", "ws-02", "ws-03"]


def test_render_reuses_stored_secrets_and_keeps_them_when_participants_are_added(workshop):
    first = pv.secret_values(workshop)
    pv.render(4, "ws", out_dir=workshop)
    assert first < pv.secret_values(workshop)
    assert len(pv.secret_values(workshop)) == 8


def test_render_without_api_key_writes_no_engine_key(tmp_path):
    pv.render(1, "ws", out_dir=tmp_path, api_key=False)
    assert not (tmp_path / "ws-01" / pv.SECRETS_DIR / "vllm-api-key").exists()
    assert "vllm-api-key" not in (tmp_path / "ws-01" / "kustomization.yaml").read_text()


@pytest.mark.parametrize("kwargs, message", [
    ({"participants": 0}, "between 1 and"),
    ({"participants": 100}, "between 1 and"),
    ({"prefix": "Team_A"}, "DNS label"),
    ({"prefix": "kube-ws"}, "not starting with 'kube'"),
    ({"gpu_type": "tpu"}, "unknown --gpu-type"),
    ({"model": "meta-llama/Llama-3-8B"}, "unknown --model"),
    ({"model": pv.MOE_MODEL, "gpu_type": "a100"}, "needs about 65 GB"),
    ({"domain": "Not A Domain"}, "DNS name"),
])
def test_render_refuses_settings_that_cannot_work(tmp_path, kwargs, message):
    settings = {"participants": 2, "prefix": "ws", "out_dir": tmp_path, **kwargs}
    with pytest.raises(pv.ProvisionError, match=message):
        pv.render(**settings)
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_the_moe_model_fits_an_h100_and_pulls_in_the_moe_component(tmp_path):
    pv.render(1, "ws", model=pv.MOE_MODEL, gpu_type="h100", out_dir=tmp_path)
    text = (tmp_path / "ws-01" / "kustomization.yaml").read_text()
    assert "components/with-moe" in text and "components/gpu-h100" in text and f"MODEL_NAME={pv.MOE_MODEL}" in text


# ---------------------------------------------------------------- kubectl through the fake runner

def test_apply_runs_one_server_side_apply_per_participant(workshop):
    fake = FakeKubectl({("apply",): "namespace/x serverside-applied\nservice/y serverside-applied\n"})
    lines = pv.apply(workshop, runner=fake)
    assert [c[-1] for c in fake.calls] == [str(workshop / ns) for ns in ("ws-01", "ws-02", "ws-03")]
    assert all(c[:2] == ["apply", "--server-side"] and "--force-conflicts" in c for c in fake.calls)
    assert lines[0] == "ws-01: 2 objects applied"


def test_teardown_deletes_only_labelled_namespaces():
    listing = (FIXTURES / "kubectl_get_namespaces.json").read_text()
    fake = FakeKubectl({("get", "namespaces"): listing})
    plan = pv.teardown(yes=False, runner=fake)
    assert plan.delete == ["ws-01", "ws-02"]
    assert plan.refused == ["default", "kube-system", "team-prod"]
    assert fake.calls == [["get", "namespaces", "-l", "app.kubernetes.io/managed-by=workshop-provision", "-o", "json"]]

    pv.teardown(prefix="ws", yes=True, runner=fake)
    assert fake.calls[-2][3] == "app.kubernetes.io/managed-by=workshop-provision,workshop/prefix=ws"
    assert fake.calls[-1] == ["delete", "namespace", "ws-01", "ws-02", "--wait=false"]
    deletes = [c for c in fake.calls if c[0] == "delete"]
    assert len(deletes) == 1


def test_teardown_with_nothing_labelled_deletes_nothing():
    fake = FakeKubectl({("get", "namespaces"): json.dumps({"kind": "List", "items": []})})
    assert pv.teardown(yes=True, runner=fake) == pv.TeardownPlan([], [])
    assert [c[0] for c in fake.calls] == ["get"]


def test_reset_reapplies_and_restarts_only_a_labelled_participant(workshop):
    labelled = json.dumps({"kind": "Namespace",
                           "metadata": {"name": "ws-02", "labels": {pv.MANAGED_BY_LABEL: pv.MANAGED_BY}}})
    fake = FakeKubectl({("get", "namespace"): labelled})
    pv.reset("ws-02", workshop, runner=fake)
    assert [c[0] for c in fake.calls] == ["get", "apply", "annotate", "rollout"]
    assert fake.calls[1][-1] == str(workshop / "ws-02")
    assert fake.calls[2] == ["annotate", "deployment/vllm", "-n", "ws-02", "workshop/last-good-config-"]
    assert fake.calls[3] == ["rollout", "restart", "deployment/vllm", "-n", "ws-02"]

    unlabelled = FakeKubectl({("get", "namespace"): json.dumps({"metadata": {"name": "ws-02", "labels": {}}})})
    with pytest.raises(pv.ProvisionError, match="refusing"):
        pv.reset("ws-02", workshop, runner=unlabelled)
    assert [c[0] for c in unlabelled.calls] == ["get"]
    with pytest.raises(pv.ProvisionError, match="not one of"):
        pv.reset("kube-system", workshop, runner=FakeKubectl())


def test_cluster_status_parses_a_recorded_pod_listing():
    fake = FakeKubectl({("get", "pods"): (FIXTURES / "kubectl_get_pods.json").read_text()})
    rows = {r.namespace: r for r in pv.status("ws", runner=fake)}
    assert fake.calls[0][:4] == ["get", "pods", "--all-namespaces", "-l"]
    assert rows["ws-01"] == pv.ParticipantStatus("ws-01", "ready", "ready", 1, "gke-gpu-pool-1")
    assert rows["ws-02"].engine == "downloading models"  # the newest of its two pods
    assert rows["ws-03"].engine.startswith("unschedulable: 0/4 nodes are available: 2 Insufficient nvidia.com/gpu")
    assert rows["ws-03"].notebook == "CrashLoopBackOff" and rows["ws-03"].node == "-"


def test_an_unreachable_cluster_is_a_clear_error():
    with pytest.raises(pv.ClusterUnreachable, match="No Kubernetes cluster reachable"):
        pv.status(runner=FakeKubectl({("get",): UNREACHABLE}))
    with pytest.raises(pv.ProvisionError, match="forbidden"):
        forbidden = pv.CommandResult((), 1, "", "Error from server (Forbidden): forbidden\n")
        pv.status(runner=FakeKubectl({("get",): forbidden}))


def test_missing_kubectl_is_reported(monkeypatch):
    monkeypatch.setattr(pv.shutil, "which", lambda name: None)
    with pytest.raises(pv.KubectlNotFound, match="kubectl is not installed"):
        pv.run_kubectl(["version"])


# ---------------------------------------------------------------- cards

def test_cards_csv_and_html_hold_the_tokens_with_mode_600(workshop, tmp_path):
    tokens = {ns: (workshop / ns / pv.SECRETS_DIR / "notebook-token").read_text() for ns in ("ws-01", "ws-02", "ws-03")}
    path = pv.write_cards(workshop, "csv")
    assert path == workshop / "cards.csv" and stat.S_IMODE(path.stat().st_mode) == 0o600
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert {r["namespace"]: r["token"] for r in rows} == tokens
    assert rows[0]["url"] == "http://localhost:8888/lab" and "port-forward svc/notebook" in rows[0]["note"]

    html_path = pv.write_cards(workshop, "html", tmp_path / "cards.html")
    page = html_path.read_text()
    assert all(t in page for t in tokens.values()) and page.count('class="card"') == 3
    assert stat.S_IMODE(html_path.stat().st_mode) == 0o600


def test_cards_use_the_ingress_host_when_a_domain_was_given(tmp_path):
    pv.render(2, "lab", out_dir=tmp_path, domain="gpu.example.org")
    cards = pv.access_cards(tmp_path)
    assert [c.url for c in cards] == ["https://lab-01.gpu.example.org/lab", "https://lab-02.gpu.example.org/lab"]
    assert cards[0].token not in repr(cards[0])  # a card printed in a log shows no token


# ---------------------------------------------------------------- the CLI

def test_cli_dry_run_and_cards_print_no_secret(tmp_path, capsys):
    out = tmp_path / "w"
    assert main(["provision", "--participants", "2", "--dry-run", "--out", str(out)]) == 0
    assert main(["cards", "--workshop-dir", str(out), "--format", "html"]) == 0
    printed = capsys.readouterr()
    assert "kubectl apply --server-side" in printed.out and "wrote 2 cards" in printed.out
    assert not [v for v in pv.secret_values(out) if v in printed.out + printed.err]


def test_cli_errors_exit_2_with_one_line_and_no_traceback(tmp_path, capsys, monkeypatch):
    real_kubectl = pv.run_kubectl
    monkeypatch.setattr(pv, "run_kubectl", FakeKubectl({("get",): UNREACHABLE}))
    assert main(["cluster-status"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: No Kubernetes cluster reachable") and "Traceback" not in err

    monkeypatch.setattr(pv, "run_kubectl", real_kubectl)
    monkeypatch.setattr(pv.shutil, "which", lambda name: None)  # kubectl missing
    assert main(["teardown"]) == 2
    assert "kubectl is not installed" in capsys.readouterr().err

    assert main(["provision", "--participants", "2", "--gpu-type", "l4", "--model", pv.MOE_MODEL,
                 "--dry-run", "--out", str(tmp_path / "x")]) == 2
    assert "needs about 65 GB" in capsys.readouterr().err
    assert main(["cards", "--workshop-dir", str(tmp_path / "nothing")]) == 2
    assert "run `workshop provision` first" in capsys.readouterr().err


def test_cli_teardown_lists_before_it_deletes(monkeypatch, capsys):
    fake = FakeKubectl({("get", "namespaces"): (FIXTURES / "kubectl_get_namespaces.json").read_text()})
    monkeypatch.setattr(pv, "run_kubectl", fake)
    assert main(["teardown"]) == 0
    captured = capsys.readouterr()
    assert "would delete 2 namespaces: ws-01 ws-02" in captured.out and "refused: kube-system" in captured.err
    assert not [c for c in fake.calls if c[0] == "delete"]
    assert main(["teardown", "--yes"]) == 0
    assert fake.calls[-1] == ["delete", "namespace", "ws-01", "ws-02", "--wait=false"]


def test_cli_status_prints_a_table(monkeypatch, capsys):
    pods = (FIXTURES / "kubectl_get_pods.json").read_text()
    monkeypatch.setattr(pv, "run_kubectl", FakeKubectl({("get", "pods"): pods}))
    assert main(["cluster-status", "--prefix", "ws"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["namespace", "engine", "notebook", "restarts", "node"]
    assert out[-1] == "1/3 participants ready"
