"""Units: nccl-tests sizes (1024-based K/M/G), SI GB, bit vs byte rates, times."""

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collsim import units
from collsim.errors import UnitError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8", 8),
        (8, 8),
        ("1K", 1024),
        ("8G", 8 * 1024**3),
        ("128M", 128 * 1024**2),
        ("1GiB", 1024**3),
        ("1GB", 10**9),
        ("2 KiB", 2048),
        ("1.5K", 1536),
        ("16B", 16),
    ],
)
def test_parse_size(text, expected):
    assert units.parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("400Gbps", 50e9),
        ("400 Gb/s", 50e9),
        ("50GB/s", 50e9),
        ("25 GBps", 25e9),
        ("3.35TB/s", 3.35e12),
        ("100Mbps", 12.5e6),
        (0, 0.0),
    ],
)
def test_parse_rate(text, expected):
    assert units.parse_rate(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("bare", [400, "400", 400.0, " 400 "])
def test_a_bare_rate_is_refused_with_both_readings(bare):
    """A bare 400 was GB/s, 8x the 400 Gb/s a NIC datasheet means by it: the error gives both."""
    with pytest.raises(UnitError) as info:
        units.parse_rate(bare)
    assert info.value.message == "400 has no unit: write 400GB/s (3200 Gbps) or 400Gbps (50 GB/s)"


def test_a_bare_size_or_time_needs_a_unit_only_where_required():
    """Bare sizes stay bytes and bare times microseconds (nccl-tests' -b 8, the CLI), but where
    a unit is required (topology files) they are refused with the readings; zero needs none."""
    assert units.parse_size("80") == 80
    assert units.parse_time(7) == pytest.approx(7e-6)
    with pytest.raises(UnitError, match=r"^80 has no unit: write 80GiB \(85.9 GB\), 80GB or 80B$"):
        units.parse_size(80, unit_required=True)
    with pytest.raises(UnitError, match=r"^100 has no unit: write 100us or 100ns \(0.1 us\)$"):
        units.parse_time("100", unit_required=True)
    assert units.parse_size("80GiB", unit_required=True) == 80 * 2**30
    assert units.parse_time("130ns", unit_required=True) == pytest.approx(130e-9)
    assert units.parse_time(0, unit_required=True) == 0.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [("5us", 5e-6), ("1.2ms", 1.2e-3), ("300ns", 3e-7), ("2s", 2.0), ("7", 7e-6), ("1µs", 1e-6)],
)
def test_parse_time(text, expected):
    assert units.parse_time(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("bad", ["8X", "abc", "", "1..2K", "-5K", "1.5B"])
def test_bad_sizes_quote_the_text(bad):
    with pytest.raises(UnitError) as info:
        units.parse_size(bad)
    assert repr(bad) in str(info.value) or "whole number" in str(info.value)


@pytest.mark.parametrize("bad", ["400Gbit", "fast", "50 GB", "12 furlongs/s"])
def test_bad_rates_quote_the_text(bad):
    with pytest.raises(UnitError) as info:
        units.parse_rate(bad)
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("bad", ["5 minutes", "us", "1h"])
def test_bad_times_quote_the_text(bad):
    with pytest.raises(UnitError) as info:
        units.parse_time(bad)
    assert repr(bad) in str(info.value)


@given(st.integers(min_value=0, max_value=2**50), st.sampled_from(["", "K", "M", "G"]))
def test_size_roundtrip_with_suffixes(n, suffix):
    scale = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[suffix]
    if n * scale > units.MAX_SIZE_BYTES:
        with pytest.raises(UnitError, match="too large"):
            units.parse_size(f"{n}{suffix}")
    else:
        assert units.parse_size(f"{n}{suffix}") == n * scale


@given(st.floats(min_value=1e-3, max_value=1e6, allow_nan=False))
def test_bits_are_an_eighth_of_bytes(x):
    assert units.parse_rate(f"{x!r}Gbps") * 8 == pytest.approx(units.parse_rate(f"{x!r}GB/s"))


@given(st.text(max_size=12))
def test_parsers_never_crash(text):
    for parse in (units.parse_size, units.parse_rate, units.parse_time):
        with contextlib.suppress(UnitError):
            parse(text)


def test_format_helpers():
    assert units.format_size(1024**2) == "1M"
    assert units.format_size(1536) == "1.5K"
    assert units.format_rate(450e9) == "450 GB/s"
    assert units.format_rate_si(4e14) == "400 TB/s"
    assert units.format_rate_si(12.5e9) == "12.5 GB/s"
    assert units.format_rate_si(1e-291) == "1e-291 B/s"
    assert units.format_time(2.1e-3) == "2.1 ms"
    assert units.to_gbps(50e9) == 50.0
    assert units.to_us(1.5e-6) == pytest.approx(1.5)


def test_size_range_like_nccl_tests():
    assert units.size_range(8, 128, 2) == [8, 16, 32, 64, 128]
    assert units.size_range(8, 8, 2) == [8]
    with pytest.raises(UnitError, match="larger than"):
        units.size_range(1024, 8, 2)


def test_a_size_past_a_pebibyte_is_refused():
    """1e19 bytes overflowed int64 into a traceback (simulate, sweeps); 1e18 printed a time of
    7.7e12 us. No buffer, memory or checkpoint is larger than 1 PiB."""
    assert units.parse_size(f"{2**40}K") == 2**50
    for text in ("1e19", f"{2**40 + 1}K", "1e30"):
        with pytest.raises(UnitError, match="too large"):
            units.parse_size(text)
