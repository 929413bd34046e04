"""Rank counts from a table's own numbers, and device lists that elide, cut or misstate ranks.

nccl-tests prints busbw = algbw x 2(n-1)/n (all_reduce) or (n-1)/n (all_gather, reduce_scatter,
alltoall), and per-rank element counts for the last three; published excerpts often shorten the
device list by hand. These logs are synthetic; tests/calibration/test_dataset.py reads the real
ones (OCI GB300, CoreWeave GB200 and H100 excerpts).
"""

from __future__ import annotations

from collsim.calibration import read_log
from collsim.calibration.rows import Draft, Group, Value, ranks_from_numbers
from tests.calibration.conftest import FOOTER, HEADER

# all_reduce rows whose bandwidths pin 8 ranks: 2(8-1)/8 = 1.75, printed to 0.01 GB/s
SIZES = (1 << 28, 1 << 29, 1 << 30)


def rows(factor: float = 1.75, *, alg: float = 100.0, per_rank: int = 0) -> list[str]:
    out = []
    for size in SIZES:
        t = size / alg / 1e3
        count = size // 4 // per_rank if per_rank else size // 4
        cols = f"{t:8.2f} {alg:7.2f} {alg * factor:7.2f}      0"
        redop = "none" if per_rank else "sum"
        out.append(f"{size:12d}  {count:12d}     float  {redop:>6}      -1 {cols} {cols}")
    return out


def device(rank: int, host: str) -> str:
    return (f"#  Rank {rank:2d} Group  0 Pid  {1000 + rank:5d} on {host:>10} device  {rank % 4} "
            "[0000:04:00] NVIDIA GB200")  # fmt: skip


def log_text(devices: list[str], table: list[str], binary: str = "all_reduce_perf") -> str:
    listing = "\n".join(devices)
    return (f"# Collective test starting: {binary}\n# Using devices\n{listing}\n"
            f"#\n{HEADER}" + "\n".join(table) + f"\n{FOOTER}")  # fmt: skip


def draft(collective_factor: float, alg: float, n_groups: int = 1) -> Draft:
    def g() -> Group:
        return Group(Value.parse("1.0"), Value.parse(f"{alg:.2f}"),
                     Value.parse(f"{alg * collective_factor:.2f}"), Value.parse("0"))  # fmt: skip

    return Draft(1, 1 << 30, 1 << 28, "float", "sum", -1, [g() for _ in range(n_groups)])


def test_numbers_pin_small_counts_and_bound_large_ones():
    exact = ranks_from_numbers("all_reduce", [draft(1.75, 100.0)])
    assert (exact.low, exact.high, exact.exact, exact.source) == (8, 8, 8, "busbw/algbw ratio")
    # 2(n-1)/n flattens: at 2160 ranks, 11.44 GB/s printed to 0.01 allows hundreds of counts
    wide = ranks_from_numbers("all_reduce", [draft(2 * 2159 / 2160, 11.44)])
    assert wide.exact is None and wide.allows(2160) and not wide.allows(8)
    # every row must agree: the intersection of what each allows
    two = ranks_from_numbers("all_reduce", [draft(1.75, 1.0), draft(1.75, 100.0)])
    assert two.exact == 8
    # busbw = algbw whatever the count: nothing to learn
    assert ranks_from_numbers("broadcast", [draft(1.0, 100.0)]) is None
    # rows that contradict each other (8 ranks, then 4) allow none
    assert ranks_from_numbers("all_reduce", [draft(1.75, 100.0), draft(1.5, 100.0)]) is None


def test_per_rank_counts_pin_alltoall_exactly():
    d = Draft(1, 1 << 30, (1 << 30) // 4 // 128, "float", None, -1, [None])
    assert ranks_from_numbers("alltoall", [d]).exact == 128
    assert ranks_from_numbers("alltoall", [d]).source == "element counts"


def test_a_device_list_cut_short_takes_the_count_from_the_rows(write):
    """Four device lines of an 8-rank run, without a '...': the listed ranks undercount, the
    bandwidths say 8, and the 8 are taken (every busbw was an anomaly before)."""
    text = log_text([device(r, "nodeA") for r in range(4)], rows())
    log = read_log(write(text))
    assert (log.ranks, log.ranks_source, log.anomalies) == (8, "busbw/algbw ratio", ())
    assert log.notes[0] == ("the device list is cut short (4 rank(s) shown, the highest 3); the "
                            "rows' busbw/algbw ratio gives 8 ranks, which are taken")  # fmt: skip
    assert log.nodes is None and "pass --nodes" in log.notes[1]
    assert read_log(write(text, "given.txt"), nodes=2).nodes == 2


def test_an_elided_list_that_overstates_ranks_yields_to_the_rows(write):
    """A published excerpt shows 'Rank 11' after '...' but every row says 8 ranks (CoreWeave's
    GB200 README shows Rank 143 on a 128-rank run): the rows are trusted and the note says the
    two disagree."""
    text = log_text([device(0, "nodeA"), "#  ...", device(11, "nodeC")], rows())
    log = read_log(write(text), strict=True)
    assert (log.ranks, log.anomalies) == (8, ())
    assert log.notes[0] == ("the device list shows rank 11, but the rows' busbw/algbw ratio "
                            "fits only 8 ranks: the two disagree, and the rows are trusted (a "
                            "list edited by hand?)")  # fmt: skip


def test_an_elided_list_the_rows_confirm_says_so(write):
    devices = [device(0, "nodeA"), device(1, "nodeA"), "#  ...", device(7, "nodeB")]
    log = read_log(write(log_text(devices, rows())))
    assert (log.ranks, log.ranks_source) == (8, "the highest listed rank")
    assert log.notes[0] == ("the device list is elided (3 rank(s) shown, the highest 7); the "
                            "rows' busbw/algbw ratio confirms 8 ranks")  # fmt: skip
    # alltoall: the per-rank element counts say it, exactly
    a2a = read_log(write(log_text(devices, rows(7 / 8, per_rank=8), "alltoall_perf"), "a2a.txt"))
    assert a2a.ranks == 8 and "the rows' element counts confirm 8 ranks" in a2a.notes[0]


def test_an_elided_list_the_rows_cannot_check(write):
    devices = [device(0, "nodeA"), "#  ...", device(7, "nodeB")]
    text = log_text(devices, rows(1.0), "broadcast_perf")
    log = read_log(write(text))
    assert log.ranks == 8
    assert log.notes[0].endswith("the rows cannot tell (broadcast prints busbw = algbw)")


def test_a_complete_list_the_rows_contradict_is_kept_and_flagged(write):
    """All eight device lines, rows that say 4 ranks: the list is what nccl-tests printed, so it
    stays; the rows become anomalies and a note names the disagreement."""
    text = log_text([device(r, "nodeA" if r < 4 else "nodeB") for r in range(8)], rows(1.5))
    log = read_log(write(text))
    assert (log.ranks, log.nodes) == (8, 2)
    assert log.anomalies and "busbw" in log.anomalies[0]
    assert log.notes[0] == ("the device list shows 8 ranks, but the rows' busbw/algbw ratio fits "
                            "4: the two disagree (the list is kept; its rows are checked against "
                            "it)")  # fmt: skip
