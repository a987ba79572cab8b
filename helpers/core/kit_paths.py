"""Where the kit's folders are, in a clone and in an installed wheel: the one place that locates them.

In a clone (``pip install -e .``, ``make lab``) the package sits beside ``notebooks/``, ``k8s/`` and ``models/``,
and those folders are used as they are. A wheel (``pip install .``, ``pip install git+URL``) carries copies of
them inside the package, under ``helpers/kit/`` (pyproject.toml, ``[tool.setuptools.package-dir]``). What the
commands write by default (``my-notebooks/``, ``build/``) goes into the clone, or into the current folder when
the helpers run from a wheel: never into site-packages.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # helpers/: its data/ ships in every install
KIT_FOLDERS = ("notebooks", "k8s", "models")  # beside helpers/ in a clone; in a wheel under helpers/kit/
SHIPPED_KIT = PACKAGE_DIR / "kit"  # a wheel's copies of KIT_FOLDERS


def checkout_root() -> Path | None:
    """The clone the helpers run from (pyproject.toml beside helpers/), or None when they run from a wheel."""
    root = PACKAGE_DIR.parent
    return root if (root / "pyproject.toml").is_file() else None


def kit_root() -> Path:
    """The folder holding notebooks/, k8s/ and models/: the clone, else helpers/kit/ in the installed package."""
    return checkout_root() or SHIPPED_KIT


def kit_dir(name: str) -> Path:
    """One of the kit's folders (``notebooks``, ``k8s``, ``models``), where this install has it."""
    if name not in KIT_FOLDERS:
        raise ValueError(f"no kit folder {name!r}: one of {', '.join(KIT_FOLDERS)}")
    return kit_root() / name


def package_path(*parts: str) -> Path:
    """A file or folder inside the helpers package (``data/...``), there in every install."""
    return PACKAGE_DIR.joinpath(*parts)


def work_root() -> Path:
    """Where commands write by default (my-notebooks/, build/): the clone, else the current folder (a relative path)."""
    return checkout_root() or Path()


def missing_kit_message(name: str, looked_in: Path) -> str:
    """One line for a kit folder this install lacks: where it was looked for, and how to get an install that has it."""
    return (f"this install of the helpers has no {name}/ folder (looked in {looked_in}): install them from the "
            "workshop's repository (pip install . in a clone, or pip install git+URL), or work in a clone (make lab)")
