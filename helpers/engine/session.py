"""Connect a notebook (or a script) to the engine: one call, clear errors.

``connect()`` reads the settings, starts the local engine when the profile runs one (or finds the
one already running), checks that the endpoint answers and serves the expected model, and returns a
``Lab`` holding the settings, the engine and an OpenAI client. Every failure says what to do next.

The model is always the one the settings name (``MODEL_NAME``), never another one the engine happens to
serve: a local engine serving another model is restarted on it, a name the local engine cannot serve is
refused naming the shipped models, and a remote endpoint that does not serve it is refused naming the
models it serves.

``thinking_model_served`` serves the lessons' thinking model (``helpers.core.models``, role "thinking") with vLLM's
reasoning parser for a block (notebooks 01 and 04): on a CPU the stand-in on its own engine beside the baseline,
stopped after.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import httpx
import openai

from helpers.engine.interface import (Engine, EngineError, ExternalEngine, default_config, list_models,
                                     resolve_model)
from helpers.engine.local import LocalEngine
from helpers.engine.replicas import ReplicaSet, replica_set_for
from helpers.core.models import lesson_model, missing_reason
from helpers.core.settings import Settings, load_settings
from helpers.core.vllm_args import EngineConfig, flag_value, with_flag
from helpers.core.errors import WorkshopError

CONNECT_TIMEOUT_S = 5.0


class EndpointError(WorkshopError, RuntimeError):
    """The endpoint is unreachable, refuses our key, or does not serve the model we asked for."""


def check_endpoint(settings: Settings, model: str | None = None, timeout_s: float = CONNECT_TIMEOUT_S) -> list[str]:
    """The served model names; raises EndpointError with what to check when something is wrong."""
    url = settings.base_url + "/models"
    try:
        served = list_models(settings, timeout_s)
    except httpx.TimeoutException:
        raise EndpointError(f"{url} did not answer within {timeout_s:.0f} s. Is the engine still starting or "
                            "overloaded? Check `workshop status`, or VLLM_HOST if it points elsewhere.") from None
    except httpx.HTTPStatusError as err:
        if err.response.status_code == 401:
            raise EndpointError(f"{url} answered 401 Unauthorized: the server expects an API key. Set VLLM_API_KEY "
                                "to the key the engine was started with (it is not shown here).") from None
        raise EndpointError(f"{url} answered HTTP {err.response.status_code}: {err.response.text[:200]}") from None
    except httpx.HTTPError as err:
        hint = ("start it with `workshop up`" if settings.managed
                else "check VLLM_HOST, your network or port-forward, and that the engine pod is running")
        raise EndpointError(f"Cannot reach the engine at {url} ({type(err).__name__}): {hint}.") from None
    if model is not None and model not in served:
        if not settings.managed:
            raise EndpointError(f"Model {model!r} is not served at {settings.base_url}. Served: {served}. "
                                "Set MODEL_NAME to one of them (or switch the engine's model).")
        try:
            resolve_model(model, settings.profile)  # a name the local engine cannot serve: the shipped ones
        except EngineError as err:
            raise EndpointError(str(err)) from None
        raise EndpointError(f"Model {model!r} is not served at {settings.base_url}. Served: {served}. "
                            f"Restart the local engine on it with `MODEL_NAME={model} workshop up`, or set MODEL_NAME "
                            "to one of them.")
    return served


@dataclass
class Lab:
    """What a notebook works with: settings, the engine, and a client for it."""

    settings: Settings
    engine: Engine
    client: openai.OpenAI

    @property
    def model(self) -> str:
        """The model name to send in requests (follows engine.switch_model)."""
        return self.engine.model

    def check(self) -> list[str]:
        """Re-check the endpoint (after a restart, or when a call failed)."""
        return check_endpoint(self.settings, self.model)

    def chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        """One chat completion at temperature 0 unless told otherwise; engine failures explained."""
        kwargs.setdefault("temperature", 0.0)
        try:
            return self.client.chat.completions.create(model=self.model, messages=messages, **kwargs)
        except openai.APIConnectionError:
            raise EndpointError(f"The engine at {self.settings.base_url} stopped answering. If it was stopped or "
                                "killed, restart it: `workshop up` in a terminal, or lab.engine.restart().") from None
        except openai.AuthenticationError:
            raise EndpointError("The engine rejected the API key (401): set VLLM_API_KEY to the engine's key.") from None
        except openai.NotFoundError as err:
            raise EndpointError(f"{err.message}. Served models: {check_endpoint(self.settings)}") from None


def make_client(settings: Settings, timeout_s: float = 120.0) -> openai.OpenAI:
    """An OpenAI client for the endpoint (no automatic retries: failures should show)."""
    return openai.OpenAI(base_url=settings.base_url, api_key=settings.api_key or "EMPTY",
                         timeout=timeout_s, max_retries=0)


def make_engine(settings: Settings) -> Engine:
    """The backend for these settings: the participant's Deployment (k8s), a local process, or read-only external."""
    if settings.profile == "k8s":
        from helpers.engine.k8s import KubernetesEngine  # imports kubectl helpers only the k8s profile needs

        return KubernetesEngine(settings)
    if settings.managed:
        return replica_set_for(settings) or LocalEngine(settings)  # replicas behind the router: workshop up --replicas N
    return ExternalEngine(settings)


def connect(settings: Settings | None = None, start: bool = True) -> Lab:
    """Settings -> engine (started or found) serving the settings' model -> checked endpoint -> Lab. In a notebook
    it also makes tables show whole numbers as whole numbers and gaps as "-" (``helpers.core.tables.format_tables``).

    ``start=False`` starts no engine that is not running, but a local engine serving another model than the
    settings name is still restarted on it (``LocalEngine.start`` says so). A name the local engine cannot serve
    raises EngineError naming the shipped models; one a remote endpoint does not serve, EndpointError naming
    the served ones."""
    from helpers.core.tables import format_tables  # pandas: only when connecting, not on import

    format_tables()
    settings = settings or load_settings()
    engine = make_engine(settings)
    if isinstance(engine, (LocalEngine, ReplicaSet)) and (start or engine.model != settings.model):
        engine.start()  # on another model than settings.model: restarts on it (or refuses a name it cannot serve)
    check_endpoint(settings, settings.model)
    return Lab(settings, engine, make_client(settings))


def engine_summary(settings: Settings | None = None) -> tuple[dict[str, Any], str]:
    """The engine's status as one table column (lists joined; secrets only as set / not set) and a sentence:
    ready, or not and what to do. Starts nothing, so a first screen can show it at once."""
    settings = settings or load_settings()
    status = make_engine(settings).status()
    shown = {key: " ".join(map(str, value)) if isinstance(value, list) else value for key, value in status.items()}
    if status.get("ready"):
        return shown, (f"The engine is ready: {settings.base_url} serves {status.get('model')!r} "
                       f"(profile {settings.profile}).")
    if settings.managed:
        return shown, ("The engine is not running. Start it with `workshop up` in a terminal, or open notebook 01: "
                       "its first cell starts it (about a minute on a laptop CPU).")
    return shown, (f"The endpoint {settings.base_url} is not ready ({status.get('problem', 'no answer')}): check "
                   "VLLM_HOST, your network or port-forward, and that the engine is running.")


# ---------------------------------------------------------------- the thinking model, for a block

REASONING_PARSER = "qwen3"  # vLLM's parser for Qwen3's <think>...</think> (k8s/base/vllm.yaml, the gpu profile)


# The port of an engine a step serves beside the baseline on the CPU (the thinking stand-in, a traced copy), past the
# replica set's (``workshop up --replicas``: the next 8 ports) and its router
THINKING_PORT_OFFSET = 10
THINKING_KV_CACHE_BYTES = 256 << 20  # one agent at a time: a quarter of the baseline's KV memory, allocated sooner


def thinking_engine(settings: Settings, model: str | None = None) -> LocalEngine:
    """The local engine that serves beside the baseline on its own port and state file (``workshop down`` stops it
    too): the CPU's thinking stand-in, or ``model``."""
    port = settings.port + THINKING_PORT_OFFSET
    return LocalEngine(replace(settings, port=port, base_url=f"http://127.0.0.1:{port}/v1",
                               model=model or lesson_model("thinking", settings) or settings.model))


def beside_config(settings: Settings, model: str | None = None) -> EngineConfig:
    """The CPU profile's default configuration of ``model`` (default the thinking stand-in) on the engine beside the
    baseline (``thinking_engine``), before ``served_beside`` sets its KV memory."""
    return default_config(thinking_engine(settings, model).settings)


def beside_possible(lab: Lab) -> bool:
    """Can a step serve its configuration beside the baseline (the cpu profile's local engine), not instead of it?"""
    return lab.settings.profile == "cpu" and type(lab.engine) is LocalEngine


@contextmanager
def served_beside(lab: Lab, config: EngineConfig, what: str,
                  kv_cache_bytes: int = THINKING_KV_CACHE_BYTES) -> Iterator[Callable[[bool], None]]:
    """The CPU profile: ``config`` on its own engine beside the baseline, which keeps running (one start, not a
    restart there and one back), with ``kv_cache_bytes`` of KV memory (default a quarter of the baseline's); ``lab``
    points at it for the block (``point(False)`` points it back at the baseline, ``point(True)`` at it again: a
    comparison alternates with no restart) and at the baseline after, whatever happened. Its start is recorded like
    any other (``helpers.engine.starts``)."""
    engine = thinking_engine(lab.settings, config.served_name)
    config = replace(config, args=with_flag(config.args, "--kv-cache-memory-bytes", str(kv_cache_bytes)))
    print(f"serving {what} on port {engine.settings.port}, beside {lab.model} (which keeps running): one start now, "
          "stopped after this cell")
    saved = (lab.settings, lab.engine, lab.client)
    beside = (engine.settings, engine, make_client(engine.settings))

    def point(at_beside: bool) -> None:
        lab.settings, lab.engine, lab.client = beside if at_beside else saved

    try:
        engine.start(config)
        point(True)
        yield point
    finally:
        point(False)
        engine.stop()


@contextmanager
def served_for_the_block(lab: Lab, config: EngineConfig, what: str) -> Iterator[None]:
    """``lab`` on ``config`` for the block: on the cpu profile's local engine a second engine beside the baseline (one
    start; ``served_beside``), on another engine that can be reconfigured a restart on it and one back to the
    configuration it had, whatever happened."""
    if beside_possible(lab):
        with served_beside(lab, config, what):
            yield
        return
    before = lab.engine.config()
    print(f"serving {what}: one restart now, and one back to {before.served_name} after this cell")
    lab.engine.apply(config)
    try:
        yield
    finally:
        lab.engine.apply(before)


@contextmanager
def thinking_model_served(lab: Lab) -> Iterator[str]:
    """Serve the lesson's thinking model (``lesson_model("thinking")``) with ``--reasoning-parser qwen3`` for the block,
    and give its name. No restart where the engine serves it so already (the gpu and k8s profiles: the baseline
    itself). On the cpu profile's local engine, the stand-in (tiny-qwen3) starts on its own port beside it, ``lab``
    points there for the block, and it stops after; another engine that can be reconfigured (a replica set) restarts
    on it, and back to the configuration it had, whatever happened (``served_for_the_block``). An endpoint run
    elsewhere serves what it serves: the block runs on its model, and the line printed says so."""
    model = lesson_model("thinking", lab.settings)
    if model is None:
        print(missing_reason("thinking", lab.settings))
        yield lab.model
        return
    before = lab.engine.config()
    if before.served_name == model and flag_value(before.args, "--reasoning-parser") == REASONING_PARSER:
        print(f"{model} is the workshop's thinking model and is served with --reasoning-parser {REASONING_PARSER} "
              "already: no restart.")
        yield model
        return
    if not lab.engine.reconfigurable:
        print(f"{lab.settings.base_url} is run elsewhere, so its model and flags are set where it runs: this step "
              f"asks {lab.model} to think (the thinking model here would be {model}).")
        yield lab.model
        return
    base = beside_config(lab.settings) if beside_possible(lab) else before
    config = replace(base, model=resolve_model(model, lab.settings.profile), served_name=model,
                     args=with_flag(base.args, "--reasoning-parser", REASONING_PARSER))
    with served_for_the_block(lab, config, f"{model}, the thinking stand-in, with --reasoning-parser "
                                           f"{REASONING_PARSER}"):
        yield model
