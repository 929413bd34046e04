"""Concurrent groups on shared NICs: the share of the network each group's collectives get."""

from __future__ import annotations

import pytest

from collsim.topology.graph import Network
from collsim.topology.loader import load_topology
from collsim.training.comm import make_timer
from collsim.training.layout import resolve_layout
from collsim.training.sharing import concurrent_groups, link_share
from collsim.training.workload import workload_from_dict
from tests.training._step_fixtures import evaluate, gpt


def _share(topology, parallel, kind, n=None):
    w = workload_from_dict(gpt(global_batch=64, micro_batch=1, parallel=parallel))
    lay = resolve_layout(w, n or topology.n_gpus)
    names = [g.name for g in topology.gpus]
    return link_share(concurrent_groups(lay, names, kind), Network(topology))


def test_two_gpus_per_nic_halve_each_data_parallel_group():
    """roce-100g: 8 GPUs, 4 NICs (each with its PCIe path). With TP 8 inside the node the 8 DP
    groups leave each node through 4 NICs, two groups a NIC; with a NIC per GPU and NVSwitch
    (DGX H100) each has its own links."""
    roce, dgx = load_topology("roce-100g", nodes=2), load_topology("dgx-h100", nodes=2)
    assert _share(roce, {"tp": 8}, "dp") == 2.0
    assert _share(dgx, {"tp": 8}, "dp") == 1.0
    assert _share(dgx, {"tp": 2}, "dp") == 1.0
    assert _share(roce, {"tp": 8}, "tp") == 1.0  # TP inside the node: alone
    # TP 4: all 4 DP rings cross the node's 62.4 GB/s socket link, which stays faster than each
    # ring's NIC share: the NIC, shared by 2, sets it (the engine running all 4 at once: x1.69)
    assert _share(roce, {"tp": 4}, "dp") == 2.0
    # 8 PCIe GPUs, TP 4: the 4 DP rings' socket crossings do limit them (engine: x3.03)
    box = load_topology("rtx3090-8gpu-pcie", nodes=1)
    assert _share(box, {"tp": 4}, "dp") == pytest.approx(3.03, abs=0.01)


def test_pipeline_sends_of_every_tp_rank_share_the_nics():
    topo = load_topology("roce-100g", nodes=2)
    assert _share(topo, {"tp": 8, "pp": 2}, "pp") == 2.0


def _dp_step(tp: int):
    """A 1.3B GPT with TP ``tp`` on 2 roce-100g nodes, DP not overlapped: its step, the analytic
    timer, rank 0's DP group and its gradient bytes (16-bit, the default reduce type)."""
    data = gpt(model={"layers": 24, "hidden": 2048, "heads": 16, "vocab": 50257,
                      "seq_len": 2048, "flash_attention": True},
               global_batch=64, micro_batch=1, training={"dp_overlap": False},
               parallel={"tp": tp})  # fmt: skip
    topo = load_topology("roce-100g", nodes=2)
    names = [g.name for g in topo.gpus]
    res = evaluate(topo, data)
    return res, make_timer("analytic", topo), names[::tp], res.details["params_per_gpu"] * 2


def test_the_step_times_data_parallel_traffic_at_the_share():
    """8 GPUs x 0.33 GB of gradients leave a roce-100g node through 4 x 12.5 GB/s: twice what
    one DP group alone on its NIC takes."""
    res, timer, dp, size = _dp_step(8)
    alone = timer.time_s("all_reduce", dp, size)
    shared = timer.time_s("all_reduce", dp, size, share=2.0)
    assert shared == pytest.approx(2 * alone, rel=0.05)
    assert res.breakdown["dp_comm"] == pytest.approx(shared, rel=0.01)


def test_sibling_rings_through_the_same_pcie_switches_share_them():
    """TP 2 on roce-100g: a DP group has 4 GPUs a node, and its ring inside the node crosses the
    PCIe switch uplinks the sibling group's ring crosses too (the engine running both groups at
    once takes 1.7x one alone; a review measured it): the step's DP time reflects it."""
    res, timer, dp, size = _dp_step(2)
    assert res.breakdown["dp_comm"] > 1.6 * timer.time_s("all_reduce", dp, size)


def test_the_des_engine_takes_the_share_too():
    topo = load_topology("roce-100g", nodes=2)
    names = [g.name for g in topo.gpus]
    timer = make_timer("des", topo)
    alone = timer.time_s("all_reduce", [names[0], names[8]], 256e6)
    shared = timer.time_s("all_reduce", [names[0], names[8]], 256e6, share=2.0)
    assert shared == pytest.approx(2 * alone, rel=0.05)
