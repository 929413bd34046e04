"""Traffic and structure properties the closed-form models rely on."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collsim.collectives.registry import build_schedule
from collsim.collectives.schedule import REDUCTION, TRANSFER

from .conftest import PAIRS, network_bytes


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 40), per=st.integers(1, 50), channels=st.integers(1, 4))
def test_ring_all_reduce_sends_2_n_minus_1_over_n(n: int, per: int, channels: int) -> None:
    count = n * channels * per
    s = build_schedule("all_reduce", "ring", nranks=n, count=count, channels=channels)
    expect = 2 * (n - 1) / n * count * 4
    assert np.allclose(s.bytes_sent(), expect)
    assert s.n_transfers() == 2 * (n - 1) * n * channels


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 40), count=st.integers(0, 5000))
def test_ring_all_reduce_total_bytes_any_count(n: int, count: int) -> None:
    s = build_schedule("all_reduce", "ring", nranks=n, count=count)
    assert s.bytes_sent().sum() == 2 * (n - 1) * count * 4


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 40), blk=st.integers(0, 60), channels=st.integers(1, 4))
def test_ring_gather_scatter_send_n_minus_1_over_n(n: int, blk: int, channels: int) -> None:
    count = n * blk
    for collective in ("all_gather", "reduce_scatter"):
        s = build_schedule(collective, "ring", nranks=n, count=count, channels=channels)
        assert np.allclose(network_bytes(s), (n - 1) / n * count * 4)


@pytest.mark.parametrize(("collective", "algorithm"), PAIRS)
def test_channels_and_chunks_conserve_bytes(collective: str, algorithm: str) -> None:
    n, count = 12, 12 * 37 + 5
    base = build_schedule(collective, algorithm, nranks=n, count=count)
    for channels, chunk in ((2, None), (3, 64), (4, 7)):
        s = build_schedule(
            collective, algorithm, nranks=n, count=count, channels=channels, chunk_bytes=chunk
        )
        assert s.bytes_sent().sum() == base.bytes_sent().sum()
        assert sorted(set(s.channel.tolist())) == list(range(channels))


def test_ring_steps_depend_on_the_delivery_and_the_previous_send() -> None:
    n = 6
    s = build_schedule("all_reduce", "ring", nranks=n, count=600)
    net = np.flatnonzero((s.kind == TRANSFER) & (s.src != s.dst))
    without = 0
    for i in net:
        deps = [d for d in s.deps_of(int(i)) if s.src[d] != s.dst[d]]  # network deps only
        if not deps:
            without += 1
            continue
        delivering = [d for d in deps if s.dst[d] == s.src[i]]
        own = [d for d in deps if s.src[d] == s.src[i]]
        assert len(delivering) == 1  # the transfer that brought the data to this rank
        assert len(own) <= 1 and len(deps) == len(delivering) + len(own)  # + its previous send
    assert without == n  # only the first step starts unconditionally


def test_ring_reduce_scatter_uses_fused_reduce() -> None:
    s = build_schedule("reduce_scatter", "ring", nranks=5, count=50)
    t = s.kind == TRANSFER
    assert s.reduce[t].sum() == 5 * 3  # all but the last hop into each owner
    assert (s.kind == REDUCTION).sum() == 5


def test_pipelined_algorithms_cap_chunks() -> None:
    huge = 2**28
    s = build_schedule("all_reduce", "in_network", nranks=8, count=huge, chunk_bytes=1024)
    assert len(s) == 64
    s = build_schedule("broadcast", "chain", nranks=4, count=huge, channels=2)
    assert len(s) <= 2 * 64 * 4
    s = build_schedule("all_reduce", "in_network", nranks=8, count=1000, chunk_bytes=1024)
    assert len(s) == 4  # ceil(4000 B / 1 KiB)


def test_tree_all_reduce_halves_the_data_per_tree() -> None:
    n, count = 16, 16 * 1024
    s = build_schedule("all_reduce", "tree", nranks=n, count=count, chunk_bytes=count * 4)
    # Each tree: every non-root sends its half up once and receives it down once.
    assert s.bytes_sent().sum() == 2 * 2 * (n - 1) * (count // 2) * 4
    assert s.reduce[s.kind == TRANSFER].any()


def test_empty_and_single_rank_schedules() -> None:
    for collective, algorithm in PAIRS:
        if collective == "sendrecv":
            continue
        assert len(build_schedule(collective, algorithm, nranks=5, count=0)) == 0
        one = build_schedule(collective, algorithm, nranks=1, count=10)
        assert network_bytes(one).sum() == 0


def test_ring_channels_use_every_rail_and_stay_rail_aligned() -> None:
    from collsim.collectives.layout import RankLayout

    s = build_schedule(
        "all_reduce", "ring", nranks=32, count=3200, layout=RankLayout(32, 8), channels=8
    )
    rails = set()
    for c in range(8):
        m = (s.channel == c) & (s.kind == TRANSFER) & (s.src // 8 != s.dst // 8)
        hops = {(int(a), int(b)) for a, b in zip(s.src[m], s.dst[m], strict=True)}
        assert all(a % 8 == b % 8 for a, b in hops)  # even node count: every hop on one rail
        used = {a % 8 for a, _ in hops}
        assert used == {c, (c + 1) % 8}  # channel c alternates between rails c and c + 1
        rails |= used
    assert rails == set(range(8))  # the 8 channels use all 8 GPUs' NICs
