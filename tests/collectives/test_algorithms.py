"""Every collective x algorithm x rank count computes its collective (checked by ``verify``)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collsim.collectives.layout import RankLayout
from collsim.collectives.registry import build_schedule
from collsim.collectives.verify import verify

from .conftest import NRANKS, PAIRS, layouts_for


@pytest.mark.parametrize("n", NRANKS)
@pytest.mark.parametrize(("collective", "algorithm"), PAIRS)
def test_verifies_on_every_rank_count(collective: str, algorithm: str, n: int) -> None:
    if collective == "sendrecv" and n < 2:
        pytest.skip("sendrecv needs two ranks")
    for layout in layouts_for(algorithm, n):
        for count, channels in ((0, 1), (1, 2), (n - 1, 1), (5 * n + 3, 2), (97, 3)):
            s = build_schedule(
                collective,
                algorithm,
                nranks=n,
                count=count,
                channels=channels,
                layout=layout,
                chunk_bytes=24,
                root=n - 1,
            )
            verify(s, seed=n + count, orders=2)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pair=st.sampled_from(PAIRS),
    n=st.sampled_from(NRANKS),
    count=st.one_of(st.integers(0, 40), st.integers(0, 400)),
    channels=st.integers(1, 4),
    ranks_per_node=st.sampled_from((1, 2, 3, 4, 8)),
    chunk_bytes=st.one_of(st.none(), st.integers(1, 200)),
    elem_bytes=st.sampled_from((1, 2, 4, 8)),
    root_seed=st.integers(0, 1000),
)
def test_verifies_on_random_requests(
    pair: tuple[str, str],
    n: int,
    count: int,
    channels: int,
    ranks_per_node: int,
    chunk_bytes: int | None,
    elem_bytes: int,
    root_seed: int,
) -> None:
    collective, algorithm = pair
    if collective == "sendrecv" and n < 2:
        n = 2
    s = build_schedule(
        collective,
        algorithm,
        nranks=n,
        count=count,
        channels=channels,
        layout=RankLayout(n, ranks_per_node),
        chunk_bytes=chunk_bytes,
        elem_bytes=elem_bytes,
        root=root_seed % n,
    )
    assert s.collective == collective and s.algorithm == algorithm and s.count == count
    if len(s):
        assert set(s.channel.tolist()) <= set(range(channels))
    verify(s, seed=root_seed, orders=2)


@pytest.mark.parametrize("n", [6, 9, 10, 20])
@pytest.mark.parametrize("ranks_per_node", [2, 3, 4, 8])
@pytest.mark.parametrize(("collective", "algorithm"), [p for p in PAIRS if p[1] == "hierarchical"])
def test_hierarchical_partial_nodes(
    collective: str, algorithm: str, n: int, ranks_per_node: int
) -> None:
    layout = RankLayout(n, ranks_per_node)
    for count, channels in ((3 * n * ranks_per_node + 1, 1), (n * 7 + 5, 2)):
        s = build_schedule(
            collective, algorithm, nranks=n, count=count, channels=channels, layout=layout
        )
        verify(s, seed=count, orders=2)
