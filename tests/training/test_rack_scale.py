"""Rack-scale systems in the step model: on a GB200 NVL72 (18 trays of 4 GPUs in one NVLink
domain) a TP or EP group of 8 to 64 GPUs runs over the rack's NVLink switch trays, not over the
trays' NICs; groups crossing racks use the NICs (hand-checked times below)."""

from __future__ import annotations

import pytest

from collsim.topology.loader import load_topology
from collsim.training.comm import group_layout, group_shape, make_timer
from collsim.training.layout import Layout
from collsim.training.tp_span import tp_span

GB = 1e9
NVLINK_BYTES_PER_S = 18 * 50e9  # 18 NVLink 5 links of 50 GB/s per direction per GPU
NIC_BYTES_PER_S = 400e9 / 8  # one 400 Gb/s ConnectX-7 per GPU


@pytest.fixture(scope="module")
def two_racks():
    return load_topology("gb200-nvl72", nodes=36)


def test_a_tp8_group_on_two_trays_is_one_nccl_node(two_racks):
    names = [g.name for g in two_racks.gpus]
    for n in (8, 16, 32, 64):
        lay = group_layout(two_racks, names[:n])
        assert (lay.ranks_per_node, lay.grid) == (n, None)
    cross = group_layout(two_racks, [names[0], names[72]])  # GPU 0 of each rack
    assert (cross.nranks, cross.ranks_per_node) == (2, 1)
    # the shape key follows the domain: tray 1's GPUs are indices 4..7 of rack 0
    assert group_shape(two_racks, names[4:8]) == (4, (4, 5, 6, 7), 1, 0)
    assert group_shape(two_racks, [names[0], names[72]]) == (2, (0,), 2, 1)


def test_tp8_all_reduce_takes_the_nvlink_time(two_racks):
    """1 GB ring all-reduce over 8 GPUs: 2 (n-1)/n x 1 GB / 900 GB/s = 1.944 ms on NVLink
    (a ring over the 50 GB/s NICs would take 35 ms)."""
    timer = make_timer("analytic", two_racks)
    names = [g.name for g in two_racks.gpus]
    t = timer.time_s("all_reduce", names[:8], GB)
    nvlink_ring_s = 2 * 7 / 8 * GB / NVLINK_BYTES_PER_S
    assert t == pytest.approx(nvlink_ring_s, rel=0.05)
    assert t < 0.1 * 2 * 7 / 8 * GB / NIC_BYTES_PER_S


def test_a_two_rack_dp_group_uses_the_nics(two_racks):
    """2-rank all-reduce of 1 GB: each rank sends and receives half twice, 1 GB / 50 GB/s."""
    timer = make_timer("analytic", two_racks)
    names = [g.name for g in two_racks.gpus]
    t = timer.time_s("all_reduce", [names[0], names[72]], GB)
    assert t == pytest.approx(GB / NIC_BYTES_PER_S, rel=0.05)


def test_tp_span_counts_racks_not_trays(two_racks):
    def layout(tp):
        return Layout(n_gpus=144, tp=tp, pp=1, dp=144 // tp, ep=1, v=1, micro=1, m=1,
                      schedule="1f1b", sequence_parallel=True, zero=0)  # fmt: skip

    assert not tp_span(layout(8), two_racks).spans
    assert tp_span(layout(8), two_racks).gpus_per_node == 72
    wide = tp_span(layout(48), two_racks)  # the second group straddles the racks
    assert wide.spans and wide.split_groups == 1 and wide.nodes == 2


def test_a_dp_group_split_unevenly_over_racks_spreads_its_channels_over_the_nics(two_racks):
    """64 ranks, 36 in rack 0 and 28 in rack 1 (a 128-GPU job's FSDP group at TP2): NCCL's
    channels each cross between the racks through their own NICs, so a 3.2 GB all-gather runs
    near the NVLink ring's time ((n-1)/n x 3.2 GB / 900 GB/s = 3.5 ms), not at one NIC's
    50 GB/s (63 ms, what rank order's single crossing pair gave before)."""
    timer = make_timer("analytic", two_racks)
    names = [g.name for g in two_racks.gpus]
    group = names[0:72:2] + names[72:128:2]
    assert group_layout(two_racks, group).ranks_per_node == 36  # the larger node's ranks
    t = timer.time_s("all_gather", group, 3.2 * GB, "nccl")
    nvlink_s = 63 / 64 * 3.2 * GB / NVLINK_BYTES_PER_S
    assert nvlink_s < t < 1.3 * nvlink_s
