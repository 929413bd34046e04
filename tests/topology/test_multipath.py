"""Multipath routing (``routing: spray`` / ``adaptive``): hand-computed rates on small fabrics,
the engine and the analytic model alike, and nothing changed where a route is one path."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from collsim.cli import main
from collsim.collectives.schedule import ScheduleBuilder
from collsim.engine import simulate
from collsim.model.flows import FlowCosts
from collsim.model.params import DEFAULT_PARAMS
from collsim.topology.describe import to_explicit_yaml
from collsim.topology.fabric import TopologyFabric
from collsim.topology.graph import Network
from collsim.topology.loader import CATALOG_DIR, load_topology, topology_from_dict
from collsim.transports import transport_for
from collsim.whatif import WhatIf

MB = 1 << 20


def _gpu(name: str, node: int) -> dict:
    return {"name": name, "kind": "gpu", "node": node}


def _fat_tree(routing: str | None, *, uplink: str = "100GB/s") -> dict:
    """Two leaves of two GPUs each (100 GB/s ports), both leaves joined to two spines."""
    devices = [_gpu(f"g{i}", i) for i in range(4)]
    devices += [{"name": n, "kind": "switch"} for n in ("leaf0", "leaf1", "spine0", "spine1")]
    links = [{"a": f"g{i}", "b": f"leaf{i // 2}", "kind": "roce", "bandwidth": "100GB/s"}
             for i in range(4)]  # fmt: skip
    links += [{"a": f"leaf{i}", "b": f"spine{j}", "kind": "roce", "bandwidth": uplink}
              for i in range(2) for j in range(2)]  # fmt: skip
    doc = {"name": "ft", "gpu": _GPU, "devices": devices, "links": links}
    if routing is not None:
        doc["routing"] = routing
    return doc


def _dragonfly(routing: str) -> dict:
    """One dragonfly group of four routers, all-to-all at 25 GB/s; a GPU on r0 and one on r1,
    each on a 100 GB/s port: the pair has the direct r0-r1 link and detours via r2 and r3."""
    devices = [_gpu("g0", 0), _gpu("g1", 1)]
    devices += [{"name": f"r{i}", "kind": "switch"} for i in range(4)]
    links = [{"a": "g0", "b": "r0", "kind": "slingshot", "bandwidth": "100GB/s"},
             {"a": "g1", "b": "r1", "kind": "slingshot", "bandwidth": "100GB/s"}]  # fmt: skip
    links += [{"a": f"r{i}", "b": f"r{j}", "kind": "slingshot", "bandwidth": "25GB/s"}
              for i in range(4) for j in range(i + 1, 4)]  # fmt: skip
    return {"name": "df", "gpu": _GPU, "devices": devices, "links": links, "routing": routing}


_GPU = {"model": "X", "peak_tflops": {"bf16": 100}, "memory": "80GB", "memory_bandwidth": "1TB/s"}


def _flows(pairs: list[tuple[int, int]], nbytes: int, nranks: int):
    """One transfer per (src, dst) pair, all starting together."""
    builder = ScheduleBuilder()
    for src, dst in pairs:
        builder.transfer(src, dst, nbytes // 4, "input", 0, "output", 0)
    return builder.build("sendrecv", "direct", nranks, nbytes // 4, 4)


def _rates(doc: dict, pairs: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, str]:
    """Each transfer's payload rate (bytes/s) on the engine and on the analytic flow model."""
    fabric = TopologyFabric(Network(topology_from_dict(doc)))
    result = simulate(_flows(pairs, 64 * MB, fabric.nranks), fabric)
    tr = result.transfers
    engine = tr.bytes / (tr.end_s - tr.flow_start_s)
    costs = FlowCosts(fabric, DEFAULT_PARAMS, DEFAULT_PARAMS.protocol("Simple"))
    src, dst = (np.array(x) for x in zip(*pairs, strict=True))
    model = 1.0 / costs.wave(src, dst).s_per_byte
    return engine, model, result.meta["engine_path"]


def test_spray_gives_one_flow_both_spines_where_ecmp_gives_one():
    """Up-links at half the ports' rate: hashed onto one spine a flow gets 50 GB/s, sprayed
    over both it gets its port's 100 GB/s (the engine and the model)."""
    for routing, expected in (("ecmp", 50e9), ("spray", 100e9), ("adaptive", 100e9)):
        engine, model, _ = _rates(_fat_tree(routing, uplink="50GB/s"), [(0, 2)])
        assert engine == pytest.approx([expected], rel=1e-9), routing
        assert model == pytest.approx([expected], rel=1e-9), routing


def test_two_flows_collide_under_ecmp_and_not_under_spray():
    """Two flows from one leaf to the other on 100 GB/s links: hashed onto the same spine they
    get half the rate each, onto different ones full rate; sprayed, each half of each flow
    shares a spine with half of the other: full rate, whatever a hash would pick."""
    pairs = [(0, 2), (1, 3)]
    net = Network(topology_from_dict(_fat_tree("ecmp")))
    spines = {net.gpu_route(s, d).devices[2] for s, d in pairs}
    ecmp = 100e9 if len(spines) == 2 else 50e9
    engine, model, _ = _rates(_fat_tree("ecmp"), pairs)
    assert engine == pytest.approx([ecmp] * 2, rel=1e-9)
    assert model == pytest.approx([ecmp] * 2, rel=1e-9)
    engine, model, path = _rates(_fat_tree("spray"), pairs)
    assert engine == pytest.approx([100e9] * 2, rel=1e-9)
    assert model == pytest.approx([100e9] * 2, rel=1e-9)
    assert path == "replay"  # a split flow's sub-flows share its port: the replay shares them


def test_ecmp_collides_somewhere_on_the_fat_tree():
    """Of the four cross-leaf pairings, hashing puts some two flows of one leaf on one spine
    (what spraying avoids): the case the test above guards is real, not hypothetical."""
    net = Network(topology_from_dict(_fat_tree("ecmp")))
    spine = {(s, d): net.gpu_route(s, d).devices[2] for s in (0, 1) for d in (2, 3)}
    assert any(spine[(0, a)] == spine[(1, b)] for a in (2, 3) for b in (2, 3) if a != b)


def test_adaptive_dragonfly_pair_uses_the_direct_link_and_two_detours():
    """r0 -> r1: the direct link (two lanes: one hop) and the detours via r2 and r3 (one lane
    each: two hops), a quarter of the bytes per lane. The direct link's two lanes share its
    25 GB/s, so the flow takes (S/2) / 25 GB/s: 50 GB/s, twice the 25 GB/s of ecmp's one path.
    Every detour crosses two router links, and the shares sum to 1."""
    net = Network(topology_from_dict(_dragonfly("adaptive")))
    paths = net.paths_index(net.index["g0"], net.index["g1"])
    names = sorted(tuple(net.link_names[k] for k in links) for links, _ in paths)
    assert names == [("g0->r0", "r0->r1", "r1->g1")] * 2 + [
        ("g0->r0", "r0->r2", "r2->r1", "r1->g1"),
        ("g0->r0", "r0->r3", "r3->r1", "r1->g1"),
    ]
    assert [w for _, w in paths] == [0.25] * 4
    assert paths[0][0] == net.gpu_route(0, 1).links  # the usual route first (its latency)
    for routing, expected in (("ecmp", 25e9), ("adaptive", 50e9)):
        engine, model, _ = _rates(_dragonfly(routing), [(0, 1)])
        assert engine == pytest.approx([expected], rel=1e-9), routing
        assert model == pytest.approx([expected], rel=1e-9), routing


def test_link_bytes_count_each_path_share():
    """A sprayed flow puts half its bytes on each spine's links (the engine's link records)."""
    doc = _fat_tree("spray")
    fabric = TopologyFabric(Network(topology_from_dict(doc)))
    result = simulate(_flows([(0, 2)], 64 * MB, fabric.nranks), fabric)
    by_name = dict(zip(result.links.name, result.links.bytes, strict=True))
    assert by_name["g0->leaf0"] == pytest.approx(64 * MB)
    assert by_name["leaf0->spine0"] == pytest.approx(32 * MB)
    assert by_name["leaf0->spine1"] == pytest.approx(32 * MB)


def test_one_path_routes_are_unchanged():
    """Where routing yields one path (dmodk, ecmp, or spray inside one leaf), the engine's
    answer is bit for bit the single-path one, on its contention-free fast path."""
    doc = yaml.safe_load((CATALOG_DIR / "roce-100g.yaml").read_text())
    results = {}
    for routing in (None, "ecmp", "spray"):
        doc["fabric"]["routing"] = routing
        whatif = WhatIf(topology_from_dict(doc, nodes=2))  # both nodes on one leaf
        assert not np.any(np.diff(whatif.fabric.paths(np.r_[0, 8], np.r_[8, 0])[0]) > 1)
        sim, _ = whatif.run("all_reduce", "ring", 4 * MB)
        results[routing] = sim
    for routing in ("ecmp", "spray"):
        assert results[routing].time_s == results[None].time_s
        assert results[routing].meta["engine_path"] == "contention_free"
    assert results["spray"].meta["engine_path"] == "contention_free"


def test_gh200_slingshot_ring_grows_with_channels_to_the_nics():
    """The issue's case: 8 nodes on two dragonfly routers. With one path between the routers a
    ring all-reduce stayed at 25 GB/s busbw whatever the channels; routed adaptively its
    busbw grows with the channels up to the four 25 GB/s NICs a node drives (at the share of
    the line rate the CXI transport attains), on the engine and the analytic model alike
    (within 1%)."""
    whatif = WhatIf(load_topology("gh200-slingshot", nodes=8))
    assert whatif.topology.routing == "adaptive"
    model = whatif.cost_model("collsim")
    busbw = {}
    for channels in (1, 2, 4, 8):
        sim, _ = whatif.run("all_reduce", "ring", 64 * MB, channels=channels)
        pred = float(model.predict("all_reduce", "ring", [64 * MB], channels=channels)[0])
        assert pred == pytest.approx(sim.time_s, rel=0.01)
        busbw[channels] = 2 * 31 / 32 * 64 * MB / sim.time_s / 1e9
    nic = 25.0 * transport_for("slingshot", None).bandwidth_fraction  # CXI's share of 25 GB/s
    assert busbw[1] < nic * 1.02
    assert busbw[2] > 1.9 * busbw[1]
    assert busbw[4] > 3.3 * nic and busbw[8] > 3.5 * nic
    assert busbw[8] <= 4 * nic


def test_topo_show_prints_the_routing(capsys, tmp_path):
    for name, words in (("gh200-slingshot", "adaptive"), ("p4d", "spray"),
                        ("dgx-h100", "dmodk"), ("roce-100g", "ecmp")):  # fmt: skip
        with pytest.raises(SystemExit) as info:
            main(["topo", "show", name])
        assert info.value.code in (0, None)
        line = [x for x in capsys.readouterr().out.splitlines() if "routing:" in x]
        assert line and words in line[0], name
    doc = _fat_tree(None)
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(SystemExit):
        main(["topo", "show", str(path)])
    assert "not given: by link kind (roce ecmp)" in capsys.readouterr().out


def test_export_keeps_the_routing():
    """``topo export`` writes the routing, so the explicit graph loads back to the same spec."""
    topo = load_topology("gh200-slingshot")
    again = topology_from_dict(yaml.safe_load(to_explicit_yaml(topo)))
    assert again.routing == "adaptive"


def test_every_catalog_fabric_says_its_routing_and_why():
    for path in sorted(CATALOG_DIR.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        fabric = doc.get("fabric")
        if not fabric or fabric.get("kind", "none") == "none":
            continue
        assert fabric.get("routing") in ("ecmp", "dmodk", "spray", "adaptive"), path.name
        assert f"Routing {fabric['routing']}:" in fabric["source"], path.name
