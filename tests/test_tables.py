"""Tables show whole numbers as whole numbers and gaps as "-", in HTML and in text, once installed in IPython."""

import math

import numpy as np
import pandas as pd
import pytest

from helpers.core.tables import MISSING, format_tables, format_value, to_html, to_text


@pytest.mark.parametrize("value, shown", [
    (12.0, "12"), (np.float64(16192.0), "16,192"), (np.int64(3), "3"), (7, "7"), (-4.0, "-4"),
    (0.25, "0.25"), (12.3456, "12.35"), (0.0034123, "0.00341"), (1234.5, "1,234.50"),
    (None, MISSING), (float("nan"), MISSING), (np.nan, MISSING), (pd.NA, MISSING), (pd.NaT, MISSING),
    (True, "True"), (np.bool_(False), "False"), ("bf16", "bf16"), (math.inf, "inf"), ([1, 2], "[1, 2]"),
])
def test_a_cell_is_written_as_meant(value, shown):
    assert format_value(value) == shown


def test_a_float_that_is_not_whole_keeps_its_decimals():
    assert format_value(12.001) == "12.00" and format_value(12.0) == "12"
    assert format_value(2.5, decimals=1) == "2.5"


def _frame() -> pd.DataFrame:
    return pd.DataFrame({"tokens": [16192.0, np.nan], "gib": [1.5, 2.0], "text": ["<tool_call>", None]},
                        index=pd.Index([1.0, 2.0], name="step"))


def test_html_and_text_show_integers_and_dashes_never_nan_or_dot_zero():
    html, text = to_html(_frame()), to_text(_frame())
    for out in (html, text):
        assert "16,192" in out and "NaN" not in out and "None" not in out and "16192.0" not in out
        assert "1.50" in out
    assert "&lt;tool_call&gt;" in html, "text from a model must be escaped, not read as a tag"
    assert "<tool_call>" in text
    assert "2.00" not in text and "\n2 " in text, "a whole-number value and index label lose their '.0'"


def test_a_long_table_is_cut_and_says_so():
    frame = pd.DataFrame({"x": range(100)})
    assert "the first 10 of 100 rows" in to_text(frame, max_rows=10)
    assert "the first 10 of 100 rows" in to_html(frame, max_rows=10)
    assert "99" not in to_text(frame, max_rows=10).split("\n")[-2]


def test_a_series_prints_formatted():
    text = to_text(pd.Series({"ttft_ms": 12.0, "gap": np.nan}, name="value"))
    assert "12" in text and "12.0" not in text and MISSING in text


def test_installed_in_ipython_the_display_uses_it_and_outside_nothing_happens():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        assert format_tables(shell) is True and format_tables(shell) is True  # twice is harmless
        data, _ = shell.display_formatter.format(_frame())
        assert "16,192" in data["text/html"] and "NaN" not in data["text/html"]
        assert "16,192" in data["text/plain"] and "NaN" not in data["text/plain"]
    finally:
        InteractiveShell.clear_instance()
    assert format_tables() is False  # no IPython shell running in pytest
