"""helpers.cluster (overlays, namespaces, cards, the kubectl runner) and its CLI with a recorded fake kubectl: no
cluster, no kubectl needed."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Sequence

import pytest
import yaml

from helpers.cluster import cards, kubectl, namespaces, overlays
from helpers.cli.provision import main

FIXTURES = Path(__file__).resolve().parent / "fixtures"
README = overlays.K8S_DIR / "README.md"
# The two flags every workshop needs (addresses made up for the tests): the NFS export of the room's one
# download, and the API server's endpoint the notebooks may reach.
ROOM = {"model_nfs": "10.0.0.5:/workshop-models", "kube_api": ["10.0.0.2/32:6443"]}
ROOM_FLAGS = ["--model-nfs", ROOM["model_nfs"], "--kube-api", ROOM["kube_api"][0]]


def render(*args, **kwargs) -> overlays.Rendered:
    """overlays.render with the room's flags, unless the test gives its own."""
    return overlays.render(*args, **{**ROOM, **kwargs})


class FakeKubectl:
    """Answers kubectl commands from recorded outputs (matched by argument prefix) and records every call."""

    def __init__(self, answers: dict[tuple[str, ...], kubectl.CommandResult | str] | None = None) -> None:
        self.answers = answers or {}
        self.calls: list[list[str]] = []

    def __call__(self, args: Sequence[str]) -> kubectl.CommandResult:
        self.calls.append(list(args))
        for prefix, answer in self.answers.items():
            if tuple(args[:len(prefix)]) == prefix:
                if isinstance(answer, kubectl.CommandResult):
                    return answer
                return kubectl.CommandResult(tuple(args), 0, answer, "")
        return kubectl.CommandResult(tuple(args), 0, "", "")


# What kubectl printed here with no cluster configured (stderr, exit code 1).
UNREACHABLE = kubectl.CommandResult((), 1, "", (
    'E1129 memcache.go:265] "Unhandled Error" err="couldn\'t get current server API group list: '
    'dial tcp 127.0.0.1:8080: connect: connection refused"\n'
    "The connection to the server localhost:8080 was refused - did you specify the right host or port?\n"))


def namespace(name: str, prefix: str | None = None, labelled: bool = True, annotated: bool = True) -> dict:
    """A Namespace as `kubectl get namespaces -o json` lists it; provisioned like ``render`` does by default."""
    labels = {"kubernetes.io/metadata.name": name}
    if labelled:
        labels |= {overlays.MANAGED_BY_LABEL: overlays.MANAGED_BY,
                   overlays.PREFIX_LABEL: prefix or name.rsplit("-", 1)[0]}
    meta = {"name": name, "labels": labels}
    if annotated:
        meta["annotations"] = {overlays.PROVISIONED_ANNOTATION: overlays.MANAGED_BY}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def namespaces_answer(*items: dict) -> FakeKubectl:
    """A fake kubectl whose `get namespaces` lists ``items`` (whatever the label selector: teardown checks again)."""
    return FakeKubectl({("get", "namespaces"): json.dumps({"kind": "List", "items": list(items)})})


@pytest.fixture
def workshop(tmp_path: Path) -> Path:
    render(3, "ws", out_dir=tmp_path / "ws")
    return tmp_path / "ws"


# ---------------------------------------------------------------- rendering

def test_render_writes_one_overlay_per_participant_with_private_secrets(workshop):
    assert sorted(p.name for p in workshop.iterdir() if p.is_dir()) == ["ws-01", "ws-02", "ws-03", "ws-models"]
    assert not (workshop / "ws-models" / overlays.SECRETS_DIR).exists()  # the room holds no participant's secret
    tokens = set()
    for ns in ("ws-01", "ws-02", "ws-03"):
        secrets_dir = workshop / ns / overlays.SECRETS_DIR
        assert stat.S_IMODE(secrets_dir.stat().st_mode) == 0o700
        for name in ("notebook-token", "vllm-api-key"):
            assert stat.S_IMODE((secrets_dir / name).stat().st_mode) == 0o600
        tokens.add((secrets_dir / "notebook-token").read_text())
        kustomization = (workshop / ns / "kustomization.yaml").read_text()
        assert f"namespace: {ns}" in kustomization and "workshop-provision" in kustomization
    assert len(tokens) == 3 and all(len(t) == 48 for t in tokens)
    assert "*/.secrets/" in (workshop / ".gitignore").read_text()
    assert overlays.load_workshop(workshop).namespaces() == ["ws-01", "ws-02", "ws-03"]


def test_render_reuses_stored_secrets_and_keeps_them_when_participants_are_added(workshop):
    first = overlays.secret_values(workshop)
    render(4, "ws", out_dir=workshop)
    assert first < overlays.secret_values(workshop)
    assert len(overlays.secret_values(workshop)) == 8


def test_render_annotates_the_namespace_and_marks_each_overlay(workshop):
    text = (workshop / "ws-02" / "kustomization.yaml").read_text()
    assert f"{overlays.PROVISIONED_ANNOTATION}: {overlays.MANAGED_BY}" in text
    assert "kind: Namespace" in text
    assert all((workshop / ns / overlays.OVERLAY_MARKER).is_file() for ns in ("ws-01", "ws-02", "ws-03"))


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (its built-in kustomize) is not installed")
def test_the_built_overlay_annotates_the_namespace_and_nothing_else(workshop):
    built = subprocess.run(["kubectl", "kustomize", str(workshop / "ws-02")], capture_output=True, text=True,
                           timeout=60)
    assert built.returncode == 0, built.stderr
    objs = [d for d in yaml.safe_load_all(built.stdout) if d]
    annotated = [(o["kind"], o["metadata"]["name"]) for o in objs
                 if overlays.PROVISIONED_ANNOTATION in (o["metadata"].get("annotations") or {})]
    assert annotated == [("Namespace", "ws-02")]
    ns = next(o for o in objs if o["kind"] == "Namespace")
    assert ns["metadata"]["annotations"][overlays.PROVISIONED_ANNOTATION] == overlays.MANAGED_BY
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"  # the patch kept the labels
    # what provision makes, teardown takes
    assert namespaces.teardown("ws", runner=namespaces_answer(ns)).delete == ["ws-02"]


def test_rendering_fewer_participants_removes_the_stale_overlays_and_reports_them(workshop):
    tokens = {ns: (workshop / ns / overlays.SECRETS_DIR / "notebook-token").read_text() for ns in ("ws-01", "ws-02")}
    rendered = render(2, "ws", out_dir=workshop)
    assert rendered.removed == ["ws-03"] and rendered.kept == []
    assert not (workshop / "ws-03").exists()
    assert [d.name for d in rendered.overlays] == ["ws-01", "ws-02"]
    assert {ns: (workshop / ns / overlays.SECRETS_DIR / "notebook-token").read_text() for ns in tokens} == tokens
    assert overlays.load_workshop(workshop).namespaces() == ["ws-01", "ws-02"]
    assert render(2, "ws", out_dir=workshop).removed == []  # nothing stale the second time


def test_rendering_fewer_participants_leaves_files_it_did_not_write(workshop):
    (workshop / "notes.txt").write_text("room 4")
    (workshop / "ws-03" / "extra.yaml").write_text("kind: ConfigMap\n")
    (workshop / "ws-03" / overlays.SECRETS_DIR / "mine").write_text("keep")
    (workshop / "ws-02" / "also-mine.txt").write_text("keep")
    rendered = render(1, "ws", out_dir=workshop)
    assert rendered.removed == ["ws-02", "ws-03"]
    assert rendered.kept == [workshop / "ws-02" / "also-mine.txt", workshop / "ws-03" / overlays.SECRETS_DIR / "mine",
                             workshop / "ws-03" / "extra.yaml"]
    assert (workshop / "notes.txt").read_text() == "room 4"
    assert (workshop / "ws-03" / "extra.yaml").is_file()
    assert (workshop / "ws-03" / overlays.SECRETS_DIR / "mine").is_file()
    assert sorted(p.name for p in (workshop / "ws-03").rglob("*") if p.is_file()) == ["extra.yaml", "mine"]
    assert sorted(p.name for p in (workshop / "ws-02").iterdir()) == ["also-mine.txt"]


def test_an_overlay_written_before_the_marker_is_recognised_by_the_old_workshop_json(workshop):
    (workshop / "ws-03" / overlays.OVERLAY_MARKER).unlink()  # as a render of an older version left it
    (workshop / "ws-09").mkdir()  # neither marked nor in workshop.json: not ours
    (workshop / "ws-09" / "kustomization.yaml").write_text("resources: []\n")
    assert render(2, "ws", out_dir=workshop).removed == ["ws-03"]
    assert not (workshop / "ws-03").exists()
    assert (workshop / "ws-09" / "kustomization.yaml").read_text() == "resources: []\n"


def test_render_refuses_an_out_dir_it_did_not_write_or_of_another_workshop(tmp_path, workshop):
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / ".gitignore").write_text("mine\n")
    with pytest.raises(kubectl.ProvisionError, match="not empty and has no workshop.json.*new or empty directory"):
        render(2, "ws", out_dir=foreign)
    assert [p.name for p in foreign.iterdir()] == [".gitignore"] and (foreign / ".gitignore").read_text() == "mine\n"

    before = sorted(p for p in workshop.rglob("*"))
    with pytest.raises(kubectl.ProvisionError, match="holds workshop 'ws'.*into another --out"):
        render(2, "lab", out_dir=workshop)
    assert sorted(p for p in workshop.rglob("*")) == before

    (tmp_path / "a-file").write_text("x")
    with pytest.raises(kubectl.ProvisionError, match="is a file"):
        render(1, "ws", out_dir=tmp_path / "a-file")
    (workshop / overlays.SETTINGS_FILE).write_text("{not json")
    with pytest.raises(kubectl.ProvisionError, match="not a workshop.json"):
        render(1, "ws", out_dir=workshop)


def test_render_without_api_key_writes_no_engine_key(tmp_path):
    render(1, "ws", out_dir=tmp_path, api_key=False)
    assert not (tmp_path / "ws-01" / overlays.SECRETS_DIR / "vllm-api-key").exists()
    assert "vllm-api-key" not in (tmp_path / "ws-01" / "kustomization.yaml").read_text()


@pytest.mark.parametrize("kwargs, message", [
    ({"participants": 0}, "between 1 and"),
    ({"participants": 100}, "between 1 and"),
    ({"prefix": "Team_A"}, "DNS label"),
    ({"prefix": "kube-ws"}, "not starting with 'kube'"),
    ({"prefix": "openshift"}, "or 'openshift'"),
    ({"gpu_type": "tpu"}, "unknown --gpu-type"),
    ({"model": "meta-llama/Llama-3-8B"}, "unknown --model"),
    ({"model": overlays.MOE_MODEL, "gpu_type": "a100"}, "needs about 65 GB"),
    ({"domain": "Not A Domain"}, "DNS name"),
])
def test_render_refuses_settings_that_cannot_work(tmp_path, kwargs, message):
    settings = {"participants": 2, "prefix": "ws", "out_dir": tmp_path, **kwargs}
    with pytest.raises(kubectl.ProvisionError, match=message):
        render(**settings)
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_the_moe_model_fits_an_h100_and_pulls_in_the_moe_component(tmp_path):
    render(1, "ws", model=overlays.MOE_MODEL, gpu_type="h100", out_dir=tmp_path)
    text = (tmp_path / "ws-01" / "kustomization.yaml").read_text()
    assert "components/with-moe" in text and "components/gpu-h100" in text
    assert f"MODEL_NAME={overlays.MOE_MODEL}" in text


@pytest.mark.parametrize("gpu_type", sorted(overlays.GPU_PROFILES))
def test_every_gpu_type_names_its_gpu_once_for_the_notebook(tmp_path, gpu_type):
    from helpers.hardware.gpus import get_gpu

    render(1, "ws", gpu_type=gpu_type, out_dir=tmp_path)
    data = yaml.safe_load((tmp_path / "ws-01" / "kustomization.yaml").read_text())
    literals = [line for g in data["configMapGenerator"] if g["name"] == "workshop-engine" for line in g["literals"]]
    named = [line.split("=", 1)[1] for line in literals if line.startswith("WORKSHOP_GPU=")]
    assert named == [overlays.GPU_PROFILES[gpu_type].gpu] and get_gpu(named[0]).name == named[0]


# ---------------------------------------------------------------- kubectl through the fake runner

def test_apply_runs_one_server_side_apply_per_participant_after_the_rooms_download(workshop):
    fake = FakeKubectl({("apply",): "namespace/x serverside-applied\nservice/y serverside-applied\n"})
    lines = namespaces.apply(workshop, runner=fake)
    assert [c[-1] for c in fake.calls] == [str(workshop / ns) for ns in ("ws-models", "ws-01", "ws-02", "ws-03")]
    assert all(c[:2] == ["apply", "--server-side"] and "--force-conflicts" in c for c in fake.calls)
    assert lines[1] == "ws-01: 2 objects applied"


def test_teardown_deletes_only_labelled_and_annotated_namespaces_of_the_prefix():
    fake = namespaces_answer(namespace("ws-02"), namespace("ws-01"), namespace("lab-01"))
    plan = namespaces.teardown(prefix="ws", yes=False, runner=fake)
    assert plan.delete == ["ws-01", "ws-02"]
    assert plan.skipped == {"lab-01": "workshop 'lab', not 'ws'"}
    assert plan.workshops == ["lab", "ws"]
    assert fake.calls == [["get", "namespaces", "-l", "app.kubernetes.io/managed-by=workshop-provision", "-o", "json"]]

    namespaces.teardown(prefix="ws", yes=True, runner=fake)
    assert fake.calls[-2] == ["delete", "namespace", "ws-01", "ws-02", "--wait=false"]
    # then the workshop's PersistentVolumes (cluster-wide), by its labels; the models on the export stay
    assert fake.calls[-1] == ["delete", "persistentvolume", "-l", namespaces.managed_selector("ws"), "--wait=false"]
    assert len([c for c in fake.calls if c[0] == "delete"]) == 2


def test_teardown_takes_the_rooms_download_namespace_of_the_prefix_too():
    plan = namespaces.teardown(prefix="ws", runner=namespaces_answer(namespace("ws-01"), namespace("ws-models"),
                                                                     namespace("lab-models", prefix="lab")))
    assert plan.delete == ["ws-01", "ws-models"] and "lab-models" in plan.skipped


@pytest.mark.parametrize("name", ["kube-foo", "kube-system", "openshift-x", "openshift", "default"])
def test_teardown_never_deletes_a_system_namespace_even_labelled_and_annotated(name):
    fake = namespaces_answer(namespace(name, prefix="kube" if name.startswith("kube") else name), namespace("ws-01"))
    plan = namespaces.teardown(prefix=name.split("-")[0], yes=True, runner=fake)
    assert name not in plan.delete
    assert plan.skipped[name].startswith("a system namespace: teardown never deletes default, kube-*, openshift")
    assert not [c for c in fake.calls if c[0] == "delete" and name in c]


def test_teardown_leaves_a_labelled_but_unannotated_namespace():
    fake = namespaces_answer(namespace("ws-01", annotated=False), namespace("ws-02"))
    plan = namespaces.teardown(prefix="ws", yes=True, runner=fake)
    assert plan.delete == ["ws-02"]
    assert "without the annotation workshop/provisioned-by=workshop-provision" in plan.skipped["ws-01"]
    assert fake.calls[-2] == ["delete", "namespace", "ws-02", "--wait=false"]


def test_teardown_leaves_other_prefixes_and_names_that_do_not_match_their_label():
    fake = namespaces_answer(namespace("ws-01"), namespace("wsx-01"), namespace("ws-team-01", prefix="ws-team"),
                             namespace("ws-prod", prefix="ws"), namespace("ws-001", prefix="ws"),
                             namespace("team-prod", labelled=False))
    plan = namespaces.teardown(prefix="ws", yes=True, runner=fake)
    assert plan.delete == ["ws-01"]
    assert plan.skipped["wsx-01"] == "workshop 'wsx', not 'ws'"
    assert plan.skipped["ws-team-01"] == "workshop 'ws-team', not 'ws'"
    wrong_name = "its name is not <prefix>-NN for its label workshop/prefix=ws"
    assert plan.skipped["ws-prod"] == plan.skipped["ws-001"] == wrong_name
    assert plan.skipped["team-prod"] == "not labelled app.kubernetes.io/managed-by=workshop-provision"
    assert fake.calls[-2] == ["delete", "namespace", "ws-01", "--wait=false"]


def test_teardown_without_prefix_lists_the_workshops_and_refuses_to_delete():
    fake = namespaces_answer(namespace("ws-01"), namespace("lab-01"), namespace("kube-foo", prefix="kube"))
    plan = namespaces.teardown(yes=False, runner=fake)
    assert plan.delete == [] and plan.workshops == ["lab", "ws"]
    assert plan.skipped["ws-01"] == "no --prefix given (workshop 'ws': --prefix ws)"
    assert plan.skipped["kube-foo"].startswith("a system namespace")
    with pytest.raises(kubectl.ProvisionError, match="teardown --yes needs --prefix"):
        namespaces.teardown(yes=True, runner=fake)
    assert [c[0] for c in fake.calls] == ["get"]  # the refusal asked the cluster nothing


def test_teardown_with_nothing_labelled_deletes_nothing():
    fake = namespaces_answer()
    assert namespaces.teardown(prefix="ws", yes=True, runner=fake) == namespaces.TeardownPlan("ws", [], {}, [])
    assert [c[0] for c in fake.calls] == ["get"]


def test_teardown_refuses_a_prefix_that_is_no_namespace_prefix():
    fake = namespaces_answer(namespace("ws-01"))
    with pytest.raises(kubectl.ProvisionError, match="not a namespace prefix"):
        namespaces.teardown(prefix="Team_A", yes=True, runner=fake)
    assert fake.calls == []


def test_the_readme_teardown_sentence_says_what_the_code_does():
    text = " ".join(README.read_text().split())
    claims = re.search(r"`teardown` deletes a namespace only if (.*?with the reason)\.", text).group(1)
    for claim in ("has that label and that annotation", "`<prefix>-NN`",
                  f"`{overlays.PREFIX_LABEL}` label equal to the `--prefix` given", "nothing without `--yes`",
                  "`--yes` without `--prefix` is refused"):
        assert claim in claims, claim
    assert f"annotation `{overlays.PROVISIONED_ANNOTATION}={overlays.MANAGED_BY}`" in text
    listed = re.findall(r"`([^`]+)`", claims.split("is not ")[1].split(";")[0])
    assert tuple(listed) == overlays.SYSTEM_NAMESPACES
    for pattern in listed:  # each is refused by the code, as a name of that form
        name = pattern.replace("*", "x")
        assert namespaces.teardown("x", runner=namespaces_answer(namespace(name, prefix="x"))).delete == []


def test_reset_reapplies_and_restarts_only_a_labelled_participant(workshop):
    labelled = json.dumps({"kind": "Namespace",
                           "metadata": {"name": "ws-02", "labels": {overlays.MANAGED_BY_LABEL: overlays.MANAGED_BY}}})
    fake = FakeKubectl({("get", "namespace"): labelled})
    namespaces.reset("ws-02", workshop, runner=fake)
    assert [c[0] for c in fake.calls] == ["get", "apply", "annotate", "rollout"]
    assert fake.calls[1][-1] == str(workshop / "ws-02")
    assert fake.calls[2] == ["annotate", "deployment/vllm", "-n", "ws-02", "workshop/last-good-config-"]
    assert fake.calls[3] == ["rollout", "restart", "deployment/vllm", "-n", "ws-02"]

    unlabelled = FakeKubectl({("get", "namespace"): json.dumps({"metadata": {"name": "ws-02", "labels": {}}})})
    with pytest.raises(kubectl.ProvisionError, match="refusing"):
        namespaces.reset("ws-02", workshop, runner=unlabelled)
    assert [c[0] for c in unlabelled.calls] == ["get"]
    with pytest.raises(kubectl.ProvisionError, match="not one of"):
        namespaces.reset("kube-system", workshop, runner=FakeKubectl())


def test_cluster_status_parses_a_recorded_pod_listing():
    fake = FakeKubectl({("get", "pods"): (FIXTURES / "kubectl_get_pods.json").read_text()})
    rows = {r.namespace: r for r in namespaces.status("ws", runner=fake)}
    assert fake.calls[0][:4] == ["get", "pods", "--all-namespaces", "-l"]
    assert rows["ws-01"] == namespaces.ParticipantStatus("ws-01", "ready", "ready", 1, "gke-gpu-pool-1")
    assert rows["ws-02"].engine == "downloading models"  # the newest of its two pods
    assert rows["ws-03"].engine.startswith("unschedulable: 0/4 nodes are available: 2 Insufficient nvidia.com/gpu")
    assert rows["ws-03"].notebook == "CrashLoopBackOff" and rows["ws-03"].node == "-"


def test_an_unreachable_cluster_is_a_clear_error():
    with pytest.raises(kubectl.ClusterUnreachable, match="No Kubernetes cluster reachable"):
        namespaces.status(runner=FakeKubectl({("get",): UNREACHABLE}))
    with pytest.raises(kubectl.ProvisionError, match="forbidden"):
        forbidden = kubectl.CommandResult((), 1, "", "Error from server (Forbidden): forbidden\n")
        namespaces.status(runner=FakeKubectl({("get",): forbidden}))


def test_missing_kubectl_is_reported(monkeypatch):
    monkeypatch.setattr(kubectl.shutil, "which", lambda name: None)
    with pytest.raises(kubectl.KubectlNotFound, match="kubectl is not installed"):
        kubectl.run_kubectl(["version"])


# ---------------------------------------------------------------- cards

def test_cards_csv_and_html_hold_the_tokens_with_mode_600(workshop, tmp_path):
    tokens = {ns: (workshop / ns / overlays.SECRETS_DIR / "notebook-token").read_text()
              for ns in ("ws-01", "ws-02", "ws-03")}
    path = cards.write_cards(workshop, "csv")
    assert path == workshop / "cards.csv" and stat.S_IMODE(path.stat().st_mode) == 0o600
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert {r["namespace"]: r["token"] for r in rows} == tokens
    assert rows[0]["url"] == "http://localhost:8888/lab" and "port-forward svc/notebook" in rows[0]["note"]

    html_path = cards.write_cards(workshop, "html", tmp_path / "cards.html")
    page = html_path.read_text()
    assert all(t in page for t in tokens.values()) and page.count('class="card"') == 3
    assert stat.S_IMODE(html_path.stat().st_mode) == 0o600


def test_cards_use_the_ingress_host_when_a_domain_was_given(tmp_path):
    render(2, "lab", out_dir=tmp_path, domain="gpu.example.org")
    issued = cards.access_cards(tmp_path)
    assert [c.url for c in issued] == ["https://lab-01.gpu.example.org/lab", "https://lab-02.gpu.example.org/lab"]
    assert issued[0].token not in repr(issued[0])  # a card printed in a log shows no token


# ---------------------------------------------------------------- the CLI

def test_cli_dry_run_and_cards_print_no_secret(tmp_path, capsys):
    out = tmp_path / "w"
    assert main(["provision", *ROOM_FLAGS, "--participants", "2", "--dry-run", "--out", str(out)]) == 0
    assert main(["cards", "--workshop-dir", str(out), "--format", "html"]) == 0
    printed = capsys.readouterr()
    assert "kubectl apply --server-side" in printed.out and "wrote 2 cards" in printed.out
    assert not [v for v in overlays.secret_values(out) if v in printed.out + printed.err]


def test_cli_errors_exit_2_with_one_line_and_no_traceback(tmp_path, capsys, monkeypatch):
    real_kubectl = kubectl.run_kubectl
    monkeypatch.setattr(kubectl, "run_kubectl", FakeKubectl({("get",): UNREACHABLE}))
    assert main(["cluster-status"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: No Kubernetes cluster reachable") and "Traceback" not in err

    monkeypatch.setattr(kubectl, "run_kubectl", real_kubectl)
    monkeypatch.setattr(kubectl.shutil, "which", lambda name: None)  # kubectl missing
    assert main(["teardown"]) == 2
    assert "kubectl is not installed" in capsys.readouterr().err

    assert main(["provision", *ROOM_FLAGS, "--participants", "2", "--gpu-type", "l4", "--model", overlays.MOE_MODEL,
                 "--dry-run", "--out", str(tmp_path / "x")]) == 2
    assert "needs about 65 GB" in capsys.readouterr().err
    assert main(["cards", "--workshop-dir", str(tmp_path / "nothing")]) == 2
    assert "run `workshop provision` first" in capsys.readouterr().err


def test_cli_teardown_lists_what_stays_and_why_before_it_deletes(monkeypatch, capsys):
    fake = namespaces_answer(namespace("ws-01"), namespace("ws-02"), namespace("kube-foo", prefix="kube"),
                             namespace("ws-03", annotated=False), namespace("lab-01"))
    monkeypatch.setattr(kubectl, "run_kubectl", fake)
    assert main(["teardown", "--prefix", "ws"]) == 0
    out = capsys.readouterr().out
    assert "would delete 2 namespaces of workshop 'ws': ws-01 ws-02" in out
    assert "leaving kube-foo: a system namespace" in out and "leaving lab-01: workshop 'lab', not 'ws'" in out
    assert "leaving ws-03: labelled, but without the annotation" in out
    assert not [c for c in fake.calls if c[0] == "delete"]
    assert main(["teardown", "--prefix", "ws", "--yes"]) == 0
    assert fake.calls[-2] == ["delete", "namespace", "ws-01", "ws-02", "--wait=false"]


def test_cli_teardown_without_prefix_names_the_workshops_and_refuses_yes(monkeypatch, capsys):
    fake = namespaces_answer(namespace("ws-01"), namespace("lab-01"))
    monkeypatch.setattr(kubectl, "run_kubectl", fake)
    assert main(["teardown"]) == 0
    out = capsys.readouterr().out
    assert "pass --prefix. Workshops provisioned here: lab, ws. To see what it would delete: workshop teardown " \
           "--prefix lab" in out
    assert main(["teardown", "--yes"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: teardown --yes needs --prefix") and "Traceback" not in err
    assert not [c for c in fake.calls if c[0] == "delete"]


def test_cli_provision_reports_the_overlays_it_removed_and_the_files_it_kept(tmp_path, capsys):
    out = tmp_path / "w"
    assert main(["provision", *ROOM_FLAGS, "--participants", "3", "--dry-run", "--out", str(out)]) == 0
    (out / "ws-03" / "notes.txt").write_text("mine")
    assert main(["provision", *ROOM_FLAGS, "--participants", "1", "--dry-run", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "removed 2 overlays this workshop no longer has, with their tokens: ws-02 ws-03" in printed
    assert f"kept {out / 'ws-03' / 'notes.txt'}: not written by workshop provision" in printed
    assert main(["provision", *ROOM_FLAGS, "--participants", "1", "--prefix", "lab", "--dry-run", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out") and "holds workshop 'ws'" in err and "Traceback" not in err


def test_cli_status_prints_a_table(monkeypatch, capsys):
    pods = (FIXTURES / "kubectl_get_pods.json").read_text()
    monkeypatch.setattr(kubectl, "run_kubectl", FakeKubectl({("get", "pods"): pods}))
    assert main(["cluster-status", "--prefix", "ws"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("model download (ws-models")  # the room's download first (tests/test_cluster_status.py)
    assert out[1].split() == ["namespace", "engine", "notebook", "restarts", "node"]
    assert out[-1] == "1/3 participants ready"


def test_status_rows_are_the_participants_and_an_engine_waiting_for_the_rooms_download_says_so():
    def pod(ns: str, app: str, init: str | None = None) -> dict:
        status = {"phase": "Pending", "containerStatuses": [{"ready": False, "state": {"waiting": {
            "reason": "PodInitializing"}}}]}
        if init:
            status["initContainerStatuses"] = [{"name": init, "state": {"running": {}}}]
        return {"kind": "Pod", "metadata": {"namespace": ns, "labels": {"app.kubernetes.io/name": app},
                                            "creationTimestamp": "2026-12-01T10:00:00Z"}, "spec": {}, "status": status}

    rows = namespaces.parse_status({"items": [pod("ws-models", "model-download"), pod("ws-01", "vllm", "wait-for-models"),
                                              pod("demo", "vllm", "predownload")]})
    assert [(r.namespace, r.engine) for r in rows] == [("demo", "downloading models"), ("ws-01", "waiting for models")]
