"""Which model plays each role of a lesson, per profile: one table, and the notebooks' values chosen by profile.

On the ``cpu`` profile a lesson serves the tiny models shipped in ``models/``. On ``gpu`` and ``k8s`` it names the hub
ids the room downloads: ``PREDOWNLOAD_MODELS`` in k8s/base/kustomization.yaml (``ROOM_MODELS``), and the MoE only when
the room adds k8s/components/with-moe (``PREDOWNLOAD_EXTRA_MODELS``, which the notebook pod reads as
``WORKSHOP_EXTRA_MODELS``). A role the room does not download has no model there: ``lesson_model`` gives None and
``missing_reason`` the one sentence a lesson prints before it skips that step. A cluster engine is never given a
path of the notebook pod: the engine pod reads only the room's model volume.

``by_profile(cpu=..., gpu=...)`` is what a notebook's parameters cell calls: the CPU value on the ``cpu`` profile,
the workshop GPU's value on ``gpu`` and ``k8s``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from helpers.core.settings import Settings, load_settings

T = TypeVar("T")

# k8s/base/kustomization.yaml, configMapGenerator workshop-engine, PREDOWNLOAD_MODELS (a test keeps them in step)
ROOM_MODELS = ("Qwen/Qwen3-4B", "RedHatAI/Qwen3-4B-FP8-dynamic", "Qwen/Qwen3-0.6B")
# k8s/components/with-moe: PREDOWNLOAD_EXTRA_MODELS, downloaded only when a room adds that component
ROOM_EXTRA_MODELS = ("Qwen/Qwen3-30B-A3B",)


@dataclass(frozen=True)
class LessonModel:
    """One role a lesson gives a model: the shipped tiny model on a CPU, the room's hub id on a GPU (None: none)."""

    role: str
    cpu: str  # a model shipped in models/
    gpu: str | None  # a hub id of ROOM_MODELS or ROOM_EXTRA_MODELS; None: the room downloads none for this role
    what: str  # what the role is, in a few words
    missing: str = ""  # why the room has no model for it (gpu None), or when it has one (an extra download)


LESSON_MODELS: dict[str, LessonModel] = {m.role: m for m in (
    LessonModel("baseline", "tiny-agent", "Qwen/Qwen3-4B", "the workshop's model in BF16, every comparison's baseline"),
    LessonModel("thinking", "tiny-qwen3", "Qwen/Qwen3-4B",
                "a model that thinks before it answers: Qwen3's chat template with its reasoning parser (on a GPU the "
                "baseline itself; on a CPU the tiny stand-in trained under Qwen3-4B's own template)"),
    LessonModel("fp8-checkpoint", "tiny-agent-fp8-dynamic", "RedHatAI/Qwen3-4B-FP8-dynamic",
                "the baseline's weights and activations in FP8, a published checkpoint (llmcompressor's FP8_DYNAMIC)"),
    LessonModel("w8a8", "tiny-agent-w8a8", None, "INT8 weights and activations",
                "the room downloads no INT8 (W8A8) checkpoint of Qwen/Qwen3-4B"),
    LessonModel("w4a16", "tiny-agent-w4a16", None, "4-bit weights, 16-bit activations",
                "the room downloads no 4-bit (W4A16) checkpoint of Qwen/Qwen3-4B"),
    LessonModel("gptq-int4", "tiny-agent-gptq-int4", None, "4-bit GPTQ weights",
                "the room downloads no GPTQ checkpoint of Qwen/Qwen3-4B"),
    LessonModel("draft", "tiny-draft", "Qwen/Qwen3-0.6B",
                "an aligned draft: a much smaller model with the baseline's tokenizer, trained on the same data"),
    LessonModel("misaligned-draft", "tiny-draft-untrained", None, "a misaligned draft: the draft's shape, untrained",
                "the room downloads no untrained draft for Qwen/Qwen3-4B (the tiny one exists only for the CPU "
                "profile)"),
    LessonModel("moe", "tiny-moe", "Qwen/Qwen3-30B-A3B", "a mixture of experts with the baseline's tokenizer",
                "the room downloads Qwen/Qwen3-30B-A3B only with k8s/components/with-moe (61 GB in BF16: an 80 GB "
                "GPU), so ask your instructor whether this room has it"),
)}


def _settings(settings: Settings | None) -> Settings:
    return settings if settings is not None else load_settings()


def on_cpu(settings: Settings | None = None) -> bool:
    """True on the ``cpu`` profile (the shipped tiny models), False on ``gpu`` and ``k8s`` (the room's hub ids)."""
    return _settings(settings).profile == "cpu"


def by_profile(cpu: T, gpu: T, settings: Settings | None = None) -> T:
    """A notebook parameter's value: ``cpu`` on the cpu profile, ``gpu`` (the workshop GPU's) on gpu and k8s."""
    return cpu if on_cpu(settings) else gpu


def _role(role: str) -> LessonModel:
    if role not in LESSON_MODELS:
        raise KeyError(f"no lesson role {role!r}: the roles are {', '.join(LESSON_MODELS)} (helpers/core/models.py)")
    return LESSON_MODELS[role]


def room_models(settings: Settings | None = None) -> tuple[str, ...]:
    """The hub ids this room downloads: the base list and the extras the notebook pod was told of."""
    extras = _settings(settings).extra_models
    return ROOM_MODELS + tuple(m for m in extras if m not in ROOM_MODELS)


def lesson_model(role: str, settings: Settings | None = None) -> str | None:
    """The model that plays ``role`` on this profile: a shipped tiny model on cpu, the room's hub id on gpu and
    k8s; None when the room does not download one (``missing_reason`` says why)."""
    entry, settings = _role(role), _settings(settings)
    if settings.profile == "cpu":
        return entry.cpu
    return entry.gpu if entry.gpu in room_models(settings) else None


def missing_reason(role: str, settings: Settings | None = None) -> str | None:
    """None when ``role`` has a model on this profile; else one sentence: which role, why not, what happens."""
    if lesson_model(role, settings) is not None:
        return None
    entry = _role(role)
    return (f"Not run: {entry.what} ({role}) has no model on the {_settings(settings).profile} profile, since "
            f"{entry.missing}; this step is skipped and its checks say so.")



def lesson_models(*roles: str, settings: Settings | None = None) -> list[str]:
    """The models of ``roles`` on this profile, in order; for each role the room has none for, its sentence printed."""
    found = []
    for role in roles:
        model = lesson_model(role, settings)
        if model is None:
            print(missing_reason(role, settings))
        else:
            found.append(model)
    return found


def workshop_gpu(settings: Settings | None = None) -> str:
    """The workshop GPU's name (``WORKSHOP_GPU``, set by provisioning); unset, the default, and one line that says so."""
    settings = _settings(settings)
    if settings.gpu_is_default:
        print(f"WORKSHOP_GPU is unset, so the GPU figures are for the default, {settings.gpu} (the public workshop's "
              "GPU); set WORKSHOP_GPU to your GPU's name in helpers/hardware/gpus.py for yours.")
    return settings.gpu
