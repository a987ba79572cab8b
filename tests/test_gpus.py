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


def test_every_price_row_has_a_source_and_a_date_and_the_api_rows_cached_below_fresh():
    from helpers.core.errors import WorkshopError
    from helpers.hardware.gpus import API_PRICES, HOURLY_PRICES, api_price, hourly_price, profile_hourly_price

    assert all(p.source and p.date for p in HOURLY_PRICES)
    for p in API_PRICES:
        assert p.source and p.date and 0 < p.usd_per_m_cached_input < p.usd_per_m_input < p.usd_per_m_output
    assert api_price("GPT-4.1 mini").usd_per_m_output == 1.60
    assert profile_hourly_price("cpu") == hourly_price("2-vCPU VM")
    assert profile_hourly_price("k8s") == hourly_price("H100 SXM")
    with pytest.raises(WorkshopError, match="pass your own prices"):
        api_price("gpt-9")
    with pytest.raises(LookupError, match="pass your own price"):
        hourly_price("TPU v5e")
