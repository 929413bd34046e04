"""Rows of nccl-tests tables: the public :class:`Row`, and the checks every row goes through.

A row is first read into a :class:`Draft` that keeps, for every number, half of the last digit it
was printed with (:class:`Value`): nccl-tests rounds time and bandwidths independently, so whether
busbw equals algbw times the bus factor, or algbw equals size/time, can only be judged within that
rounding. :func:`check_rows` does so, and also flags wrong results and element counts that do not
match size, type and ranks.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from collsim.dtypes import DTYPE_BYTES, canonical_dtype
from collsim.errors import CollsimError
from collsim.metrics import ROUNDED_TO_RANKS, bus_factor

LEGACY_ERROR_LIMIT = {"half": 1e-2, "bfloat16": 1e-2, "float": 1e-5, "double": 1e-12}
"""nccl-tests' ``DeltaMaxValue``: the largest ``error`` the legacy layout accepts (integers: 0)."""


def _type(printed: str) -> str | None:
    """The canonical name of a type a table prints (nccl-tests for NCCL 1 printed ``char`` and
    ``int``), or None for one collsim does not know (its rows' counts are then not checked)."""
    try:
        return canonical_dtype(printed)
    except CollsimError:
        return None


@dataclass(frozen=True)
class Row:
    """One size of one nccl-tests table. ``None`` where the log has no value (``N/A``, no in-place).

    ``oop_wrong``/``ip_wrong`` hold ``#wrong`` (a count of wrong elements) in the current layout
    and the maximum deviation in the legacy ``error`` layout (see ``NcclTestsLog.layout``).
    """

    size_bytes: int
    count: int
    dtype: str
    redop: str | None
    root: int | None
    oop_time_us: float | None
    oop_algbw_gbps: float | None
    oop_busbw_gbps: float | None
    oop_wrong: float | None
    ip_time_us: float | None = None
    ip_algbw_gbps: float | None = None
    ip_busbw_gbps: float | None = None
    ip_wrong: float | None = None
    line: int = 0

    @property
    def time_us(self) -> float | None:
        """The out-of-place time, or the in-place one where only that was measured."""
        return self.oop_time_us if self.oop_time_us is not None else self.ip_time_us

    @property
    def busbw_gbps(self) -> float | None:
        """The busbw belonging to :attr:`time_us`."""
        return self.oop_busbw_gbps if self.oop_time_us is not None else self.ip_busbw_gbps

    @property
    def has_in_place(self) -> bool:
        return self.ip_time_us is not None


@dataclass
class Value:
    """A number as printed, with half its last printed digit (the rounding it carries)."""

    value: float | None
    half_unit: float = 0.0

    @classmethod
    def parse(cls, token: str | None, *, exact: bool = False) -> Value:
        if token is None or token == "N/A" or token == "nan":
            return cls(None)
        match = re.match(r"^[-+]?\d*(?:\.(\d*))?(?:[eE]([-+]?\d+))?$", token)
        if not match:
            raise ValueError(token)
        value = float(token)
        if not math.isfinite(value):  # 1e999: not a measurement
            raise ValueError(token)
        if exact:
            return cls(value, 5e-7)
        decimals = len(match.group(1) or "")
        exponent = int(match.group(2) or 0)
        try:
            return cls(value, 0.5 * 10.0 ** (exponent - decimals))
        except OverflowError:  # 0E310
            raise ValueError(token) from None


@dataclass
class Group:
    """One (out-of-place or in-place) result of a row, with its printing precision."""

    time: Value
    algbw: Value
    busbw: Value
    wrong: Value


@dataclass
class Draft:
    """A row before checks: values plus the precision they were printed with."""

    line: int
    size: int
    count: int
    dtype: str
    redop: str | None
    root: int | None
    groups: list[Group | None] = field(default_factory=list)

    def row(self) -> Row:
        oop, ip = [*self.groups, None, None][:2]

        def values(g: Group | None) -> list[float | None]:
            if g is None:
                return [None, None, None, None]
            return [g.time.value, g.algbw.value, g.busbw.value, g.wrong.value]

        return Row(
            self.size,
            self.count,
            self.dtype,
            self.redop,
            self.root,
            *values(oop),
            *values(ip),
            line=self.line,
        )


@dataclass(frozen=True)
class RankEvidence:
    """The rank counts a table's printed numbers allow, ``low`` to ``high`` (None: no upper
    bound), and which numbers say so (``element counts`` or ``busbw/algbw ratio``)."""

    low: int
    high: int | None
    source: str

    @property
    def exact(self) -> int | None:
        """The one rank count the numbers allow, or None where they allow several."""
        return self.low if self.high == self.low else None

    def allows(self, ranks: int) -> bool:
        return self.low <= ranks and (self.high is None or ranks <= self.high)

    def describe(self) -> str:
        if self.high is None:
            return f"{self.low} or more"
        return str(self.low) if self.high == self.low else f"{self.low} to {self.high}"


def _fits(collective: str, n: int, g: Group) -> bool:
    """Whether busbw = algbw x the bus factor for ``n`` ranks, within print rounding."""
    a, b = g.algbw, g.busbw
    f = bus_factor(collective, n)
    return abs(b.value - a.value * f) <= b.half_unit + f * a.half_unit + 1e-9  # type: ignore[operator]


def _ratio_bounds(collective: str, g: Group) -> tuple[int, int | None] | None:
    """The rank counts one result's busbw/algbw allows (None: it allows any)."""
    a, b = g.algbw, g.busbw
    if a.value is None or b.value is None or a.value <= a.half_unit:
        return None  # algbw 0.00: busbw says nothing
    top = 2.0 if collective == "all_reduce" else 1.0  # the factor's limit as n grows

    def ranks_at(factor: float) -> float:  # the inverse of top x (n-1)/n
        return 1.0 if factor <= 0 else math.inf if factor >= top else top / (top - factor)

    f_low = (b.value - b.half_unit) / (a.value + a.half_unit)
    f_high = (b.value + b.half_unit) / (a.value - a.half_unit)
    low = max(1, math.ceil(ranks_at(f_low) - 1e-6))
    far = ranks_at(f_high)
    high = None if math.isinf(far) or far > 10**7 else math.floor(far + 1e-6)
    while (high is None or low <= high) and not _fits(collective, low, g):
        low += 1  # the float inverse may land one off: the exact check decides the ends
        if low > 10**7:
            return None
    while high is not None and high >= low and not _fits(collective, high, g):
        high -= 1
    return low, high


def ranks_from_numbers(collective: str, drafts: list[Draft]) -> RankEvidence | None:
    """The rank counts a table's numbers allow: exact from element counts where nccl-tests
    prints per-rank counts (all_gather, reduce_scatter, alltoall) and every row agrees, else the
    counts busbw = algbw x nccl-tests' factor allows on every row (2(n-1)/n for all_reduce,
    (n-1)/n for the rest; the factor flattens as n grows, so large counts come as a range).
    None where the numbers say nothing (broadcast, reduce and sendrecv print busbw = algbw) or
    the rows disagree with each other."""
    if collective in ROUNDED_TO_RANKS:
        found = set()
        for d in drafts:
            elem = DTYPE_BYTES.get(_type(d.dtype) or "")
            if elem and d.count > 0 and d.size % (d.count * elem) == 0:
                found.add(d.size // (d.count * elem))
        if len(found) == 1:
            n = found.pop()
            return RankEvidence(n, n, "element counts")
    if collective not in ("all_reduce", "all_gather", "reduce_scatter", "alltoall"):
        return None  # busbw = algbw whatever the rank count
    low, high, seen = 1, None, False
    for d in drafts:
        for g in d.groups:
            bounds = _ratio_bounds(collective, g) if g is not None else None
            if bounds is None:
                continue
            seen = True
            low = max(low, bounds[0])
            if bounds[1] is not None:
                high = bounds[1] if high is None else min(high, bounds[1])
    if not seen or (high is not None and low > high):
        return None
    return RankEvidence(low, high, "busbw/algbw ratio")


def infer_ranks(collective: str, drafts: list[Draft]) -> tuple[int | None, str]:
    """Ranks from the printed numbers (see :func:`ranks_from_numbers`); where they allow several
    counts, the smallest, and the source says so."""
    evidence = ranks_from_numbers(collective, drafts)
    if evidence is None:
        return None, ""
    if evidence.exact is not None:
        return evidence.exact, evidence.source
    return evidence.low, f"{evidence.source} (which allows {evidence.describe()})"


def check_rows(collective: str, ranks: int, drafts: Iterable[Draft], legacy: bool) -> list[str]:
    """Anomalies of the rows: wrong results and numbers inconsistent with each other."""
    factor = bus_factor(collective, ranks)
    out: list[str] = []
    for d in drafts:
        where = f"line {d.line}, size {d.size}" if d.line else f"size {d.size}"
        elem = DTYPE_BYTES.get(_type(d.dtype) or "")
        if elem:
            expect = d.size // elem // (ranks if collective in ROUNDED_TO_RANKS else 1)
            if d.count != expect:
                out.append(
                    f"{where}: count {d.count}, but {d.size} B of {d.dtype} on {ranks} "
                    f"ranks is {expect} elements"
                )
        for label, g in zip(("out-of-place", "in-place"), d.groups, strict=False):
            if g is None:
                continue
            t, a, b, w = g.time, g.algbw, g.busbw, g.wrong
            if w.value is not None:
                limit = LEGACY_ERROR_LIMIT.get(_type(d.dtype) or "", 0.0) if legacy else 0.0
                if w.value > limit:
                    what = "max error" if legacy else "#wrong"
                    out.append(f"{where} {label}: {what} = {w.value:g} (results are wrong)")
            if t.value is not None and (t.value < 0 or (t.value == 0 and d.size > 0)):
                out.append(f"{where} {label}: time {t.value:g} us (a measured time is positive)")
                continue
            if t.value is None or a.value is None or b.value is None:
                continue
            if d.size > 0 and t.value > 0:
                expect_a = d.size / t.value / 1e3
                tol = a.half_unit + expect_a * t.half_unit / t.value * 1.01 + 1e-9
                if abs(a.value - expect_a) > tol:
                    out.append(
                        f"{where} {label}: algbw {a.value:g} GB/s, but size/time gives "
                        f"{expect_a:.4g}"
                    )
            if abs(b.value - a.value * factor) > b.half_unit + factor * a.half_unit + 1e-9:
                out.append(
                    f"{where} {label}: busbw {b.value:g} is not algbw {a.value:g} x "
                    f"{factor:.4g} (nccl-tests' factor for {ranks} ranks)"
                )
    return out
