"""The compiled replay (``collsim/engine/kernel_*.py``) against the Python one.

The mode-by-mode comparison on random contended DAGs is in test_incremental.py (every reshare
scheme in both kernels, "all"/"components" bit for bit). Here: progressive filling against
numpy's bit for bit, the contended benchmark scenario in both kernels, runs that outgrow their
slot and event arrays, which schedules fall back to Python, and the stale-cache guard.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collsim.collectives.registry import build_schedule
from collsim.collectives.schedule import ScheduleBuilder
from collsim.engine import simulate, star_fabric
from collsim.engine.kernel_maxmin import fill, link_scratch
from collsim.engine.kernel_replay import drop_if_changed
from collsim.engine.maxmin import max_min_rates, max_min_small
from collsim.topology.loader import topology_from_dict
from collsim.whatif import WhatIf

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from contended_scaling import fat_tree

B = 25e9


@settings(max_examples=120, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(0, 7), min_size=1, max_size=5, unique=True), min_size=1, max_size=14
    ),
    st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0, 1.0 / 3.0, 7.25]), min_size=8, max_size=8),
    st.lists(st.sampled_from([np.inf, 0.4, 1.0, 2.5]), min_size=14, max_size=14),
)
def test_compiled_filling_is_numpys_bit_for_bit(paths, capacity, ceilings):
    k = len(paths)
    width = max(len(p) for p in paths)
    table = np.full((k, width), -1, dtype=np.int64)
    for i, p in enumerate(paths):
        table[i, : len(p)] = p
    nlinks = np.array([len(p) for p in paths], dtype=np.int64)
    ceil = np.array(ceilings[:k])
    capped = bool(np.isfinite(ceil).any())
    rates, bns = np.empty(k), np.empty(k, dtype=np.int64)
    fill(np.arange(k), table, nlinks, np.array(capacity), ceil, capped, rates, bns,
         link_scratch(8), np.zeros(1))  # fmt: skip
    links = np.concatenate([np.array(p) for p in paths])
    expected = max_min_rates(links, nlinks, np.array(capacity), ceil if capped else None)
    np.testing.assert_array_equal(rates, expected)
    small, small_bns = max_min_small(paths, capacity, ceil.tolist() if capped else None)
    np.testing.assert_array_equal(rates, small)
    assert bns.tolist() == small_bns  # the same bottleneck links (CAPPED: at the ceiling)


def _both(schedule, fabric, **kw):
    py = simulate(schedule, fabric, kernel="python", **kw)
    compiled = simulate(schedule, fabric, **kw)
    assert py.meta["replay_kernel"] == "python"
    return py, compiled


def _close(a, b, rtol=1e-12):
    for name in ("start_s", "flow_start_s", "end_s"):
        np.testing.assert_allclose(getattr(a.transfers, name), getattr(b.transfers, name),
                                   rtol=rtol, atol=0, err_msg=name)  # fmt: skip
    np.testing.assert_allclose(a.links.busy_s, b.links.busy_s, rtol=rtol, atol=1e-15)


def test_the_contended_ring_scenario_in_both_kernels():
    """The benchmark's scattered 1-channel ring at 64 GPUs (fused receive-reduces, ``after``
    chains, channel ceilings, a giant component settled locally)."""
    w = WhatIf(topology_from_dict(fat_tree(64, 1)))
    s = build_schedule("all_reduce", "ring", nranks=64, count=(1 << 24) // 4, layout=w.layout,
                       channels=1)  # fmt: skip
    py, compiled = _both(s, w.fabric, protocol="Simple")
    assert compiled.meta["replay_kernel"] == "compiled"
    assert compiled.meta["engine_path"] == "replay"
    counts = compiled.meta["replay_counts"]
    assert counts["flows"] == s.n_transfers() and counts["batches"] > counts["flows"]
    _close(py, compiled)
    exact = (simulate(s, w.fabric, protocol="Simple", reshare=m, kernel=k) for m, k in
             (("all", "python"), ("all", "compiled"), ("components", "compiled")))  # fmt: skip
    ref, *others = exact
    for other in others:
        np.testing.assert_array_equal(other.transfers.end_s, ref.transfers.end_s)


def test_a_run_that_outgrows_its_slots_and_events_replays_with_more_room():
    """One transfer releases 300 transfers into one port: far more flows and pending events
    than the first guess (64 slots, 256 events); the kernel doubles its room and replays."""
    n = 4
    fabric = star_fabric(n, B, 1e-6, switch_latency=0.5e-6)
    b = ScheduleBuilder()
    first = b.transfer(1, 0, 4096, "input", 0, "output", 0)
    for i in range(300):
        src = 1 + i % (n - 1)
        b.transfer(src, 0, 1024 * (1 + i % 7), "input", 0, "output", 0, deps=[first])
    s = b.build("custom", "fan", n, 0, 4)
    py, compiled = _both(s, fabric, fast_path=False)
    counts = compiled.meta["replay_counts"]
    assert counts["slots"] >= 256 and counts["event_room"] >= 300
    _close(py, compiled)


def test_schedules_the_kernel_does_not_cover_take_the_python_replay():
    fabric = star_fabric(4, B, 1e-6, switch_latency=0.4e-6, reducing=True)
    b = ScheduleBuilder()
    b.network_reduce([0, 1, 2, 3], [0, 1, 2, 3], 1 << 16, "input", 0, "output", 0)
    b.transfer(0, 3, 1 << 16, "input", 0, "output", 0)
    result = simulate(b.build("custom", "nvls", 4, 0, 4), fabric, fast_path=False)
    assert result.meta["replay_kernel"] == "python"
    late = simulate(b.build("custom", "nvls", 4, 0, 4), fabric, fast_path=False,
                    rank_start_s=np.array([0.0, 1e-6, 0.0, 0.0]))  # fmt: skip
    assert late.meta["replay_kernel"] == "python"


def test_kernel_is_checked():
    fabric = star_fabric(2, B, 1e-6)
    b = ScheduleBuilder()
    b.transfer(0, 1, 64, "input", 0, "output", 0)
    with pytest.raises(ValueError, match="replay kernel"):
        simulate(b.build("custom", "one", 2, 0, 4), fabric, kernel="fortran")
    with pytest.raises(ValueError, match="reshare mode"):
        simulate(b.build("custom", "one", 2, 0, 4), fabric, fast_path=False, reshare="some")


def test_the_cache_is_dropped_when_a_kernel_source_changes(tmp_path):
    """numba would reuse ``_run``'s cache after an edit to a file it calls into: the digest of
    the sources, kept beside the cache, drops every kernel cache file when it differs."""
    files = ["kernel_replay._run-1.py311.nbi", "kernel_replay._run-1.py311.1.nbc",
             "kernel_network.add-9.py311.nbi", "other_module.f-3.py311.nbi"]  # fmt: skip
    for name in files:
        (tmp_path / name).write_text("x")
    assert drop_if_changed(tmp_path, "aaaa")  # no digest yet: dropped
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "collsim-kernels.digest",
        "other_module.f-3.py311.nbi",
    ]
    (tmp_path / files[0]).write_text("x")
    assert not drop_if_changed(tmp_path, "aaaa")  # same sources: kept
    assert (tmp_path / files[0]).exists()
    assert drop_if_changed(tmp_path, "bbbb")  # a source changed: dropped
    assert not (tmp_path / files[0]).exists()
