"""One request's life (issue 27 part 4, the timeline of issue 28): built from a stream's timing and the server's
metrics around it, or from a trace's rows; the intervals line up with the chunks; the picture draws them."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from helpers.measure import request_life as rl  # noqa: E402
from helpers.measure.server_metrics import parse_metrics, window  # noqa: E402
from helpers.measure.stream_timing import StreamTiming  # noqa: E402

# One request as the server saw it (s): 40 ms in the front end, 10 queued, 200 prefilling, 600 decoding 31 more
# tokens, 10 on the way out; the client receives each token 5 ms after the server made it.
QUEUE, PREFILL, DECODE, TTFT, E2E, NET = 0.010, 0.200, 0.600, 0.250, 0.860, 0.005
FAMILIES = {"request_queue_time_seconds": QUEUE, "request_prefill_time_seconds": PREFILL,
            "request_decode_time_seconds": DECODE, "time_to_first_token_seconds": TTFT,
            "e2e_request_latency_seconds": E2E}


def exposition(requests: int, earlier: float = 0.0) -> str:
    """A /metrics text holding ``requests`` observations of each family (each the values above) plus ``earlier``
    seconds of requests before them, in one bucket."""
    lines = []
    for name, value in FAMILIES.items():
        total = earlier + requests * value
        count = requests + (1 if earlier else 0)
        lines += [f"# HELP vllm:{name} x", f"# TYPE vllm:{name} histogram",
                  f'vllm:{name}_bucket{{le="10.0",model_name="m"}} {count}',
                  f'vllm:{name}_bucket{{le="+Inf",model_name="m"}} {count}',
                  f'vllm:{name}_sum{{model_name="m"}} {total}', f'vllm:{name}_count{{model_name="m"}} {count}']
    return "\n".join(lines) + "\n"


def served(requests: int = 1) -> dict:
    """The kit's own window over a scrape before (one earlier request) and after ``requests`` more."""
    return window(parse_metrics(exposition(0, earlier=3.0), model="m"),
                  parse_metrics(exposition(requests, earlier=3.0), model="m"))


def streamed(tokens: int = 32, sent: float = 1000.0) -> StreamTiming:
    """The client's side of the same request: the first token NET after the server's TTFT, then one a step."""
    timing = StreamTiming(t_sent=sent)
    step = DECODE / (tokens - 1)
    for i in range(tokens):
        timing.record_chunk(sent + TTFT + NET + i * step, i + 1, content="x")
    timing.t_done = sent + E2E + NET
    return timing


def test_the_server_phases_come_from_one_requests_histograms_in_the_kits_window():
    phases = {s.name: (round(s.start_s, 6), round(s.end_s, 6)) for s in rl.server_phases(served())}
    assert phases == {"arrival": (0.0, 0.04), "queue": (0.04, 0.05), "prefill": (0.05, 0.25),
                      "decode": (0.25, 0.85), "return": (0.85, 0.86)}


def test_queue_and_prefill_end_near_the_first_chunk_and_decode_near_the_last():
    life = rl.from_stream(streamed(), served())
    lined = rl.alignment(life)
    assert lined["first_chunk_after_prefill_ms"] == pytest.approx(NET * 1000)
    assert lined["last_chunk_after_decode_ms"] == pytest.approx(NET * 1000)
    assert lined["queue_plus_prefill_ms"] == pytest.approx((QUEUE + PREFILL) * 1000)
    assert lined["client_ttft_ms"] == pytest.approx((TTFT + NET) * 1000)
    assert life.lanes() == ["server", "client"] and len(life.chunk_s) == 32 and life.chunk_tokens == (1,) * 32


def test_without_the_servers_ttft_the_queue_starts_at_the_send():
    window_ = {k: v for k, v in served().items() if not k.startswith(("ttft", "e2e"))}
    life = rl.from_stream(streamed(), window_)
    assert [s.name for s in life.spans] == ["queue", "prefill", "decode", "request"]
    assert rl.alignment(life)["first_chunk_after_prefill_ms"] == pytest.approx((TTFT - QUEUE - PREFILL + NET) * 1000)
    assert "queue first" in life.notes[0]


def test_a_window_of_two_requests_or_without_vllms_phases_or_a_stream_without_tokens_is_refused():
    with pytest.raises(rl.RequestLifeError, match="hold 2 requests for queue_time, not one"):
        rl.server_phases(served(requests=2))
    with pytest.raises(rl.RequestLifeError, match="lack vLLM's per-request queue"):
        rl.server_phases({"ttft_count": 1, "ttft_mean_s": 0.2})
    with pytest.raises(rl.RequestLifeError, match="streamed no token"):
        rl.from_stream(StreamTiming(t_sent=0.0, error="ConnectError: refused"), served())


def test_a_traces_rows_feed_the_same_picture():
    """Rows as a trace's timeline gives them (issue 28): the agent, its LLM call, vLLM's phases, a tool."""
    rows = [{"lane": "agent", "name": "invoke_agent", "start_s": 0.0, "end_s": 1.2},
            {"lane": "llm", "name": "chat m", "start_s": 0.01, "end_s": 0.9},
            {"lane": "vllm", "name": "vLLM queue", "start_s": 0.05, "end_s": 0.06},
            {"lane": "vllm", "name": "vLLM prefill", "start_s": 0.06, "end_s": 0.26},
            {"lane": "vllm", "name": "vLLM decode", "start_s": 0.26, "end_s": 0.86},
            {"lane": "tool", "name": "execute_tool get_weather", "start_s": 0.91, "end_s": 0.95}]
    life = rl.from_rows(rows, chunk_s=[0.265, 0.5, 0.865], chunk_tokens=[1, 2, 1])
    assert life.lanes() == ["agent", "llm", "vllm", "tool"]
    assert rl.alignment(life)["first_chunk_after_prefill_ms"] == pytest.approx(5.0)
    trace_only = rl.from_rows(rows)
    assert trace_only.chunk_s == () and rl.alignment(trace_only)["first_chunk_after_prefill_ms"] is None
    with pytest.raises(rl.RequestLifeError, match="row 0 needs lane, name, start_s and end_s"):
        rl.from_rows([{"lane": "agent", "start_s": 0}])
    with pytest.raises(rl.RequestLifeError, match="ends before it starts"):
        rl.from_rows([{"lane": "a", "name": "b", "start_s": 1.0, "end_s": 0.5}])
    with pytest.raises(rl.RequestLifeError, match="3 chunk times but 2 token counts"):
        rl.from_rows(rows, chunk_s=[0.1, 0.2, 0.3], chunk_tokens=[1, 1])


def test_the_picture_draws_every_span_in_its_lane_and_every_chunk():
    life = rl.from_stream(streamed(tokens=8), served())
    fig = rl.plot_request_life(life, title="tiny-agent: one request")
    ax = fig.axes[0]
    bars = [p for p in ax.patches]
    assert len(bars) == len(life.spans) == 6  # arrival, queue, prefill, decode, return; the client's request
    assert [t.get_text() for t in ax.get_yticklabels()] == ["server", "client", "chunks"]
    prefill = next(c for c in ax.containers if c.get_label() == "prefill").patches[0]
    assert prefill.get_x() == pytest.approx(50.0) and prefill.get_width() == pytest.approx(200.0)  # ms
    [ticks] = ax.collections
    assert [round(x, 3) for x in sorted(seg[0][0] for seg in ticks.get_segments())] == [round(t * 1000, 3) for t in life.chunk_s]
    assert ax.get_title() == "tiny-agent: one request" and "placed from the send" in ax.get_xlabel()
    plt.close(fig)
