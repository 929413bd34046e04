"""The plots of ``collsim scale`` (speedup and efficiency vs GPUs) and ``collsim plan`` (time to
train vs cost, Pareto front). Each has a ``*_figure`` builder (a matplotlib figure, for tests
and notebooks) and a ``plot_*`` writer (PNG/SVG by suffix, written atomically)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from collsim.io import save_figure
from collsim.report.axes import count_axis, legend_beside, place_labels, plain_log_axis, thin_ticks
from collsim.training.amdahl import ScalingCurve
from collsim.training.plan import Option


def scaling_figure(curve: ScalingCurve, *, title: str = "") -> Any:
    """Speedup vs GPUs (log-log) with ideal and the fitted law; efficiency on a second panel.
    GPU counts are the ticks, as plain numbers."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    n = curve.n_gpus.astype(float)
    grid = np.geomspace(n.min(), n.max(), 64)
    ax1.loglog(n, curve.speedup, "o-", label="collsim")
    ax1.loglog(grid, grid * curve.speedup[0] / n[0], "k--", lw=0.8, label="ideal")
    if curve.mode == "strong":
        fit = curve.fit_t1_s / curve.predicted(grid)
        ax1.loglog(grid, fit, ":", label=f"Amdahl fit, f = {curve.serial_fraction:.3g}")
    else:
        ax1.loglog(
            grid, curve.predicted(grid), ":", label=f"Gustafson, f = {curve.serial_fraction:.3g}"
        )
    count_axis(ax1, n)
    if curve.mode == "strong":  # ideal speedup is the GPU count: the same ticks read off it
        count_axis(ax1, n, which="y")
    else:
        plain_log_axis(ax1, which="y")
    ax1.set_xlabel("GPUs")
    ax1.set_ylabel("speedup (x 1 GPU)" if curve.mode == "strong" else "scaled speedup")
    ax1.legend(loc="upper left", fontsize=8)
    ax2.semilogx(n, 100 * curve.efficiency, "o-")
    count_axis(ax2, n)
    ax2.set_xlabel("GPUs")
    ax2.set_ylabel("parallel efficiency (%)")
    ax2.set_ylim(0, 105)
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
    fig.suptitle(title or f"{curve.mode} scaling")
    thin_ticks(fig)
    return fig


def plot_scaling(curve: ScalingCurve, path: str | os.PathLike[str], *, title: str = "") -> Path:
    """:func:`scaling_figure` written to ``path``."""
    return save_figure(scaling_figure(curve, title=title), path)


def _unit(values: Sequence[float], units: Sequence[tuple[float, str]]) -> tuple[float, str]:
    """The largest unit the biggest value reaches (``units``: (size, name), smallest first)."""
    top = max(values, default=0.0)
    chosen = units[0]
    for unit in units:
        if top >= unit[0]:
            chosen = unit
    return chosen


_TIME_UNITS = ((60.0, "minutes"), (3600.0, "hours"), (2 * 86400.0, "days"))
_COST_UNITS = ((1.0, "USD"), (1e3, "thousand USD"), (1e6, "million USD"))


def pareto_figure(options: list[Option], *, title: str = "") -> Any:
    """Time to train vs cost, one point per option, the Pareto front joined. Axis units follow
    the numbers (minutes to days, USD to millions); options whose tensor-parallel group spans
    nodes are hollow; labels are placed clear of each other and of the frame (the front
    first), and the options left unlabelled are counted in a note."""
    fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    secs = [o.expected_hours * 3600 for o in options]
    usd = [o.expected_cost_usd for o in options]
    t_div, t_name = _unit(secs, _TIME_UNITS)
    c_div, c_name = _unit(usd, _COST_UNITS)
    xy = [(s / t_div, c / c_div) for s, c in zip(secs, usd, strict=True)]
    kinds = (
        ("Pareto front", lambda o: o.pareto and o.tp_nodes == 1, {"c": "C1"}),
        ("other options", lambda o: not o.pareto and o.tp_nodes == 1, {"c": "C0"}),
        ("TP group spans nodes", lambda o: o.tp_nodes > 1,
         {"facecolors": "none", "edgecolors": "C3"}),
    )  # fmt: skip
    for name, picks, style in kinds:
        pts = [p for p, o in zip(xy, options, strict=True) if picks(o)]
        if pts:
            ax.scatter(*zip(*pts, strict=True), s=24, label=name, zorder=3, **style)
    front = sorted((p for p, o in zip(xy, options, strict=True) if o.pareto))
    if front:
        ax.plot(*zip(*front, strict=True), "C1-", lw=1, zorder=2)
    ax.set_xlabel(f"{t_name} to train (with failures when the workload models them)")
    ax.set_ylabel(f"cost ({c_name})")
    ax.set_title(title or "capacity plan: time vs cost")
    ax.margins(0.12)
    ax.grid(True, alpha=0.3)
    legend_beside(ax)
    order = sorted(range(len(options)), key=lambda i: (not options[i].pareto, secs[i]))
    texts = [f"{options[i].cluster} ({options[i].result.layout.label()})" for i in order]
    left = place_labels(ax, [xy[i] for i in order], texts)
    if left:
        ax.text(1.02, 0.0, f"{len(left)} of {len(options)} options\nnot labelled (no room):\n"
                "see the table", transform=ax.transAxes, fontsize=7, va="bottom")  # fmt: skip
    return fig


def plot_pareto(options: list[Option], path: str | os.PathLike[str], title: str = "") -> Path:
    """:func:`pareto_figure` written to ``path``."""
    return save_figure(pareto_figure(options, title=title), path)
