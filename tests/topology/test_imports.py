"""``collsim topo import`` on real NCCL dumps, nvidia-smi matrices and ibnetdiscover scans
(``imports_data/README.md`` names each file's source), and ``collsim topo diff``."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from collsim.cli import cli
from collsim.errors import TopologyError
from collsim.topology.describe import describe
from collsim.topology.diff import topology_diff
from collsim.topology.imports.files import ImportRequest, import_files, sniff
from collsim.topology.imports.ibnet import fabric_section, read_ibnetdiscover
from collsim.topology.imports.inventory import pcie_bytes_per_s
from collsim.topology.loader import load_topology, topology_from_dict
from collsim.whatif import WhatIf

DATA = Path(__file__).parent / "imports_data"
runner = CliRunner()

# file: (GPUs, model, intra kind, NVLink/PCIe GB/s per GPU, NICs, NIC GB/s, NIC of each GPU)
KNOWN = {
    "nccl_ibmcloud_gx3d_h100_8gpu_topo.xml": (
        8, "H100 SXM5 80GB", "nvswitch", 450.0, 8, 25.0, [0, 1, 2, 3, 4, 5, 6, 7]),
    "nccl_yccl_h800_8gpu_topo.xml": (
        8, "H800 SXM5 80GB", "nvswitch", 200.0, 8, 50.0, [0, 1, 2, 3, 4, 5, 6, 7]),
    "nccl_yccl_l20_topo.xml": (
        16, "L20 48GB", "pcie", 31.5077, 8, 50.0, [i // 2 for i in range(16)]),
    "nccl_panlichen_rtx3090_8gpu_topo.xml": (
        8, "GeForce RTX 3090 24GB", "explicit", 31.5077, 1, 7.0, [0] * 8),
    "nccl_rwkvinllama_rtx4090_2gpu_topo.xml": (
        2, "GeForce RTX 4090 24GB", "pcie", 31.5077, 2, 12.5, [0, 1]),
    "nccl_yccl_a6000_4gpu_topo.xml": (4, "RTX A6000 48GB", "pcie", 15.7538, 2, 0.125, [0, 0, 1, 1]),
    "nccl_azure_ncv4-topo.xml": (4, "A100 PCIe 80GB", "pcie", 15.7538, 1, 12.5, [0, 0, 0, 0]),
}  # fmt: skip


def _import(*files, **options):
    request = ImportRequest("imported", **options)
    doc = import_files([str(DATA / f) for f in files], request)
    return doc, topology_from_dict(doc)


@pytest.mark.parametrize("file", sorted(KNOWN))
def test_real_dumps_import_with_their_known_structure(file):
    gpus, model, intra, intra_gbps, nics, nic_gbps, affinity = KNOWN[file]
    doc, topo = _import(file)
    info = describe(topo)
    assert info["gpus"] == gpus and info["gpu"]["model"] == model
    assert info["intra_fabric"].split()[0] == intra
    assert info["intra_bandwidth_gbps_per_gpu"] == pytest.approx(intra_gbps, rel=1e-4)
    assert info["devices"]["nic"] == nics
    kind = doc["node"]["nics"]["link"]["kind"] if "node" in doc else None
    rates = {r for k, v in info["links"].items() if k == kind or kind is None for r in v[
        "bandwidth_gbps"]} if kind else None  # fmt: skip
    if rates is not None:
        assert rates == {nic_gbps}
    got = [sorted(int(n.split("nic")[1]) for n in info["gpu_nic_affinity"][f"n0.gpu{i}"])
           for i in range(gpus)]  # fmt: skip
    assert [g[0] for g in got] == affinity
    assert "collsim topo import of " + file in doc["source"]


def test_nics_are_ordered_by_gpu_and_their_names_kept():
    doc, _ = _import("nccl_ibmcloud_gx3d_h100_8gpu_topo.xml")
    # GPU 0 shares its PCIe bridge with mlx5_7, GPU 7 with mlx5_0 (the dump's reverse order).
    assert "nic0=mlx5_7" in doc["source"] and "nic7=mlx5_0" in doc["source"]
    assert doc["node"]["intra"]["in_network_reduction"] is True  # Hopper NVSwitch: NVLS
    assert doc["node"]["pcie"]["bandwidth"].startswith("63.01")  # Gen5 x16 (width 0 -> 16)


def test_a_nic_away_from_the_template_place_makes_an_explicit_graph():
    doc, topo = _import("nccl_panlichen_rtx3090_8gpu_topo.xml")
    assert "devices" in doc and "explicit graph: NIC 0 sits away from GPU 0" in doc["source"]
    nic_links = {lk.b if lk.a == "n0.nic0" else lk.a for lk in topo.links if "n0.nic0" in (
        lk.a, lk.b)}  # fmt: skip
    assert nic_links == {"n0.cpu1", "sw0"}  # under the switch of GPUs 4-7, on socket 1


def test_virtual_interfaces_and_self_links_are_left_out_and_said():
    doc, _ = _import("nccl_yccl_a6000_4gpu_topo.xml")
    assert "virtual interface veth268d912 left out" in doc["source"]
    doc, _ = _import("nccl_azure_ncv4-topo.xml")
    assert "an NVLink entry to itself (count 12) left out" in doc["source"]
    assert "Gen3 x16 assumed" in doc["source"]  # the VM reports no PCIe speed


@pytest.mark.parametrize(
    ("file", "twin", "options"),
    [
        ("nccl_ibmcloud_gx3d_h100_8gpu_topo.xml", "dgx-h100", {"nodes": 1}),
        ("nccl_panlichen_rtx3090_8gpu_topo.xml", "rtx3090-8gpu-pcie", {}),
        ("nccl_rwkvinllama_rtx4090_2gpu_topo.xml", "rtx4090-4gpu-pcie", {"gpus_per_node": 2}),
    ],
)
def test_imported_systems_predict_their_catalog_twins_busbw(file, twin, options):
    _, topo = _import(file)
    catalog = load_topology(twin, **options)
    for collective in ("all_reduce", "all_gather"):
        got = [WhatIf(t).sweep(collective, "auto", [1 << 30], tuned=True).points[0].busbw_gbps
               for t in (topo, catalog)]  # fmt: skip
        assert got[0] == pytest.approx(got[1], rel=0.02)


def test_diff_explains_why_the_h800_is_not_its_h100_twin():
    _, topo = _import("nccl_yccl_h800_8gpu_topo.xml")
    rows = {key: (a, b) for key, a, b in topology_diff(topo, load_topology("dgx-h100", nodes=1))}
    assert rows["intra_bandwidth_gbps_per_gpu"] == (200.0, 450.0)
    assert rows["links.nvlink.bandwidth_gbps"] == ([200.0], [450.0])
    assert not topology_diff(topo, topo)


def test_nvidia_smi_alone_gives_the_dgx1_cube_mesh_and_nvswitch_boxes():
    doc, topo = _import("nvsmi_topo_dgx1_v100_msccl-tools.txt", gpu="dgx1-v100",
                        nic_speed_gbps=100.0)  # fmt: skip
    catalog = load_topology("dgx1-v100", nodes=1)
    mine = {frozenset((lk.a, lk.b)): lk.bandwidth_bytes_per_s for lk in topo.links
            if lk.kind == "nvlink"}  # fmt: skip
    theirs = {frozenset((lk.a, lk.b)): lk.bandwidth_bytes_per_s for lk in catalog.links
              if lk.kind == "nvlink"}  # fmt: skip
    assert mine == theirs  # the 16 pairs of the hybrid cube-mesh, doubled ones doubled
    affinity = describe(topo)["gpu_nic_affinity"]
    assert affinity["n0.gpu0"] == affinity["n0.gpu1"] == ["n0.nic0"]
    assert affinity["n0.gpu6"] == ["n0.nic3"]
    for file, catalog_name, gbps in (
        ("nvsmi_topo_h100_8gpu_ml-engineering.txt", "dgx-h100", 450),
        ("nvsmi_topo_a100_8gpu_ml-engineering.txt", "dgx-a100", 300),
    ):
        doc, topo = _import(file, gpu=catalog_name)
        assert doc["node"]["intra"]["kind"] == "nvswitch"
        assert describe(topo)["intra_bandwidth_gbps_per_gpu"] == gbps


def test_nvidia_smi_merged_into_a_dump_sets_the_affinity(tmp_path):
    # A matrix written for this test (not real output): it says GPU 0's nearest NIC is mlx5_0.
    names = [f"mlx5_{j}" for j in range(8)]
    head = "\t" + "\t".join([f"GPU{i}" for i in range(8)] + names) + "\tCPU Affinity"
    rows = []
    for i in range(8):
        cells = ["X" if i == k else "NV18" for k in range(8)]
        cells += ["PIX" if j == i else "SYS" for j in range(8)]
        rows.append(f"GPU{i}\t" + "\t".join(cells) + "\t0-51")
    matrix = tmp_path / "nvsmi.txt"
    matrix.write_text("\n".join([head, *rows]) + "\n")
    xml = DATA / "nccl_ibmcloud_gx3d_h100_8gpu_topo.xml"
    doc = import_files([str(xml), str(matrix)], ImportRequest("merged"))
    assert "nic0=mlx5_0" in doc["source"] and "nvsmi.txt" in doc["source"]


def test_ibnetdiscover_scans_give_the_fabric():
    fabric, words = fabric_section(
        read_ibnetdiscover(DATA / "ibnetdiscover_loginoff_sx6036_qdr_2014.topo")
    )
    assert fabric["kind"] == "fat_tree" and fabric["tiers"] == 2 and fabric["radix"] == 36
    assert fabric["oversubscription"] == 3.0  # leaves: 27 hosts to 9 spine cables (median)
    assert fabric["link"]["bandwidth"] == "40Gbps"  # the FDR10 inter-switch cables
    assert "144 host adapters" in words
    fabric, _ = fabric_section(read_ibnetdiscover(DATA / "ibnetdiscover_ibm_pcm_sdr_2009.topo"))
    assert fabric == {"switch_latency": "0.17us", "radix": 8, "routing": "dmodk",
                      "kind": "single_switch"}  # fmt: skip
    doc, topo = _import("nccl_rwkvinllama_rtx4090_2gpu_topo.xml",
                        "ibnetdiscover_ibm_pcm_sdr_2009.topo")  # fmt: skip
    assert topo.nodes == 2  # the scan's two hosts
    assert "ibnetdiscover scan of ibnetdiscover_ibm_pcm_sdr_2009.topo" in doc["source"]


def test_pcie_rates_follow_the_encoding():
    assert pcie_bytes_per_s(16.0, 16) == pytest.approx(31.5077e9, rel=1e-5)  # Gen4 x16
    assert pcie_bytes_per_s(5.0, 8) == pytest.approx(4e9)  # Gen2 x8, 8b/10b
    assert pcie_bytes_per_s(32.0, 0) == pcie_bytes_per_s(32.0, 16)  # a VF's width 0


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda t: t[: len(t) // 2], "malformed XML at line"),
        (
            lambda t: t.replace('link_speed="32.0 GT/s PCIe"', 'link_speed="32 GT/sec"', 1),
            "unknown PCIe speed",
        ),
        (
            lambda t: t.replace(
                '<system version="1">', '<system version="1"><nic><net name="ib0" speed="1"/></nic>'
            ),
            "no GPU affinity",
        ),
        (lambda t: t.replace('device="0x2330"', 'device="0x9999"', 1), "--gpu"),
        (lambda t: t.replace('speed="200000"', 'speed="fast"', 1), "not an integer"),
        (lambda t: t.replace('sm="90" ', "", 1), "has no 'sm' attribute"),
    ],
)
def test_bad_dumps_are_one_line_naming_file_element_and_value(tmp_path, edit, words):
    text = (DATA / "nccl_ibmcloud_gx3d_h100_8gpu_topo.xml").read_text()
    bad = tmp_path / "bad.xml"
    bad.write_text(edit(text))
    result = runner.invoke(cli, ["topo", "import", str(bad), "-o", str(tmp_path / "out.yaml")])
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert "\n" not in line and "Traceback" not in line
    assert str(bad) in line and words in line
    assert not (tmp_path / "out.yaml").exists()


@pytest.mark.parametrize("overlay", ["nccl_azure_ndv4-topo.xml", "nccl_azure_ndv5-topo.xml"])
def test_an_ncc_topo_file_overlay_is_refused_with_what_to_give(overlay, tmp_path):
    result = runner.invoke(cli, ["topo", "import", str(DATA / overlay), "-o",
                                 str(tmp_path / "x.yaml")])  # fmt: skip
    assert result.exit_code == 2
    assert "overlay" in result.output and "NCCL_TOPO_DUMP_FILE" in result.output
    assert "<pci busid=" in result.output


def test_an_unknown_file_and_a_matrix_without_rates(tmp_path):
    junk = tmp_path / "notes.txt"
    junk.write_text("hello\n")
    with pytest.raises(TopologyError, match="not an NCCL topology dump"):
        sniff(junk)
    with pytest.raises(TopologyError, match="--nic-speed"):
        _import("nvsmi_topo_dgx1_v100_msccl-tools.txt", gpu="dgx1-v100")
    with pytest.raises(TopologyError, match="--gpu"):
        _import("nvsmi_topo_h100_8gpu_ml-engineering.txt")


def test_cli_import_then_show_simulate_and_diff(tmp_path):
    out = tmp_path / "cluster.yaml"
    xml = DATA / "nccl_ibmcloud_gx3d_h100_8gpu_topo.xml"
    result = runner.invoke(cli, ["topo", "import", str(xml), "-o", str(out), "--nodes", "2"])
    assert result.exit_code == 0, result.output
    assert "(template)" in result.output
    shown = json.loads(runner.invoke(cli, ["topo", "show", str(out), "--json"]).output)
    assert shown["gpus"] == 16 and shown["name"] == "cluster"
    sim = runner.invoke(cli, ["simulate", "all_reduce", "-t", str(out), "-b", "1M", "-e", "1M"])
    assert sim.exit_code == 0, sim.output
    diff = runner.invoke(cli, ["topo", "diff", str(out), "dgx-h100", "--nodes", "2", "--json"])
    assert diff.exit_code == 0, diff.output
    figures = {row["figure"] for row in json.loads(diff.output)["differences"]}
    assert "injection_bandwidth_gbps_per_gpu" in figures  # 200G RoCE vs 400G NDR per GPU
    same = runner.invoke(cli, ["topo", "diff", str(out), str(out)])
    assert "no differences" in same.output and "(+0.0%)" in same.output
    again = runner.invoke(cli, ["topo", "import", str(out), "-o", str(out)])
    assert again.exit_code == 2  # never overwrites its input


def test_a_default_fabric_grows_a_third_tier_for_many_servers():
    doc, topo = _import("nccl_ibmcloud_gx3d_h100_8gpu_topo.xml", nodes=300)
    # one NIC per GPU: rail-optimized, as DGX-class clusters are built
    assert doc["fabric"] == {"kind": "rail_optimized", "radix": 64, "switch_latency": "0.3us",
                             "tiers": 3}  # fmt: skip
    assert topo.n_gpus == 2400
    assert "fabric not scanned: a default one (estimate)" in doc["source"]
