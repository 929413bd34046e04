"""What-if sweeps and `collsim simulate`: nccl-tests rows, JSON, traces, auto, bad input."""

import json
from functools import lru_cache

import pytest
from click.testing import CliRunner

from collsim.channel_rates import SIMPLE_GBPS
from collsim.cli import cli
from collsim.collectives.registry import COLLECTIVES, algorithms_for, needs_in_network
from collsim.dtypes import dtype_bytes
from collsim.model.tuner import nccl_channel_options
from collsim.topology.loader import catalog_names, load_topology
from collsim.whatif import WhatIf, element_count

runner = CliRunner()


def test_element_count_rounds_like_nccl_tests():
    assert element_count("all_reduce", 1000, 4, 8) == 250
    assert element_count("all_gather", 1000, 4, 8) == 248
    assert element_count("alltoall", 8, 4, 8) == 0
    assert dtype_bytes("bfloat16") == 2 and dtype_bytes("double") == 8


def test_sizes_that_round_to_one_count_are_one_row():
    """-b 0 -e 8 on floats: 0, 1 and 2 bytes are all the empty call; one row for it. An empty
    call launches nothing (NCCL returns at once for count 0), so it takes no time."""
    w = WhatIf(load_topology("dgx-h100", nodes=1))
    rows = w.sweep("all_reduce", "auto", [0, 1, 2, 4, 8], engine="analytic").points
    assert [r.size_bytes for r in rows] == [0, 4, 8]
    assert rows[0].time_s == 0 and rows[1].time_s > 0
    # a requested size that rounds to no element is empty too, on every engine and model
    for engine, model in (("des", "collsim"), ("analytic", "collsim"), ("analytic", "nccl")):
        rows = w.sweep("all_gather", "ring", [8, 64], engine=engine, model=model).points
        assert rows[0].count == 0 and rows[0].time_s == 0 and rows[1].time_s > 0


def test_ring_all_reduce_inside_one_dgx_matches_the_closed_form():
    # 8 GPUs on one NVSwitch: every ring step crosses gpu->nvswitch->gpu, uncontended, at the
    # one channel's rate (an H100 channel's 38.7 GB/s, below the 450 GB/s link).
    topo = load_topology("dgx-h100", nodes=1)
    whatif = WhatIf(topo)
    size = 64 << 20
    sweep = whatif.sweep("all_reduce", "ring", [size], protocol="Simple")
    n = 8
    link = topo.links[0]
    rate = min(link.bandwidth_bytes_per_s, SIMPLE_GBPS["hopper"] * 1e9)
    route_s = 2 * link.latency_s + topo.device("n0.nvswitch").latency_s
    alpha = max(route_s, 3.4e-6)  # Simple's NVLink hwLat covers this route's latency
    expected = 2 * (n - 1) * (alpha + size / n / rate)
    assert sweep.points[0].time_s == pytest.approx(expected, rel=1e-9)
    assert sweep.points[0].busbw_gbps == pytest.approx(
        size / expected / 1e9 * 2 * (n - 1) / n, rel=1e-9
    )


def test_oversubscribed_fabric_is_slower():
    import yaml

    from collsim.topology.loader import CATALOG_DIR, topology_from_dict

    doc = yaml.safe_load((CATALOG_DIR / "dgx-h100.yaml").read_text())
    doc["fabric"].update(kind="fat_tree", radix=16)
    times = {}
    for ratio in (1, 3):
        doc["fabric"]["oversubscription"] = ratio
        whatif = WhatIf(topology_from_dict(doc, nodes=4))
        # on NCCL's 16 point-to-point channels: one channel's rate would hide the fabric
        times[ratio] = whatif.sweep("alltoall", "direct", [64 << 20], channels=16).points[0].time_s
    assert times[3] > 1.15 * times[1]  # part of the traffic stays inside a leaf or a node


@lru_cache(maxsize=4)
def _catalog_whatif(name: str) -> WhatIf:
    return WhatIf(load_topology(name))


@pytest.mark.parametrize(
    ("name", "collective"), [(n, c) for n in catalog_names() for c in COLLECTIVES]
)
def test_every_collective_and_algorithm_runs_on_every_catalog_system(name, collective):
    """One test per system and collective (a parallel run spreads the large systems)."""
    whatif = _catalog_whatif(name)
    topo = whatif.topology
    in_net = any(d.in_network_reduction for d in topo.devices)
    if collective == "sendrecv" and topo.n_gpus < 2:
        return
    for algorithm in algorithms_for(collective):
        if needs_in_network(algorithm) and not in_net:
            continue
        try:
            sweep = whatif.sweep(collective, algorithm, [4096, 1 << 20])
        except Exception as exc:  # in-network across nodes without SHARP, PAT with several GPUs
            # per node: a clean error saying why NCCL would not run it here
            assert needs_in_network(algorithm) or whatif.why_not(collective, algorithm), (
                collective, algorithm, exc,
            )  # fmt: skip
            continue
        assert all(p.time_s > 0 for p in sweep.points), (collective, algorithm)
        assert all(p.busbw_gbps >= 0 for p in sweep.points)


def test_auto_picks_the_fastest_algorithm():
    whatif = WhatIf(load_topology("dgx-h100", nodes=2))
    auto = whatif.sweep("all_reduce", "auto", [1024, 256 << 20])
    for point in auto.points:
        for algo in whatif.candidates("all_reduce"):
            try:
                one = whatif.sweep("all_reduce", algo, [point.size_bytes]).points[0]
            except Exception:
                continue
            assert point.time_s <= one.time_s * (1 + 1e-12)


@pytest.mark.parametrize(
    ("name", "nodes", "collective"),
    [("dgx-h100", 2, "all_reduce"), ("dgx-a100", 2, "all_gather"), ("p4d", 2, "alltoall"),
     ("rtx4090-4gpu-pcie", 1, "broadcast")],
)  # fmt: skip
def test_tuned_runs_nccls_choice_which_is_never_slower_than_the_default(name, nodes, collective):
    """--tuned: per size the fastest of NCCL's algorithms x default protocols x 1, 8 or NCCL's
    channel count; on
    the cost model that can never lose to the default (NCCL's algorithm, Simple, 1 channel),
    which is one of its candidates."""
    from collsim.collectives.registry import NCCL_ALGORITHMS

    whatif = WhatIf(load_topology(name, nodes=nodes))
    sizes = [8, 64 << 10, 8 << 20, 512 << 20]
    tuned = whatif.sweep(collective, "auto", sizes, engine="analytic", tuned=True)
    default = NCCL_ALGORITHMS[collective][0]
    plain = whatif.sweep(collective, default, sizes, engine="analytic")
    assert tuned.tuned and tuned.protocol is None and tuned.channels is None
    assert not plain.tuned and (plain.protocol, plain.channels) == ("Simple", 1)
    for t, p in zip(tuned.points, plain.points, strict=True):
        assert t.algorithm in NCCL_ALGORITHMS[collective]
        offered = nccl_channel_options(whatif.cost_model("collsim"), collective)
        assert t.protocol in ("LL", "LL128", "Simple") and t.channels in offered
        assert t.time_s <= p.time_s * (1 + 1e-12), (t, p)
    # small messages take a low-latency protocol, the largest its full bandwidth -- except where
    # every step waits for host staging (no P2P on the RTX 4090s: ~4 us per route, more than
    # LL's 1 us hwLat), so LL saves nothing there and Simple's full bandwidth wins at 64 KiB
    if name != "rtx4090-4gpu-pcie":
        assert tuned.points[1].protocol != "Simple"  # 64 KiB (8 B is empty on 16 ranks)
    assert tuned.points[-1].busbw_gbps >= plain.points[-1].busbw_gbps


def test_tuned_takes_more_channels_where_the_model_prices_them_alike():
    """NCCL's own model gives a ring the same time on 1 and 8 channels; NCCL still runs 8 and
    the engine must time 8, not one channel through one NIC (at most 38.7 GB/s, an H100
    channel's rate; 8 reach 250 GB/s)."""
    whatif = WhatIf(load_topology("dgx-h100", nodes=2))
    point = whatif.sweep("all_reduce", "auto", [128 << 20], tuned=True, model="nccl").points[0]
    assert point.channels == 8 and point.busbw_gbps > 200


def test_simulate_tuned_prints_and_writes_each_sizes_choice(tmp_path):
    out = tmp_path / "t.json"
    args = ["simulate", "all_reduce", "-t", "dgx-h100", "--nodes", "2", "--tuned", "-b", "8",
            "-e", "256M", "-f", "32", "--json", str(out)]  # fmt: skip
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "protocol and channels per size as NCCL's tuner picks them" in result.output
    rows = [ln.split() for ln in result.output.splitlines() if ln.startswith("  ")]
    doc = json.loads(out.read_text())
    assert len(rows) == len(doc["points"]) == 6
    for row, p in zip(rows, doc["points"], strict=True):
        assert row[-1] == f"{p['algorithm']}/{p['protocol']}/{p['channels']}ch"
    assert doc["tuned"] is True and doc["protocol"] is None and doc["channels"] is None
    # 256 MiB over 2 DGX H100s: NVLS+tree, whose slices leave by all eight NICs, beyond the
    # ring's 400 GB/s NIC bound; on NCCL's 16 NVLS thread blocks (NVLS_NCHANNELS_SM90), which
    # NCCL runs NVLS+tree on at every size (enqueue.cc: nc = comm->nvlsChannels), though
    # collsim's fixed-chunk pipeline times 8 faster (engine 856 us on 8, 897 us on 16)
    last = doc["points"][-1]
    assert last["algorithm"] == "nvls_tree" and last["channels"] == 16
    assert last["busbw_gbps"] > 400


def test_simulate_cli_table_json_and_trace(tmp_path):
    out, trace = tmp_path / "r.json", tmp_path / "t.json"
    args = ["simulate", "all_reduce", "-t", "dgx-h100", "--nodes", "2", "-a", "ring", "-b", "8",
            "-e", "1M", "-f", "4", "--json", str(out), "--trace", str(trace)]  # fmt: skip
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "algbw" in result.output and "busbw" in result.output
    assert "bottleneck links" in result.output
    doc = json.loads(out.read_text())
    assert doc["collective"] == "all_reduce" and doc["ranks"] == 16 and doc["nodes"] == 2
    assert [p["bytes"] for p in doc["points"]] == [8, 32, 128, 512, 2048, 8192, 32768,
                                                   131072, 524288]  # fmt: skip
    for p in doc["points"]:
        assert set(p) >= {"bytes", "time_us", "algbw_gbps", "busbw_gbps"}
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["simulate", "all_reduce", "-t", "dgx-h100", "-a", "bogus"], ["algorithm", "bogus"]),
        (["simulate", "all_reduce", "-t", "dgx-a100", "-a", "in_network"], ["in_network"]),
        (["simulate", "all_reduce", "-t", "dgx-h100", "-b", "1G", "-e", "8"], ["larger than"]),
        (["simulate", "all_reduce", "-t", "dgx-h100", "-b", "8X"], ["-b", "8X"]),
        (["simulate", "all_reduce", "-t", "dgx-h100", "-d", "float7"], ["--datatype", "float7"]),
        (["simulate", "all_reduce", "-t", "dgx-h100", "--channels", "0"], ["channels", "0"]),
        (
            ["simulate", "all_reduce", "-t", "dgx-h100", "--tuned", "-a", "ring"],
            ["algorithm", "ring", "picks the algorithm itself"],
        ),
        (
            ["simulate", "all_reduce", "-t", "dgx-h100", "--tuned", "--chunk-bytes", "1M"],
            ["chunk_bytes", "NCCL's own chunking"],
        ),
    ],
)
def test_simulate_bad_input_is_one_line(args, words):
    result = runner.invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    for word in words:
        assert word in result.output, (word, result.output)


def test_the_count_column_is_what_nccl_tests_prints():
    """all_gather, reduce_scatter and alltoall print the per-rank count (as the bundled
    h100-snellius-1n4g reduce_scatter log does: 65536 floats for 1 MiB on 4 ranks)."""
    args = ["simulate", "reduce_scatter", "-t", "h100-4gpu-ib", "--nodes", "1", "-a", "ring",
            "-b", "1M", "-e", "1M", "--engine", "analytic"]  # fmt: skip
    row = [
        ln for ln in CliRunner().invoke(cli, args).output.splitlines() if ln.strip()[:1].isdigit()
    ]
    assert row[0].split()[:2] == ["1048576", "65536"]
    whole = CliRunner().invoke(cli, ["simulate", "all_reduce", *args[2:]]).output
    assert any(ln.split()[:2] == ["1048576", "262144"] for ln in whole.splitlines())
    bad = CliRunner().invoke(cli, [*args, "-f", "nan"])
    assert bad.exit_code == 2 and "finite" in bad.output


@pytest.mark.parametrize("engine", ["des", "analytic"])
def test_a_deep_pipeline_fills(engine):
    """A chain over 64 nodes (63 hops) broadcasting 16 GiB runs near its links' bound (g4dn's
    50 Gb/s EFA at host-staged EFA's 0.5, 3.125 GB/s): the buffer is cut into enough chunks to
    fill the pipeline (it was capped at 64: 51%)."""
    w = WhatIf(load_topology("g4dn-efa", nodes=64))
    sweep = w.sweep("broadcast", "chain", [16 << 30], engine=engine)
    assert sweep.points[0].busbw_bound_gbps == pytest.approx(3.125)
    assert sweep.points[0].busbw_gbps > 0.9 * sweep.points[0].busbw_bound_gbps
