"""The GPU-share planner: parsing --gpu-share, the verdict on one share both ways, the cost of the day, the MIG table,
and the lab figures it assumes, read back from k8s/ and the notebooks so they cannot drift."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from helpers.hardware.gpu_shares import MIG_PROFILES, UnknownMigProfileError, get_mig_profile, mig_profiles
from helpers.hardware.gpus import get_gpu, hourly_price
from helpers.lab.notebooks import notebook_parameters, parameters_cell_index, read_notebook
from helpers.planning import gpu_share as gs

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- the lab's figures, from their sources

def _engine_args() -> list[str]:
    deployment = next(d for d in yaml.safe_load_all((ROOT / "k8s/base/vllm.yaml").read_text())
                      if d and d.get("kind") == "Deployment")
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_the_lab_figures_are_those_of_the_cluster_and_the_notebooks():
    args = _engine_args()
    assert int(args[args.index("--max-model-len") + 1]) == gs.LAB_MAX_MODEL_LEN
    assert float(args[args.index("--gpu-memory-utilization") + 1]) == gs.LAB_GPU_MEMORY_UTILIZATION
    p07 = notebook_parameters(read_notebook(ROOT / "notebooks/07_saturation.ipynb"))
    assert max(p07["CONCURRENCIES"]) == gs.TOP_CONCURRENCY
    assert p07["INPUT_LEN"] + p07["OUTPUT_LEN"] == gs.REQUEST_TOKENS
    nb08 = read_notebook(ROOT / "notebooks/08_tuning_and_evaluation.ipynb")
    source = nb08.cells[parameters_cell_index(nb08)].source
    knob = re.search(r'"k8s": \("--gpu-memory-utilization", ([0-9.]+)\)', source)
    assert knob and float(knob.group(1)) == gs.NOTEBOOK_08_UTILIZATION
    for name in ("01_connect_and_first_agent", "03_prefill_decode_kv_cache", "08_tuning_and_evaluation"):
        params = notebook_parameters(read_notebook(ROOT / f"notebooks/{name}.ipynb"))
        assert max(params.get("CONCURRENCIES", [1])) <= gs.TOP_CONCURRENCY  # 07's is the highest


# ---------------------------------------------------------------- --gpu-share

@pytest.mark.parametrize("text, share", [("none", gs.GpuShare("none")), ("", gs.GpuShare("none")),
                                         ("mig-1g.10gb", gs.GpuShare("mig", "1g.10gb")),
                                         ("MIG-2g.20gb", gs.GpuShare("mig", "2g.20gb")),
                                         ("time-slicing:4", gs.GpuShare("time-slicing", replicas=4))])
def test_a_gpu_share_is_read_and_written_back(text, share):
    assert gs.parse_gpu_share(text) == share
    assert gs.parse_gpu_share(str(share)) == share


@pytest.mark.parametrize("text", ["mig", "mig-big", "time-slicing:1", "time-slicing:x", "half"])
def test_a_bad_gpu_share_says_what_to_write(text):
    with pytest.raises(gs.GpuShareError, match="none|time-slicing"):
        gs.parse_gpu_share(text)


def test_participants_per_gpu_and_the_engine_memory_flag():
    assert gs.participants_per_gpu("none", "H100 SXM") == 1
    assert gs.participants_per_gpu("mig-1g.10gb", "H100 SXM") == 7
    assert gs.participants_per_gpu("time-slicing:3", "H100 SXM") == 3
    assert gs.engine_gpu_memory_utilization("mig-1g.10gb") == 0.90  # vLLM sees the slice's own memory
    assert gs.engine_gpu_memory_utilization("time-slicing:4") == 0.22  # ... but the whole GPU when time-sliced
    with pytest.raises(UnknownMigProfileError, match="mig-1g.10gb"):
        gs.participants_per_gpu("mig-3g.20gb", "H100 SXM")
    with pytest.raises(UnknownMigProfileError, match="time-slicing"):
        gs.participants_per_gpu("mig-1g.10gb", "L4")


# ---------------------------------------------------------------- the verdict, both ways

def test_bf16_qwen3_4b_does_not_fit_an_h100_1g_10gb_slice():
    v = gs.share_verdict("Qwen/Qwen3-4B", "mig-1g.10gb", "H100 SXM")
    assert v.verdict == gs.NO and not v.fits
    assert v.weights_gib + v.overhead_gib >= v.budget_gib and v.kv_gib == 0
    assert v.sentence.startswith("no: Qwen3-4B (bf16 weights) on a MIG 1g.10gb slice") and "does not fit" in v.sentence


def test_fp8_qwen3_4b_fits_where_bf16_does_not():
    v = gs.share_verdict("RedHatAI/Qwen3-4B-FP8-dynamic", "mig-1g.10gb", "H100 SXM")
    assert v.weight_dtype == "fp8" and v.verdict == gs.YES
    assert v.kv_gib >= v.kv_needed_gib and v.requests_at_max_len >= 1
    assert v.weights_gib < gs.share_verdict("Qwen/Qwen3-4B", "mig-1g.10gb", "H100 SXM").weights_gib


def test_a_share_that_starts_but_cannot_hold_the_top_concurrency_is_partly():
    v = gs.share_verdict("Qwen/Qwen3-4B", "mig-2g.20gb", "H100 SXM", request_tokens=gs.LAB_MAX_MODEL_LEN)
    assert v.verdict == gs.PARTLY and v.requests_at_max_len >= 1
    assert v.concurrency_at_request_tokens < v.concurrency and "preempts" in v.sentence
    assert gs.share_verdict("Qwen/Qwen3-4B", "mig-2g.20gb", "H100 SXM").verdict == gs.YES  # 07's own requests fit


def test_time_slicing_gives_each_engine_one_nth_of_the_memory():
    whole = gs.share_verdict("Qwen/Qwen3-4B", "none", "H100 SXM")
    quarter = gs.share_verdict("Qwen/Qwen3-4B", "time-slicing:4", "H100 SXM")
    eighth = gs.share_verdict("Qwen/Qwen3-4B", "time-slicing:8", "H100 SXM")
    assert whole.verdict == quarter.verdict == gs.YES and eighth.verdict == gs.NO
    assert quarter.budget_gib == pytest.approx(get_gpu("H100 SXM").usable_memory_gib * 0.22)
    assert quarter.gpu_memory_utilization == 0.22 and whole.gpu_memory_utilization == 0.90
    assert quarter.kv_gib < whole.kv_gib


def test_the_verdict_uses_the_planner():
    from helpers.planning.memory import plan_memory
    from helpers.planning.shape import GIB, REFERENCE_CONFIGS

    profile = get_mig_profile("A100 80GB SXM", "3g.40gb")
    plan = plan_memory(REFERENCE_CONFIGS / "Qwen3-4B.json", gpu="A100 80GB SXM", weight_dtype="bf16",
                       gpu_memory_utilization=0.90, max_model_len=8192, total_memory_bytes=profile.memory_bytes)
    v = gs.share_verdict("Qwen/Qwen3-4B", "mig-3g.40gb", "A100 80GB SXM")
    assert v.kv_gib == pytest.approx(plan.kv_cache.kv_memory_bytes / GIB)
    assert v.requests_at_max_len == int(plan.kv_cache.max_concurrency)


def test_an_unknown_model_says_what_to_pass():
    with pytest.raises(gs.GpuShareError, match="config.json"):
        gs.share_verdict("someone/NotAModel-7B", "none", "H100 SXM")


def test_share_table_has_one_row_per_profile():
    rows = gs.share_table({"Qwen/Qwen3-4B": None}, ("H100 SXM", "A100 80GB SXM"))
    assert len(rows) == len(mig_profiles("H100 SXM")) + len(mig_profiles("A100 80GB SXM"))
    assert {r["verdict"] for r in rows} == {gs.NO, gs.YES}


# ---------------------------------------------------------------- the cost of the day

def test_the_day_costs_less_per_participant_on_a_share():
    price = hourly_price("H100 SXM").usd_per_hour
    cost = gs.day_cost("mig-2g.20gb", "H100 SXM", participants=30, hours=8)
    assert cost.gpus == 10 and cost.participants_per_gpu == 3
    assert cost.usd_per_participant == pytest.approx(10 * price * 8 / 30)
    assert cost.usd_per_participant_one_gpu_each == pytest.approx(price * 8)
    assert cost.price_source in cost.sentence
    odd = gs.day_cost("time-slicing:4", "H100 SXM", participants=30, hours=8)
    assert odd.gpus == 8 and odd.usd_per_participant == pytest.approx(8 * price * 8 / 30)  # 2 seats left over
    same = gs.day_cost("none", "H100 SXM", participants=30, hours=8)
    assert same.usd_per_participant == pytest.approx(same.usd_per_participant_one_gpu_each)


def test_a_gpu_without_a_price_asks_for_one():
    with pytest.raises(gs.GpuShareError, match="USD per GPU-hour"):
        gs.day_cost("time-slicing:2", "L4", participants=4, hours=8)
    given = gs.day_cost("time-slicing:2", "L4", participants=4, hours=8, usd_per_gpu_hour=1.0, price_source="mine")
    assert given.gpus == 2 and given.usd_per_participant == pytest.approx(4.0)


# ---------------------------------------------------------------- the lessons that want a whole GPU

def test_the_lessons_note_says_what_changes_on_each_share():
    assert gs.whole_gpu_lessons_note("none", "H100 SXM") == ""
    mig = gs.whole_gpu_lessons_note("mig-2g.20gb", "H100 SXM")
    assert "2/7" in mig and "07" in mig and "08" in mig
    sliced = gs.whole_gpu_lessons_note("time-slicing:4", "H100 SXM")
    assert "0.22" in sliced and "WHOLE GPU" in sliced


# ---------------------------------------------------------------- the MIG table

def test_the_mig_table_adds_up():
    assert {p.gpu for p in MIG_PROFILES} == {"H100 SXM", "H100 PCIe", "A100 80GB SXM"}
    for p in MIG_PROFILES:
        gpu = get_gpu(p.gpu)
        assert 0 < p.memory_fraction <= 1 and 0 < p.sm_fraction <= 1
        assert p.instances_per_gpu * p.sm_fraction <= 1 and p.instances_per_gpu * p.memory_fraction <= 1
        assert p.memory_bytes <= gpu.usable_memory_bytes * p.memory_fraction
        assert p.name.startswith(f"{p.sm_fraction.numerator * 7 // p.sm_fraction.denominator}g.")
        assert p.resource_name == f"nvidia.com/mig-{p.name}" and "Supported MIG Profiles" in p.source
    assert get_mig_profile("h100-sxm", "mig-1g.10gb").memory_gib == 9.75
    assert get_mig_profile("A100 80GB SXM", "7g.80gb").memory_fraction == Fraction(1)


def test_the_readme_table_is_what_the_planner_computes():
    def cell(v: gs.ShareVerdict) -> str:
        if v.verdict == gs.NO:
            return v.verdict
        return f"{v.verdict} ({v.kv_gib:.1f} GiB KV, {v.requests_at_max_len} x 8,192)"

    readme = (ROOT / "k8s/README.md").read_text()
    for gpu in ("H100 SXM", "A100 80GB SXM"):
        for p in mig_profiles(gpu):
            bf16 = gs.share_verdict("Qwen/Qwen3-4B", f"mig-{p.name}", gpu)
            fp8 = gs.share_verdict("RedHatAI/Qwen3-4B-FP8-dynamic", f"mig-{p.name}", gpu)
            row = f"| {gpu} | {p.name} | {p.memory_gib:.2f} | {p.instances_per_gpu} | {cell(bf16)} | {cell(fp8)} |"
            assert row in readme, f"k8s/README.md, GPU sharing: expected the row {row}"


def test_lab_models_resolve_to_their_published_config():
    from helpers.planning.shape import REFERENCE_CONFIGS

    assert gs.lab_model_source("Qwen/Qwen3-4B") == (REFERENCE_CONFIGS / "Qwen3-4B.json", None)
    assert gs.lab_model_source("RedHatAI/Qwen3-4B-FP8-dynamic") == (REFERENCE_CONFIGS / "Qwen3-4B.json", "fp8")
    config = {"model_type": "qwen3"}
    assert gs.lab_model_source(config) == (config, None)  # not a name: as it is


def test_workshop_gpu_share_prints_verdicts_costs_and_the_lessons_note(capsys):
    from helpers.cli.main import main

    assert main(["gpu-share", "--gpu-type", "h100", "--participants", "30"]) == 0
    lines = capsys.readouterr().out.splitlines()
    verdicts = [line for line in lines if not line.startswith("  ")]
    assert len(verdicts) == len(mig_profiles("H100 SXM")) and verdicts[0].startswith("no: Qwen3-4B (bf16 weights)")
    assert all("per participant" in line for line in lines if line.startswith("  "))
    assert main(["gpu-share", "--gpu-type", "h100", "--gpu-share", "time-slicing:4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("yes: Qwen3-4B (bf16 weights) on 1/4 of a time-sliced H100 SXM") and "WHOLE GPU" in out
    assert main(["gpu-share", "--gpu-type", "l4", "--gpu-share", "mig-1g.10gb"]) == 2
    assert "no MIG profiles known for L4" in capsys.readouterr().err


def test_the_whole_gpu_slice_changes_nothing_for_the_lessons():
    assert gs.whole_gpu_lessons_note("mig-7g.80gb", "H100 SXM").startswith("A MIG 7g.80gb slice is the whole H100 SXM")
