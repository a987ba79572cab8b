"""Local package indexes for install tests: PEP 503 simple pages over small wheels that carry only metadata.

They stand in for PyPI and for PyTorch's CPU index (which do not answer from the test machines), so a test can
watch pip's resolver choose between a CUDA torch and a +cpu one without downloading anything.
"""

from __future__ import annotations

import html
import re
import urllib.parse
import zipfile
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class FakeDist:
    """One distribution: name, version (local labels allowed: ``2.13.0+cpu``) and its Requires-Dist lines."""

    name: str
    version: str
    requires: tuple[str, ...] = field(default=())


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def write_wheel(dist: FakeDist, folder: Path) -> Path:
    """A pure-Python wheel with only its metadata (``py3-none-any``), written into ``folder``."""
    stem = re.sub(r"[-_.]+", "_", dist.name).lower()
    info = f"{stem}-{dist.version}.dist-info"
    metadata = "".join([f"Metadata-Version: 2.1\nName: {dist.name}\nVersion: {dist.version}\n",
                        *(f"Requires-Dist: {line}\n" for line in dist.requires)])
    files = {f"{info}/METADATA": metadata,
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: fake_index\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    path = folder / f"{stem}-{dist.version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return path


def write_index(root: Path, dists: list[FakeDist]) -> str:
    """A simple index of ``dists`` under ``root``; its URL (``file://.../simple``) for ``--index-url``."""
    files = root / "files"
    files.mkdir(parents=True, exist_ok=True)
    by_project: dict[str, list[Path]] = {}
    for dist in dists:
        by_project.setdefault(_canonical(dist.name), []).append(write_wheel(dist, files))
    simple = root / "simple"
    simple.mkdir(exist_ok=True)
    links = "".join(f'<a href="{p}/">{p}</a>\n' for p in sorted(by_project))
    (simple / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    for project, wheels in by_project.items():
        (simple / project).mkdir(exist_ok=True)
        anchors = "".join(f'<a href="../../files/{urllib.parse.quote(w.name)}">{html.escape(w.name)}</a>\n'
                          for w in wheels)
        (simple / project / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{anchors}</body></html>\n")
    return simple.resolve().as_uri()
