"""Every weight format the planner knows has a native-hardware row with a source."""

from helpers.memory import WEIGHT_FORMATS
from helpers.quant_formats import NATIVE_HARDWARE


def test_every_weight_format_has_hardware_and_a_source():
    assert set(NATIVE_HARDWARE) == set(WEIGHT_FORMATS)
    for hardware, source in NATIVE_HARDWARE.values():
        assert hardware and len(source) > 10
