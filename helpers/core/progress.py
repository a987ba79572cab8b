"""Progress for anything that can keep a notebook cell busy for more than a few seconds.

A ``tqdm.auto`` bar: a widget in JupyterLab, a text bar in a terminal, and in a headless run (nbclient,
``workshop run``) a display whose text the executed notebook keeps, which ``notebooks.silent_long_cells``
looks for. ``progress=None`` means "in a notebook kernel only", so tests and scripts stay quiet unless asked.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")


def in_notebook() -> bool:
    """True inside a Jupyter kernel (JupyterLab, nbclient), where a bar renders as a widget."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def wanted(progress: bool | None) -> bool:
    """``progress`` as given, or, for None, whether this runs in a notebook kernel."""
    return in_notebook() if progress is None else bool(progress)


class _NoBar:
    """What ``bar`` yields when no progress is wanted: the calls a bar takes, doing nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        pass


@contextmanager
def bar(total: int | None, desc: str, unit: str = "run", progress: bool | None = None) -> Iterator[Any]:
    """A tqdm.auto bar of ``total`` steps (closed on exit, kept on screen), or a do-nothing stand-in."""
    if not wanted(progress):
        yield _NoBar()
        return
    from tqdm.auto import tqdm

    shown = tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True)
    try:
        yield shown
    finally:
        shown.close()


def steps(items: Iterable[T], desc: str, unit: str = "run", progress: bool | None = None,
          label: Any = None) -> Iterator[T]:
    """Each item of ``items`` in turn, with a bar; ``label(item)`` names the step being run beside the bar."""
    items = list(items)
    with bar(len(items), desc, unit, progress) as shown:
        for item in items:
            if label is not None:
                shown.set_postfix_str(str(label(item)))
            yield item
            shown.update(1)
