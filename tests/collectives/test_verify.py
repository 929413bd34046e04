"""``verify`` itself: it accepts correct schedules and fails loudly on broken ones."""

from __future__ import annotations

import numpy as np
import pytest

from collsim.collectives.registry import build_schedule
from collsim.collectives.schedule import ScheduleBuilder
from collsim.collectives.verify import (
    VerificationError,
    buffer_counts,
    expected_outputs,
    verify,
)

from .conftest import with_arrays, without_dep


def ring(n: int = 5, count: int = 40):
    return build_schedule("all_reduce", "ring", nranks=n, count=count)


def test_correct_ring_passes() -> None:
    verify(ring(), orders=5)


def test_corrupted_offset_is_caught() -> None:
    s = ring()
    dst_off = s.dst_off.copy()
    dst_off[len(s) // 2] += 1
    with pytest.raises(VerificationError, match=r"all_reduce/ring on 5 ranks.*rank \d+ output\["):
        verify(with_arrays(s, dst_off=dst_off))


def test_dropped_write_is_caught() -> None:
    s = ring()
    count = s.arrays["count"].copy()
    count[len(s) - 1] = 0  # the last all-gather transfer delivers nothing
    with pytest.raises(VerificationError, match="expected"):
        verify(with_arrays(s, count=count))


def test_every_dropped_ring_dependency_is_caught() -> None:
    s = ring(n=6, count=60)
    owners = [i for i in range(len(s)) if s.deps_of(i)]
    for op in owners[:: max(1, len(owners) // 12)]:
        broken = without_dep(s, op, s.deps_of(op)[0])
        with pytest.raises(VerificationError):
            verify(broken, seed=op, orders=8)


def test_dropped_tree_dependency_is_caught() -> None:
    s = build_schedule("all_reduce", "tree", nranks=8, count=64, chunk_bytes=32)
    op = next(i for i in range(len(s) - 1, 0, -1) if s.deps_of(i))
    with pytest.raises(VerificationError):
        verify(without_dep(s, op, s.deps_of(op)[0]), orders=8)


def test_out_of_bounds_offset_is_an_error() -> None:
    s = ring()
    src_off = s.src_off.copy()
    src_off[0] = 10_000
    with pytest.raises(VerificationError, match="out-of-bounds"):
        verify(with_arrays(s, src_off=src_off))


def test_bad_rank_is_an_error() -> None:
    s = ring()
    dst = s.dst.copy()
    dst[0] = 99
    with pytest.raises(VerificationError, match="bad rank"):
        verify(with_arrays(s, dst=dst))


def test_reading_unwritten_scratch_is_caught() -> None:
    b = ScheduleBuilder()
    b.transfer(0, 1, 4, "scratch", 0, "output", 0)
    b.transfer(1, 0, 4, "input", 0, "output", 0)
    s = b.build("sendrecv", "p2p", 2, 4, 4)
    with pytest.raises(VerificationError, match="rank 1"):
        verify(s)


def test_reduce_checks_only_the_root() -> None:
    s = build_schedule("reduce", "chain", nranks=4, count=8, root=2)
    verify(s)
    # The root's output is wrong if its final local reduction is dropped.
    kind_red = np.flatnonzero(s.kind == 1)
    count = s.arrays["count"].copy()
    count[kind_red] = 0
    with pytest.raises(VerificationError, match="rank 2"):
        verify(with_arrays(s, count=count))


def test_semantics() -> None:
    assert buffer_counts("all_gather", 4, 10) == (2, 8)
    assert buffer_counts("reduce_scatter", 4, 10) == (8, 2)
    assert buffer_counts("alltoall", 3, 10) == (9, 9)
    assert buffer_counts("all_reduce", 4, 10) == (10, 10)
    x = np.arange(12.0).reshape(3, 4)
    assert np.array_equal(expected_outputs("sendrecv", x)[0], x[2])
    a2a = expected_outputs("alltoall", np.arange(9.0).reshape(3, 3))
    assert a2a[1].tolist() == [1.0, 4.0, 7.0]
    rs = expected_outputs("reduce_scatter", np.ones((2, 4)))
    assert rs[1].tolist() == [2.0, 2.0]
    red = expected_outputs("reduce", x, root=1)
    assert red[0] is None and red[1] is not None
