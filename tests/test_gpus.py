"""The GPU table: datasheet capacity in GB, the driver's total in MiB, each with its source."""

import pytest

from helpers.hardware.gpus import GPUS, get_gpu


def test_an_80gb_h100_reports_about_79_6_gib():
    h100 = get_gpu("H100 SXM")
    assert h100.memory_bytes == 80 * 10**9
    assert h100.usable_memory_gib == pytest.approx(79.65, abs=0.01)


def test_every_gpu_states_its_reported_memory_with_a_source():
    for gpu in GPUS:
        assert gpu.usable_memory_mib, gpu.name
        assert "nvidia-smi" in gpu.usable_memory_source, gpu.name
        # the driver's total is within 8% of the datasheet's capacity (GB or GiB alike)
        assert 0.92 < gpu.usable_memory_bytes / gpu.memory_bytes < 1.08, gpu.name
