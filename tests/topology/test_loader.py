"""Loading topologies: both formats give one spec; every kind of bad input is one clear line."""

import copy

import pytest
import yaml
from click.testing import CliRunner

from collsim.cli import cli
from collsim.errors import TopologyError
from collsim.topology.describe import to_explicit_yaml
from collsim.topology.loader import catalog_names, load_topology, topology_from_dict
from collsim.whatif import WhatIf

from .conftest import template


@pytest.mark.parametrize("duplex", [None, 0.6])
def test_template_and_its_explicit_export_give_the_same_spec(tmp_path, duplex):
    from collsim.topology.spec import with_duplex

    topo = load_topology("dgx-h100", nodes=2)
    if duplex is not None:  # links short of full duplex keep their shared capacity
        topo = with_duplex(topo, {"infiniband": duplex})
    path = tmp_path / "explicit.yaml"
    path.write_text(to_explicit_yaml(topo))
    again = load_topology(path)
    assert again.devices == topo.devices
    assert again.links == topo.links
    assert again.gpu == topo.gpu
    assert (again.nodes, again.gpus_per_node) == (2, 8)


def test_best_matmul_rate_is_measured_or_the_assumed_fraction_of_peak():
    from collsim.topology.spec import DEFAULT_MATMUL_FRACTION

    h100 = load_topology("dgx-h100", nodes=1).gpu
    assert h100.matmul_rate("bf16") == pytest.approx(794.5e12)
    assert h100.matmul_rate("fp8") == pytest.approx(1402.6e12)
    # no measurement for TF32: the lowest fraction its measured dtypes reach (FP8's)
    assert h100.matmul_rate("tf32") == pytest.approx(494.7e12 * 1402.6 / 1978.9)
    assert round(DEFAULT_MATMUL_FRACTION, 3) == 0.869
    text = CliRunner().invoke(cli, ["topo", "show", "dgx-h100"]).output
    assert "best matmul: 1403 fp8 (measured, 71% of peak), 794.5 bf16 (measured, 80%" in text
    # a GPU without measurements: the A100's fraction
    v100 = CliRunner().invoke(cli, ["topo", "show", "dgx1-v100"]).output
    assert "108.7 fp16 (assumed, 87% of peak)" in v100


def test_overrides_change_nodes_and_gpus():
    topo = topology_from_dict(template(), nodes=3, gpus_per_node=2)
    assert (topo.nodes, topo.gpus_per_node, topo.n_gpus) == (3, 2, 6)
    assert [g.name for g in topo.gpus][:3] == ["n0.gpu0", "n0.gpu1", "n1.gpu0"]


def test_catalog_has_at_least_fifteen_systems():
    assert len(catalog_names()) >= 15


def _mutate(doc, path, value):
    doc = copy.deepcopy(doc)
    *parents, last = path
    target = doc
    for key in parents:
        target = target[key]
    if value is _DELETE:
        del target[last]
    else:
        target[last] = value
    return doc


_DELETE = object()

# (what is wrong, mutation path, new value, words the one-line error must contain)
BAD_DOCS = [
    ("unknown key", ("node", "gpu"), 8, ["node.gpu", "unknown key", "did you mean 'gpus'"]),
    ("unknown nested key", ("fabric", "radx"), 8, ["fabric.radx", "did you mean 'radix'"]),
    ("missing field", ("gpu", "model"), _DELETE, ["gpu.model", "missing"]),
    ("missing section", ("node",), _DELETE, ["node", "missing"]),
    ("wrong type", ("node", "gpus"), "eight", ["node.gpus", "'eight'"]),
    ("wrong type list", ("gpu", "peak_tflops"), [1, 2], ["gpu.peak_tflops"]),
    ("zero bandwidth", ("node", "intra", "link", "bandwidth"), "0GB/s", ["bandwidth", "0GB/s"]),
    ("negative bandwidth", ("node", "nics", "link", "bandwidth"), "-5Gbps", ["-5Gbps"]),
    ("negative latency", ("node", "pcie", "latency"), "-1us", ["node.pcie.latency", "-1us"]),
    ("bad unit", ("gpu", "memory_bandwidth"), "3 furlongs", ["gpu.memory_bandwidth", "furlongs"]),
    ("unknown link kind", ("node", "intra", "link", "kind"), "nvlunk", ["nvlunk", "link kind"]),
    ("unknown fabric", ("fabric", "kind"), "hypercube", ["fabric.kind", "hypercube"]),
    ("zero nodes", ("nodes",), 0, ["nodes", "0"]),
    ("bad oversubscription", ("fabric", "oversubscription"), 0.5, ["oversubscription", "0.5"]),
    ("uneven NICs", ("node", "nics", "count"), 3, ["node.nics.count", "3"]),
    ("bad torus dims", ("fabric",), {"kind": "torus", "dims": [3, 3]}, ["fabric.dims", "[3, 3]"]),
    ("bad NIC path", ("node", "nics", "gpu_path"), "phx", ["node.nics.gpu_path", "'phx'"]),
    (
        "matmul above peak",
        ("gpu", "matmul_tflops"),
        {"bf16": 120},
        ["gpu.matmul_tflops", "120", "exceeds the peak (100)"],
    ),
    (
        "matmul without peak",
        ("gpu", "matmul_tflops"),
        {"fp8": 50},
        ["gpu.matmul_tflops", "'fp8'", "no peak_tflops entry", "has: bf16"],
    ),
]


@pytest.mark.parametrize(("what", "path", "value", "words"), BAD_DOCS, ids=[b[0] for b in BAD_DOCS])
def test_bad_template_gives_one_line_naming_field_and_value(tmp_path, what, path, value, words):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_mutate(template(), path, value)))
    result = CliRunner().invoke(cli, ["topo", "show", str(bad)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    assert str(bad) in lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])


def _explicit():
    return {
        "name": "pair",
        "gpu": template()["gpu"],
        "devices": [
            {"name": "g0", "kind": "gpu", "node": 0},
            {"name": "g1", "kind": "gpu", "node": 0},
            {"name": "sw", "kind": "pcie_switch", "node": 0},
        ],
        "links": [
            {"a": "g0", "b": "sw", "kind": "pcie", "bandwidth": "32GB/s", "latency": "1us"},
            {"a": "g1", "b": "sw", "kind": "pcie", "bandwidth": "32GB/s", "latency": "1us"},
        ],
    }


BAD_EXPLICIT = [
    ("link to nowhere", ("links", 1, "b"), "sw2", ["links.1.b", "'sw2'", "did you mean 'sw'"]),
    ("unknown device kind", ("devices", 2, "kind"), "router", ["devices.2.kind", "router"]),
    ("unreachable GPUs", ("links",), [], ["cannot reach", "g0"]),
    ("duplicate device", ("devices", 1, "name"), "g0", ["devices.1.name", "duplicate"]),
    ("self loop", ("links", 0, "b"), "g0", ["links.0.b", "two devices"]),
]


@pytest.mark.parametrize(
    ("what", "path", "value", "words"), BAD_EXPLICIT, ids=[b[0] for b in BAD_EXPLICIT]
)
def test_bad_explicit_graph(tmp_path, what, path, value, words):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_mutate(_explicit(), path, value)))
    result = CliRunner().invoke(cli, ["topo", "show", str(bad)])
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert "\n" not in line and str(bad) in line
    for word in words:
        assert word in line, (word, line)


def test_explicit_graph_loads_and_rejects_overrides(tmp_path):
    good = tmp_path / "pair.yaml"
    good.write_text(yaml.safe_dump(_explicit()))
    topo = load_topology(good)
    assert topo.n_gpus == 2 and not topo.is_template
    with pytest.raises(TopologyError, match="fixed size"):
        load_topology(good, nodes=2)
    # its own size may be restated (a sweep task names every topology's node count)
    assert load_topology(good, nodes=topo.nodes, gpus_per_node=topo.gpus_per_node).n_gpus == 2


def test_explicit_gpus_without_a_node_are_on_node_0(tmp_path):
    """A single machine's graph needs no node numbers (this used to crash in routing)."""
    data = _explicit()
    for dev in data["devices"]:
        dev.pop("node", None)
        dev.pop("index", None)
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(data))
    topo = load_topology(path)
    assert topo.nodes == 1 and topo.n_gpus == 2
    assert WhatIf(topo).run("all_reduce", "ring", 1 << 20)[0].time_s > 0


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("name: [unclosed\n", ["malformed YAML", "line"]),
        ("- just\n- a list\n", ["mapping"]),
        ("", ["mapping"]),
    ],
)
def test_malformed_yaml(tmp_path, text, words):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    result = CliRunner().invoke(cli, ["topo", "show", str(bad)])
    assert result.exit_code == 2
    assert str(bad) in result.output and "\n" not in result.output.strip()
    for word in words:
        assert word in result.output


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["topo", "show", "dgx-h100", "--nodes", "0"], ["--nodes", "0"]),
        (["topo", "show", "dgx-h100", "--gpus-per-node", "-2"], ["--gpus-per-node", "-2"]),
        (["topo", "show", "no-such-file.yaml"], ["no such topology file", "no-such-file.yaml"]),
        (["topo", "show", "dgx-h10"], ["did you mean 'dgx-h100'"]),
    ],
)
def test_bad_overrides_and_missing_files(args, words):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1
    for word in words:
        assert word in result.output
