"""Parse and format sizes, rates and times: the only place in collsim where units convert.

Conventions (stated once, used everywhere):

* Sizes are integers of bytes. Bare numbers are bytes and the nccl-tests suffixes ``K``, ``M``,
  ``G``, ``T`` powers of 1024, exactly as nccl-tests reads ``-b 8 -e 8G``; ``KiB``/``MiB``/... are
  powers of 1024 too, while ``KB``/``MB``/``GB``/``TB`` are powers of 1000 (SI). Topology files
  require a unit (``unit_required``).
* Rates are floats of bytes per second internally. ``GB/s`` and ``GBps`` mean 1e9 bytes/s, as
  nccl-tests prints; ``Gbps``/``Gb/s`` mean 1e9 *bits*/s, as network datasheets print. A rate
  always needs its unit: a bare number could be either (8x apart).
  In names, ``_gbps`` means GB/s (1e9 bytes/s), matching nccl-tests' ``algbw``/``busbw``;
  bit rates are never stored.
* Times are floats of seconds internally; names carry ``_s`` or ``_us``. A bare number is
  microseconds on the command line; topology files require a unit.
"""

from __future__ import annotations

import math
import re

from collsim.errors import UnitError

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"
_PATTERN = re.compile(rf"^\s*{_NUMBER}\s*([A-Za-z/]*)\s*$")

_SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "B": 1,
    "k": 1024,
    "K": 1024,
    "M": 1024**2,
    "G": 1024**3,
    "T": 1024**4,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
    "kB": 1000,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
}

# Rate units in bytes per second.
_RATE_UNITS: dict[str, float] = {}
for _prefix, _scale in (("", 1.0), ("K", 1e3), ("k", 1e3), ("M", 1e6), ("G", 1e9), ("T", 1e12)):
    for _spelling in ("B/s", "Bps"):
        _RATE_UNITS[_prefix + _spelling] = _scale
    for _spelling in ("b/s", "bps", "bit/s"):
        _RATE_UNITS[_prefix + _spelling] = _scale / 8.0

_TIME_UNITS: dict[str, float] = {
    "s": 1.0,
    "ms": 1e-3,
    "us": 1e-6,
    "µs": 1e-6,
    "ns": 1e-9,
}

MAX_SIZES = 10_000
"""Most sizes one ``-b/-e/-f`` range may give (a factor of 1.0000001 would not fit in memory)."""

BYTES_PER_GB = 1e9
"""nccl-tests' GB: algbw and busbw are printed in units of 1e9 bytes per second."""


def _split(text: str | int | float, what: str) -> tuple[float, str]:
    if isinstance(text, bool):
        raise UnitError(f"expected a {what}, got {text!r}")
    if isinstance(text, int | float):
        value, unit = float(text), ""
    elif not isinstance(text, str):
        raise UnitError(f"expected a {what}, got {text!r}")
    else:
        match = _PATTERN.match(text.replace("µ", "u"))
        if not match:
            raise UnitError(f"malformed {what} {text!r}")
        value, unit = float(match.group(1)), match.group(2)
    if not math.isfinite(value):
        raise UnitError(f"{what} {text!r} is not a finite number")
    return value, unit


LINK_RATE_RANGE_BYTES_PER_S = (1e3, 1e13)
"""Physical range of one direction of one link (a topology's ``bandwidth``, a fault's ``rate``),
1 kB/s to 10 TB/s: outside it a figure is a slip of the unit (a ``400000GB/s`` meant as 400 Gb/s
is 400 TB/s; below, times overflow or print 300 digits). The fastest link today, NVLink 5,
carries 0.9 TB/s per direction per GPU (18 x 50 GB/s)."""
DUPLEX_RATE_RANGE_BYTES_PER_S = (1e3, 2e13)
"""Both directions of a link together, or a capacity several directions share
(``duplex_bandwidth``, ``shared``): twice :data:`LINK_RATE_RANGE_BYTES_PER_S`."""
MEMORY_RATE_RANGE_BYTES_PER_S = (1e9, 1e14)
"""A GPU's memory bandwidth: 1 GB/s to 100 TB/s (B200's HBM3e: 8 TB/s; a laptop GPU: 100 GB/s)."""
TIME_RANGE_S = (0.0, 10.0)
"""Physical range of a latency, 0 to 10 s (topologies, faults)."""

MAX_SIZE_BYTES = 2**50
"""1 PiB: no buffer, memory or checkpoint is larger; past 2^63 bytes sizes overflow int64."""

MAX_JOBS = 1024
"""The most local worker processes ``--jobs`` may ask for (a typo of 100000 would fork that
many before the first result)."""


def _no_unit(text: str | int | float, value: float, readings: str) -> UnitError:
    """The error for a bare number where a unit is required. ``readings`` (a format whose ``{n}``
    is the number as written) lists what the number could mean, so the user picks one instead of
    collsim guessing."""
    shown = text.strip() if isinstance(text, str) else f"{value:g}"
    return UnitError(f"{shown} has no unit: write {readings.format(n=shown)}")


def parse_size(text: str | int, *, unit_required: bool = False) -> int:
    """Bytes in ``text``: ``8``, ``1K`` (1024), ``8G`` (8 GiB), ``1GiB``, ``1GB`` (1e9).

    A bare number is bytes (as nccl-tests reads ``-b 8``); with ``unit_required`` (topology
    files, where ``memory: 80`` means 80 GB to its writer) it is an error naming the readings.
    """
    value, unit = _split(text, "size")
    if unit == "" and unit_required and value != 0:
        raise _no_unit(text, value, f"{{n}}GiB ({value * 2**30 / 1e9:.3g} GB), {{n}}GB or {{n}}B")
    if unit not in _SIZE_UNITS:
        raise UnitError(f"unknown size unit {unit!r} in {text!r} (use B, K, M, G, KiB, MB, ...)")
    size = value * _SIZE_UNITS[unit]
    if not math.isfinite(size) or size > MAX_SIZE_BYTES:
        raise UnitError(f"size {text!r} is too large (at most 1024T, 1 PiB)")
    if size != int(size):
        raise UnitError(f"size {text!r} is not a whole number of bytes")
    return int(size)


def parse_rate(text: str | int | float) -> float:
    """Bytes per second in ``text``: ``50GB/s``, ``25 GBps`` (x1e9 B/s), ``400Gbps`` (bits).

    A unit is required: a bare ``400`` is 400 GB/s to nccl-tests and 400 Gb/s (8x less) to a NIC
    datasheet, so it is an error that names both readings (zero, the same in every unit, is
    taken).
    """
    value, unit = _split(text, "rate")
    if unit == "" and value != 0:
        readings = f"{{n}}GB/s ({value * 8:g} Gbps) or {{n}}Gbps ({value / 8:g} GB/s)"
        raise _no_unit(text, value, readings)
    if unit not in _RATE_UNITS and unit != "":
        raise UnitError(f"unknown rate unit {unit!r} in {text!r} (use GB/s, GBps, Gbps, Gb/s, ...)")
    return value * _RATE_UNITS.get(unit, 1.0)


def parse_time(text: str | int | float, *, unit_required: bool = False) -> float:
    """Seconds in ``text``: ``5us``, ``1.2ms``, ``300ns``, ``2s``.

    A bare number is microseconds; with ``unit_required`` (topology files and faults, where a
    switch datasheet's ``100`` means nanoseconds) it is an error naming the readings. Zero needs
    no unit.
    """
    value, unit = _split(text, "time")
    if unit == "" and unit_required and value != 0:
        raise _no_unit(text, value, f"{{n}}us or {{n}}ns ({value / 1000:g} us)")
    if unit == "":
        return value * 1e-6
    if unit not in _TIME_UNITS:
        raise UnitError(f"unknown time unit {unit!r} in {text!r} (use s, ms, us, ns)")
    return value * _TIME_UNITS[unit]


def parse_flops(text: str | int | float) -> float:
    """FLOP/s in ``text``: ``989TFLOPS``, ``989 TFLOP/s``; a bare number is TFLOP/s."""
    if isinstance(text, str):
        match = re.match(rf"^\s*{_NUMBER}\s*([kMGTPE]?)FLOP(?:S|/s)\s*$", text)
        if not match:
            raise UnitError(f"malformed FLOP rate {text!r} (use e.g. 989TFLOPS)")
        scale = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
        return float(match.group(1)) * scale[match.group(2)]
    value, _ = _split(text, "FLOP rate")
    return value * 1e12


def format_size(size_bytes: int) -> str:
    """Short binary size: 1048576 -> '1M', 1536 -> '1.5K' (nccl-tests' K/M/G are 1024-based)."""
    value = float(size_bytes)
    for unit in ("", "K", "M", "G", "T"):
        if abs(value) < 1024 or unit == "T":
            text = f"{value:.0f}" if value == int(value) else f"{value:.3g}"
            return f"{text}{unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_rate(bytes_per_s: float) -> str:
    """'450 GB/s' (1e9 bytes/s) for a rate in bytes per second."""
    gbps = bytes_per_s / BYTES_PER_GB
    if gbps >= 1:
        return f"{gbps:.4g} GB/s"
    return f"{bytes_per_s / 1e6:.4g} MB/s"


def format_rate_si(bytes_per_s: float) -> str:
    """A rate in the largest SI unit that keeps it readable (an error message's reading of a
    figure, from far too slow to far too fast): '400 TB/s', '12.5 GB/s', '1e-291 B/s'."""
    for scale, unit in ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.4g} {unit}"
    return f"{bytes_per_s:.4g} B/s"


def format_time(seconds: float) -> str:
    """Human time: 1.5e-6 -> '1.5 us', 0.0021 -> '2.1 ms'."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-9:.4g} ns"


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(min|h|d)\s*$")
_DURATION_S = {"min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration_s(value: object) -> float:
    """Seconds in a duration: ``30s``, ``10min``, ``1.5h``, ``2d`` (and ``ms``/``us``/``ns``).

    A unit is required: a bare number would be microseconds in :func:`parse_time`."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            return float(match.group(1)) * _DURATION_S[match.group(2)]
        if re.search(r"[0-9]\s*(s|ms|us|µs|ns)\s*$", value):
            return parse_time(value)
    raise UnitError(f"malformed duration {value!r} (use a unit: 30s, 10min, 1.5h, 2d)")


def format_duration(seconds: float) -> str:
    """``'42 s'``, ``'12.5 min'``, ``'3.2 h'``, ``'4.1 d'`` (under 1 s: ``format_time``)."""
    for unit, scale in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= 2 * scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds:.3g} s" if seconds >= 1 else format_time(seconds)


def to_gbps(bytes_per_s: float) -> float:
    """GB/s (1e9 bytes/s) from bytes per second."""
    return bytes_per_s / BYTES_PER_GB


def to_us(seconds: float) -> float:
    """Microseconds from seconds."""
    return seconds * 1e6


def size_range(min_bytes: int, max_bytes: int, factor: float) -> list[int]:
    """Sizes from ``min_bytes`` to ``max_bytes``, times ``factor`` each step (as nccl-tests)."""
    if min_bytes < 0 or max_bytes < 0:
        raise UnitError(f"sizes must not be negative (got -b {min_bytes}, -e {max_bytes})")
    if min_bytes > max_bytes:
        raise UnitError(f"minimum size {min_bytes} is larger than maximum size {max_bytes}")
    if not math.isfinite(factor) or (factor <= 1 and min_bytes != max_bytes):
        raise UnitError(f"step factor must be a finite number > 1, got {factor}")
    if min_bytes > 0 and max_bytes > min_bytes:
        count = math.floor(math.log(max_bytes / min_bytes) / math.log(factor)) + 1
        if count > MAX_SIZES:
            raise UnitError(
                f"sizes {min_bytes}..{max_bytes} by factor {factor} are {count} sizes; "
                f"at most {MAX_SIZES} (use a larger factor)"
            )
    sizes = [min_bytes]
    while True:
        nxt = int(sizes[-1] * factor) if sizes[-1] > 0 else 1
        if nxt > max_bytes or nxt <= sizes[-1]:
            break
        sizes.append(nxt)
    return sizes
