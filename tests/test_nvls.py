"""NCCL's NVLS chunking (collsim.nvls) and the chunk round trips both engines charge for it."""

from pathlib import Path

import numpy as np
import pytest
import yaml

from collsim.nvls import (
    nvls_channels,
    nvls_chunk_bytes,
    nvls_chunks,
    nvls_heads,
    nvls_tree_chunk_bytes,
)
from collsim.topology.loader import load_topology, topology_from_dict
from collsim.whatif import WhatIf

KIB, GIB = 1024, 1 << 30


@pytest.mark.parametrize(
    ("nbytes", "chunk"),
    [
        (3 * GIB // 2, 128 * KIB),  # 64 x 24 channels x 8 heads x 128 KiB = 1.5 GiB
        (3 * GIB // 2 - 1, 64 * KIB),
        (96 << 20, 64 * KIB),  # 8 x 192 x 64 KiB = 96 MiB
        (96 * (1 << 20) - 1, 32 * KIB),
        (12 << 20, 32 * KIB),  # 2 x 192 x 32 KiB = 12 MiB
        (12 * (1 << 20) - 1, 16 * KIB),
        (1024, 16 * KIB),
    ],
)
def test_chunk_follows_nccls_thresholds(nbytes, chunk):
    """``calcCollChunking`` for NVLS in one node: 128 KiB, halved below 64x / 8x / 2x
    channels x heads x the chunk (two GB300 trays: 24 channels, 8 heads)."""
    assert nvls_chunk_bytes(nbytes, 24, 8) == chunk


def test_channels_heads_and_chunks_per_channel():
    assert nvls_channels("GB300 (B300 288GB)") == 24  # NVLS_NCHANNELS_SM100_NVL
    assert nvls_channels("GB200", several_domains=True) == 32  # NVLS_NCHANNELS_SM100
    assert nvls_channels("H100 SXM5 80GB") == 16  # NVLS_NCHANNELS_SM90
    assert nvls_channels("A100 SXM4 80GB") is None and nvls_channels("MI300X") is None
    assert nvls_heads(72) == 32 and nvls_heads(8) == 8  # NCCL_MAX_NVLS_ARITY
    assert nvls_chunks(0, 24, 8) == 0
    assert nvls_chunks(2 * GIB, 24, 8) == -(-2 * GIB // (24 * 128 * KIB))  # 683, rounded up


def test_nvls_on_nvl72_pays_a_route_trip_per_chunk_in_both_engines():
    """Two GB300 trays: each of the 24 NVLS channels moves its share chunk by chunk and pays
    the in-network route (0.7 + 0.1 + 0.7 us) per chunk, so the engine and the model, which
    agree exactly, are that much slower than the data alone; and busbw steps up where NCCL's
    chunk doubles (64 KiB below 1.5 GiB, 128 KiB from it), as the OCI log does (725 -> 823)."""
    wi = WhatIf(load_topology("gb300-nvl72", nodes=2))
    model = wi.cost_model("collsim")
    fabric = wi.fabric
    ranks = np.arange(8)
    route_s = fabric.in_network(ranks, ranks)[4]
    assert route_s == pytest.approx(1.5e-6)
    sizes = (GIB, 2 * GIB)
    times = []
    for size in sizes:
        sim, _ = wi.run("all_reduce", "in_network", size)
        pred = float(model.predict("all_reduce", "in_network", [size])[0])
        assert pred == pytest.approx(sim.time_s, rel=1e-9)
        chunks = fabric.in_network_chunks(ranks, ranks, size)
        assert chunks == nvls_chunks(size, 24, 8) > 0
        data_s = size * (1 + 1 / 8) / (50e9 * 18 * 0.74)  # 18 NVLink 5 links, NVLS efficiency
        assert sim.time_s > data_s + chunks * route_s
        assert sim.time_s == pytest.approx(data_s + chunks * route_s, rel=0.01)
        times.append(sim.time_s)
    busbw = [s / t for s, t in zip(sizes, times, strict=True)]
    assert busbw[1] / busbw[0] > 1.08


def test_sharp_on_infiniband_pays_no_nvls_chunk_trips():
    """SHARP in the InfiniBand switches is no NVLS: no chunk round trips (and none on an
    NVSwitch multicast from one rank, NVLS+tree's last stage)."""
    data = yaml.safe_load((Path(__file__).parents[1] / "topologies" / "selene.yaml").read_text())
    data["fabric"]["in_network_reduction"] = True
    data["nodes"] = 2
    wi = WhatIf(topology_from_dict(data))
    ranks = np.arange(wi.fabric.nranks)
    assert wi.fabric.in_network_chunks(ranks, ranks, GIB) == 0
    nvl = WhatIf(load_topology("gb300-nvl72", nodes=2)).fabric
    assert nvl.in_network_chunks(np.array([0]), np.arange(4), GIB) == 0


def test_an_nvls_call_costs_nccls_nvls_latency_not_the_rings_hop():
    """A 1 KiB NVLS all-reduce on two GB300 trays: NCCL's NVLS latency (25 us, hwLat
    NVLINK/NVLS/Simple) plus its one chunk's route trip (1.5 us), engine and model alike; the
    ring's 3.4 us NVLink hop made it 5 us where the log measures 30 us at 512 KiB."""
    wi = WhatIf(load_topology("gb300-nvl72", nodes=2))
    sim, _ = wi.run("all_reduce", "in_network", 1024)
    pred = float(wi.cost_model("collsim").predict("all_reduce", "in_network", [1024])[0])
    assert pred == pytest.approx(sim.time_s, rel=1e-9)
    assert sim.time_s == pytest.approx(25e-6 + 1.5e-6, rel=0.01)


@pytest.mark.parametrize(
    ("nbytes", "nodes", "chunk"),
    [
        (GIB, 2, 128 * KIB),  # 4 x 32 channels x 32 heads x 128 KiB = 512 MiB
        (512 << 20, 2, 128 * KIB),
        ((512 << 20) - 1, 2, 64 * KIB),
        ((64 << 20) - 1, 2, 32 * KIB),  # 1 x 1024 x 64 KiB = 64 MiB
        (GIB, 4, 64 * KIB),  # NCCL_NVLSTREE_MAX_CHUNKSIZE: 64 KiB from four nodes on
    ],
)
def test_nvls_tree_chunk_follows_nccls_rule(nbytes, nodes, chunk):
    """``calcCollChunking`` for NVLS_TREE (32 channels, 32 heads): the 32-tray GB300 log's
    busbw jumps from 313 to 485 GB/s between 256 and 512 MiB, where the chunk doubles."""
    assert nvls_tree_chunk_bytes(nbytes, 32, 32, nodes) == chunk


def test_nvls_tree_pays_its_node_reduce_chunks_once_in_both_engines():
    """Two GB300 racks (32 trays): NVLS+tree's node reduce pays its chunks' route trips, so
    engine and model both take exactly that much longer than without (their gap, recorded for
    the pipeline's fill, stays what it was in microseconds)."""
    wi = WhatIf(load_topology("gb300-nvl72", nodes=32))
    model = wi.cost_model("collsim")
    node = np.arange(72)
    assert wi.fabric.in_network_chunks(node, node[:1], GIB) == GIB // (32 * 128 * KIB)
    assert wi.fabric.in_network_chunks(node[:1], node, GIB) == 0  # the multicast: once only
    serial_s = GIB // (32 * 128 * KIB) * 1.5e-6
    sim, _ = wi.run("all_reduce", "nvls_tree", GIB, channels=2)
    pred = float(model.predict("all_reduce", "nvls_tree", [GIB], channels=2)[0])
    structure = model.structure("all_reduce", "nvls_tree", channels=2)
    assert structure.serial_chunks is not None
    assert float(structure.serial_chunks.time_s(np.array([GIB]))[0]) == pytest.approx(serial_s)
    assert sim.time_s > serial_s and abs(pred - sim.time_s) < 0.03 * sim.time_s
