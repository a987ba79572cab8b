"""Dense vs MoE conclusions: fed runs that agree with the lesson, and the implausible 332 vs 28 tok/s."""

import pandas as pd
import pytest

from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE
from helpers.lessons.l04_moe import conclude_dense_vs_moe, conclude_roofline_fit, decode_table, moe_gpu_caveat


def runs(dense, moe, batch=4, mbu=0.01):
    rows = [{"model": m, "batch": batch, "run": i, "decode_tok_s": v, "mbu": mbu, "roofline_ceiling_tok_s": 5000.0}
            for m, values in (("tiny-agent", dense), ("tiny-moe", moe)) for i, v in enumerate(values)]
    return pd.DataFrame(rows)


def test_no_difference_or_slower_moe_is_shown():
    assert conclude_dense_vs_moe(runs([300, 310], [305, 300]), "tiny-agent", "tiny-moe")[0].verdict == SHOWN
    slower = conclude_dense_vs_moe(runs([300, 305], [200, 205]), "tiny-agent", "tiny-moe")[0]
    assert slower.verdict == SHOWN and "routing" in slower.text


def test_a_tenfold_moe_is_called_implausible():
    c = conclude_dense_vs_moe(runs([28, 29], [332, 330]), "tiny-agent", "tiny-moe", quiet=False)[0]
    assert c.verdict == NOT_SHOWN and "implausible" in c.text and "machine was busy" in c.text
    assert "batch 4: tiny-moe 331 tok/s vs tiny-agent 28 tok/s" in c.text


def test_a_modestly_faster_moe_is_read_as_noise():
    c = conclude_dense_vs_moe(runs([300, 302], [360, 362]), "tiny-agent", "tiny-moe")[0]
    assert c.verdict == WITHIN_NOISE


def test_roofline_fit_and_the_gpu_caveat():
    assert conclude_roofline_fit(runs([300, 300], [300, 300], mbu=0.02), 20.0).verdict == SHOWN
    assert conclude_roofline_fit(runs([300, 300], [300, 300], mbu=0.8), 20.0).verdict == NOT_SHOWN
    caveat = moe_gpu_caveat("Qwen3-4B", "Qwen3-30B-A3B", 8.0, 6.6, "H100 SXM", 3350)
    assert caveat.text.startswith("On a GPU (computed from the published configs") and "not measured here" in caveat.text
    assert decode_table(runs([1, 3], [2, 4]))["decode_tok_s"].tolist() == [2, 3]


def test_runs_that_disagree_among_themselves_compare_nothing():
    # the busy-machine run: batch 1 dense 33 tok/s, MoE 3 tok/s, the runs of a model +/-131% apart
    c = conclude_dense_vs_moe(runs([10, 56], [3, 3.3]), "tiny-agent", "tiny-moe", quiet=False)[0]
    assert c.verdict == WITHIN_NOISE and "too noisy to compare" in c.text and "no measurable difference" not in c.text


def test_paper_conclusion_says_whether_the_advantage_is_gone():
    from helpers.lessons.l04_moe import conclude_moe_on_paper

    paper = {"dense": {"total_params_B": 4.0, "bytes_read_batch1_GB": 8.0},
             "moe": {"total_params_B": 30.5, "active_params_B": 3.3, "bytes_read_batch1_GB": 6.7, "bf16_weights_GB": 61.0}}
    gone = conclude_moe_on_paper("dense", "moe", paper, 64, 126, 128, 60.1)[1]
    kept = conclude_moe_on_paper("dense", "moe", paper, 2, 4, 128, 8.0)[1]
    assert "mostly gone" in gone.text and "still there" in kept.text


def test_a_model_that_was_not_measured_is_said_not_compared():
    only_dense = runs([300, 310], [])
    [c] = conclude_dense_vs_moe(only_dense, "tiny-agent", "tiny-moe")
    assert c.verdict == NOT_SHOWN and c.text == "batch 4: tiny-moe was not measured (see above), so there is nothing to compare."


def test_an_endpoint_run_elsewhere_is_measured_on_the_tiny_models_it_serves(monkeypatch):
    from types import SimpleNamespace

    import pytest

    from helpers.lessons import l04_moe as moe
    from helpers.engine.interface import ExternalEngine
    from helpers.core.settings import load_settings

    settings = load_settings({"VLLM_HOST": "http://127.0.0.1:1/v1"})
    engine = ExternalEngine(settings)
    lab = SimpleNamespace(settings=settings, engine=engine, model="tiny-agent")
    monkeypatch.setattr(engine, "served_models", lambda: ["Qwen/Qwen3-4B"])
    seen = []
    monkeypatch.setattr(moe, "interleave", lambda runs, rounds, desc: seen.append(list(runs)) or {})
    lab.model = "Qwen/Qwen3-4B"  # serving neither: what it serves is measured, and the notebook goes on
    moe.measure_decode(lab, ["tiny-agent", "tiny-moe"], [1], 8, 8, 1, 1, 1, 10.0)
    assert seen == [["Qwen/Qwen3-4B"]]
    lab.model = "tiny-agent"
    monkeypatch.setattr(engine, "served_models", lambda: ["tiny-agent"])
    moe.measure_decode(lab, ["tiny-agent", "tiny-moe"], [1], 8, 8, 1, 1, 1, 10.0)
    assert seen[-1] == ["tiny-agent"]  # the MoE is not switched to: that would restart an engine we do not run


def test_a_moe_the_room_did_not_download_is_skipped_with_its_sentence(monkeypatch, capsys):
    from types import SimpleNamespace

    from helpers.core.models import missing_reason
    from helpers.core.settings import load_settings
    from helpers.lessons import l04_moe as moe

    settings = load_settings({"VLLM_HOST": "http://vllm-engine:8000/v1", "NAMESPACE": "ws-01"})
    engine = SimpleNamespace(reconfigurable=True)
    lab = SimpleNamespace(settings=settings, engine=engine, model="Qwen/Qwen3-4B")
    seen = []
    monkeypatch.setattr(moe, "interleave", lambda runs, rounds, desc: seen.append(list(runs)) or {})
    moe.measure_decode(lab, [moe.lesson_model("baseline", settings), moe.lesson_model("moe", settings)],
                       [1], 8, 8, 1, 1, 1, 10.0)
    assert seen == [["Qwen/Qwen3-4B"]] and capsys.readouterr().out.strip() == missing_reason("moe", settings)


def test_a_hub_id_is_counted_from_its_published_config_and_a_shipped_name_from_its_directory():
    from helpers.lessons.l04_moe import model_config

    assert model_config("Qwen/Qwen3-4B").name == "Qwen3-4B.json" and model_config("tiny-moe").is_dir()
    with pytest.raises(FileNotFoundError, match="no config for 'org/unknown'"):
        model_config("org/unknown")


def test_paper_and_fade_tables_from_the_published_configs():
    from helpers.hardware.gpus import get_gpu
    from helpers.lessons.l04_moe import fade_table, paper_table

    paper = paper_table(["Qwen3-4B", "Qwen3-30B-A3B"], get_gpu("H100 SXM"))
    moe, dense = paper["Qwen3-30B-A3B"], paper["Qwen3-4B"]
    assert moe["total_params_B"] > 30 and 3.3 < moe["active_params_B"] < 3.4 and moe["experts"] == 128
    assert moe["bytes_read_batch1_GB"] < dense["bytes_read_batch1_GB"] < moe["bf16_weights_GB"]
    fade = fade_table("Qwen3-4B", "Qwen3-30B-A3B", [1, 64])
    assert fade["distinct_experts_per_layer"].round(1).tolist() == [8.0, 125.9]  # the reference numbers


def test_experts_share_outcome_bands():
    from helpers.lessons.l04_moe import experts_share_outcome

    assert experts_share_outcome(8, 128) == "a few (under 25%)"
    assert experts_share_outcome(64, 128) == "about half (25-75%)"
    assert experts_share_outcome(112, 128) == "most of them (over 75%)"


def test_gpu_figures_beside_the_cpu_ones():
    from helpers.hardware.gpus import get_gpu
    from helpers.lessons.l04_moe import PUBLISHED_MOE, moe_beside_gpu, moe_roofline_table

    table = moe_roofline_table("Qwen3-4B", "Qwen3-30B-A3B", get_gpu("H100 SXM"), [1, 64, 1024, 1])
    assert table.batch.tolist() == [1, 64, 1024]
    same = table["same size, dense_ms_per_token"] / table["Qwen3-30B-A3B_ms_per_token"]
    assert same.iloc[0] > 5 and 0.9 < same.iloc[1] < 1.1 and same.iloc[2] > 2  # the advantage fades, then returns
    assert table["same size, dense_bound"].iloc[-1] == "compute"
    lines = moe_beside_gpu(runs([300, 310], [280, 290], batch=16), "tiny-agent", "tiny-moe", table, "Qwen3-4B",
                           "Qwen3-30B-A3B", "H100 SXM")
    assert lines[0].startswith("- This run (measured here, CPU): at batch 16 tiny-moe decodes 285 tok/s")
    assert "computed, not measured" in lines[1] and lines[2].startswith("- Published, not from this run")
    assert "arXiv 2405.04434" in PUBLISHED_MOE["source"] and "5.76" in PUBLISHED_MOE["claim"]
    missing = moe_beside_gpu(runs([300], [], batch=16), "tiny-agent", "tiny-moe", table, "Qwen3-4B",
                             "Qwen3-30B-A3B", "H100 SXM")
    assert "no CPU number" in missing[0]


def test_without_a_moe_the_comparison_says_not_run():
    [c] = conclude_dense_vs_moe(runs([300, 310], []), "Qwen/Qwen3-4B", None)
    assert c.text.startswith("not run: no MoE is served on this profile") and c.verdict == ""


# ---------------------------------------------------------------- what fits: the workshop GPU, this CPU's cache

def test_what_fits_the_gpu_is_computed_both_ways():
    from helpers.hardware.gpus import get_gpu
    from helpers.lessons.l04_moe import fits_lines, paper_table

    small, big = get_gpu("RTX 4000 Ada"), get_gpu("H200")
    lines = fits_lines(paper_table(["Qwen3-4B", "Qwen3-30B-A3B"], small), small)
    assert lines[0].startswith("Qwen3-4B: 8.0 GB of BF16 weights fit the RTX 4000 Ada's")
    assert lines[1].startswith("Qwen3-30B-A3B: 61.1 GB of BF16 weights exceed the RTX 4000 Ada's")
    assert all(" fit the H200's" in line for line in fits_lines(paper_table(["Qwen3-4B", "Qwen3-30B-A3B"], big), big))


def test_the_tiny_models_served_bytes_come_from_their_files():
    from helpers.core.settings import models_dir
    from helpers.lessons.l04_cache_fit import served_weight_bytes

    # tiny-agent's safetensors file stores its tied LM head twice (10.4 MB); the engine holds it once
    assert served_weight_bytes(models_dir() / "tiny-agent") == 2 * 4_164_352  # 8.3 MB
    assert served_weight_bytes(models_dir() / "tiny-moe") == 2 * 11_250_432   # 22.5 MB


def _sysfs(tmp_path, caches):
    for i, (level, kind, size) in enumerate(caches):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    return tmp_path


def test_the_last_level_cache_is_read_from_sysfs(tmp_path):
    from helpers.lessons.l04_cache_fit import last_level_cache

    root = _sysfs(tmp_path, [(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"),
                             (3, "Unified", "12288K")])
    cache = last_level_cache(root)
    assert (cache.label, cache.size_bytes) == ("L3", 12 * 2**20)
    assert last_level_cache(tmp_path / "nowhere") is None


def test_the_cache_sentence_goes_each_way():
    from helpers.lessons.l04_cache_fit import Cache, conclude_cache_fit

    sizes = {"tiny-agent": 8_328_704, "tiny-moe": 22_500_864}
    both = conclude_cache_fit(sizes, Cache(3, 32 * 2**20, "sysfs")).text
    assert "tiny-agent 8.3 MB, tiny-moe 22.5 MB" in both and "L3 holds 32 MiB" in both and "all of them fit" in both
    laptop = conclude_cache_fit(sizes, Cache(3, 12 * 2**20, "sysfs")).text
    assert "tiny-agent fits and tiny-moe does not" in laptop
    assert "none of them fits" in conclude_cache_fit(sizes, Cache(3, 4 * 2**20, "sysfs")).text
    assert "not readable here" in conclude_cache_fit(sizes, None).text


def test_on_a_gpu_the_cache_sentence_says_where_the_weights_are_read():
    from types import SimpleNamespace

    from helpers.lessons.l04_cache_fit import engine_cache_fit

    lab = SimpleNamespace(settings=SimpleNamespace(profile="k8s"))
    text = engine_cache_fit(lab, ["Qwen/Qwen3-4B", None]).text
    assert text.startswith("The engine runs on a GPU (k8s profile)") and "Qwen/Qwen3-4B 8.0 GB" in text


def test_on_a_cpu_the_moe_starts_once_beside_the_dense_baseline_and_each_run_reads_its_own_engine(monkeypatch, tmp_path):
    """The cpu profile's local engine: the MoE on the port beside the baseline for the whole comparison (one start, no
    restart of the baseline, stopped after), each round's run pointed at its model's engine."""
    from helpers.core.settings import load_settings
    from helpers.engine import session
    from helpers.engine.local import LocalEngine
    from helpers.lessons import l04_moe as moe
    from helpers.measure import bench_results, loadgen, server_metrics

    monkeypatch.setenv("WORKSHOP_STATE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(LocalEngine, "start", lambda self, config=None, timeout_s=None: calls.append(
        ("start", self.settings.port, config.served_name)))
    monkeypatch.setattr(LocalEngine, "stop", lambda self, timeout_s=None: calls.append(("stop", self.settings.port)))
    monkeypatch.setattr(LocalEngine, "apply", lambda self, config, timeout_s=None: calls.append(("restart",)))
    loads = []
    monkeypatch.setattr(loadgen, "run_load", lambda settings, *a, model, prompts: loads.append((settings.port, model)))
    monkeypatch.setattr(loadgen, "prompt_factory", lambda settings, model: None)
    monkeypatch.setattr(bench_results, "summarize", lambda runs: {"output_throughput": 1.0, "median_tpot_ms": 1.0})
    monkeypatch.setattr(server_metrics, "scrape", lambda url: url)
    monkeypatch.setattr(server_metrics, "window", lambda a, b: {"itl_mean_s": 0.01})

    class Lab:  # as helpers.engine.session.Lab: the model follows the engine
        def __init__(self, settings):
            self.settings, self.engine, self.client = settings, LocalEngine(settings), object()

        @property
        def model(self):
            return self.settings.model

    settings = load_settings({})
    lab = Lab(settings)
    baseline_engine = lab.engine
    runs = moe.measure_decode(lab, ["tiny-agent", "tiny-moe"], [1], 8, 8, 1, 1, 2, 10.0)
    beside = settings.port + session.THINKING_PORT_OFFSET
    assert calls == [("start", beside, "tiny-moe"), ("stop", beside)]  # no restart of the baseline
    assert loads == [(settings.port, "tiny-agent"), (beside, "tiny-moe")] * 2  # two rounds, each on its engine
    assert list(runs.model) == ["tiny-agent", "tiny-agent", "tiny-moe", "tiny-moe"]
    assert lab.engine is baseline_engine and lab.settings is settings
