"""NCCL's algorithms across nodes: NVLS+tree, CollNet (SHARP) and PAT, enabled where NCCL does."""

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from collsim.cli import cli
from collsim.collectives.crossnode import head_ranks
from collsim.collectives.layout import RankLayout
from collsim.collectives.registry import build_schedule
from collsim.collectives.verify import verify
from collsim.metrics import busbw_gbps
from collsim.model.tuner import nccl_tuning
from collsim.topology.loader import load_topology, topology_from_dict
from collsim.whatif import WhatIf


@pytest.mark.parametrize("algorithm", ["nvls_tree", "collnet"])
@pytest.mark.parametrize(("n", "g", "channels"), [(16, 8, 1), (12, 4, 3), (20, 8, 2), (6, 2, 1)])
def test_schedules_compute_the_all_reduce(algorithm, n, g, channels):
    s = build_schedule("all_reduce", algorithm, nranks=n, count=1003, channels=channels,
                       layout=RankLayout.default(n, g), chunk_bytes=256)  # fmt: skip
    verify(s)


def test_heads_spread_over_a_node_and_a_partial_last_one():
    heads = head_ranks(RankLayout(nranks=128, ranks_per_node=72))  # 18 + 14 trays of 4 GPUs
    assert heads.shape == (2, 32)
    assert heads[0, :3].tolist() == [0, 2, 4] and heads[1, :3].tolist() == [72, 73, 75]


def test_two_dgx_h100_pick_nvls_tree_beyond_the_rings_nic_bound():
    """1 GiB over two DGX H100: the ring's busbw is capped by the NICs (8 x 50 GB/s); NVLS+tree
    sends each head's NIC only 1/8 of the buffer each way and goes past it, as NCCL does."""
    w = WhatIf(load_topology("dgx-h100", nodes=2))
    model = w.cost_model("collsim")
    size = 1 << 30
    tuning = nccl_tuning(model, "all_reduce", [size], elem_bytes=4)
    assert tuning.choice_at(0).algorithm == "nvls_tree"
    # NCCL's own channel count across DGX H100 nodes (model/nccl_channels.py: a channel per
    # NIC, doubled): at 1 GiB each channel's rate ceiling makes the most channels the fastest.
    assert tuning.choice_at(0).channels == 16
    t = float(tuning.best_s[0])
    assert busbw_gbps("all_reduce", 16, size, t) > 400.0
    ring = float(model.predict("all_reduce", "ring", [size], channels=16)[0])
    assert busbw_gbps("all_reduce", 16, size, ring) <= 400.0 * 1.001
    sim, _ = w.run("all_reduce", "nvls_tree", size, channels=1)  # the engine agrees on it
    assert busbw_gbps("all_reduce", 16, size, sim.time_s) > 400.0


def test_nvls_tree_at_1kib_is_its_latency_in_both_engines():
    """Small sizes: node reduce + tree edge up + down + multicast, each paying its latency
    once (the model and the engine charge the same route and hop latencies)."""
    w = WhatIf(load_topology("dgx-h100", nodes=2))
    sim, _ = w.run("all_reduce", "nvls_tree", 1024)
    pred = float(w.cost_model("collsim").predict("all_reduce", "nvls_tree", [1024])[0])
    assert pred == pytest.approx(sim.time_s, rel=1e-4)


def test_pat_at_one_gpu_per_node_small_sizes():
    """PAT's log2(n) network steps beat the ring's n - 1 at small sizes once n is large enough:
    at 32 single-GPU nodes (at 16 the ring's 15 LL steps still win over 4 Simple ones)."""
    w = WhatIf(load_topology("dgx-h100", nodes=32, gpus_per_node=1))
    assert "pat" in w.candidates("all_gather")
    tuning = nccl_tuning(w.cost_model("collsim"), "all_gather", [16 << 10], elem_bytes=4)
    assert tuning.choice_at(0).algorithm == "pat"
    assert "pat" not in WhatIf(load_topology("dgx-h100", nodes=2)).candidates("all_gather")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["all_reduce", "-t", "h100-4gpu-ib", "-a", "nvls_tree"], "NVLink SHARP in every node"),
        (["all_reduce", "-t", "dgx-h100", "--nodes", "1", "-a", "nvls_tree"], "several nodes"),
        (["all_reduce", "-t", "dgx-h100", "-a", "collnet"], "needs SHARP"),
        (["all_gather", "-t", "dgx-h100", "-a", "pat"], "one GPU per node"),
        (["all_reduce", "-t", "dgx-h100", "-a", "nvls_tree", "--protocol", "LL"], "Simple"),
    ],
)
def test_where_nccl_would_not_run_it_one_line_exit_2(args, says):
    result = CliRunner().invoke(cli, ["simulate", *args, "-b", "1M", "-e", "1M"])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in result.output


def _selene_with_sharp(nodes: int = 4):
    data = yaml.safe_load((Path(__file__).parents[2] / "topologies" / "selene.yaml").read_text())
    data["fabric"]["in_network_reduction"] = True  # Quantum HDR switches with SHARP enabled
    data["nodes"] = nodes
    return topology_from_dict(data)


def test_collnet_where_the_fabric_has_sharp():
    """SHARP on the InfiniBand fabric: CollNet Direct runs (heads reduce their node's slices,
    the switches all-reduce among the heads), both engines agree where no pipeline fills, and
    NCCL's choice at 1 GiB is CollNet; without SHARP it is not offered."""
    w = WhatIf(_selene_with_sharp())
    assert "collnet" in w.candidates("all_reduce")
    model = w.cost_model("collsim")
    for size in (1024, 1 << 20):  # latency-bound; one 128 KiB chunk per slice (8 heads)
        sim, _ = w.run("all_reduce", "collnet", size)
        pred = float(model.predict("all_reduce", "collnet", [size])[0])
        assert pred == pytest.approx(sim.time_s, rel=1e-3)
    tuning = nccl_tuning(model, "all_reduce", [1 << 30], elem_bytes=4)
    assert tuning.choice_at(0).algorithm == "collnet"
    assert "collnet" not in WhatIf(load_topology("selene", nodes=4)).candidates("all_reduce")


def test_two_dgx_h100_at_1gib_by_hand():
    """By hand: each GPU's NVLink port carries its whole buffer up to the NVSwitch (node reduce)
    and, as head of one slice in 8, that slice once more (multicast): (1 + 1/8) S at NVLS's
    85% of 450 GB/s. Each head's NIC carries S/8 each way (half its slices up, half down),
    at 50 GB/s: 2.68 ms, under the NVLink's 3.16 ms. The node reduce's NVLS chunks add one
    route trip (1.5 us) each: 1 GiB / 16 channels (Hopper) / 128 KiB = 512 (collsim.nvls). Both
    engines are within the pipeline's fill (32 chunks per slice, four stages) of that."""
    size = 1 << 30
    nvlink_s = (1 + 1 / 8) * size / (0.85 * 450e9) + 512 * 1.5e-6
    assert size / 8 / 50e9 < nvlink_s
    w = WhatIf(load_topology("dgx-h100", nodes=2))
    sim, _ = w.run("all_reduce", "nvls_tree", size, channels=8)
    pred = float(w.cost_model("collsim").predict("all_reduce", "nvls_tree", [size], channels=8)[0])
    for t in (sim.time_s, pred):
        assert nvlink_s <= t <= nvlink_s * (1 + 3 / 32)


def test_nvls_tree_runs_on_nccls_nvls_channels_only():
    """NCCL never sizes an NVLS+tree call down: ``topoGetAlgoInfo`` sets ``nc =
    comm->nvlsChannels`` (src/enqueue.cc, v2.26-v2.28), 32 on Blackwell across NVLink domains,
    16 on Hopper; the tuner offers no fewer (it had picked 8 on 32 GB300 trays at 64 MiB-2 GiB,
    12-27% faster than the log)."""
    gb = WhatIf(load_topology("gb300-nvl72", nodes=20)).cost_model("collsim")
    assert not gb.enabled("all_reduce", "nvls_tree", "Simple", 8)
    assert gb.enabled("all_reduce", "nvls_tree", "Simple", 32)
    h100 = WhatIf(load_topology("dgx-h100", nodes=2)).cost_model("collsim")
    assert not h100.enabled("all_reduce", "nvls_tree", "Simple", 8)
    assert h100.enabled("all_reduce", "nvls_tree", "Simple", 16)


def test_validate_on_two_gb300_racks_runs_nvls_tree_on_32_channels_at_every_size():
    log = (
        Path(__file__).parents[2]
        / "data/nccl-tests/logs/gb300-oci-nvl72-roce8x400-32n-all_reduce-1.txt"
    )
    res = CliRunner().invoke(cli, ["validate", "-t", "gb300-nvl72", "--nodes", "32", str(log)])
    assert res.exit_code == 0, res.output
    rows = [ln.split() for ln in res.output.splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(rows) == 16
    assert {r[-1] for r in rows} == {"nvls_tree/Simple/32ch"}
