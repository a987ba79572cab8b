"""KV-cache conclusions: one request's blocks, prefix caching cold vs warm, an agent's cache hits, and reusing
a prefix's KV from a tier of the memory hierarchy or from this machine's RAM and files."""

import pandas as pd
import pytest

from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE
from helpers.hardware.gpus import get_gpu
from helpers.lessons.l03.kv_cache import (conclude_agent_cache, conclude_kv_peak, conclude_machine_reuse,
                                          conclude_prefix_cache, conclude_tiers, expected_blocks)
from helpers.planning import kv_reuse
from helpers.planning.shape import REFERENCE_CONFIGS


def test_peak_within_the_request_blocks_is_shown():
    assert expected_blocks(3800, 128) == 30
    peak, freed = conclude_kv_peak(3800, 128, 1001, 29 / 1000, 0.0)
    assert peak.verdict == SHOWN and "missed the last 1 block" in peak.text and freed.verdict == SHOWN


def test_peak_above_the_request_or_left_over_is_not_shown():
    peak, freed = conclude_kv_peak(3800, 128, 1001, 40 / 1000, 0.01)
    assert peak.verdict == NOT_SHOWN and "another request" in peak.text and freed.verdict == NOT_SHOWN


def prefix(cold, warm):
    rows = [{"round": i, "cache": c, "prompt_tokens": 2100, "ttft_ms": t, "ok": True}
            for i, (a, b) in enumerate(zip(cold, warm)) for c, t in (("cold", a), ("warm", b))]
    return pd.DataFrame(rows)


def test_prefix_cache_verdicts_follow_the_numbers():
    assert conclude_prefix_cache(prefix([900, 950, 920], [100, 110, 105]), 2048, 0.7).verdict == SHOWN
    assert conclude_prefix_cache(prefix([300, 500, 400], [400, 350, 420]), 2048, 0.7).verdict == WITHIN_NOISE
    slower = conclude_prefix_cache(prefix([100, 105, 100], [900, 950, 920]), 2048, 0.0)
    assert slower.verdict == NOT_SHOWN and "enable-prefix-caching" in slower.text


def test_agent_cache():
    assert conclude_agent_cache(0.8, 5000, 6).verdict == SHOWN
    assert conclude_agent_cache(0.0, 5000, 6).verdict == NOT_SHOWN


def test_a_noisy_saving_says_the_run_cannot_tell():
    c = conclude_prefix_cache(prefix([400, 5000, 700], [400, 420, 410]), 2048, 0.5)
    assert c.verdict == WITHIN_NOISE and "this run cannot tell" in c.text
    flat = conclude_prefix_cache(prefix([300, 500, 400], [400, 350, 420]), 2048, 0.5)
    assert "no saving beyond the run-to-run spread" in flat.text


def _break_rows(cold, warm, broken, prompt_tokens=300):
    return pd.DataFrame([{"request": name, "prompt_tokens": prompt_tokens, "cached_tokens": hits, "ttft_ms": 10.0}
                         for name, hits in (("cold", cold), ("warm (same prefix)", warm),
                                            ("one token changed at 5", broken))])


def test_break_the_cache_conclusion_both_ways():
    from helpers.lessons.l03.kv_cache import conclude_break_cache

    broken = conclude_break_cache(_break_rows(0, 256, 0), block_size=128)
    assert broken.verdict == SHOWN and "none of it" in broken.text
    partly = conclude_break_cache(_break_rows(0, 256, 128), block_size=128)
    assert partly.verdict == SHOWN and "only the 1 block(s) of 128" in partly.text
    late = conclude_break_cache(_break_rows(0, 256, 256), block_size=128)
    assert late.verdict == NOT_SHOWN and "after the last full block" in late.text
    off = conclude_break_cache(_break_rows(0, 0, 0), block_size=128)
    assert off.verdict == NOT_SHOWN and "--enable-prefix-caching" in off.text


def test_the_middle_change_outcome_goes_every_way():
    from helpers.lessons.l03.kv_cache import middle_change_outcome

    part, detail = middle_change_outcome(_break_rows(0, 512, 256), block_size=128)
    assert part == "part of it" and detail.startswith("256 cached prompt tokens against 512")
    assert middle_change_outcome(_break_rows(0, 512, 0), block_size=128)[0] == "none"
    assert middle_change_outcome(_break_rows(0, 512, 512), block_size=128)[0] == "all of it"


def test_break_the_cache_refuses_a_position_outside_the_prefix():
    from helpers.lessons.l03.kv_cache import measure_break_cache

    with pytest.raises(ValueError, match="inside the prefix"):
        measure_break_cache(None, 10, 10)


# ---------------------------------------------------------------- hierarchical reuse: load against recompute

LLAMA = kv_reuse.prefix_model(REFERENCE_CONFIGS / "Llama-3.1-8B.json")
A100 = get_gpu("A100 80GB SXM")


def test_tier_conclusion_both_ways():
    fast = kv_reuse.tier_verdicts(LLAMA, A100.peak_flops(), 0.5, kv_reuse.DGX_A100_TIERS, 4096)
    assert conclude_tiers("DGX A100", fast, 4096, 0.5).verdict == SHOWN
    slow = kv_reuse.tier_verdicts(LLAMA, A100.peak_flops(), 0.5, [kv_reuse.Tier("slow", 0.5, "test")], 64)
    concluded = conclude_tiers("DGX A100", slow, 64, 0.5)
    assert concluded.verdict == NOT_SHOWN and "wins only from" in concluded.text


def test_machine_reuse_is_judged_both_ways():
    table = pd.DataFrame({"prompt_tokens": [64, 1024], "kv_MB": [0.13, 2.1], "recompute_ttft_ms": [30.0, 200.0]})
    shown = conclude_machine_reuse(table.assign(read_from_RAM_ms=0.1, read_from_file_ms=0.2))
    assert shown.verdict == SHOWN and "1,024 prompt tokens" in shown.text
    slow = conclude_machine_reuse(table.assign(read_from_RAM_ms=0.1, read_from_file_ms=[50.0, 500.0]))
    assert slow.verdict == NOT_SHOWN and "[64, 1024]" in slow.text
    assert conclude_machine_reuse(table.iloc[:0]).verdict == NOT_SHOWN


# ---------------------------------------------------------------------------------------------
# The paged KV cache's picture, from synthetic streams

def _picture_streams():
    from helpers.lessons.l03.pictures import BlockStream

    early = BlockStream("early request", t_sent=0.0, t_first_token=0.5, t_done=10.0, prompt_tokens=10,
                        token_times=[0.5 + 0.1 * i for i in range(30)], token_ids=list(range(100, 140)))
    late = BlockStream("late request", t_sent=2.0, t_first_token=2.2, t_done=3.0, prompt_tokens=6,
                       token_times=[2.2 + 0.1 * i for i in range(8)], token_ids=None)  # the server gave no ids
    return [early, late]


def test_the_paged_view_fills_each_requests_blocks_and_hashes_the_full_ones():
    from helpers.lessons.l03.pictures import FREED, HELD, NOT_YET, PREFILL, paged_view
    from helpers.lessons.l03.prefix_hash import block_hashes, short

    moments = {"alone": 1.95, "both": 2.55, "late ended": 3.5, "before": -1.0}
    view = paged_view(_picture_streams(), 8, moments)
    alone = view[(view.moment == "alone") & (view.request == "early request")]
    # 10 prompt tokens + 15 arrived by t = 1.95 (0.5, 0.6, ... 1.9): 25 tokens, blocks of 8, 8, 8, 1
    assert alone["tokens"].tolist() == [8, 8, 8, 1] and alone["full"].tolist() == [True, True, True, False]
    chain = block_hashes(list(range(100, 140)), 8)
    assert alone["hash"].tolist() == [short(h) for h in chain[:3]] + [""]
    assert view[(view.moment == "alone") & (view.request == "late request")]["state"].tolist() == [NOT_YET]
    both = view[(view.moment == "both") & (view.request == "late request")]
    assert both["tokens"].tolist() == [8, 2] and both["hash"].tolist() == ["", ""]  # 6 + 4 tokens, no ids: no hash
    assert (both["state"] == HELD).all()
    assert view[(view.moment == "late ended") & (view.request == "late request")]["state"].tolist() == [FREED]
    assert view[(view.moment == "before")]["block"].tolist() == [-1, -1]
    prefilling = paged_view(_picture_streams(), 8, {"prefill": 2.1})
    assert prefilling[prefilling.request == "late request"][["state", "tokens"]].values.tolist() == [[PREFILL, 6]]


def test_the_pool_gauge_is_read_at_the_nearest_sample():
    from helpers.lessons.l03.pictures import pool_used

    gauges = pd.DataFrame({"t": [0.0, 1.0, 2.0], "kv_cache_usage": [0.0, 0.5, float("nan")]})
    assert pool_used(gauges, {"a": 0.9, "b": 1.9}, 11) == {"a": (5, pytest.approx(0.1)), "b": (5, pytest.approx(-0.9))}
    assert pool_used(gauges.iloc[:0], {"a": 1.0}, 11) == {"a": None}


def test_the_paged_kv_picture_draws_every_block_and_says_what_vllm_does_not_report():
    import matplotlib

    matplotlib.use("Agg")
    from helpers.lessons.l03.pictures import paged_view, plot_paged_kv

    view = paged_view(_picture_streams(), 8, {"alone": 1.95, "both": 2.55, "late ended": 3.5})
    fig = plot_paged_kv(view, 8, {"alone": (4, -0.05), "both": (6, 0.02), "late ended": None})
    assert len(fig.axes) == 3
    texts = [t.get_text() for ax in fig.axes for t in ax.texts] + [t.get_text() for t in fig.texts]
    assert "2/8" in texts and any("freed" in t for t in texts)
    assert any("not which physical block" in t for t in texts)
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert titles[0] == "alone, t = 1.9 s: 4 blocks held (the pool's gauge -0.05 s from then: 4 used)"
    assert titles[2].endswith("blocks held")  # no gauge sample: none named
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_the_join_gives_the_picture_its_streams_and_moments():
    from helpers.lessons.l03 import batching
    from helpers.measure.stream_timing import StreamTiming

    early = StreamTiming(t_sent=0.0, t_first_token=0.2, chunk_times=[0.2, 0.3, 0.4, 0.5], chunk_tokens=[1, 1, 2, 1],
                         prompt_tokens=3, completion_tokens=5, t_done=0.6)
    late = StreamTiming(t_sent=0.25, t_first_token=0.3, chunk_times=[0.3, 0.35], chunk_tokens=[1, 1], prompt_tokens=2,
                        completion_tokens=2, t_done=0.4)
    joined = batching.JoinResult(early, late, pd.DataFrame(), None, early_ids=list(range(8)), late_ids=[1, 2, 3])
    first, second = batching.join_streams(joined)
    assert first.token_ids == list(range(8)) and first.token_times == [0.2, 0.3, 0.4, 0.4, 0.5]
    assert second.token_ids is None  # 3 ids for 4 tokens counted: not the server's whole request, so no hashes
    moments = batching.join_moments(joined)
    assert list(moments) == ["the early request alone", "both decoding", "the late request ended",
                             "the early request's last token"]
    assert moments["the early request alone"] < 0.25 and moments["both decoding"] == pytest.approx(0.35)
    assert moments["the late request ended"] == pytest.approx(0.45) and moments["the early request's last token"] == 0.5
