"""The validation report's busbw-vs-nodes plot of a scale series, checked as a reader would look
at it: node counts as the ticks, none on top of another (12288 beside 16384 at scale), nothing
cut off, the legend clear of the panels, a log without a prediction drawn without a point."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib.pyplot as plt
import pytest

from collsim.calibration.dataset import load_index
from collsim.calibration.scale_series import ScalePanel, ScalePlot, scale_plot, series_of
from collsim.report.scale_plots import plot_scale, scale_figure
from tests.report.figure_checks import overlapping_tick_labels, texts_outside_figure


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


NODES = (2, 8, 256, 540)
PLOT = ScalePlot("a100-polaris-slingshot all_reduce", (2, 8), (
    ScalePanel(1 << 20, NODES, (10.0, 8.0, 3.0, 2.5), (12.0, 9.0, 2.0, 1.5), (10.5, 8.2, 2.8, 2.2)),
    ScalePanel(64 << 20, NODES, (60.0, 50.0, 40.0, 38.0), (70.0, 55.0, 30.0, 25.0),
               (61.0, 49.0, 35.0, 33.0)),
    ScalePanel(1 << 30, NODES, (80.0, 75.0, 70.0, 69.0), (90.0, 85.0, 50.0, 40.0),
               (81.0, 76.0, 60.0, None)),
))  # fmt: skip


def test_one_panel_per_size_with_node_counts_as_ticks_and_nothing_overlapping():
    fig = scale_figure(PLOT)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == [
        "message size 1M", "message size 64M", "message size 1G"
    ]  # fmt: skip
    for ax in axes:
        ticks = [t.get_text() for t in ax.xaxis.get_ticklabels() if t.get_text()]
        assert ticks == ["2", "8", "256", "540"]
        assert ax.get_ylim()[0] == 0
    assert overlapping_tick_labels(fig) == []
    assert texts_outside_figure(fig) == []
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == [
        "fitted on (cross-scale)", "uncalibrated", "cross-scale calibrated", "measured"
    ]  # fmt: skip
    fig.canvas.draw()
    box = legend.get_window_extent()
    assert all(box.y1 <= ax.get_window_extent().y0 for ax in axes)  # under the panels
    # the 540-node log without a calibrated prediction: three calibrated points, not four
    drawn = {line.get_label(): list(line.get_xdata()) for line in axes[2].lines}
    assert drawn["cross-scale calibrated"] == [2, 8, 256]


def test_crowded_counts_are_thinned_and_one_panel_keeps_its_legend_inside(tmp_path):
    counts = (1024, 2048, 4096, 8192, 12288, 16384)
    one = ScalePlot("x all_reduce", (), (ScalePanel(1 << 30, counts, (1.0,) * 6, (1.1,) * 6,
                                                    (None,) * 6),))  # fmt: skip
    fig = scale_figure(one)
    assert overlapping_tick_labels(fig) == []
    assert texts_outside_figure(fig) == []
    path = plot_scale(PLOT, tmp_path / "s.png")
    assert path.stat().st_size > 1000


def test_a_series_on_one_node_is_drawn_against_ranks():
    """Two and four GPUs of one machine: against nodes every point would sit at x = 1."""
    (series,) = [s for s in series_of(load_index()) if s.name == "rtx4090-kalavai all_reduce"]

    def result(busbw):
        point = SimpleNamespace(bytes=1 << 20, measured_busbw_gbps=busbw,
                                predicted_busbw_gbps=2 * busbw)  # fmt: skip
        return SimpleNamespace(points=[point])

    unc = {g.name: result(float(g.ranks)) for g in series.logs}
    plot = scale_plot(series, {"uncalibrated": unc})
    assert plot.axis == "ranks" and plot.fit_nodes == (2,)
    (panel,) = plot.panels
    assert panel.nodes == (2, 2, 4, 4) and panel.uncalibrated_gbps == (4.0, 4.0, 8.0, 8.0)
    assert scale_figure(plot).axes[0].get_xlabel() == "ranks"


def test_a_log_without_the_exact_size_is_drawn_at_its_nearest_row():
    """2160 ranks: sizes are 8640 x 2^k, so 1045440 bytes stands for 1 MiB (within sqrt 2)."""
    (series,) = [s for s in series_of(load_index()) if s.name == "a100-polaris-slingshot alltoall"]
    rows = {"a100-polaris-slingshot-540n-alltoall-1.txt": 1045440}

    def result(name):
        pts = [
            SimpleNamespace(
                bytes=rows.get(name, 1 << 20), measured_busbw_gbps=1.0, predicted_busbw_gbps=2.0
            ),
            SimpleNamespace(bytes=3 << 20, measured_busbw_gbps=9.0, predicted_busbw_gbps=9.0),
        ]
        return SimpleNamespace(points=pts)  # fmt: skip

    plot = scale_plot(series, {"uncalibrated": {g.name: result(g.name) for g in series.logs}})
    assert plot.panels[0].nodes == (2, 8, 256, 540)
    assert plot.panels[0].measured_gbps == (1.0,) * 4  # not the 3 MiB row: beyond sqrt 2
