"""``build_schedule``'s registry and its user-facing errors."""

from __future__ import annotations

import pytest

from collsim.collectives.layout import RankLayout, near_square_grid
from collsim.collectives.registry import (
    COLLECTIVES,
    algorithms_for,
    build_schedule,
    default_algorithm,
    needs_in_network,
)
from collsim.errors import ScheduleError


def test_catalogue() -> None:
    assert COLLECTIVES == (
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "reduce",
        "alltoall",
        "sendrecv",
    )
    assert set(algorithms_for("all_reduce")) == {
        "ring", "tree", "rhd", "hierarchical", "ring2d", "direct", "in_network", "nvls_tree",
        "collnet",
    }  # fmt: skip
    assert set(algorithms_for("all_gather")) == {"ring", "rd", "direct", "hierarchical", "pat"}
    assert set(algorithms_for("reduce_scatter")) == {"ring", "rd", "direct", "hierarchical", "pat"}
    assert set(algorithms_for("broadcast")) == {"chain", "tree"}
    assert set(algorithms_for("reduce")) == {"chain", "tree"}
    assert set(algorithms_for("alltoall")) == {"direct", "hierarchical"}
    assert algorithms_for("sendrecv") == ("p2p",)
    assert default_algorithm("all_reduce") == "ring"
    assert default_algorithm("alltoall") == "direct"
    assert needs_in_network("in_network") and not needs_in_network("ring")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"collective": "allreduce"}, "collective"),
        ({"algorithm": "butterfly"}, "algorithm"),
        ({"nranks": 0}, "nranks"),
        ({"nranks": 2.5}, "nranks"),
        ({"count": -1}, "count"),
        ({"channels": 0}, "channels"),
        ({"channels": 65}, "channels"),
        ({"chunk_bytes": 0}, "chunk_bytes"),
        ({"elem_bytes": 0}, "elem_bytes"),
        ({"root": 4}, "root"),
        ({"root": -1}, "root"),
        ({"layout": RankLayout(3, 1)}, "layout"),
    ],
)
def test_bad_requests_name_the_field(kwargs: dict, field: str) -> None:
    args = {"collective": "all_reduce", "algorithm": "ring", "nranks": 4, "count": 16}
    args.update(kwargs)
    collective, algorithm = args.pop("collective"), args.pop("algorithm")
    with pytest.raises(ScheduleError) as err:
        build_schedule(collective, algorithm, **args)
    assert err.value.field == field
    assert field in str(err.value)


def test_unknown_algorithm_lists_the_valid_ones() -> None:
    with pytest.raises(ScheduleError, match="ring, tree, rhd") as err:
        build_schedule("all_reduce", "magic", nranks=4, count=4)
    assert err.value.value == "magic"
    with pytest.raises(ScheduleError, match="all_reduce, all_gather"):
        algorithms_for("gather")


def test_layout_validation() -> None:
    with pytest.raises(ScheduleError, match="grid") as err:
        RankLayout(6, 2, grid=(4, 2))
    assert err.value.field == "layout.grid"
    with pytest.raises(ScheduleError):
        RankLayout(6, 0)
    three_d = RankLayout(8, 2, grid=(2, 2, 2))
    with pytest.raises(ScheduleError, match="2-dimensional"):
        build_schedule("all_reduce", "ring2d", nranks=8, count=8, layout=three_d)


def test_layout_helpers() -> None:
    lay = RankLayout(10, 4)
    assert lay.nnodes == 3 and lay.last_node_size == 2
    assert lay.node_of(9) == 2 and lay.local_of(9) == 1 and lay.node_size(2) == 2
    assert RankLayout.default(4).ranks_per_node == 4
    assert RankLayout.default(64).ranks_per_node == 8
    assert near_square_grid(12) == (3, 4)
    assert near_square_grid(16) == (4, 4)
    assert near_square_grid(7) == (1, 7)
    assert near_square_grid(1) == (1, 1)
    assert RankLayout(12, 4).grid2d() == (3, 4)
    assert RankLayout(12, 4, grid=(2, 6)).grid2d() == (2, 6)


def test_meta_and_knobs_recorded() -> None:
    s = build_schedule("all_reduce", "ring2d", nranks=12, count=120, channels=2, elem_bytes=2)
    assert s.meta["grid"] == (3, 4)
    assert s.channels == 2 and s.elem_bytes == 2 and s.size_bytes == 240
    s = build_schedule("broadcast", "tree", nranks=5, count=10, root=3)
    assert s.root == 3
