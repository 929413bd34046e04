"""Per-channel limits: channel counts change results as on hardware, in the engine and the model
alike, and the tuner offers NCCL's own channel count (issue 28, deliverable 3).

Hand-computed figures: an H100 channel moves 38.7 GB/s (``tuning.cc`` ``perChMaxTreeBws``,
Hopper, one node; :mod:`collsim.channel_rates`), a DGX H100 GPU's NVLink port 450 GB/s, so a ring
all-reduce's busbw is ``min(450, C x 38.7)`` GB/s (less its per-step latency, under 1% at 1 GiB).
A point-to-point channel over the network moves 14 GB/s (``P2P_PER_CHANNEL_NET_BW``).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from click.testing import CliRunner

from collsim.channel_rates import P2P_NET_GBPS, SIMPLE_GBPS
from collsim.cli import cli
from collsim.metrics import bus_factor
from collsim.model.nccl_channels import nccl_channels
from collsim.model.tuner import nccl_channel_options, nccl_choices
from collsim.topology.loader import load_topology
from collsim.whatif import WhatIf

GIB = 1 << 30
HOPPER = SIMPLE_GBPS["hopper"]
runner = CliRunner()


@pytest.fixture(scope="module")
def dgx() -> WhatIf:
    return WhatIf(load_topology("dgx-h100", nodes=1))


def _busbw_gbps(collective: str, size: int, time_s: float, n: int) -> float:
    return size / time_s * bus_factor(collective, n) / 1e9


@pytest.mark.parametrize("channels", [1, 4, 8, 16, 24])
def test_dgx_h100_ring_all_reduce_busbw_follows_the_channel_count(dgx, channels) -> None:
    """1, 4, 8 channels: C x 38.7 GB/s busbw; 16 and 24 fill the 450 GB/s port. Engine and
    model agree."""
    sim, _ = dgx.run("all_reduce", "ring", GIB, channels=channels)
    busbw = _busbw_gbps("all_reduce", GIB, sim.time_s, 8)
    assert busbw == pytest.approx(min(450.0, channels * HOPPER), rel=0.02)
    pred = float(dgx.cost_model("collsim").predict("all_reduce", "ring", [GIB],
                                                   channels=channels)[0])  # fmt: skip
    assert pred == pytest.approx(sim.time_s, rel=0.01)


def test_simulate_channels_changes_the_intra_node_busbw() -> None:
    """``collsim simulate --channels`` shows it: 1 < 4 < 8 < 16 channels inside a DGX H100."""
    got = []
    for channels in (1, 4, 8, 16):
        result = runner.invoke(cli, ["simulate", "all_reduce", "-t", "dgx-h100", "--nodes", "1",
                                     "-a", "ring", "-b", "1G", "-e", "1G",
                                     "--channels", str(channels)])  # fmt: skip
        assert result.exit_code == 0, result.output
        row = next(line for line in result.output.splitlines() if line.strip().startswith("1073"))
        got.append(float(row.split()[7]))
    assert got[0] < got[1] < got[2] < got[3]
    assert got[0] == pytest.approx(HOPPER, rel=0.01)


def test_nccl_channel_counts_follow_its_search() -> None:
    """NCCL's counts (search, duplication, postset; p2p per peer): 24 in one DGX H100 / A100,
    16 across nodes, 2 on a PCIe server; per peer 32 inside one H100 node, then
    max(NICs, ceil(50 / 14)) = 4 across two nodes and fewer as the peers grow (12 nodes: 1)."""
    one = nccl_channels(load_topology("dgx-h100", nodes=1))
    assert (one.collective, one.p2p, one.p2p_per_peer) == (24, 32, 32)
    assert nccl_channels(load_topology("dgx-a100", nodes=1)).collective == 24
    two = nccl_channels(load_topology("dgx-h100", nodes=2))
    assert (two.collective, two.p2p, two.p2p_per_peer) == (16, 16, 4)
    assert nccl_channels(load_topology("dgx-h100", nodes=12)).p2p_per_peer == 1
    assert nccl_channels(load_topology("a100-pcie-2gpu")).collective == 2
    assert nccl_channels(load_topology("hgx-b200", nodes=1)).collective == 32


def test_the_tuner_offers_and_picks_nccls_channel_count(dgx) -> None:
    """The NCCL-like choice ranks 1, 8 and NCCL's 24 channels, and takes 24 for a large ring
    all-gather (only 24 channels fill the port); sendrecv's candidates are the per-peer count."""
    model = dgx.cost_model("collsim")
    assert nccl_channel_options(model, "all_gather") == (1, 8, 24)
    assert nccl_channel_options(model, "sendrecv") == (1, 8, 32)
    (choice,) = nccl_choices(model, "all_gather", [GIB], elem_bytes=4)
    assert choice.channels == 24
    result = runner.invoke(cli, ["tune", "all_gather", "-t", "dgx-h100", "--nodes", "1",
                                 "-b", "1G", "-e", "1G"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "1, 8 or 24 channels" in result.output
    assert re.search(r"ring\s+Simple\s+24", result.output)


def test_sendrecv_over_the_network_runs_at_its_channels_p2p_rate() -> None:
    """Two GPUs on two DGX H100 nodes (a 400 Gb/s NIC between them): one point-to-point channel
    moves 14 GB/s, 4 fill the NIC (4 x 14 > 50; NCCL gives a DGX H100's network peer
    max(1 NIC, ceil(50 / 14)) = 4); a ring all-gather's channel over the same NIC is a
    collective's, 38.7 GB/s. Engine and model agree."""
    assert nccl_channels(load_topology("dgx-h100", nodes=2)).p2p_per_peer == 4
    w = WhatIf(load_topology("dgx-h100", nodes=2, gpus_per_node=1))
    model = w.cost_model("collsim")
    rates = {}
    for channels in (1, 4):
        sim, _ = w.run("sendrecv", "p2p", GIB, channels=channels)
        rates[channels] = GIB / sim.time_s / 1e9
        pred = float(model.predict("sendrecv", "p2p", [GIB], channels=channels)[0])
        assert pred == pytest.approx(sim.time_s, rel=0.01)
    assert rates[1] == pytest.approx(P2P_NET_GBPS, rel=0.01)
    assert rates[4] == pytest.approx(50.0, rel=0.02)
    sim, _ = w.run("all_gather", "ring", GIB)
    assert _busbw_gbps("all_gather", GIB, sim.time_s, 2) == pytest.approx(HOPPER, rel=0.01)


def test_alltoall_spreads_its_channels_over_the_peers(dgx) -> None:
    """Inside a DGX H100, 7 channels give each of the 7 peers one (7 x 38.7 = 271 GB/s out of each
    GPU); NCCL's 32 point-to-point channels give each peer 32/7 and fill the 450 GB/s port."""
    model = dgx.cost_model("collsim")
    out = {}
    for channels in (7, 32):
        sim, _ = dgx.run("alltoall", "direct", GIB, channels=channels)
        out[channels] = GIB * 7 / 8 / sim.time_s / 1e9
        pred = float(model.predict("alltoall", "direct", [GIB], channels=channels)[0])
        assert pred == pytest.approx(sim.time_s, rel=0.01)
    assert out[7] == pytest.approx(7 * HOPPER, rel=0.02)
    assert out[32] == pytest.approx(450.0, rel=0.02)
    assert np.isclose(nccl_channel_options(model, "alltoall")[-1], 32)
