"""algbw / busbw exactly as nccl-tests defines them."""

from __future__ import annotations

import math

import pytest

from collsim.errors import ScheduleError
from collsim.metrics import (
    COLLECTIVES,
    algbw_gbps,
    bus_factor,
    busbw_gbps,
    canonical_collective,
)

# nccl-tests src/*.cu GetBw: factor = busBw / algBw.
EXPECTED = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("n", [1, 2, 3, 8, 24, 1024])
def test_bus_factor_for_every_collective(collective: str, n: int) -> None:
    assert bus_factor(collective, n) == EXPECTED[collective](n)


def test_algbw_is_bytes_per_second_over_1e9() -> None:
    assert algbw_gbps(1 << 30, 0.01) == pytest.approx(107.3741824)
    # nccl-tests all_reduce, 8 ranks, 1 GiB in 10 ms: busbw = algbw * 14/8.
    assert busbw_gbps("all_reduce", 8, 1 << 30, 0.01) == pytest.approx(107.3741824 * 1.75)
    assert busbw_gbps("all_gather", 4, 4e9, 1.0) == pytest.approx(3.0)
    assert busbw_gbps("broadcast", 4, 4e9, 2.0) == pytest.approx(2.0)


def test_edge_cases() -> None:
    assert algbw_gbps(0, 0.0) == 0.0
    assert math.isinf(algbw_gbps(8, 0.0))
    assert busbw_gbps("all_reduce", 1, 8, 0.0) == 0.0  # factor 0 for a single rank
    with pytest.raises(ScheduleError):
        algbw_gbps(8, -1.0)
    with pytest.raises(ScheduleError):
        bus_factor("all_reduce", 0)


def test_collective_names() -> None:
    assert canonical_collective("AllReduce") == "all_reduce"
    assert canonical_collective("all-gather") == "all_gather"
    assert canonical_collective("reducescatter") == "reduce_scatter"
    assert canonical_collective("all_to_all") == "alltoall"
    with pytest.raises(ScheduleError) as info:
        canonical_collective("scan")
    assert info.value.field == "collective"
