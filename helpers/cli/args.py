"""Checks for the ``workshop`` command's arguments, shared by every subcommand (no engine, no network).

``number_type`` is an argparse ``type=`` that refuses what a subcommand cannot use (negative, zero, not
finite, out of range) with a one-line usage error; ``output_path_problem`` says before a run why a file
could not be written, so minutes of measurement do not end in a traceback; ``error`` prints the one line every
subcommand ends with when it refuses.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any


def error(message: str) -> int:
    """Print ``error: message`` on stderr; the exit code of a refused command (2, as argparse's usage errors)."""
    print(f"error: {message}", file=sys.stderr)
    return 2


def checked_number(text: str, kind: type = int, minimum: float | None = 1, maximum: float | None = None,
                   above: bool = False) -> Any:
    """``text`` as a finite ``kind`` (int or float) >= ``minimum`` (> with ``above``) and <= ``maximum``;
    ValueError saying what is needed (an int also reads ``2e9``)."""
    try:
        value = kind(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if kind is not int or not number.is_integer():
            raise ValueError(f"needs a {'whole ' if kind is int else ''}number (got {text!r})") from None
        value = int(number)
    if not math.isfinite(value):
        raise ValueError(f"needs a finite number (got {text!r})")
    low = minimum is not None and (value <= minimum if above else value < minimum)
    if low or (maximum is not None and value > maximum):
        bounds = ([f"{'>' if above else '>='} {minimum:g}"] if minimum is not None else []) + \
                 ([f"<= {maximum:g}"] if maximum is not None else [])
        raise ValueError(f"must be {' and '.join(bounds)} (got {text!r})")
    return value


def number_type(kind: type = int, minimum: float | None = 1, maximum: float | None = None,
                above: bool = False) -> Any:
    """An argparse ``type=`` for ``checked_number``: a bad value is a one-line usage error naming the flag."""
    def parse(text: str) -> Any:
        try:
            return checked_number(text, kind, minimum, maximum, above)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    parse.__name__ = kind.__name__
    return parse


def output_path_problem(flag: str, path: str | None) -> str | None:
    """Why ``path`` cannot take a file ``flag`` writes (a directory, or under a file), or None: checked
    before a run, so that minutes of measurement do not end in a traceback."""
    if path is None:
        return None
    target = Path(path)
    if target.is_dir():
        return f"{flag} {path} is a directory: give the path of a file (inside it, say)"
    for parent in target.parents:
        if parent.exists():
            if not parent.is_dir():
                return f"{flag} {path}: {parent} is a file, not a directory"
            break
    return None
