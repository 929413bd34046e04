"""busbw against node count for one scale series (:class:`~collsim.calibration.scale_series.
ScalePlot`): per message size a panel with the measured busbw, the uncalibrated prediction and
the cross-scale calibrated one (fitted on the shaded node counts), node counts as plain ticks at
the counts measured (log scale), busbw on a linear scale from 0, one legend under the panels so it
hides no data."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from collsim.calibration.scale_series import ScalePlot
from collsim.io import save_figure
from collsim.report.axes import count_axis, thin_ticks
from collsim.units import format_size


def _line(ax: Any, nodes: tuple[int, ...], values: tuple[float | None, ...], fmt: str,
          **kw: Any) -> None:  # fmt: skip
    pts = [(n, v) for n, v in zip(nodes, values, strict=True) if v is not None]
    if pts:
        ax.plot([n for n, _ in pts], [v for _, v in pts], fmt, **kw)


def scale_figure(plot: ScalePlot) -> Any:
    """The figure of ``plot`` (module docstring)."""
    n = max(1, len(plot.panels))
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n + 0.6, 3.9), layout="constrained",
                             squeeze=False)  # fmt: skip
    for ax, panel in zip(axes[0], plot.panels, strict=False):
        nodes = panel.nodes
        if plot.fit_nodes:
            lo, hi = min(plot.fit_nodes), max(plot.fit_nodes)
            ax.axvspan(lo / 1.15, hi * 1.15, color="0.9", zorder=0,
                       label="fitted on (cross-scale)")  # fmt: skip
        _line(ax, nodes, panel.uncalibrated_gbps, "s--", color="C3", ms=4, label="uncalibrated")
        _line(ax, nodes, panel.calibrated_gbps, "^-", color="C0", ms=5,
              label="cross-scale calibrated")  # fmt: skip
        _line(ax, nodes, panel.measured_gbps, "o", color="k", ms=5, label="measured")
        count_axis(ax, nodes)
        ax.set_ylim(bottom=0)  # a linear scale from 0: how far off a prediction is reads directly
        ax.set_xlabel(plot.axis)
        ax.set_title(f"message size {format_size(panel.size_bytes)}", fontsize=10)  # or nearest
        ax.grid(True, alpha=0.3)
        if len(set(nodes)) == 1:
            ax.set_xlim(nodes[0] / 2, nodes[0] * 2)
    axes[0][0].set_ylabel("busbw (GB/s)")
    for ax in axes[0][len(plot.panels) :]:
        ax.set_visible(False)
    if not plot.panels:
        axes[0][0].text(0.5, 0.5, "no sizes to draw", ha="center", transform=axes[0][0].transAxes)
    fig.suptitle(plot.title, fontsize=11)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        cols = len(handles) if n > 1 else 2  # one panel: two rows, no wider than the figure
        fig.legend(handles, labels, loc="outside lower center", ncol=cols, fontsize=8)
    thin_ticks(fig)
    return fig


def plot_scale(plot: ScalePlot, path: str | os.PathLike[str]) -> Path:
    """:func:`scale_figure` written to ``path`` (PNG/SVG by suffix, atomically)."""
    save_figure(scale_figure(plot), path)
    return Path(path)
