import pytest

from planner.errors import InputError
from planner.inputs.units import parse_bandwidth_bytes_per_s, parse_bytes, parse_flops, parse_seconds


def test_human_units_become_si():
    assert parse_bytes("80GB", field="m") == 80e9
    assert parse_bytes("16GiB", field="m") == 16 * 2**30
    assert parse_bandwidth_bytes_per_s("1.12Gbps", field="b") == pytest.approx(1.12e9 / 8)
    assert parse_bandwidth_bytes_per_s("12.5GB/s", field="b") == 12.5e9
    assert parse_seconds("67ms", field="l") == pytest.approx(0.067)
    assert parse_seconds(0, field="l") == 0.0
    assert parse_flops("312TFLOPS", field="f") == 312e12


@pytest.mark.parametrize("parser, value, fragment", [
    (parse_bytes, "80gb", "did you mean 'GB'"), (parse_bandwidth_bytes_per_s, "1.12", "has no unit"),
    (parse_bandwidth_bytes_per_s, 1.12, "has no unit"), (parse_bandwidth_bytes_per_s, "-5Gbps", "cannot read"),
    (parse_bandwidth_bytes_per_s, "0Gbps", "greater than zero"), (parse_bytes, "fast", "cannot read"),
    (parse_bandwidth_bytes_per_s, "10Gbs", "unknown unit"), (parse_bytes, True, "expected"),
    (parse_bandwidth_bytes_per_s, "10GB", "unknown unit"),
])
def test_bad_quantities_name_field_and_fix(parser, value, fragment):
    with pytest.raises(InputError) as info:
        parser(value, field="network.region.bandwidth")
    assert "network.region.bandwidth" in str(info.value)
    assert fragment in str(info.value)
