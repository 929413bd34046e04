"""NCCL's ring-vs-tree choice for an all-reduce across nodes, from its own tuning table on its own
graphs (collsim/model/nccl_choice.py), and the tuner, `tune` and the log predictor following it."""

import numpy as np
import pytest
from click.testing import CliRunner

from collsim.calibration.predict import Predictor, uncalibrated_params
from collsim.cli import cli
from collsim.model.nccl import tune_table
from collsim.model.nccl_channels import nccl_graph
from collsim.model.nccl_choice import (
    follow_nccl,
    graph_inputs,
    nccl_all_reduce_algorithms,
    tree_bw_intra_gbps,
)
from collsim.model.tuner import Tuner, nccl_tuning
from collsim.topology.loader import load_topology
from collsim.whatif import WhatIf

GIB = 1 << 30
runner = CliRunner()


def test_polaris_graph_is_one_24_gbps_channel_per_nic_and_the_tree_doubles_it():
    topo = load_topology("polaris", nodes=2)
    graph = nccl_graph(topo)
    # two 200 Gb/s NICs (25 GB/s): speedArrayInter's 24 fits once per NIC; under 25, no dup
    assert (graph.channels, graph.speed_gbps) == (2, 24.0)
    # search.cc raises the tree's bwIntra 24 -> 28 -> 30 -> 48 (twice bwInter): NVLink carries it
    assert tree_bw_intra_gbps(graph, 80) == 48.0


def test_polaris_two_nodes_table_by_hand_ring_beats_capped_tree():
    topo = load_topology("polaris", nodes=2)
    graph = nccl_graph(topo)
    ring = graph_inputs(topo, graph, "ring", ll128=False)
    tree = graph_inputs(topo, graph, "tree", ll128=False)
    # ring: 2 channels x 24 GB/s x nRanks / nsteps = 48 x 8 / 14
    assert tune_table(ring, "all_reduce", "ring", "Simple")[1] == pytest.approx(48 * 8 / 14)
    # tree: min(0.92 x 2 x 48, 2 x perChMaxTreeBw 23.6 (Ampere, 2 nodes)) / 2
    assert tune_table(tree, "all_reduce", "tree", "Simple")[1] == pytest.approx(23.6)
    picks = nccl_all_reduce_algorithms(topo, graph, np.array([8, GIB]), ("LL", "Simple"))
    assert list(picks) == ["tree", "ring"]  # the tree's latency small, the ring's rate large


@pytest.mark.parametrize("name", ["h100-4gpu-ib", "p4d"])
def test_two_node_tree_stays_where_nccl_cap_does_not_bind(name):
    topo = load_topology(name, nodes=2)
    graph = nccl_graph(topo)
    picks = nccl_all_reduce_algorithms(topo, graph, np.array([GIB]), ("LL", "LL128", "Simple"))
    assert list(picks) == ["tree"]


def test_tuner_follows_nccl_pick_not_collsims_fastest():
    whatif = WhatIf(load_topology("polaris", nodes=2))
    model = whatif.cost_model("collsim")
    fastest = Tuner(model, channels=(4,)).tune("all_reduce", [GIB], algorithms=["ring", "tree"])
    assert fastest.choice_at(0).algorithm == "tree"  # collsim times the tree faster...
    followed = follow_nccl(fastest, whatif.topology, whatif.network)
    choice = followed.choice_at(0)
    assert choice.algorithm == "ring"  # ... NCCL runs the ring
    ring = fastest.times_s[[c.algorithm == "ring" for c in fastest.choices], 0]
    assert followed.best_s[0] == pytest.approx(ring.min())
    assert nccl_tuning(model, "all_reduce", [GIB], elem_bytes=4).choice_at(0).algorithm == "ring"


def test_follow_nccl_leaves_one_node_and_other_collectives_alone():
    whatif = WhatIf(load_topology("polaris", nodes=1))
    model = whatif.cost_model("collsim")
    one = Tuner(model).tune("all_reduce", [8, GIB], algorithms=["ring", "tree"])
    assert follow_nccl(one, whatif.topology, whatif.network) is one
    two = WhatIf(load_topology("polaris", nodes=2))
    gather = Tuner(two.cost_model("collsim")).tune("all_gather", [GIB])
    assert follow_nccl(gather, two.topology, two.network) is gather


def test_predictor_runs_polaris_two_node_all_reduce_on_the_ring():
    pred = Predictor(WhatIf(load_topology("polaris", nodes=2)), uncalibrated_params())
    t, labels = pred.predict("all_reduce", np.array([GIB]), nccl_version="2.21.5")
    assert labels[0].startswith("ring/Simple")
    # the log's 36.6 GB/s busbw (a100-polaris-slingshot-2n-all_reduce-1.txt) within 5%
    busbw = GIB / t[0] / 1e9 * 2 * 7 / 8
    assert busbw == pytest.approx(36.6, rel=0.05)


def test_tune_cli_shows_the_ring_at_large_sizes_on_two_polaris_nodes():
    result = runner.invoke(cli, ["tune", "all_reduce", "-t", "polaris", "--nodes", "2",
                                 "-b", "1G", "-e", "1G"])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines() if not line.startswith("#")][1:]
    assert rows[-1][2:4] == ["ring", "Simple"]


def test_nccl_algo_setting_still_wins_over_the_table():
    pred = Predictor(WhatIf(load_topology("polaris", nodes=2)), uncalibrated_params())
    _, labels = pred.predict("all_reduce", np.array([GIB]), env={"NCCL_ALGO": "Tree"},
                             nccl_version="2.21.5")  # fmt: skip
    assert labels[0].startswith("tree/")
