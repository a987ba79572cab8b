"""Replica-set arithmetic: ports, the CPU split, each replica's configuration, the record that finds the set."""

from __future__ import annotations

import socket

import pytest
from fake_engine_server import use_fake_engine

from helpers.engine import replicas
from helpers.engine.interface import EngineError, default_config
from helpers.engine.replicas import (BIND_VARIABLE, THREADS_VARIABLE, ReplicaSet, cores_shared, omp_threads, read_record,
                              replica_config, replica_ports, replica_set_for, replica_settings, router_metrics_port)
from helpers.engine.router import RouterError
from helpers.core.settings import load_settings
from helpers.core.vllm_args import flag_value


def test_ports_follow_the_router():
    assert replica_ports(8850, 2) == [8851, 8852]
    assert router_metrics_port(8850, 2) == 8853


@pytest.mark.parametrize("n, cores, expected", [
    (2, [0, 1], 1),
    (2, [0, 1, 2, 3], 2),
    (3, [0, 1, 2, 3, 4, 5, 6], 2),
    (3, [0, 1], 1),  # more replicas than cores: shared
    (1, [0, 1], 2),
])
def test_each_replica_gets_an_equal_share_of_threads(n, cores, expected):
    assert omp_threads(n, cores) == expected
    assert cores_shared(n, cores) == (n > len(cores))


def test_threads_refuse_nothing():
    with pytest.raises(EngineError):
        omp_threads(0, [0, 1])


def test_replica_config_sets_kv_budget_and_unpinned_threads():
    base = default_config(load_settings({}))
    config = replica_config(base, 3, 512 << 20)
    assert flag_value(config.args, "--kv-cache-memory-bytes") == str(512 << 20)
    assert dict(config.env)[BIND_VARIABLE] == "nobind" and dict(config.env)[THREADS_VARIABLE] == "3"
    assert dict(config.env)["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # the profile's env is kept
    assert config.model == base.model and "--enforce-eager" in config.args


def test_replica_settings_point_at_the_replica():
    s = replica_settings(load_settings({"WORKSHOP_PORT": "8850"}), 8851)
    assert s.base_url == "http://127.0.0.1:8851/v1" and s.port == 8851 and s.model == "tiny-agent"


def test_set_is_found_only_when_recorded():
    settings = load_settings({"WORKSHOP_PORT": "8850"})
    assert replica_set_for(settings) is None and read_record(8850) is None
    ReplicaSet(settings, 2, "round_robin")._record()
    found = replica_set_for(settings)
    assert isinstance(found, ReplicaSet) and found.n == 2 and found.policy == "round_robin"
    assert found.worker_urls() == ["http://127.0.0.1:8851", "http://127.0.0.1:8852"]
    assert replica_set_for(load_settings({"WORKSHOP_PORT": "8860"})) is None


def test_bad_sizes_and_policies_are_refused():
    settings = load_settings({"WORKSHOP_PORT": "8850"})
    with pytest.raises(EngineError, match="between 1 and"):
        ReplicaSet(settings, replicas.MAX_REPLICAS + 1)
    with pytest.raises(RouterError, match="choose one of"):
        ReplicaSet(settings, 2, "fastest")
    with pytest.raises(EngineError, match="external endpoint"):
        ReplicaSet(load_settings({"VLLM_HOST": "http://example:8000"}), 2)


def test_a_set_beside_the_workshop_engine_uses_other_ports():
    from helpers.engine.replicas import replica_set_beside

    rs = replica_set_beside(load_settings({"WORKSHOP_PORT": "8000"}), 2, "cache_aware")
    assert rs.settings.base_url == "http://127.0.0.1:8010/v1" and rs.ports == [8011, 8012] and rs.policy == "cache_aware"


def test_a_missing_router_is_reported_before_any_engine_starts(monkeypatch, tmp_path):
    from helpers.engine import router

    monkeypatch.setattr(router.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    rs = ReplicaSet(load_settings({"WORKSHOP_PORT": "8850"}), 2)
    with pytest.raises(RouterError, match="pip install vllm-router"):
        rs.start()
    assert rs.replicas[0].pid is None and read_record(8850) is None


def test_replicas_serving_another_model_than_model_name_are_restarted_on_it(monkeypatch, capsys):
    use_fake_engine(monkeypatch)  # each replica's server is tests/fake_engine_server.py; the router is not under test
    monkeypatch.setattr(replicas, "router_binary", lambda: "vllm-router")
    monkeypatch.setattr(ReplicaSet, "ensure_router", lambda self, policy: None)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    agent = ReplicaSet(load_settings({"WORKSHOP_PORT": str(port)}), 2)
    try:
        agent.start(timeout_s=60)
        assert [r.served_models() for r in agent.replicas] == [["tiny-agent"]] * 2
        moe = ReplicaSet(load_settings({"WORKSHOP_PORT": str(port), "MODEL_NAME": "tiny-moe"}))
        moe.start(timeout_s=60)
        assert moe.model == "tiny-moe" and [r.served_models() for r in moe.replicas] == [["tiny-moe"]] * 2
        assert "The replicas serve 'tiny-agent'; the settings ask for 'tiny-moe'" in capsys.readouterr().out
        with pytest.raises(EngineError, match="'no-such-model' is neither a model shipped in models/"):
            ReplicaSet(load_settings({"WORKSHOP_PORT": str(port), "MODEL_NAME": "no-such-model"})).start(timeout_s=60)
        assert [r.served_models() for r in moe.replicas] == [["tiny-moe"]] * 2  # refused before anything stopped
    finally:
        agent.stop()


@pytest.mark.parametrize("env, words", [
    ({"VLLM_HOST": "http://10.0.0.5:8000"}, "external (VLLM_HOST is set)"),
    ({"VLLM_HOST": "http://vllm:8000", "NAMESPACE": "alice"}, "k8s/components/router"),
    ({"WORKSHOP_PROFILE": "gpu"}, "would not fit"),
])
def test_the_lesson_starts_replicas_only_beside_a_local_cpu_engine(env, words):
    from types import SimpleNamespace

    from helpers.lessons.l07_saturation import lesson_replica_set

    found, start_it, why = lesson_replica_set(SimpleNamespace(settings=load_settings(env)), 2)
    assert found is None and not start_it and words in why


def test_the_lesson_uses_the_workshop_replica_set_as_it_is_or_starts_one_beside(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from helpers.lessons.l07_saturation import lesson_replica_set

    own = ReplicaSet(load_settings({"WORKSHOP_PORT": "8850"}), 3)
    assert lesson_replica_set(own, 2) == (own, False, "")  # never started or stopped by the notebook
    beside, start_it, why = lesson_replica_set(SimpleNamespace(settings=load_settings({"WORKSHOP_PORT": "8850"})), 2)
    if why:  # vllm-router absent from this environment: the reason says how to install it
        assert "pip install vllm-router" in why
    else:
        assert start_it and beside.ports == [8861, 8862]
    from helpers.engine import router

    monkeypatch.setattr(router.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    found, start_it, why = lesson_replica_set(SimpleNamespace(settings=load_settings({})), 2)
    assert found is None and "pip install vllm-router" in why and "skipped" in why
