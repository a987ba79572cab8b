"""The tiny models' weights against this CPU's last-level cache, computed rather than assumed (notebooks 04 and 05).

A decode step of the tiny models reads a few to a few tens of MB of weights: whether that stays in the CPU's
last-level cache depends on the machine (a laptop's L3 holds 8 to 36 MB, a server socket's tens to hundreds of MB).
``served_weight_bytes`` counts what the engine holds for a shipped model (its config.json's parameters, tied
embeddings once, 2 bytes each: vLLM serves them in BF16 on a CPU); ``last_level_cache`` reads this machine's
largest cache from Linux's sysfs; ``conclude_cache_fit`` says which fit and what that does and does not explain;
``engine_cache_fit`` is the notebook's call (a GPU's engine reads from the GPU's memory, and says so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.core.conclusion import Conclusion
from helpers.core.settings import models_dir
from helpers.planning.shape import REFERENCE_CONFIGS

SYSFS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")
BYTES_PER_WEIGHT = 2  # BF16, as the CPU profile serves the tiny models


@dataclass(frozen=True)
class Cache:
    """One CPU cache level: its size in bytes and where the figure came from."""

    level: int
    size_bytes: int
    source: str

    @property
    def label(self) -> str:
        return f"L{self.level}"


def model_config(name: str) -> Path:
    """Where ``name``'s config.json is read from here: a shipped model's directory, else the published config of a hub
    id (``helpers/data/configs/<name after the slash>.json``: the notebook pod has no copy of the room's weights)."""
    shipped = models_dir() / name
    if "/" not in name and shipped.is_dir():
        return shipped
    published = REFERENCE_CONFIGS / f"{name.rsplit('/', 1)[-1]}.json"
    if published.is_file():
        return published
    raise FileNotFoundError(f"no config for {name!r}: neither a model shipped in models/ nor a published config in "
                            f"{REFERENCE_CONFIGS} (add its config.json there to measure it)")


def served_weight_bytes(model_dir: Path | str) -> int:
    """Bytes of weights the engine holds for a model directory: its config.json's parameters (tied embeddings once)
    x ``BYTES_PER_WEIGHT``."""
    from helpers.planning.shape import count_params

    return count_params(Path(model_dir)).total * BYTES_PER_WEIGHT


def _size_bytes(text: str) -> int | None:
    text = text.strip().upper()
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    try:
        return int(float(text[:-1]) * units[text[-1]]) if text[-1:] in units else int(text)
    except (ValueError, IndexError):
        return None


def last_level_cache(root: Path = SYSFS_CACHE) -> Cache | None:
    """This machine's largest data or unified cache (``/sys/devices/system/cpu/cpu0/cache``); None where it is not
    readable (another OS, a sandbox)."""
    best: Cache | None = None
    for index in sorted(root.glob("index*")) if root.is_dir() else []:
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = _size_bytes((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind != "Instruction" and size and (best is None or level > best.level):
            best = Cache(level, size, str(index))
    return best


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def conclude_cache_fit(sizes: Mapping[str, int], cache: Cache | None) -> Conclusion:
    """Which of the models' weights (name -> bytes) fit ``cache``, in one sentence with the sizes; what follows for a
    decode step's time."""
    shown = ", ".join(f"{name} {_mb(size)}" for name, size in sizes.items())
    if cache is None:
        return Conclusion(f"Weights served: {shown}. This machine's cache sizes are not readable here, so whether a "
                          "step's weights stay in the CPU's last-level cache is not known.")
    fit = [name for name, size in sizes.items() if size <= cache.size_bytes]
    over = [name for name in sizes if name not in fit]
    where = f"this CPU's {cache.label} holds {cache.size_bytes / 2**20:.0f} MiB ({_mb(cache.size_bytes)})"
    if not over:
        verdict = ("all of them fit, so a step can read its weights from the cache rather than from memory, and the "
                   "measured memory bandwidth is not what bounds it")
    elif not fit:
        verdict = "none of them fits, so each step reads its weights from memory"
    else:
        verdict = (f"{', '.join(fit)} fit{'s' if len(fit) == 1 else ''} and {', '.join(over)} "
                   f"do{'es' if len(over) == 1 else ''} not: the two read their weights from different places")
    return Conclusion(f"Weights served: {shown}; {where}: {verdict}. A machine with a smaller cache (many laptops have "
                      "8 to 16 MB of L3) puts them elsewhere.")


def engine_cache_fit(lab: Any, models: Sequence[str | None]) -> Conclusion:
    """``conclude_cache_fit`` for the models of ``models`` (None: not served here, left out) where the engine runs on
    this machine's CPU (the cpu profile); on a GPU, the sentence that its weights are read from the GPU's memory."""
    sizes = {m: served_weight_bytes(model_config(m)) for m in models if m}
    if lab.settings.profile == "cpu":
        return conclude_cache_fit(sizes, last_level_cache())
    shown = ", ".join(f"{name} {size / 1e9:.1f} GB" for name, size in sizes.items())
    return Conclusion(f"The engine runs on a GPU ({lab.settings.profile} profile): a step reads the weights ({shown} in "
                      "BF16) from the GPU's memory, far more than any cache holds.")
