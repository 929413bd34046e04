"""Figures drawn in worker processes (``collsim/report/figures.py``): the same PNG bytes as
drawn here, every figure written before the block ends, a failure raised rather than lost."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest

from collsim.report.axes import plain_log_axis, size_axis
from collsim.report.figures import FigureWriter


def _figure(k: int):  # type: ignore[no-untyped-def]
    fig, ax = plt.subplots(figsize=(4, 3))
    xs = [2.0**i for i in range(3, 30)]
    ax.plot(xs, [x ** (0.1 * k) for x in xs], marker=".", label=f"curve {k}")
    size_axis(ax, xs[0], xs[-1])  # module-level tick formatters: the figure pickles
    ax.set_yscale("log")
    plain_log_axis(ax)
    ax.legend()
    return fig


def test_workers_draw_the_same_bytes_as_one_process(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    with FigureWriter(one, jobs=1) as plots:
        names = [plots.save(_figure(k), f"f{k}.png") for k in range(4)]
    with FigureWriter(two, jobs=2) as plots:
        assert [plots.save(_figure(k), f"f{k}.png") for k in range(4)] == names
    for name in names:  # all written when the block ends, byte for byte alike
        assert (one / name).read_bytes() == (two / name).read_bytes()


def test_a_figure_that_cannot_be_written_raises(tmp_path):
    with pytest.raises(FileNotFoundError), FigureWriter(tmp_path / "missing", jobs=2) as plots:
        plots.save(_figure(1), "f.png")
