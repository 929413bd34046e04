"""TopologyFabric keeps the routes and paths of small asks (``_Memo``): the same answers as a
fabric asked afresh, read-only, and never one ask's answer for another."""

import numpy as np
import pytest

from collsim.topology.fabric import TopologyFabric
from collsim.topology.graph import Network
from collsim.topology.loader import load_topology


def _fabric():
    # two Polaris nodes: a multipath fabric (paths and routes differ in kind)
    return TopologyFabric(Network(load_topology("polaris", nodes=2)))


def _same(a, b):
    return len(a) == len(b) and all(x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))


def test_a_repeated_ask_is_served_read_only_with_the_fresh_answer():
    fab, fresh = _fabric(), _fabric()
    src, dst = np.array([0, 1, 5]), np.array([4, 7, 2])
    first = fab.paths(src, dst)
    again = fab.paths(src.astype(np.int32), list(dst))  # the same pairs, other types
    assert all(a is b for a, b in zip(first, again, strict=True))
    assert _same(first, fresh.paths(src, dst))
    assert first[3].size > 3 * 3  # every pair crosses links: the answer is not trivial
    with pytest.raises(ValueError):
        first[3][0] = 0  # a caller cannot change a later answer


def test_other_asks_get_their_own_answers():
    fab, fresh = _fabric(), _fabric()
    src, dst = np.array([0, 1, 5]), np.array([4, 7, 2])
    fab.paths(src, dst)
    # routes of the same pairs, the pairs reversed, one pair less: none is the paths' answer
    assert _same(fab.routes(src, dst), fresh.routes(src, dst))
    assert _same(fab.paths(dst, src), fresh.paths(dst, src))
    assert _same(fab.paths(src[:2], dst[:2]), fresh.paths(src[:2], dst[:2]))


def test_large_asks_are_not_kept():
    fab = _fabric()
    n = fab.nranks
    src = np.tile(np.arange(n), 600)  # 4,800 pairs: past the 64 KiB an entry may take
    dst = (src + 4) % n
    first = fab.routes(src, dst)
    assert first[1].flags.writeable
    assert fab.routes(src, dst)[1] is not first[1]
