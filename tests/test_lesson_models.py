"""The lessons' models by role and profile (helpers/core/models.py), the values chosen by profile, and what a
cluster engine is given for a model name (helpers/engine/interface.resolve_model)."""

from __future__ import annotations

import pytest
import yaml

from helpers.core.kit_paths import kit_dir
from helpers.core.models import (LESSON_MODELS, ROOM_EXTRA_MODELS, ROOM_MODELS, by_profile, lesson_model,
                                 missing_reason, room_models)
from helpers.core.settings import load_settings
from helpers.engine.interface import EngineError, resolve_model, shipped_models

CPU = load_settings({})
GPU = load_settings({"WORKSHOP_PROFILE": "gpu"})
K8S = load_settings({"VLLM_HOST": "http://vllm-engine:8000/v1", "NAMESPACE": "ws-01"})
K8S_MOE = load_settings({"VLLM_HOST": "http://vllm-engine:8000/v1", "NAMESPACE": "ws-01",
                         "WORKSHOP_EXTRA_MODELS": "Qwen/Qwen3-30B-A3B"})


def _generated_literals(kustomization: dict) -> dict[str, str]:
    literals = next(g for g in kustomization["configMapGenerator"] if g["name"] == "workshop-engine")["literals"]
    return dict(line.split("=", 1) for line in literals)


def test_the_room_lists_match_the_manifests_download_lists():
    k8s = kit_dir("k8s")
    base = _generated_literals(yaml.safe_load((k8s / "base" / "kustomization.yaml").read_text()))
    moe = _generated_literals(yaml.safe_load((k8s / "components" / "with-moe" / "kustomization.yaml").read_text()))
    assert tuple(base["PREDOWNLOAD_MODELS"].split()) == ROOM_MODELS
    assert tuple(moe["PREDOWNLOAD_EXTRA_MODELS"].split()) == ROOM_EXTRA_MODELS
    assert base["MODEL_NAME"] == lesson_model("baseline", K8S)


def test_every_role_has_a_shipped_model_on_cpu_and_a_downloaded_one_or_a_reason_on_the_cluster():
    shipped = set(shipped_models())
    for role, entry in LESSON_MODELS.items():
        assert lesson_model(role, CPU) == entry.cpu and entry.cpu in shipped, role
        assert missing_reason(role, CPU) is None
        for settings in (GPU, K8S):
            model = lesson_model(role, settings)
            assert model is None or model in ROOM_MODELS, (role, model)
            if model is None:
                reason = missing_reason(role, settings)
                assert reason.startswith("Not run: ") and reason.count(". ") == 0 and reason.endswith("say so."), reason
                assert entry.missing in reason
            else:
                assert missing_reason(role, settings) is None


def test_the_cluster_names_the_hub_ids_the_room_downloads():
    assert [lesson_model(r, K8S) for r in ("baseline", "fp8-checkpoint", "draft")] == list(ROOM_MODELS)
    assert lesson_model("misaligned-draft", K8S) is None and lesson_model("w8a8", GPU) is None


def test_the_moe_only_where_the_room_downloads_it():
    assert lesson_model("moe", K8S) is None and "with-moe" in missing_reason("moe", K8S)
    assert lesson_model("moe", K8S_MOE) == "Qwen/Qwen3-30B-A3B" and missing_reason("moe", K8S_MOE) is None
    assert room_models(K8S_MOE) == ROOM_MODELS + ROOM_EXTRA_MODELS


def test_an_unknown_role_names_the_roles():
    with pytest.raises(KeyError, match="the roles are baseline, thinking, fp8-checkpoint"):
        lesson_model("teacher", CPU)


def test_by_profile_takes_the_gpu_value_on_gpu_and_k8s():
    assert by_profile(cpu=[1, 4], gpu=[1, 8, 32], settings=CPU) == [1, 4]
    assert by_profile(cpu=2, gpu=3, settings=GPU) == 3 and by_profile(cpu=2, gpu=3, settings=K8S) == 3


def test_by_profile_reads_the_environment(monkeypatch):
    monkeypatch.delenv("VLLM_HOST", raising=False)
    monkeypatch.setenv("WORKSHOP_PROFILE", "gpu")
    assert by_profile(cpu="a", gpu="b") == "b" and lesson_model("draft") == "Qwen/Qwen3-0.6B"
    monkeypatch.setenv("WORKSHOP_PROFILE", "cpu")
    assert by_profile(cpu="a", gpu="b") == "a" and lesson_model("draft") == "tiny-draft"


def test_a_cluster_engine_is_never_given_a_directory_of_the_notebook_pod(tmp_path):
    for name in ("tiny-agent", "tiny-draft", "tiny-moe"):
        with pytest.raises(EngineError, match=f"{name}' is a tiny model shipped for the CPU profile.*Qwen/Qwen3-4B"):
            resolve_model(name, "k8s")
        with pytest.raises(EngineError, match="the gpu engine cannot serve"):
            resolve_model(name, "gpu")
    with pytest.raises(EngineError, match="is a directory of this machine"):
        resolve_model(str(tmp_path), "k8s")
    for hub_id in ROOM_MODELS:
        assert resolve_model(hub_id, "k8s") == hub_id == resolve_model(hub_id, "gpu")
    assert resolve_model(str(tmp_path), "gpu") == str(tmp_path)  # a local GPU engine reads this machine's disk
    assert resolve_model("tiny-agent", "cpu").endswith("models/tiny-agent")


def test_lesson_models_keeps_what_the_profile_has_and_says_what_it_skips(capsys):
    from helpers.core.models import lesson_models

    assert lesson_models("fp8-checkpoint", "w8a8", settings=CPU) == ["tiny-agent-fp8-dynamic", "tiny-agent-w8a8"]
    assert capsys.readouterr().out == ""
    assert lesson_models("fp8-checkpoint", "w8a8", "w4a16", settings=K8S) == ["RedHatAI/Qwen3-4B-FP8-dynamic"]
    printed = capsys.readouterr().out.splitlines()
    assert printed == [missing_reason("w8a8", K8S), missing_reason("w4a16", K8S)]


def test_the_workshop_gpu_default_is_stated_and_a_named_one_is_not(capsys):
    from helpers.core.models import workshop_gpu

    assert workshop_gpu(CPU) == "RTX 4000 Ada" and "WORKSHOP_GPU is unset" in capsys.readouterr().out
    assert workshop_gpu(load_settings({"WORKSHOP_GPU": "L4"})) == "L4" and capsys.readouterr().out == ""


def test_the_cluster_draft_is_the_rooms_hub_id_and_a_missing_one_is_left_out(monkeypatch, capsys):
    import json

    import pandas as pd

    from helpers.lessons.l06 import aligned_vs_misaligned, draft_methods, spec_config

    monkeypatch.setenv("VLLM_HOST", "http://vllm-engine:8000/v1")
    monkeypatch.setenv("NAMESPACE", "ws-01")
    monkeypatch.delenv("WORKSHOP_PROFILE", raising=False)
    assert json.loads(spec_config("draft_model", 3, model="Qwen/Qwen3-0.6B"))["model"] == "Qwen/Qwen3-0.6B"
    with pytest.raises(EngineError, match="tiny model shipped for the CPU profile"):
        spec_config("draft_model", 3, model="tiny-draft")
    methods = draft_methods(3, lesson_model("draft"), lesson_model("misaligned-draft"), ("A", "M", "N"), "base")
    assert list(methods) == ["base", "A", "N"] and methods["base"] is None
    assert capsys.readouterr().out.strip() == missing_reason("misaligned-draft", K8S)
    runs = pd.DataFrame({"config": ["A", "A"], "acceptance_rate": [0.5, 0.6]})
    left_out = aligned_vs_misaligned(runs, "A", "M")
    assert left_out.text.startswith("not run: M left out") and left_out.verdict == ""


def test_prompt_lookup_on_a_hub_id_without_its_tokenizer_here_uses_the_roles_stand_in(monkeypatch):
    from helpers.lessons.l06 import copied_text_lookup

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", "/nonexistent-hf-home")
    length, detail = copied_text_lookup("Qwen/Qwen3-4B", "the weather in Paris is sunny", 3, 3)
    assert length > 1 and "tokenized with tiny-agent's tokenizer: Qwen/Qwen3-4B's is not on this machine" in detail
    shipped = copied_text_lookup("tiny-agent", "the weather in Paris is sunny", 3, 3)
    assert shipped[0] == length and "tokenized with" not in shipped[1]
