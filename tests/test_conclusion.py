"""The conclusion type every notebook prints: its verdict tag and its plural."""

from helpers.core.conclusion import NOT_SHOWN, SHOWN, Conclusion, plural, report


def test_printed_form_carries_verdict_and_expectation():
    assert str(Conclusion("a note")) == "- a note"
    assert str(Conclusion("TTFT 10 -> 90 ms", SHOWN, "TTFT grows")) == "- [shown] TTFT grows: TTFT 10 -> 90 ms"
    assert str(Conclusion("no stall", NOT_SHOWN)) == "- [not shown] no stall"


def test_report_flattens_lists_and_skips_none():
    text = report(Conclusion("one"), [Conclusion("two", SHOWN)], None, "three")
    assert text.splitlines() == ["- one", "- [shown] two", "- three"]


def test_plural():
    assert plural(1, "conversation") == "1 conversation"
    assert plural(0, "conversation") == "0 conversations"
    assert plural(12345, "token") == "12,345 tokens"
    assert plural(2.0, "run") == "2 runs"
