"""Policy over every rendered overlay, offline: a workshop of 30 participants rendered by `workshop provision
--dry-run` and built with kustomize (kubectl's, from the dev extra), its variants (GPU shares, flags, MoE), and
the static overlays. Checked: one pod downloads from the hub and one copy of the models backs 30 namespaces; no
Secret but the participant's own in a participant's namespace; egress denied by default and no rule admits the
cloud's metadata address; requests and limits on every container; no mutable image tag; engines mount the models
read-only; `kubernetes-validate --strict` accepts every object. No cluster is involved: what a live cluster must
still show is listed in k8s/README.md, "What remains unverified"."""

from __future__ import annotations

import contextlib
import io
import ipaddress
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.cli.provision import main as provision_main
from helpers.cluster import overlays, room
from test_k8s_manifests import (K8S, K8S_VERSION, ROOM_FLAGS, build, find, kustomize, one, pod_specs,
                                validate_strict)

PARTICIPANTS = 30
OWN_SECRETS = {"notebook-token", "vllm-api-key"}  # the participant's own: their notebook token, their engine's key
WEIGHTS_GB = {m.name: m.weights_gb for m in overlays.LAB_MODELS.values()}
Objects = list[dict[str, Any]]


def provision(out: Path, *flags: str) -> str:
    """`workshop provision --dry-run` into ``out`` with the room's flags; its stdout."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = provision_main(["provision", "--dry-run", "--out", str(out), *ROOM_FLAGS, *flags])
    assert code == 0
    return printed.getvalue()


def build_all(out: Path) -> dict[str, Objects]:
    """Every overlay under ``out`` (the participants' and the room's), built."""
    return {d.name: build(d) for d in sorted(out.iterdir()) if d.is_dir()}


@pytest.fixture(scope="module")
def room30(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Objects]:
    """A workshop of 30 participants, as provisioned by default (plus the room's two flags)."""
    out = tmp_path_factory.mktemp("room30")
    provision(out, "--participants", str(PARTICIPANTS))
    return build_all(out)


VARIANTS = {
    "mig": ["--participants", "2", "--gpu-type", "h100", "--gpu-share", "mig-2g.20gb"],
    "time-sliced": ["--participants", "2", "--gpu-type", "h100", "--gpu-share", "time-slicing:2"],
    "flags": ["--participants", "2", "--domain", "lab.example.com", "--ingress-class", "traefik",
              "--ingress-namespace", "traefik", "--monitoring-namespace", "observability", "--egress-internet",
              "--egress-allow", "10.20.0.0/16:3128", "--kube-api", "10.0.0.3/32:6443"],
    "moe": ["--participants", "2", "--gpu-type", "h100", "--with-moe"],
}


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Objects]]:
    """Two participants each of the variants above, built."""
    built = {}
    for name, flags in VARIANTS.items():
        out = tmp_path_factory.mktemp(name)
        provision(out, *flags)
        built[name] = build_all(out)
    return built


@pytest.fixture(scope="module")
def demos() -> dict[str, Objects]:
    """The static demo overlays, which start as rendered with `kubectl apply -k`."""
    return {g: build(K8S / "overlays" / g) for g in ("l4", "a100", "h100")}


def every_build(room30, variants, demos) -> dict[str, Objects]:
    builds = {f"room30/{ns}": objs for ns, objs in room30.items()}
    for name, per_ns in variants.items():
        builds |= {f"{name}/{ns}": objs for ns, objs in per_ns.items()}
    return builds | {f"demo/{g}": objs for g, objs in demos.items()}


def participants(builds: dict[str, Objects]) -> dict[str, Objects]:
    return {name: objs for name, objs in builds.items() if not name.endswith("-models") and "demo/" not in name}


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return spec.get("initContainers", []) + spec["containers"]


# ---------------------------------------------------------------- one download for the room

def test_one_pod_downloads_and_one_copy_of_the_models_backs_thirty_namespaces(room30):
    assert len(room30) == PARTICIPANTS + 1 and "ws-models" in room30
    everything = [o for objs in room30.values() for o in objs]
    footprint = room.footprint(everything, WEIGHTS_GB)
    assert footprint.download_pods == 1 and footprint.backing_volumes == 1
    assert footprint.download_gb == pytest.approx(sum(WEIGHTS_GB[m] for m in overlays.LAB_MODELS
                                                      if m != overlays.MOE_MODEL))
    assert footprint.volume_gib == 50
    [job] = find(room30["ws-models"], "Job")
    assert job["metadata"]["name"] == room.DOWNLOAD_JOB and job["metadata"]["namespace"] == "ws-models"
    # every claim of a participant is a read-only view bound ahead to its own PV on the room's export
    exports = set()
    for ns, objs in room30.items():
        [claim] = find(objs, "PersistentVolumeClaim", "model-cache")
        [volume] = find(objs, "PersistentVolume")
        assert claim["spec"]["volumeName"] == volume["metadata"]["name"] and claim["spec"]["storageClassName"] == ""
        assert volume["spec"]["claimRef"] == {"namespace": ns, "name": "model-cache"}
        writable = ns == "ws-models"
        assert volume["spec"]["nfs"]["readOnly"] is not writable
        assert claim["spec"]["accessModes"] == (["ReadWriteMany"] if writable else ["ReadOnlyMany"])
        exports.add((volume["spec"]["nfs"]["server"], volume["spec"]["nfs"]["path"]))
    assert exports == {("10.0.0.5", "/workshop-models")}


def test_the_footprint_counts_downloads_and_volumes_both_ways():
    def engine(ns: str, download: bool) -> dict[str, Any]:
        command = ["python3", "/opt/workshop/predownload.py"] + ([] if download else ["--wait"])
        return {"kind": "Deployment", "metadata": {"name": "vllm", "namespace": ns},
                "spec": {"template": {"spec": {"initContainers": [{"name": "i", "command": command}],
                                               "containers": [{"name": "vllm", "command": ["vllm"]}]}}}}

    def models(ns: str) -> dict[str, Any]:
        return {"kind": "ConfigMap", "metadata": {"name": "workshop-engine", "namespace": ns},
                "data": {"PREDOWNLOAD_MODELS": "a b", "PREDOWNLOAD_EXTRA_MODELS": "b"}}

    def claim(ns: str, bound: bool) -> dict[str, Any]:
        spec = {"resources": {"requests": {"storage": "50Gi"}}} | ({"volumeName": f"{ns}-pv"} if bound else {})
        return {"kind": "PersistentVolumeClaim", "metadata": {"name": "model-cache", "namespace": ns}, "spec": spec}

    def volume(ns: str) -> dict[str, Any]:
        return {"kind": "PersistentVolume", "metadata": {"name": f"{ns}-pv"},
                "spec": {"capacity": {"storage": "50Gi"}, "nfs": {"server": "s", "path": "/m"}}}

    weights = {"a": 2.0, "b": 1.5}
    each_their_own = [o for ns in ("x", "y") for o in (engine(ns, True), models(ns), claim(ns, False))]
    assert room.footprint(each_their_own, weights) == room.Footprint(2, 7.0, 2, 100.0)
    shared = [o for ns in ("x", "y") for o in (engine(ns, False), models(ns), claim(ns, True), volume(ns))]
    assert room.footprint(shared, weights) == room.Footprint(0, 0.0, 1, 50.0)
    assert "1 volume(s) of 50 GiB" in room.footprint(shared, weights).sentence


def test_the_room_and_the_participants_list_the_same_models(room30):
    lists = {ns: one(objs, "ConfigMap", "workshop-engine")["data"] for ns, objs in room30.items()}
    wanted = {(d["PREDOWNLOAD_MODELS"], d["PREDOWNLOAD_EXTRA_MODELS"]) for d in lists.values()}
    assert len(wanted) == 1  # what the room downloads is what every engine waits for


def test_engines_start_offline_and_mount_the_models_read_only(room30, variants, demos):
    for name, objs in every_build(room30, variants, demos).items():
        for deployment in find(objs, "Deployment", "vllm"):
            spec = deployment["spec"]["template"]["spec"]
            vllm = next(c for c in spec["containers"] if c["name"] == "vllm")
            mount = next(m for m in vllm["volumeMounts"] if m["mountPath"] == "/models")
            assert mount.get("readOnly") is True, name
            env = {e["name"]: e for e in vllm["env"]}
            assert env["HF_HUB_OFFLINE"]["valueFrom"]["configMapKeyRef"]["key"] == "HF_HUB_OFFLINE"
            assert one(objs, "ConfigMap", "workshop-engine")["data"]["HF_HUB_OFFLINE"] == "1"
            # the caches vLLM writes are off the read-only volume
            assert not env["VLLM_CACHE_ROOT"]["value"].startswith("/models")
            assert not env["TRITON_CACHE_DIR"]["value"].startswith("/models")


# ---------------------------------------------------------------- secrets

def test_no_secret_but_the_participants_own_in_a_participant_namespace(room30, variants):
    for name, objs in participants(every_build(room30, variants, {})).items():
        assert {o["metadata"]["name"] for o in find(objs, "Secret")} <= OWN_SECRETS, name
        for workload, spec in pod_specs(objs):
            refs = {e["valueFrom"]["secretKeyRef"]["name"] for c in containers(spec) for e in c.get("env", [])
                    if "secretKeyRef" in e.get("valueFrom", {})}
            refs |= {v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
            assert refs <= OWN_SECRETS, f"{name}: {workload} refers to {refs - OWN_SECRETS}"
        for ingress in find(objs, "Ingress"):
            assert not [t for t in ingress["spec"].get("tls", []) if "secretName" in t], name  # no TLS key here
        role = one(objs, "Role", "workshop-participant")
        assert not [r for r in role["rules"] if "secrets" in r["resources"] or "*" in r["resources"]], name
    # the hub token is referred to by the room's download only
    room_refs = {e["valueFrom"]["secretKeyRef"]["name"] for _, spec in pod_specs(room30["ws-models"])
                 for c in containers(spec) for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}
    assert room_refs == {"hf-token"}


def test_the_demo_overlays_create_their_notebook_token_in_the_cluster(demos):
    for gpu, objs in demos.items():
        secret = one(objs, "Secret", "notebook-token")
        assert secret["type"] == "kubernetes.io/service-account-token" and "data" not in secret
        account = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
        assert one(objs, "ServiceAccount", account)["automountServiceAccountToken"] is False
        assert not [b for b in find(objs, "RoleBinding") if any(s["name"] == account for s in b["subjects"])]
        notebook = one(objs, "Deployment", "notebook")["spec"]["template"]["spec"]["containers"][0]
        token = next(e for e in notebook["env"] if e["name"] == "JUPYTER_TOKEN")
        assert token["valueFrom"]["secretKeyRef"]["name"] == "notebook-token", gpu
        assert one(objs, "PersistentVolumeClaim", "model-cache")  # what its engine mounts exists too


# ---------------------------------------------------------------- egress

def _admits(peer: dict[str, Any], address: ipaddress.IPv4Address) -> bool:
    block = peer.get("ipBlock")
    if block is None:
        return False  # a pod or namespace selector matches pods, and no pod has the metadata address
    if address not in ipaddress.ip_network(block["cidr"]):
        return False
    return not any(address in ipaddress.ip_network(e) for e in block.get("except", []))


def test_egress_is_denied_by_default_and_never_reaches_the_metadata_address(room30, variants, demos):
    for name, objs in every_build(room30, variants, demos).items():
        policies = find(objs, "NetworkPolicy")
        deny = [p for p in policies if p["spec"]["podSelector"] == {} and "Egress" in p["spec"]["policyTypes"]
                and not p["spec"].get("egress")]
        assert deny, f"{name}: no default-deny egress"
        for policy in policies:
            for rule in policy["spec"].get("egress", []):
                assert rule.get("to"), f"{name}: {policy['metadata']['name']} allows egress to everything"
                assert not [p for p in rule["to"] if _admits(p, room.METADATA_ADDRESS)], \
                    f"{name}: {policy['metadata']['name']} admits {room.METADATA_ADDRESS}"


def test_the_kube_api_and_opt_ins_open_only_what_the_flags_name(room30, variants):
    api = one(room30["ws-07"], "NetworkPolicy", "allow-kube-api")["spec"]
    assert api["egress"] == [{"to": [{"ipBlock": {"cidr": "10.0.0.2/32"}}], "ports": [{"protocol": "TCP", "port": 6443}]}]
    assert {v for e in api["podSelector"]["matchExpressions"] for v in e["values"]} == {"notebook", "vllm-router"}
    assert not find(room30["ws-07"], "NetworkPolicy", "allow-instructor-opt-in-egress")  # nothing opted in
    flagged = variants["flags"]["ws-01"]
    cidrs = {b["ipBlock"]["cidr"] for r in one(flagged, "NetworkPolicy", "allow-kube-api")["spec"]["egress"]
             for b in r["to"]}
    assert cidrs == {"10.0.0.2/32", "10.0.0.3/32"}
    opted = one(flagged, "NetworkPolicy", "allow-instructor-opt-in-egress")["spec"]["egress"]
    assert opted[0] == {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}], "ports": [{"protocol": "TCP", "port": 3128}]}
    internet = opted[1]["to"][0]["ipBlock"]
    assert internet["cidr"] == "0.0.0.0/0" and "169.254.0.0/16" in internet["except"] and "10.0.0.0/8" in internet["except"]


@pytest.mark.parametrize("flag, value, message", [
    ("--kube-api", "169.254.0.0/16:443", "metadata address"),
    ("--egress-allow", "0.0.0.0/0", "metadata address"),
    ("--egress-allow", "proxy.example.com:3128", "not ADDRESS"),
    ("--model-nfs", "nfs.example.com/exports", "not SERVER:/PATH"),
    ("--ingress-class", "Not_A_Label", "DNS label"),
    ("--notebook-image", "ghcr.io/acme/workshop-notebook:latest", "mutable tag"),
    ("--engine-image", "vllm/vllm-openai", "not a pinned image reference"),
    ("--gpu-share", "mig-1g.10gb", "does not fit"),  # Qwen3-4B BF16 on an H100 1g.10gb slice: the planner says no
    ("--gpu-share", "mig-3g.20gb", "no MIG profile"),
    ("--gpu-share", "time-slicing:1", "at least 2"),
])
def test_provision_refuses_what_would_not_start_or_would_open_the_fence(tmp_path, capsys, flag, value, message):
    code = provision_main(["provision", "--participants", "2", "--gpu-type", "h100", "--dry-run", "--out",
                           str(tmp_path / "w"), *ROOM_FLAGS, flag, value])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "w").exists()  # nothing half-written


def test_provision_without_the_rooms_flags_says_which_is_missing(tmp_path, capsys):
    assert provision_main(["provision", "--participants", "2", "--dry-run", "--out", str(tmp_path / "w")]) == 2
    assert "--model-nfs SERVER:/PATH is needed" in capsys.readouterr().err
    assert provision_main(["provision", "--participants", "2", "--dry-run", "--out", str(tmp_path / "w"),
                           "--model-nfs", "10.0.0.5:/m"]) == 2
    assert "--kube-api ADDRESS/32:PORT is needed" in capsys.readouterr().err


def test_ingress_class_and_namespaces_follow_the_flags_with_todays_defaults(room30, variants):
    def peer(objs: Objects, policy: str) -> str:
        spec = one(objs, "NetworkPolicy", policy)["spec"]
        return spec["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]

    assert peer(room30["ws-01"], "allow-prometheus-to-vllm") == "monitoring"
    assert peer(room30["ws-01"], "allow-ingress-controller-to-notebook") == "ingress-nginx"
    flagged = variants["flags"]["ws-02"]
    assert peer(flagged, "allow-prometheus-to-vllm") == "observability"
    assert peer(flagged, "allow-ingress-controller-to-notebook") == "traefik"
    assert one(flagged, "Ingress", "notebook")["spec"]["ingressClassName"] == "traefik"


# ---------------------------------------------------------------- pods and images

def test_every_container_has_requests_and_limits_and_a_pinned_image(room30, variants, demos):
    pinned = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())["images"]
    base_tag = next(i["newTag"] for i in pinned if i["name"] == "vllm/vllm-openai")
    for name, objs in every_build(room30, variants, demos).items():
        for workload, spec in pod_specs(objs):
            for c in containers(spec):
                where = f"{name}: {workload}/{c['name']}"
                for kind in ("requests", "limits"):
                    assert {"cpu", "memory"} <= set(c["resources"][kind]), f"{where} {kind}"
                image = c["image"]
                tag = re.fullmatch(r"[^@]+?(?::([^:/@]+))?(?:@sha256:[0-9a-f]{64})?", image)
                assert tag and (tag[1] not in (None, "latest") or "@sha256:" in image), f"{where}: {image}"
                if image.startswith("vllm/vllm-openai"):
                    assert image == f"vllm/vllm-openai:{base_tag}", where  # one engine image everywhere


# ---------------------------------------------------------------- GPU shares

def engine_resources(objs: Objects) -> dict[str, dict[str, str]]:
    return one(objs, "Deployment", "vllm")["spec"]["template"]["spec"]["containers"][0]["resources"]


def test_gpu_shares_render_their_resource_names_quota_and_memory_fraction(room30, variants):
    whole = engine_resources(room30["ws-01"])
    assert whole["limits"]["nvidia.com/gpu"] == "1"
    mig = variants["mig"]["ws-01"]
    resources = engine_resources(mig)
    for part in ("requests", "limits"):
        assert resources[part]["nvidia.com/mig-2g.20gb"] == "1" and "nvidia.com/gpu" not in resources[part]
    assert (resources["requests"]["memory"], resources["limits"]["memory"]) == ("48Gi", "96Gi")  # H100 sizing stays
    hard = one(mig, "ResourceQuota", "participant-quota")["spec"]["hard"]
    assert hard["requests.nvidia.com/mig-2g.20gb"] == "1" and hard["requests.nvidia.com/gpu"] == "0"
    sliced = variants["time-sliced"]["ws-02"]
    args = one(sliced, "Deployment", "vllm")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.45"  # 0.90 / 2, for 2 engines on one GPU
    assert engine_resources(sliced)["limits"]["nvidia.com/gpu"] == "1"


def test_provision_prints_the_planners_verdict_and_the_days_cost(tmp_path):
    printed = provision(tmp_path / "w", "--participants", "30", "--gpu-type", "h100", "--gpu-share", "mig-2g.20gb")
    assert "planner: yes:" in printed and "mig-2g.20gb: 3 per GPU) need 10 GPU(s)" in printed
    assert "USD per participant" in printed and "with one GPU each" in printed


# ---------------------------------------------------------------- schemas

def test_kubernetes_validate_strict_accepts_every_object(room30, variants, demos):
    builds = every_build(room30, variants, demos)
    # room30's participants differ only in names: one of them, the room, and every variant and demo
    checked = validate_strict({name: objs for name, objs in builds.items()
                               if not name.startswith("room30/") or name in ("room30/ws-01", "room30/ws-models")})
    assert checked > 250


def test_the_command_line_validator_accepts_a_built_overlay_strictly(room30, tmp_path):
    """The same check as the `kubernetes-validate --strict` command an instructor runs (k8s/README.md)."""
    manifest = tmp_path / "ws-01.yaml"
    manifest.write_text(subprocess.run([*kustomize(), str(K8S / "overlays" / "l4")], capture_output=True,
                                       text=True, check=True).stdout)
    validator = Path(sys.executable).parent / "kubernetes-validate"
    done = subprocess.run([str(validator), "--strict", "--kubernetes-version", K8S_VERSION, str(manifest)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


# ---------------------------------------------------------------- the room's helpers, one by one

def test_addresses_ports_and_exports_are_read_or_refused():
    assert room.parse_destination("10.0.0.2", "--kube-api") == room.Destination("10.0.0.2/32", None)
    assert room.parse_destination("10.0.0.0/24:6443", "--kube-api") == room.Destination("10.0.0.0/24", 6443)
    assert room.parse_destination("fd00::1", "--egress-allow") == room.Destination("fd00::1/128", None)
    with pytest.raises(overlays.ProvisionError, match="port must be between"):
        room.parse_destination("10.0.0.2:0", "--kube-api")
    with pytest.raises(overlays.ProvisionError, match="metadata address"):
        room.parse_destination("169.254.169.254", "--egress-allow")
    assert room.parse_nfs("nfs.example.com:/exports/models") == ("nfs.example.com", "/exports/models")
    with pytest.raises(overlays.ProvisionError, match="SERVER:/PATH"):
        room.parse_nfs("nfs.example.com:exports")
    assert room.models_namespace("ws") == "ws-models"


def test_egress_policies_exist_only_for_what_was_asked():
    assert room.egress_policies([], [], False) == []
    [api] = room.egress_policies(["10.0.0.2/32:443"], [], False)
    assert api["metadata"]["name"] == "allow-kube-api"
    [opted] = room.egress_policies([], [], True)
    assert opted["spec"]["podSelector"] == {} and not _admits(opted["spec"]["egress"][0]["to"][0],
                                                              room.METADATA_ADDRESS)


def test_gpu_share_patches_change_nothing_for_a_whole_gpu_and_divide_memory_when_time_sliced():
    args = ["--model", "m", "--served-model-name", "m", "--gpu-memory-utilization", "0.90"]
    whole = room.parse_gpu_share("none", "H100 SXM")
    assert room.gpu_share_patches(whole, args, 0.90) == ([], [])
    sliced = room.parse_gpu_share("time-slicing:4", "H100 SXM")
    engine, quota = room.gpu_share_patches(sliced, args, 0.90)
    assert engine == [{"op": "replace", "path": "/spec/template/spec/containers/0/args/5", "value": "0.22"}]
    assert quota == []
    mig = room.parse_gpu_share("mig-3g.40gb", "A100 80GB SXM")
    assert mig.resource == "nvidia.com/mig-3g.40gb"
    engine, quota = room.gpu_share_patches(mig, args, 0.90)
    assert {"op": "add", "path": "/spec/template/spec/containers/0/resources/limits/nvidia.com~1mig-3g.40gb",
            "value": "1"} in engine
    assert quota[0] == {"op": "replace", "path": "/spec/hard/requests.nvidia.com~1gpu", "value": "0"}


def test_the_share_check_passes_a_fitting_share_and_refuses_one_the_engine_cannot_start_on():
    fp8_small = room.check_share("RedHatAI/Qwen3-4B-FP8-dynamic", room.parse_gpu_share("mig-1g.10gb", "H100 SXM"),
                                 "H100 SXM")
    assert fp8_small.verdict in ("yes", "partly")
    with pytest.raises(overlays.ProvisionError, match="does not fit.*FP8 weights"):
        room.check_share("Qwen/Qwen3-4B", room.parse_gpu_share("mig-1g.10gb", "H100 SXM"), "H100 SXM")
