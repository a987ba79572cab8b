"""Tables as a participant reads them: whole numbers as whole numbers, missing values as "-".

pandas shows a float column as ``12.000000`` and a gap as ``NaN``. ``format_value`` writes one cell the way
the notebooks mean it (``12``, ``16,192``, ``0.25``, ``-``); ``format_tables()`` makes every DataFrame a
notebook shows use it, through IPython's display formatters (HTML and plain text alike), so no notebook
formats its tables by hand. ``helpers.engine.session.connect()`` calls it; a notebook that shows tables before it
connects calls it itself.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import pandas as pd

MISSING = "-"
MAX_ROWS = 60  # rows a table shows before it is cut (pandas' own default)


def is_missing(value: Any) -> bool:
    """True for None, NaN, pd.NA and NaT (a list or other container is never missing)."""
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # a list, an array: pd.isna answers per element
        return False


def format_value(value: Any, decimals: int = 2) -> str:
    """One table cell as text: missing -> "-", a whole number -> "16,192", a float -> ``decimals`` places
    ("0.25"; three significant digits below 1, "0.00341"), a bool -> "True"; anything else -> str()."""
    if is_missing(value):
        return MISSING
    if isinstance(value, (bool, pd.Timestamp, pd.Timedelta)) or not isinstance(value, numbers.Real):
        return str(value)
    number = float(value)
    if math.isinf(number):
        return "inf" if number > 0 else "-inf"
    if number.is_integer() and abs(number) < 1e15:
        return f"{int(number):,}"
    if abs(number) < 1:
        return f"{number:.3g}"
    return f"{number:,.{decimals}f}"


def formatted(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` with every cell and index label as ``format_value`` text."""
    out = frame.map(format_value)
    if not isinstance(frame.index, pd.MultiIndex):  # a MultiIndex keeps its levels as they are
        out.index = pd.Index([format_value(v) for v in frame.index], name=frame.index.name)
    return out


def _shown(frame: pd.DataFrame, max_rows: int) -> tuple[pd.DataFrame, str]:
    if len(frame) <= max_rows:
        return frame, ""
    return frame.head(max_rows), f"the first {max_rows:,} of {len(frame):,} rows"


def to_html(frame: pd.DataFrame, max_rows: int = MAX_ROWS) -> str:
    """The HTML of a table with its cells formatted (text in cells escaped: a model's ``<tool_call>`` shows)."""
    shown, caption = _shown(frame, max_rows)
    styler = shown.style.format(format_value, escape="html").format_index(format_value, escape="html", axis=0)
    if caption:
        styler = styler.set_caption(caption)
    return styler.to_html()


def to_text(frame: pd.DataFrame | pd.Series, max_rows: int = MAX_ROWS) -> str:
    """The plain text of a table (or a Series) with its cells formatted, for a terminal or a text-only output."""
    as_frame = frame.to_frame() if isinstance(frame, pd.Series) else frame
    shown, caption = _shown(as_frame, max_rows)
    text = formatted(shown).to_string(header=not isinstance(frame, pd.Series) or frame.name is not None)
    return text + (f"\n({caption})" if caption else "")


def format_tables(shell: Any = None) -> bool:
    """Make IPython show every DataFrame (and Series as text) formatted; True when installed, False outside
    IPython. Calling it again changes nothing."""
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        shell = get_ipython()
    if shell is None:
        return False
    formatters = shell.display_formatter.formatters
    formatters["text/html"].for_type(pd.DataFrame, to_html)
    formatters["text/plain"].for_type(pd.DataFrame, lambda frame, printer, cycle: printer.text(to_text(frame)))
    formatters["text/plain"].for_type(pd.Series, lambda series, printer, cycle: printer.text(to_text(series)))
    return True
