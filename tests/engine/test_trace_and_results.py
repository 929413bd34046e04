"""Result records, bottleneck links and the Chrome trace export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from collsim.collectives.schedule import ScheduleBuilder
from collsim.engine import bottleneck_links, ring_fabric, simulate, star_fabric, write_chrome_trace
from collsim.engine.testing import ring_all_reduce
from tests.engine.conftest import IDEAL, switch_fabric


def test_transfer_records_are_flat_arrays() -> None:
    n = 4
    schedule = ring_all_reduce(n, n * 256)
    result = simulate(schedule, ring_fabric(n, 1e9, 1e-6))
    tr = result.transfers
    assert len(tr) == n + 2 * n * (n - 1)  # n local copies, then the ring
    assert schedule.n_transfers() == 2 * n * (n - 1)  # network transfers only
    for column in (tr.op_id, tr.src, tr.dst, tr.bytes, tr.start_s, tr.end_s, tr.route):
        assert isinstance(column, np.ndarray) and column.shape == (len(tr),)
    ptr, links = tr.path_csr()
    assert ptr.shape == (len(tr) + 1,)
    for i in (0, n, len(tr) - 1):
        np.testing.assert_array_equal(links[ptr[i] : ptr[i + 1]], tr.path(i))
    assert np.all(tr.end_s >= tr.flow_start_s) and np.all(tr.flow_start_s >= tr.start_s)


def test_bottleneck_links_rank_by_utilization() -> None:
    size = 1 << 20
    fabric = switch_fabric([1e9, 1e9, 1e9], [1e9, 1e9, 1e9])
    b = ScheduleBuilder()
    b.transfer(0, 2, size // 4, "input", 0, "output", 0)
    b.transfer(1, 2, size // 4, "input", 0, "output", 0)
    result = simulate(b.build("custom", "t", 3, 0, 4), fabric, protocol=IDEAL)
    top = bottleneck_links(result, top=2)
    assert top[0].name == "sw->2"
    assert top[0].utilization == pytest.approx(1.0)
    assert top[0].busy_fraction == pytest.approx(1.0)
    assert top[1].utilization == pytest.approx(0.5)
    assert len(bottleneck_links(result, top=10)) == 3  # idle links are left out


def test_chrome_trace_loads_and_has_the_events(tmp_path: Path) -> None:
    n = 3
    schedule = ring_all_reduce(n, n * 100)
    result = simulate(schedule, ring_fabric(n, 1e9, 1e-6))
    path = write_chrome_trace(result, schedule, tmp_path / "trace.json")
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    x = [e for e in events if e["ph"] == "X"]
    hops = sum(len(result.transfers.path(i)) for i in range(len(result.transfers)))
    assert len(x) == len(result.transfers) + hops
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"rank 0", "rank 1", "rank 2", "0->1", "1->2", "2->0"} <= names
    last = max(e["ts"] + e["dur"] for e in x)
    assert last == pytest.approx(result.time_s * 1e6)
    assert all("bytes" in e["args"] for e in x)
    assert list(tmp_path.iterdir()) == [path]  # no temp file left behind


def test_trace_has_reductions_and_in_network_ops(tmp_path: Path) -> None:
    b = ScheduleBuilder()
    nr = b.network_reduce([0, 1], [0, 1], 64, "input", 0, "output", 0)
    b.reduction(0, 64, "output", 0, "scratch", 0, deps=[nr])
    schedule = b.build("all_reduce", "nvls", 2, 64, 4)
    fabric = star_fabric(2, 1e9, 1e-6, reducing=True, memory_bytes_per_s=1e12)
    result = simulate(schedule, fabric)
    data = json.loads(write_chrome_trace(result, schedule, tmp_path / "t.json").read_text())
    names = [e["name"] for e in data["traceEvents"] if e["ph"] == "X"]
    assert names.count("network_reduce") == 2 and names.count("reduce") == 1
