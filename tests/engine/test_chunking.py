"""The engine's bounded-memory passes (ops prepared and timed in chunks, ring steps emitted in
batches) give exactly the results of one pass: shrink the chunks to a few ops and compare."""

from __future__ import annotations

import numpy as np
import pytest

from collsim.collectives import ring
from collsim.collectives.registry import build_schedule
from collsim.engine import prepare, simulate, uncontended
from collsim.topology.loader import load_topology
from collsim.topology.spec import with_duplex
from collsim.whatif import WhatIf

CASES = [
    ("all_reduce", "ring", 2),
    ("all_reduce", "tree", 1),
    ("all_gather", "ring", 1),
    ("reduce_scatter", "ring", 2),
    ("alltoall", "direct", 1),
]


def _fingerprint(result) -> list[np.ndarray]:
    t, lk = result.transfers, result.links
    return [
        np.array([result.time_s]), result.op_start_s, result.op_end_s, result.rank_finish_s,
        t.start_s, t.flow_start_s, t.end_s, t.bytes, lk.bytes, lk.busy_s,
    ]  # fmt: skip


def _run(whatif, collective, algorithm, channels):
    n, count = whatif.topology.n_gpus, (1 << 20) // 4
    sched = build_schedule(
        collective, algorithm, nranks=n, count=count, layout=whatif.layout, channels=channels
    )
    return _fingerprint(simulate(sched, whatif.fabric))


@pytest.mark.parametrize("duplex", [False, True])
@pytest.mark.parametrize(("collective", "algorithm", "channels"), CASES)
def test_small_chunks_give_identical_results(monkeypatch, collective, algorithm, channels, duplex):
    topo = load_topology("dgx-h100", nodes=2)
    if duplex:  # coupling links: both directions of every cable share a capacity
        topo = with_duplex(topo, {"nvlink": 0.6, "infiniband": 0.6, "pcie": 0.6})
    whatif = WhatIf(topo)
    expected = _run(whatif, collective, algorithm, channels)
    monkeypatch.setattr(prepare, "CHUNK", 7)
    monkeypatch.setattr(uncontended, "CHUNK", 7)
    monkeypatch.setattr(uncontended, "_PAIR_CHUNK", 5)
    monkeypatch.setattr(ring, "_BATCH_OPS", 5)
    got = _run(whatif, collective, algorithm, channels)
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a, b)
