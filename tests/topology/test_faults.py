"""What-if faults (collsim/topology/faults.py): parsing, applying, and their effect on the engine
and the analytic model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from collsim.cli import cli
from collsim.errors import TopologyError
from collsim.topology.faults import BACKGROUND_FLOOR, apply_faults, parse_fault
from collsim.topology.graph import Network
from collsim.topology.loader import load_topology, topology_from_dict
from collsim.whatif import WhatIf

BIG = 512 << 20
"""Large enough that bandwidth dominates latency."""


def _time(topology, collective="all_reduce", algorithm="ring", size=BIG, engine="des", **kw):
    return WhatIf(topology).sweep(collective, algorithm, [size], engine=engine, **kw).points[0]


@pytest.fixture(scope="module")
def h100():
    return load_topology("dgx-h100", nodes=4)


@pytest.fixture(scope="module")
def slow_nic():
    # n1.nic0 carries the ring's hop into node 1 (n0.gpu7 -> n1.gpu0)
    return load_topology("dgx-h100", nodes=4, faults=["nic:n1.nic0:bw=0.25"])


# -- syntax ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "link:n0.nic0-leaf0:bw=0.5,lat=+2us",
        "link:n0.nic0>leaf0:bw=0.5",
        "nic:n1.nic3:fail",
        "nic:n1.nic3:bw=0.25",
        "switch:spine1:fail",
        "gpu:n1.gpu3:slow=2",
        "background:leaf0-spine0:rate=12.5GB/s",
        "background:ring[2,3]:rate=50GB/s",
        "background:alltoall[0,2-3]:rate=25GB/s",
    ],
)
def test_canonical_text_round_trips(text):
    fault = parse_fault(text)
    assert parse_fault(fault.text) == fault


def test_units_are_parsed_by_the_units_module():
    assert parse_fault("link:a-b:lat=+2us").lat_s == pytest.approx(2e-6)
    assert parse_fault("background:a-b:rate=100Gbps").rate_bytes_per_s == pytest.approx(12.5e9)
    assert parse_fault("background:ring[1-3]:rate=1GB/s").nodes == (1, 2, 3)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("nik:n1.nic0:bw=0.5", ["did you mean 'nic'"]),
        ("nic:n1.nic0:bww=0.5", ["'bww'", "did you mean 'bw'"]),
        ("nic:n1.nic0:bw=2", ["from 1e-6 to 1"]),
        ("nic:n1.nic0:bw=1e-300", ["from 1e-6 to 1"]),
        ("gpu:n0.gpu0:slow=1e308", ["from 1 to 1e6"]),
        ("link:a-b:lat=+1e30us", ["from 0 to 10 s", "1e30us"]),
        ("background:ring[0,1]:rate=1e30GB/s", ["1kB/s to 10TB/s"]),
        ("background:ring[0,1]:rate=400000GB/s", ["reads as 400 TB/s", "1kB/s to 10TB/s"]),
        ("background:ring[0,1]:rate=100", ["100 has no unit", "100GB/s (800 Gbps)", "100Gbps"]),
        ("link:a-b:lat=+2", ["2 has no unit", "write 2us or 2ns"]),
        ("nic:n1.nic0", ["needs one of"]),
        ("link:n0.nic0-leaf0:lat=+2 fortnights", ["lat", "fortnights"]),
        ("background:ring[3]:rate=1GB/s", ["two nodes"]),
        ("nic:n1.nic0:fail,bw=0.5", ["no other parameters"]),
    ],
)
def test_syntax_errors_name_the_option_and_value(text, words):
    with pytest.raises(TopologyError) as err:
        parse_fault(text)
    line = str(err.value)
    assert "\n" not in line and "'--fault'" in line
    for word in words:
        assert word in line


@pytest.mark.parametrize(
    ("fault", "words"),
    [
        ("nic:n1.nic9:bw=0.5", ["no nic named 'n1.nic9'", "did you mean 'n1.nic"]),
        ("gpu:n1.gpu33:slow=2", ["'n1.gpu33'", "did you mean 'n1.gpu3"]),
        ("switch:spin1:fail", ["did you mean 'spine1'"]),
        ("link:n1.nic0-leaf3:bw=0.5", ["no link between n1.nic0 and leaf3", "n1.nic0-leaf0"]),
        ("link:n1.nic0-lef0:bw=0.5", ["'lef0'", "did you mean"]),
        ("background:ring[2,9]:rate=1GB/s", ["no node 9"]),
        ("nic:n1.gpu0:bw=0.5", ["is a gpu, not a nic"]),
    ],
)
def test_unknown_names_give_did_you_mean(h100, fault, words):
    with pytest.raises(TopologyError) as err:
        apply_faults(h100, [parse_fault(fault)])
    for word in words:
        assert word in str(err.value)


# -- the spec and graph ----------------------------------------------------------------------------


def test_faults_in_the_file_equal_faults_on_the_command_line(h100):
    from collsim.topology.loader import CATALOG_DIR

    data = yaml.safe_load((CATALOG_DIR / "dgx-h100.yaml").read_text())
    data["faults"] = [
        {"nic": "n1.nic0", "bw": 0.25},
        {"link": "leaf0-spine0", "lat": "+2us"},
        "gpu:n1.gpu3:slow=2",
    ]
    from_file = topology_from_dict(data, nodes=4, file=str(CATALOG_DIR / "dgx-h100.yaml"))
    cli_ = load_topology(
        "dgx-h100",
        nodes=4,
        faults=["nic:n1.nic0:bw=0.25", "link:leaf0-spine0:lat=+2us", "gpu:n1.gpu3:slow=2"],
    )
    assert from_file == cli_
    assert from_file.faults == cli_.faults and len(cli_.faults) == 3
    assert from_file != h100


def test_degrade_and_direction(h100):
    one_way = load_topology("dgx-h100", nodes=4, faults=["link:n0.nic0>leaf0:bw=0.5,lat=+2us"])
    net, base = Network(one_way), Network(h100)
    fwd = net.link_names.index("n0.nic0->leaf0")
    back = net.link_names.index("leaf0->n0.nic0")
    assert net.capacity_bytes_per_s[fwd] == pytest.approx(0.5 * base.capacity_bytes_per_s[fwd])
    assert net.latency_s[fwd] == pytest.approx(base.latency_s[fwd] + 2e-6)
    assert net.capacity_bytes_per_s[back] == base.capacity_bytes_per_s[back]
    assert net.latency_s[back] == base.latency_s[back]
    # a degraded link is not routed around (routing costs the nominal bandwidth)
    assert net.route("n0.gpu0", "n1.gpu0").devices == base.route("n0.gpu0", "n1.gpu0").devices


def test_slow_gpu_figures(h100):
    topo = load_topology("dgx-h100", nodes=4, faults=["gpu:n1.gpu3:slow=2"])
    assert topo.gpu.peak_flops["bf16"] == pytest.approx(h100.gpu.peak_flops["bf16"] / 2)
    speeds = {d.name: d.speed for d in topo.devices if d.kind == "gpu"}
    assert speeds["n1.gpu3"] == 1.0 and speeds["n0.gpu0"] == 2.0
    from collsim.topology.fabric import TopologyFabric

    fab = TopologyFabric(Network(topo))
    healthy = TopologyFabric(Network(h100))
    slow = topo.gpus.index(topo.device("n1.gpu3"))
    assert fab.reduce_bytes_per_s[slow] == pytest.approx(healthy.reduce_bytes_per_s[slow] / 2)
    assert fab.reduce_bytes_per_s[0] == pytest.approx(healthy.reduce_bytes_per_s[0])


# -- effects -----------------------------------------------------------------------------------


def test_one_slow_nic_slows_every_rank_of_a_ring(h100, slow_nic):
    healthy, _ = WhatIf(h100).run("all_reduce", "ring", BIG)
    faulty, _ = WhatIf(slow_nic).run("all_reduce", "ring", BIG)
    ratio = faulty.time_s / healthy.time_s
    # one channel moves 38.7 GB/s (an H100 channel's rate), under the NIC's 50: at a quarter of
    # the NIC (12.5 GB/s) the ring takes ~38.7 / 12.5 = 3.1x at large sizes
    assert 2.9 < ratio <= 38.7 / 12.5
    # every rank finishes late, not only node 1's
    assert np.all(faulty.rank_finish_s > 2.0 * healthy.rank_finish_s.max())


def test_hierarchical_degrades_differently_from_ring_and_tree(h100, slow_nic):
    ratios = {
        alg: _time(slow_nic, algorithm=alg).time_s / _time(h100, algorithm=alg).time_s
        for alg in ("ring", "tree", "hierarchical")
    }
    assert all(r > 1.25 for r in ratios.values()), ratios
    # hierarchical crosses the slow NIC with fewer bytes than a flat ring
    assert abs(ratios["ring"] - ratios["hierarchical"]) > 0.5, ratios
    # ring and tree are both pipelines paced by their slowest link: the slow NIC at a quarter
    # rate slows both about 4x at large sizes (the tree's head on that NIC carries its share)
    assert ratios["tree"] == pytest.approx(4.0, rel=0.05), ratios


def test_engine_and_analytic_agree_on_a_faulty_uncontended_case(slow_nic):
    faulty = apply_faults(slow_nic, [parse_fault("link:leaf0-spine0:lat=+3us")])
    for size in (1 << 20, BIG):
        des = _time(faulty, size=size).time_s
        analytic = _time(faulty, size=size, engine="analytic").time_s
        assert analytic == pytest.approx(des, rel=0.02)


def _two_nic_system(faults=()):
    """Two nodes, one GPU each behind a PCIe switch with a fast and a slow NIC."""
    devices = [{"name": "sw", "kind": "switch"}]
    links = []
    for n in range(2):
        devices += [
            {"name": f"n{n}.gpu0", "kind": "gpu", "node": n},
            {"name": f"n{n}.pcie", "kind": "pcie_switch", "node": n},
            {"name": f"n{n}.fast", "kind": "nic", "node": n},
            {"name": f"n{n}.slow", "kind": "nic", "node": n},
        ]
        links += [
            {"a": f"n{n}.gpu0", "b": f"n{n}.pcie", "kind": "pcie", "bandwidth": "64GB/s"},
            {"a": f"n{n}.pcie", "b": f"n{n}.fast", "kind": "pcie", "bandwidth": "64GB/s"},
            {"a": f"n{n}.pcie", "b": f"n{n}.slow", "kind": "pcie", "bandwidth": "64GB/s"},
            {"a": f"n{n}.fast", "b": "sw", "kind": "infiniband", "bandwidth": "400Gbps"},
            {"a": f"n{n}.slow", "b": "sw", "kind": "infiniband", "bandwidth": "100Gbps"},
        ]
    data = {
        "name": "two-nics",
        "gpu": {"model": "X", "peak_tflops": {"bf16": 100}, "memory": "40GB",
                "memory_bandwidth": "1000GB/s"},
        "devices": devices,
        "links": links,
        "faults": list(faults),
    }  # fmt: skip
    return topology_from_dict(data)


def test_a_failed_nic_reroutes_and_the_collective_still_completes():
    healthy = _two_nic_system()
    failed = _two_nic_system(["nic:n1.fast:fail"])
    assert "n1.fast" in Network(healthy).route("n0.gpu0", "n1.gpu0").devices
    assert "n1.slow" in Network(failed).route("n0.gpu0", "n1.gpu0").devices
    ratio = _time(failed).time_s / _time(healthy).time_s
    assert ratio == pytest.approx(4.0, rel=0.05)  # 400 -> 100 Gbps


def test_a_partition_names_the_unreachable_gpus(h100):
    with pytest.raises(TopologyError) as err:
        apply_faults(h100, [parse_fault("switch:leaf0:fail")])
    line = str(err.value)
    assert "switch:leaf0:fail" in line and "unreachable" in line
    assert "n1.gpu0" in line and "n0.gpu1" not in line and "\n" not in line
    with pytest.raises(TopologyError, match=r"n1\.gpu0"):
        _two_nic_system(["nic:n1.fast:fail", "nic:n1.slow:fail"])


def test_a_slow_gpu_slows_reductions(h100):
    slow = apply_faults(h100, [parse_fault("gpu:n1.gpu3:slow=100")])
    # a reduction-bound all-reduce slows; an all-gather (no reductions) barely moves
    reduce_ratio = _time(slow).time_s / _time(h100).time_s
    gather_ratio = (
        _time(slow, collective="all_gather").time_s / _time(h100, collective="all_gather").time_s
    )
    assert reduce_ratio > 2.0
    assert gather_ratio < 1.05
    assert _time(slow, engine="analytic").time_s == pytest.approx(_time(slow).time_s, rel=0.02)


def test_background_traffic_on_a_link_slows_a_collective_crossing_it(h100):
    loaded = load_topology("dgx-h100", nodes=4, faults=["background:n1.nic0-leaf0:rate=37.5GB/s"])
    ratio = _time(loaded).time_s / _time(h100).time_s
    # 50 GB/s - 37.5 GB/s leaves 12.5 for the ring's one channel, which moves 38.7 healthy
    assert 2.9 < ratio <= 38.7 / 12.5
    # a link the ring does not cross: no change
    elsewhere = load_topology("dgx-h100", nodes=4, faults=["background:n1.nic5-leaf5:rate=40GB/s"])
    assert _time(elsewhere).time_s == _time(h100).time_s


def test_background_never_below_the_floor(h100):
    topo = load_topology("dgx-h100", nodes=4, faults=["background:n1.nic0>leaf0:rate=1000GB/s"])
    net, base = Network(topo), Network(h100)
    i = net.link_names.index("n1.nic0->leaf0")
    assert net.capacity_bytes_per_s[i] == pytest.approx(
        BACKGROUND_FLOOR * base.capacity_bytes_per_s[i]
    )


def test_background_pattern_is_routed_and_removed_from_capacity(h100):
    topo = load_topology("dgx-h100", nodes=4, faults=["background:ring[0,1]:rate=25GB/s"])
    net, base = Network(topo), Network(h100)
    # the other job's ring crosses n0.nic7 -> leaf7 once (n0.gpu7 -> n1.gpu0): 25 of 50 GB/s left
    i = net.link_names.index("n0.nic7->leaf7")
    assert net.capacity_bytes_per_s[i] == pytest.approx(0.5 * base.capacity_bytes_per_s[i])
    assert _time(topo).time_s > 1.5 * _time(h100).time_s


# -- CLI -------------------------------------------------------------------------------------------


def test_cli_states_the_faults_and_json_is_deterministic(tmp_path):
    args = ["simulate", "all_reduce", "-t", "dgx-h100", "--nodes", "2", "-a", "ring",
            "-b", "1M", "-e", "2M", "--fault", "nic:n1.nic0:bw=0.25",
            "--fault", "gpu:n0.gpu1:slow=2"]  # fmt: skip
    outs = []
    for k in range(2):
        path = tmp_path / f"out{k}.json"
        result = CliRunner().invoke(cli, [*args, "--json", str(path)])
        assert result.exit_code == 0, result.output
        assert "# faults: nic:n1.nic0:bw=0.25; gpu:n0.gpu1:slow=2" in result.output
        outs.append(path.read_bytes())
    assert outs[0] == outs[1]
    assert json.loads(outs[0])["faults"] == ["nic:n1.nic0:bw=0.25", "gpu:n0.gpu1:slow=2"]


def test_cli_bad_fault_is_one_line_exit_2():
    result = CliRunner().invoke(
        cli, ["simulate", "all_reduce", "-t", "dgx-h100", "--fault", "nic:n1.nic9:fail"]
    )
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "did you mean" in result.output
    assert "Traceback" not in result.output


def test_step_takes_faults():
    base = ["step", "-w", "gpt-1.3b-ddp", "-t", "dgx-h100", "--nodes", "2"]
    healthy = CliRunner().invoke(cli, base)
    slow = CliRunner().invoke(cli, [*base, "--fault", "gpu:n1.gpu3:slow=2"])
    assert healthy.exit_code == 0 and slow.exit_code == 0, slow.output
    assert "# faults: gpu:n1.gpu3:slow=2" in slow.output
    assert slow.output != healthy.output


def test_sweep_compares_healthy_and_faulty(tmp_path):
    from collsim.sweep.spec import spec_from_dict
    from collsim.sweep.tasks import run_task

    spec = spec_from_dict(
        {
            "topologies": ["dgx-h100"],
            "nodes": [4],
            "collectives": ["all_reduce"],
            "algorithms": ["ring"],
            "sizes": ["512M"],
            "engines": ["analytic"],
            "faults": [[], ["nic:n1.nic0:bw=0.25"]],
        }
    )
    assert [t.faults for t in spec.tasks] == [(), ("nic:n1.nic0:bw=0.25",)]
    rows = [run_task(t)[1].strip().split(",") for t in spec.tasks]
    from collsim.sweep.tasks import COLUMNS

    col = COLUMNS.index("time_us")
    assert float(rows[1][col]) > 2.9 * float(rows[0][col])  # 38.7 (one channel) vs 12.5 GB/s
    assert rows[1][COLUMNS.index("faults")] == "nic:n1.nic0:bw=0.25"


@pytest.mark.parametrize(
    "second",
    ["switch:spine0:fail", "link:leaf0-spine0:fail", "link:leaf0-spine0:bw=0.5",
     "link:spine0>leaf0:lat=+1us", "background:leaf0-spine0:rate=100Gbps"],
)  # fmt: skip
def test_a_fault_on_what_an_earlier_failure_removed_says_so(second):
    """The second fault looked up a switch (or its link) the first had removed: 'no switch
    named spine0; did you mean spine30?', for a name the user had spelled right."""
    topo = load_topology("dgx-h100")
    first = parse_fault("switch:spine0:fail")
    assert apply_faults(topo, [first]) is not topo
    with pytest.raises(TopologyError, match=r"gone: an earlier fault \(switch:spine0:fail\)"):
        apply_faults(topo, [first, parse_fault(second)])
