"""Writing nccl-tests-compatible tables, so measurements of our own read back like nccl-tests'.

The torch benchmark prints its results with these functions, and the result store renders its logs
with them; :func:`~collsim.calibration.nccltests.read_log` reads both. Numbers are formatted as
current nccl-tests does (``getFloatStr`` in its ``src/util.cu``: as many decimals as the column
width allows), so a row reads back with the same precision nccl-tests would have printed.
A measurement that does not exist (e.g. torch has no out-of-place all_reduce) prints as ``N/A``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from collsim.calibration.nccltests import Row
from collsim.dtypes import dtype_bytes
from collsim.metrics import algbw_gbps, busbw_gbps, canonical_collective
from collsim.whatif import element_count, printed_count

REDUCING = frozenset({"all_reduce", "reduce_scatter", "reduce"})
ROOTED = frozenset({"broadcast", "reduce"})


def float_str(value: float, width: int) -> str:
    """nccl-tests' ``getFloatStr``: fixed-point with as many decimals as ``width`` allows."""
    power = 0
    scale = 1
    while value >= scale:
        power += 1
        scale *= 10
    if power < width - 2:
        return f"{value:{width}.2f}"
    if power < width - 1:
        return f"{value:{width}.1f}"
    if power < width + 1:
        return f"{value:{width}.0f}"
    return f"{value:{width}.1e}"


def nccl_tests_count(
    collective: str, size_bytes: int, elem_bytes: int, nranks: int
) -> tuple[int, int]:
    """(count, size) as nccl-tests prints them for a requested size.

    all_gather, reduce_scatter and alltoall print the per-rank element count and round the size
    down to a multiple of ranks x element size; the others print the whole buffer.
    """
    name = canonical_collective(collective)
    elements = element_count(name, size_bytes, elem_bytes, nranks)
    return printed_count(name, elements, nranks), elements * elem_bytes


def row_from_times(
    collective: str,
    nranks: int,
    size_bytes: int,
    dtype: str,
    *,
    oop_time_s: float | None,
    ip_time_s: float | None,
    oop_wrong: float | None = None,
    ip_wrong: float | None = None,
) -> Row:
    """A row from measured times (seconds), with algbw/busbw as nccl-tests defines them."""
    name = canonical_collective(collective)
    count, size = nccl_tests_count(name, size_bytes, dtype_bytes(dtype), nranks)

    def group(time_s: float | None, wrong: float | None) -> list[float | None]:
        if time_s is None:
            return [None, None, None, None]
        return [
            time_s * 1e6,
            algbw_gbps(size, time_s),
            busbw_gbps(name, nranks, size, time_s),
            wrong,
        ]

    return Row(
        size,
        count,
        dtype,
        "sum" if name in REDUCING else "none",
        0 if name in ROOTED else -1,
        *group(oop_time_s, oop_wrong),
        *group(ip_time_s, ip_wrong),
    )


def header_lines() -> list[str]:
    """The three header lines of nccl-tests' current table layout."""
    blank = ("", "", "", "", "")
    return [
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       "
        "in-place          ".format(*blank),
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  "
        "{:>6}".format(
            "size",
            "count",
            "type",
            "redop",
            "root",
            "time",
            "algbw",
            "busbw",
            "#wrong",
            "time",
            "algbw",
            "busbw",
            "#wrong",
        ),
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  "
        "{:>6}".format(
            "(B)",
            "(elements)",
            "",
            "",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
        ),
    ]


def format_row(row: Row) -> str:
    """One result row, nccl-tests style."""
    root = -1 if row.root is None else row.root
    text = f"{row.size_bytes:12d}  {row.count:12d}  {row.dtype:>8}  {row.redop or 'none':>6}  "
    text += f"{root:6d}"
    for time_us, alg, bus, wrong in (
        (row.oop_time_us, row.oop_algbw_gbps, row.oop_busbw_gbps, row.oop_wrong),
        (row.ip_time_us, row.ip_algbw_gbps, row.ip_busbw_gbps, row.ip_wrong),
    ):
        if time_us is None or alg is None or bus is None:
            text += f"  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  {'N/A':>6}"
            continue
        shown = "N/A" if wrong is None else f"{wrong:g}"
        text += f"  {float_str(time_us, 7)}  {float_str(alg, 6)}  {float_str(bus, 6)}  {shown:>6}"
    return text


def avg_busbw(rows: Iterable[Row]) -> float:
    """nccl-tests' 'Avg bus bandwidth': the mean of every busbw printed (both placements)."""
    values = [b for r in rows for b in (r.oop_busbw_gbps, r.ip_busbw_gbps) if b is not None]
    return sum(values) / len(values) if values else 0.0


def footer_lines(rows: Sequence[Row]) -> list[str]:
    """The summary nccl-tests prints after the rows."""
    wrong = sum(1 for r in rows for w in (r.oop_wrong, r.ip_wrong) if w)
    return [
        f"# {'Out of bounds values':<20} : {wrong} {'FAILED' if wrong else 'OK'}",
        f"# {'Avg bus bandwidth':<20} : {avg_busbw(rows):g} ",
        "#",
    ]


def format_rows(rows: Sequence[Row], *, preamble: Sequence[str] = (), footer: bool = True) -> str:
    """A whole nccl-tests-compatible table: preamble lines, header, rows, summary."""
    lines = [*preamble, "#", *header_lines(), *(format_row(r) for r in rows)]
    if footer:
        lines += footer_lines(rows)
    return "\n".join(lines) + "\n"
