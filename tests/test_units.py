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
    (parse_bandwidth_bytes_per_s, 1.12, "has no unit"),
    (parse_bandwidth_bytes_per_s, "-5Gbps", "is negative: give a value greater than zero"),
    (parse_bandwidth_bytes_per_s, "0Gbps", "greater than zero"), (parse_bytes, "fast", "cannot read"),
    (parse_bandwidth_bytes_per_s, "10Gbs", "unknown unit"), (parse_bytes, True, "expected"),
    (parse_bandwidth_bytes_per_s, "10GB", "unknown unit"),
    (parse_bandwidth_bytes_per_s, "10Gb/s", "did you mean 'Gbps'"),
    (parse_bandwidth_bytes_per_s, "100Mbit", "did you mean 'Mbps'"),
    (parse_bandwidth_bytes_per_s, "10GBps", "did you mean 'GB/s'"),
    (parse_bandwidth_bytes_per_s, "10GBPS", "'Gbps' for bits, 'GB/s' for bytes"),
    (parse_bandwidth_bytes_per_s, "1e-300bps", "lies outside 1 kbit/s to 8 Ebit/s"),
    (parse_bandwidth_bytes_per_s, "1e300Gbps", "lies outside"),
    (parse_bytes, "1e30GB", "lies outside 1 B to 1 EB"),
    (parse_flops, "1e-30FLOPS", "lies outside"),
    (parse_seconds, "1e9s", "lies outside 0 s to 1 hour"),
])
def test_bad_quantities_name_field_and_fix(parser, value, fragment):
    with pytest.raises(InputError) as info:
        parser(value, field="network.region.bandwidth")
    assert "network.region.bandwidth" in str(info.value)
    assert fragment in str(info.value)


@pytest.mark.parametrize("prefix", ["k", "M", "G", "T"])
@pytest.mark.parametrize("spelling", ["b/s", "bit", "bits/s", "b"])
def test_a_bit_rate_is_never_hinted_as_a_byte_rate(prefix, spelling):
    """``10Gb/s`` means bits: hinting ``GB/s`` would make the link 8x faster than meant."""
    with pytest.raises(InputError) as info:
        parse_bandwidth_bytes_per_s(f"10{prefix}{spelling}", field="network.region.bandwidth")
    assert f"did you mean '{prefix}bps'" in str(info.value) and "B/s'?" not in str(info.value)
