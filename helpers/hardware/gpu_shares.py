"""MIG profiles of the 80 GB A100 and H100: the share of memory and SMs each slice gets, with its source.

Fractions are the tables of NVIDIA's Multi-Instance GPU User Guide, "Supported MIG Profiles"
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html, v580, read December 2026):
the H100 80GB table (PCIe and SXM5) gives every profile below; for the A100 the guide prints the A100-SXM4-40GB
table and says the 80GB product's profiles are the same slices renamed by their memory (1g.10gb, 1g.20gb,
2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb). A slice of ``g`` compute slices gets g/7 of the SMs.

Memory: what the driver reports for the slice (``nvidia-smi mig -lgip``, GiB) where a public output was read,
else the memory fraction of the whole GPU's reported total (an upper bound: the driver keeps a little back,
e.g. 9.75 GiB for 1/8 of the H100's 79.65 GiB).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from helpers.core.errors import WorkshopError
from helpers.hardware.gpus import get_gpu

MIG_GUIDE = ("NVIDIA Multi-Instance GPU User Guide, Supported MIG Profiles "
             "(docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html, v580)")
_H100_LGIP = ("nvidia-smi mig -lgip on H100 SXM5 80GB (GiB): stackhpc/ansible-slurm-appliance docs/mig.md "
              "(1g.10gb 9.75, 1g.20gb 19.62, 2g.20gb 19.62, 3g.40gb 39.50, 4g.40gb 39.50, 7g.80gb 79.25)")


@dataclass(frozen=True)
class MigProfile:
    """One MIG slice of one GPU: its share of memory and SMs, how many fit on the GPU, and sources."""

    gpu: str  # a name of helpers.hardware.gpus.GPUS
    name: str  # e.g. "1g.10gb"
    memory_fraction: Fraction
    sm_fraction: Fraction
    instances_per_gpu: int  # the guide's "Number of Instances Available"
    source: str
    reported_memory_gib: float | None = None  # nvidia-smi mig -lgip; None: not read
    reported_memory_source: str = ""
    note: str = ""

    @property
    def memory_bytes(self) -> int:
        """The slice's memory in bytes: the driver's figure when known, else the fraction of the GPU's total."""
        if self.reported_memory_gib is not None:
            return int(self.reported_memory_gib * 2**30)
        return int(get_gpu(self.gpu).usable_memory_bytes * self.memory_fraction)

    @property
    def memory_gib(self) -> float:
        """``memory_bytes`` in GiB."""
        return self.memory_bytes / 2**30

    @property
    def resource_name(self) -> str:
        """The Kubernetes extended resource of NVIDIA's device plugin ('mixed' MIG strategy)."""
        return f"nvidia.com/mig-{self.name}"


def _profiles(gpu: str, rows: tuple[tuple[str, str, str, int, float | None], ...], source: str,
              reported_source: str = "", notes: dict[str, str] | None = None) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(gpu, name, Fraction(mem), Fraction(sm), n, source, reported,
                            reported_source if reported is not None else "", (notes or {}).get(name, ""))
                 for name, mem, sm, n, reported in rows)


# (profile, fraction of memory, fraction of SMs, instances per GPU, nvidia-smi GiB or None), as the guide prints them.
_H100_ROWS = (("1g.10gb", "1/8", "1/7", 7, 9.75), ("1g.20gb", "1/4", "1/7", 4, 19.62),
              ("2g.20gb", "2/8", "2/7", 3, 19.62), ("3g.40gb", "4/8", "3/7", 2, 39.50),
              ("4g.40gb", "4/8", "4/7", 1, 39.50), ("7g.80gb", "1", "7/7", 1, 79.25))
_A100_ROWS = (("1g.10gb", "1/8", "1/7", 7, None), ("1g.20gb", "2/8", "1/7", 4, None),
              ("2g.20gb", "2/8", "2/7", 3, None), ("3g.40gb", "4/8", "3/7", 2, None),
              ("4g.40gb", "4/8", "4/7", 1, None), ("7g.80gb", "1", "7/7", 1, None))
_A100_NOTE = {"1g.20gb": "the guide's A100 table prints 1/8 for this slice (named 1g.10gb on the 40GB product) "
                         "although its name says twice the 1g.10gb memory; 2/8 follows the name and the H100 table"}

MIG_PROFILES: tuple[MigProfile, ...] = (
    _profiles("H100 SXM", _H100_ROWS, f"{MIG_GUIDE}: H100 80GB table", _H100_LGIP)
    + _profiles("H100 PCIe", tuple((*r[:4], None) for r in _H100_ROWS), f"{MIG_GUIDE}: H100 80GB table")
    + _profiles("A100 80GB SXM", _A100_ROWS, f"{MIG_GUIDE}: A100 table, 80GB names", notes=_A100_NOTE)
)


class UnknownMigProfileError(WorkshopError, LookupError):
    """Raised for a GPU without MIG profiles in the table, or a profile that GPU does not have."""


def mig_profiles(gpu: str) -> list[MigProfile]:
    """The MIG profiles of ``gpu`` (a name of the GPU table, e.g. "H100 SXM"), smallest first."""
    name = get_gpu(gpu).name
    return [p for p in MIG_PROFILES if p.gpu == name]


def get_mig_profile(gpu: str, profile: str) -> MigProfile:
    """The MIG profile ``profile`` (e.g. "1g.10gb", "mig-1g.10gb") of ``gpu``."""
    wanted = profile.lower().removeprefix("mig-")
    known = mig_profiles(gpu)
    for p in known:
        if p.name == wanted:
            return p
    if not known:
        with_mig = sorted({p.gpu for p in MIG_PROFILES})
        raise UnknownMigProfileError(f"no MIG profiles known for {get_gpu(gpu).name}: the table has "
                                     f"{', '.join(with_mig)}; use --gpu-share time-slicing:N or none")
    raise UnknownMigProfileError(f"{get_gpu(gpu).name} has no MIG profile {profile!r}: use one of "
                                 f"{', '.join('mig-' + p.name for p in known)}")
