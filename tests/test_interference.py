"""The prefill-stall conclusions, fed made-up stream timings that go each way."""

from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE
from helpers.lessons.l03.interference import StallResult, conclude_stall
from helpers.measure.stream_timing import StreamTiming


def stall_run(steady_s=0.02, stall_s=1.0, prefill_s=1.0, prompt_tokens=3500):
    """Two streams ticking every ``steady_s``; one gap of ``stall_s`` while a prefill of ``prefill_s`` runs at t=1 s."""
    streams = []
    for _ in range(2):
        t = StreamTiming(t_sent=0.0)
        now, n = 0.1, 0
        while now < 1.0:
            n += 1
            t.record_chunk(now, n, "x")
            now += steady_s
        now = 1.0 + max(stall_s, steady_s)
        for _ in range(10):
            n += 1
            t.record_chunk(now, n, "x")
            now += steady_s
        streams.append(t)
    long = StreamTiming(t_sent=1.0, prompt_tokens=prompt_tokens)
    long.record_chunk(1.0 + prefill_s, 1, "y")
    return StallResult(streams, long, 1.0, 1.0 + prefill_s)


def test_the_expected_story_is_shown():
    runs = {"default": [stall_run(stall_s=1.0, prefill_s=1.0), stall_run(stall_s=1.05, prefill_s=1.02)],
            "chunked 256": [stall_run(stall_s=0.2, prefill_s=1.5), stall_run(stall_s=0.21, prefill_s=1.55)]}
    default, chunked, shorter, longer = conclude_stall(runs)
    assert default.verdict == SHOWN and chunked.verdict == SHOWN
    assert shorter.verdict == SHOWN and longer.verdict == SHOWN


def test_the_conclusions_compare_two_chunk_sizes_never_chunking_against_none():
    # vLLM chunks every prefill above its budget (2,048 on the CPU build): both runs chunk the 3,500-token prompt
    runs = {"max-num-batched-tokens 2048 (default)": [stall_run(stall_s=1.0, prefill_s=1.0)],
            "max-num-batched-tokens 256": [stall_run(stall_s=0.2, prefill_s=1.5)]}
    *_, shorter, longer = conclude_stall(runs)
    assert shorter.expectation == "a smaller prefill chunk shortens the longest stall"
    assert longer.expectation == "a smaller prefill chunk makes the long request's own TTFT longer"
    assert "(max-num-batched-tokens 2048 (default)) vs" in shorter.text
    assert "(max-num-batched-tokens 256)" in shorter.text
    printed = " ".join(f"{c.expectation} {c.text}" for c in conclude_stall(runs)).lower()
    assert "without chunk" not in printed and "chunked prefill" not in printed


def test_the_engines_default_budget_is_named_by_its_tokens_where_it_is_known():
    from helpers.core.settings import load_settings
    from helpers.lessons.l03.interference import budget_name

    local = load_settings({})
    assert budget_name(None, local) == "max-num-batched-tokens 2048 (default)"  # vllm/engine/arg_utils.py, CPU
    assert budget_name(256, local) == "max-num-batched-tokens 256"
    elsewhere = load_settings({"VLLM_HOST": "http://127.0.0.1:1/v1"})
    assert budget_name(None, elsewhere) == "max-num-batched-tokens default"  # its hardware decides


def test_chunked_prefill_that_finishes_sooner_is_not_shown_with_the_rates():
    # the busy-machine run of the issue: the long prompt's TTFT 7,978 -> 3,941 ms
    runs = {"default": [stall_run(stall_s=8.0, prefill_s=7.978), stall_run(stall_s=7.9, prefill_s=7.9)],
            "chunked 256": [stall_run(stall_s=0.3, prefill_s=3.941), stall_run(stall_s=0.3, prefill_s=3.9)]}
    *_, longer = conclude_stall(runs, quiet=False)
    assert longer.verdict == NOT_SHOWN
    assert "7,939 ms (default) vs 3,920 ms (chunked 256)" in longer.text and "prompt tokens/s" in longer.text
    assert "the machine was busy" in longer.text


def test_no_stall_and_no_difference():
    runs = {"default": [stall_run(stall_s=0.02, prefill_s=0.02)], "chunked 256": [stall_run(stall_s=0.02, prefill_s=0.02)]}
    default, _, shorter, longer = conclude_stall(runs)
    assert default.verdict == NOT_SHOWN and "hardly noticed" in default.text
    assert shorter.verdict == WITHIN_NOISE and longer.verdict == WITHIN_NOISE


def test_no_steady_gap_says_so_instead_of_nan():
    quiet_run = stall_run()
    quiet_run.streams[0].chunk_times, quiet_run.streams[1].chunk_times = [], []
    default, *_ = conclude_stall({"default": [quiet_run], "chunked": [stall_run()]})
    assert default.verdict == NOT_SHOWN and "nan" not in default.text


def test_one_measured_budget_says_chunking_was_not_compared():
    conclusions = conclude_stall({"max-num-batched-tokens default": [stall_run()]})
    assert conclusions[0].verdict == SHOWN and len(conclusions) == 2
    assert conclusions[1].text.startswith("a second chunk size was not compared: only one --max-num-batched-tokens "
                                          "was measured")


def test_an_endpoint_run_elsewhere_is_measured_on_its_own_budget_only(monkeypatch, capsys):
    from types import SimpleNamespace

    from helpers.lessons.l03 import interference
    from helpers.engine.interface import ExternalEngine
    from helpers.core.settings import load_settings

    settings = load_settings({"VLLM_HOST": "http://127.0.0.1:1/v1"})
    lab = SimpleNamespace(settings=settings, engine=ExternalEngine(settings))
    measured = []
    monkeypatch.setattr(interference, "measure_prefill_stall", lambda *a, **k: measured.append(1) or stall_run())
    runs = interference.measure_stall_configs(lab, {"default": None, "chunked 256": 256}, 2, 100)
    assert list(runs) == ["default"] and len(measured) == 1  # no restart was attempted (it would raise)
    assert "measuring only default: http://127.0.0.1:1/v1 is run elsewhere" in capsys.readouterr().out
