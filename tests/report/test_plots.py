"""Every plot collsim draws, checked as a reader would look at it: no tick labels on top of each
other, no text cut off at the edge or running out of its axes, no blue mass of links. Small
systems only (each figure draws in well under a second)."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib.pyplot as plt
import pytest
from click.testing import CliRunner
from matplotlib.colors import to_rgb

from collsim.calibration.validate import validation_figure
from collsim.cli import cli
from collsim.report.axes import count_axis, size_axis, slide_texts, thin_ticks
from collsim.report.step_plots import pareto_figure, scaling_figure
from collsim.report.topology_groups import group
from collsim.report.topology_plot import topology_figure
from collsim.topology.loader import load_topology
from collsim.training.amdahl import scaling_curve
from collsim.training.plan import CandidatesIn, plan
from collsim.training.workload import workload_from_dict
from tests.report.figure_checks import (
    annotations,
    overlapping_texts,
    overlapping_tick_labels,
    texts_outside_axes,
    texts_outside_figure,
)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _tick_texts(axis):
    return [t.get_text() for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]


# -- topo draw --------------------------------------------------------------------------------


def test_a_16_node_cluster_is_one_node_and_the_fabric_shape():
    """16 DGX H100s have 640 links: drawn one by one (the old picture) they were a blue mass.
    Node 0 is drawn in full (its 8 GPU links to the NVSwitch, 8 NIC links), the other nodes as
    boxes, each tier as a box, each bundle of links one line labelled count x rate."""
    topo = load_topology("dgx-h100", nodes=16)
    fig = topology_figure(topo)
    ax = fig.axes[0]
    assert len(ax.lines) <= 40, len(ax.lines)
    texts = [t.get_text() for t in annotations(ax)]
    assert {"tier 1: 8 switches", "tier 2: 32 switches", "256 x 50 GB/s"} <= set(texts), texts
    assert "nodes 1-3\n(3 nodes)\n24 GPUs, 24 NICs" in texts
    assert sum(t.count("x 50 GB/s") for t in texts) == 6  # tier 1-2, and 5 boxes of nodes
    assert texts_outside_figure(fig) == []
    assert overlapping_texts(fig, annotations(ax)) == []
    full = topology_figure(topo, full=True)  # still there when asked for
    assert len(full.axes[0].lines) >= len(topo.links)


def test_nvlink_domains_are_bands_under_their_nodes_and_labels_stay_apart():
    """32 GB200 trays fill two NVL72 domains (18 + 14). The domain switches were drawn as
    diamonds inside node boxes with their NVLink bundles' labels on top of each other ("20 x
    90(20 x 90(8 x 900 GB/s"), a box of nodes 16-20 straddled the two domains, and the 4
    rail-optimized leaves, each joined to every box, were a web of lines whose labels collided
    ("5 x 50 GB/ssss"). Each domain is now a band under the boxes it spans, saying what it
    joins; the leaves one box like every other tier."""
    topo = load_topology("gb200-nvl72", nodes=32)
    fig = topology_figure(topo)
    ax = fig.axes[0]
    texts = [t.get_text() for t in annotations(ax)]
    assert texts_outside_figure(fig) == []
    assert overlapping_texts(fig, annotations(ax)) == []
    assert len(ax.lines) <= 30, len(ax.lines)
    assert {
        "NVLink domain 0: nodes 0-17, 72 GPUs, 900 GB/s per GPU",
        "NVLink domain 1: nodes 18-31, 56 GPUs, 900 GB/s per GPU",
        "tier 1: 4 switches",
        "nodes 16-17\n(2 nodes)\n8 GPUs, 8 NICs",
    } <= set(texts), texts
    assert not any("900 GB/s" in t and " x " in t for t in texts)  # no NVLink bundle labels
    boxes = [p for p in ax.patches if p.get_facecolor()[:3] == to_rgb("#f4f4f4")]
    bottom = min(p.get_y() for p in boxes)
    (switches,) = [c for c in ax.collections if c.get_label() == "nvswitch"]
    assert len(switches.get_offsets()) == 2 and max(switches.get_offsets()[:, 1]) < bottom


def test_only_leaves_that_each_reach_most_node_boxes_become_one_box():
    """Rail-optimized leaves reach every box (a web): one box. Fat-tree leaves reach two or three
    neighbouring boxes each, which reads well switch by switch: they stay apart."""
    rails, _ = group(load_topology("gb200-nvl72", nodes=32))
    leaves, _ = group(load_topology("gb300-nvl72-4nic", nodes=32))
    assert [u.label for u in rails.values() if u.kind in ("switch", "switches")] == [
        "tier 1", "tier 2"]  # fmt: skip
    assert sum(u.kind == "switch" for u in leaves.values()) == 4


@pytest.mark.parametrize("nodes", [19, 144])
def test_a_narrow_domain_band_says_less_rather_than_spill_over(nodes):
    """A partial last domain of one tray, or boxes of several domains each, have bands one node
    box wide: their text shortens to fit (``NVLink`` over ``domain 1``), never past the band."""
    topo = load_topology("gb200-nvl72", nodes=nodes)
    fig = topology_figure(topo)
    ax = fig.axes[0]
    assert texts_outside_figure(fig) == [] and overlapping_texts(fig, annotations(ax)) == []
    renderer = fig.canvas.get_renderer()
    bands = [p for p in ax.patches if p.get_edgecolor()[:3] == to_rgb("#76b900")]
    domain_texts = [t for t in annotations(ax) if "domain" in t.get_text()]
    assert len(bands) == len(domain_texts) == (2 if nodes == 19 else 5)
    spans = [(b.get_window_extent(renderer).x0, b.get_window_extent(renderer).x1) for b in bands]
    for text in domain_texts:
        box = text.get_window_extent(renderer)
        assert any(x0 < box.x0 and box.x1 < x1 for x0, x1 in spans), text.get_text()
    if nodes == 144:  # 8 domains, 5 boxes: whole domains per box after domain 0's rest
        assert "NVLink\ndomains 1-2" in [t.get_text() for t in domain_texts]


@pytest.mark.parametrize(
    ("name", "nodes"), [("dgx-h100", 1), ("dgx-h100", 2), ("p5", 4), ("dgx-a100", 3),
                        ("gh200-slingshot", 16), ("tpu-v4-torus", None), ("polaris", 8),
                        ("gb300-nvl72", 2), ("gb300-nvl72", 18), ("gb300-nvl72-4nic", 32)],
)  # fmt: skip
def test_topology_pictures_keep_their_text_inside(name, nodes):
    """The link legend was an artist the saved picture's bounding box left out: cut off."""
    topo = load_topology(name, nodes=nodes) if nodes else load_topology(name)
    fig = topology_figure(topo)
    assert texts_outside_figure(fig) == []
    assert overlapping_texts(fig, annotations(fig.axes[0])) == []
    assert len(fig.axes[0].lines) <= 180  # a torus: its 64 chips' x and y links
    assert len(fig.legends) == 2 and "links" in fig.legends[0].get_title().get_text()


def test_a_torus_bundles_its_links_between_planes():
    """Links between z-planes drawn side by side were dashed arcs over the whole picture; each
    pair of neighbouring planes is now one arrow with its count, the wrap-around a note."""
    topo = load_topology("tpu-v4-torus")
    ax = topology_figure(topo).axes[0]
    width = topo.grid_dims[0] + 1
    spanning = [ln for ln in ax.lines if ln.get_alpha() != 0 and
                max(ln.get_xdata()) - min(ln.get_xdata()) > width]  # fmt: skip
    assert spanning == []
    texts = [t.get_text() for t in annotations(ax)]
    assert texts.count("16 x 50 GB/s") == 3
    assert any("wrap-around" in t for t in texts)


def test_topo_draw_cli_compact_and_full(tmp_path):
    runner = CliRunner()
    for flag in ("--compact", "--full"):
        png = tmp_path / f"t{flag}.png"
        res = runner.invoke(cli, ["topo", "draw", "dgx-h100", "--nodes", "3", flag, "-o", str(png)])
        assert res.exit_code == 0, res.output
        assert png.read_bytes()[:4] == b"\x89PNG"


# -- scale --plot -----------------------------------------------------------------------------


def test_scaling_plot_ticks_are_the_gpu_counts_and_never_overlap():
    """Log axes labelled 3 x 10^1 and 4 x 10^1 printed on top of each other."""
    counts = [8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512]
    times = [100.0 / n + 0.01 for n in counts]
    fig = scaling_figure(scaling_curve(counts, times, "strong"), title="x")
    assert overlapping_tick_labels(fig) == []
    for ax in fig.axes:
        labels = _tick_texts(ax.xaxis)
        assert labels[0] == "8" and labels[-1] == "512", labels
        assert set(labels) <= {str(n) for n in counts}
    assert texts_outside_figure(fig) == []


# -- plan --plot ------------------------------------------------------------------------------


def _options():
    w = workload_from_dict({
        "name": "tiny", "model": {"layers": 4, "hidden": 1024, "heads": 16, "seq_len": 1024},
        "global_batch": 16, "parallel": {"tp": 8},
    })  # fmt: skip
    cand = CandidatesIn.model_validate({
        "tokens": "1B", "clusters": [{"name": "gh", "topology": "h100-4gpu-ib", "nodes": [2, 4],
                                      "gpu_hour_usd": 3}],
        "search": {"tp": [2, 4, 8], "micro_batch": [1, 2]},
    })  # fmt: skip
    return plan(w, cand, keep="all")[0]


def test_pareto_plot_labels_stay_inside_and_apart_and_units_fit_the_numbers():
    """Labels ran off the right edge and over each other; a few-dollar plan read '1e-6 million
    USD' over days of 0.005."""
    options = _options()
    fig = pareto_figure(options, title="tiny: time vs cost")
    ax = fig.axes[0]
    # option labels read "cluster (layout)"; the note on unlabelled options sits beside the axes
    labels = [t for t in annotations(ax) if "(" in t.get_text() and "not labelled" not in
              t.get_text()]  # fmt: skip
    assert labels, "no option labelled"
    assert texts_outside_axes(ax, labels) == []
    assert overlapping_texts(fig, labels) == []
    assert texts_outside_figure(fig) == []
    assert ax.get_ylabel() == "cost (USD)" and ax.get_xlabel().startswith("minutes")
    assert ax.yaxis.get_offset_text().get_text() == ""
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "TP group spans nodes" in legend  # tp 8 on 4-GPU nodes


# -- sweep report and validate plots ----------------------------------------------------------


def test_size_axis_covers_the_data_with_sizes_that_do_not_overlap():
    """The sweep report's size axis ran from 1 B to 64 G around data from 8 B to 4 G."""
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([8, 4 << 30], [1, 2])
    size_axis(ax, 8, 4 << 30)
    thin_ticks(fig)
    labels = _tick_texts(ax.xaxis)
    assert labels[0] == "8" and labels[-1] in ("2G", "4G") and len(labels) <= 8, labels
    lo, hi = ax.get_xlim()
    assert 4 <= lo < 8 and 4 << 30 < hi <= 8 << 30
    assert overlapping_tick_labels(fig) == []


def test_count_axis_thins_long_counts_that_would_collide():
    fig, ax = plt.subplots(figsize=(3, 2))
    counts = [4096, 6144, 8192, 12288, 16384]
    ax.plot(counts, [1, 2, 3, 4, 5])
    count_axis(ax, counts)
    assert overlapping_tick_labels(fig) != []  # as the counts come, at this width
    thin_ticks(fig)
    assert overlapping_tick_labels(fig) == []
    labels = _tick_texts(ax.xaxis)
    assert labels[0] == "4096" and labels[-1] == "16384"


def test_slide_texts_moves_a_label_along_its_line_or_hides_it():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10)
    first, second, third = (ax.text(5, 5, "8 x 50 GB/s", ha="center") for _ in range(3))
    hidden = slide_texts(ax, [first, second, third], [[(5, 5)], [(5, 5), (5, 2)], [(5, 5)]])
    assert hidden == [2] and not third.get_visible()
    assert second.get_position() == (5, 2)
    assert overlapping_texts(fig, annotations(ax)) == []


def test_validation_plot_names_sizes_and_logs_briefly():
    """Sizes were 2^21; legend entries whole file names in 6-point type over the curves."""
    points = [SimpleNamespace(bytes=2**k, measured_busbw_gbps=k, predicted_busbw_gbps=k + 1)
              for k in range(3, 34)]  # fmt: skip
    kinds = ("all_reduce", "all_gather", "reduce_scatter")
    logs = [SimpleNamespace(file=f"data/a100-40g-8gpu-superbench-{c}-1.txt", mape=0.1,
                            points=points) for c in kinds]  # fmt: skip
    fig = validation_figure(SimpleNamespace(logs=logs), "dgx-a100: collsim model")
    ax = fig.axes[0]
    labels = _tick_texts(ax.xaxis)
    assert "1M" in labels and not any("^" in t for t in labels), labels
    assert ax.get_legend().get_texts()[0].get_text() == "all_reduce-1 (10%)"
    assert "a100-40g-8gpu-superbench-*" in ax.get_title()
    assert overlapping_tick_labels(fig) == [] and texts_outside_figure(fig) == []
