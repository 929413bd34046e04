"""NCCL baseline: hand-computed values from NCCL's published formulas (src/graph/tuning.cc,
revision b6475625, v2.19-2.21), and the mapping from collsim topologies."""

import numpy as np
import pytest

from collsim.errors import ScheduleError
from collsim.model.analytic import AnalyticModel
from collsim.model.nccl import (
    NcclInputs,
    NcclModel,
    algo_time_us,
    compute_capability,
    ll128_by_default,
)
from collsim.model.tuner import nccl_tuning
from collsim.topology.loader import catalog_names, load_topology


def test_ring_simple_all_reduce_two_nodes_hopper():
    # nsteps 2(16-1)=30, nInterSteps 2*2=4; busBw = 2 ch x 20 GB/s, algBw = 40*16/30.
    # lat = baseLat 8.4 + 26 x max(hwLat NVL 3.4, netOverhead 1*3) + 4 x hwLat NET 14 = 152.8 us,
    # x1.4 ring plateau (1 MiB / (2 ch x 16 ranks) >= 64, compCap >= 80) = 213.92 us.
    inp = NcclInputs(n_ranks=16, n_nodes=2, comp_cap=90, n_channels=2, bw_intra_gbps=20.0,
                     bw_inter_gbps=20.0)  # fmt: skip
    got = algo_time_us(inp, "all_reduce", "ring", "Simple", np.array([1 << 20]))[0]
    assert got == pytest.approx(213.92 + 1048576 / (1000 * 40 * 16 / 30), rel=1e-12)
    assert got == pytest.approx(263.072, rel=1e-9)


def test_tree_ll_all_reduce_one_ampere_node():
    # busBw = min(4 x 24 x .92, 4 x perChMaxTreeBw 24.0) = 88.32; LL: min(/3.8, llMaxBw 87.7);
    # algBw = x.5; treeCorrectionFactor[LL][log2(4096>>6)=6] = .7.
    # lat = baseLat 6.8 + 2 x (7 x hwLat NVL tree LL 0.6 + 0) = 15.2 us.
    inp = NcclInputs(n_ranks=8, n_nodes=1, comp_cap=80, n_channels=4, bw_intra_gbps=24.0,
                     bw_inter_gbps=24.0)  # fmt: skip
    got = algo_time_us(inp, "all_reduce", "tree", "LL", np.array([4096]))[0]
    assert got == pytest.approx(15.2 + 4096 / (1000 * (96 * 0.92 / 3.8 * 0.5 * 0.7)), rel=1e-12)
    assert got == pytest.approx(15.70352, rel=1e-6)


def test_ring_ll128_all_gather_four_hopper_nodes():
    # nNodes > 2: bwInter; busBw = min(8 x 12 x .92, 8 x perChMaxRingLL128Bw 36.7) = 88.32,
    # algBw = x 32/31; lat = baseLat 14 + 28 x max(1.9, 1.0) + 3 x 4.0 = 79.2 us.
    inp = NcclInputs(n_ranks=32, n_nodes=4, comp_cap=90, n_channels=8, bw_intra_gbps=40.0,
                     bw_inter_gbps=12.0)  # fmt: skip
    got = algo_time_us(inp, "all_gather", "ring", "LL128", np.array([64 << 20]))[0]
    assert got == pytest.approx(79.2 + (64 << 20) / (1000 * 96 * 0.92 * 32 / 31), rel=1e-12)
    assert got == pytest.approx(815.29275, rel=1e-6)


def test_compute_capability_mapping():
    assert compute_capability("H100 SXM5 80GB") == 90
    assert compute_capability("A100 SXM4 40GB") == 80
    assert compute_capability("Tesla V100 SXM2 32GB") == 70


@pytest.mark.parametrize("name", catalog_names())
def test_nccl_model_on_every_catalog_system(name):
    model = NcclModel(load_topology(name))
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"):
        for algo in model.candidates(coll):
            t = model.predict(coll, algo, [1024, 1 << 20, 1 << 30])  # all non-empty
            assert np.all(t > 0) and np.all(np.diff(t) > 0), (coll, algo)


def test_nccl_model_rejects_algorithms_nccl_does_not_have():
    model = NcclModel(load_topology("dgx-h100", nodes=2))
    with pytest.raises(ScheduleError, match="no estimate"):
        model.predict("all_reduce", "rhd", [1024])


def test_nccl_model_counts_every_nic_of_a_node_across_nodes():
    """NCCL's channels leave a node through different NICs, so nChannels x bwInter is the
    node's whole network bandwidth (8 x 400G on a DGX H100), as a ring's busbw across nodes is
    measured (~370 GB/s). bwInter was one GPU's NIC / channels, which put NCCL's own ring at
    50 GB/s on 16 nodes; and the validation baseline priced NCCL on one channel, so its
    per-channel caps (tree, LL128) bound at one channel's worth."""
    model = NcclModel(load_topology("dgx-h100", nodes=16))
    size = 8 << 30
    t = float(model.predict("all_reduce", "ring", [size], channels=8)[0])
    busbw = size / t / 1e9 * 2 * 127 / 128
    assert 300 < busbw <= 400
    from collsim.calibration.predict import Predictor

    pred = Predictor.wrap(model, "nccl")
    t_pred, _ = pred.predict("all_reduce", np.array([size]))
    assert float(t_pred[0]) == pytest.approx(t, rel=1e-9)
    # the tree, capped per channel (perChMaxTreeBw), is priced on more than one channel
    tree1 = float(model.predict("all_reduce", "tree", [size], channels=1)[0])
    tree8 = float(model.predict("all_reduce", "tree", [size], channels=8)[0])
    assert tree8 < tree1 / 4


def test_ll128_across_nodes_needs_the_nic_behind_pcie_switches():
    """tuning.cc (v2.21.5): LL128 only where typeInter <= PATH_PXB (or PXN on Hopper, whose
    peer needs PXB itself); a single-node graph keeps PATH_PIX."""
    assert ll128_by_default(True, 80, multi_node=True, nic_gpu_path="pxb")
    assert not ll128_by_default(True, 80, multi_node=True, nic_gpu_path="phb")
    assert not ll128_by_default(True, 90, multi_node=True, nic_gpu_path="sys")
    assert ll128_by_default(True, 80, multi_node=False, nic_gpu_path="phb")
    assert not ll128_by_default(False, 80, multi_node=False, nic_gpu_path="pix")


def test_polaris_runs_no_ll128_across_nodes_but_does_inside_one():
    """ALCF Polaris' NICs sit behind the host bridge (PHB in its affinity table): NCCL's model
    and collsim's both drop LL128 across nodes, and keep it inside one node."""
    two = load_topology("polaris", nodes=2)
    assert two.nic_gpu_path == "phb"
    assert not NcclModel(two).enabled("all_reduce", "ring", "LL128", 4)
    assert not AnalyticModel(two).enabled("all_reduce", "ring", "LL128", 4)
    one = load_topology("polaris", nodes=1)
    assert NcclModel(one).enabled("all_reduce", "ring", "LL128", 4)
    assert AnalyticModel(one).enabled("all_reduce", "ring", "LL128", 4)
    # the catalog's other systems keep the default (a NIC under the GPU's PCIe switch)
    assert AnalyticModel(load_topology("dgx-a100", nodes=2)).enabled("all_gather", "ring", "LL128")


def test_the_tuner_never_picks_ll128_across_polaris_nodes():
    """Every candidate the tuner weighs on two Polaris nodes is LL or Simple (LL128 was its pick
    for all_gather at >= 256 MiB before the rule)."""
    got = nccl_tuning(AnalyticModel(load_topology("polaris", nodes=2)), "all_gather",
                      [1 << 12, 1 << 20, 1 << 28], elem_bytes=4)  # fmt: skip
    protocols = {c.protocol for c in got.choices}
    assert protocols and "LL128" not in protocols
