"""The one base of the errors the helpers raise for a person to read: each says what went wrong and what to do.

Every such error class derives from ``WorkshopError`` and from the built-in kind it is (``ValueError`` for bad
input, ``RuntimeError`` for a step that failed), so code that catches the built-in kind keeps working, and the
``workshop`` command prints any ``WorkshopError`` as one ``error: ...`` line instead of a traceback.
"""

from __future__ import annotations


class WorkshopError(Exception):
    """An error whose message is meant for the learner or the instructor, and says what to do next."""
