"""Axes and labels the report plots share, so that a reader never has to untangle them: message
sizes as nccl-tests writes them (``64K``, ``1G``), GPU counts as plain numbers at the counts
measured, tick labels thinned until none overlap, point labels placed where they neither
overlap each other nor leave the axes (or left out), labels on lines slid along them until clear
of each other (or left out), legends beside the axes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from collsim.units import format_size

MAX_TICKS = 8
"""Labelled ticks on an axis at most."""


def _axis(ax: Any, which: str) -> Any:
    return ax.xaxis if which == "x" else ax.yaxis


# Tick label functions at module level (not lambdas), so that a figure can be pickled and drawn
# in another process (:mod:`collsim.report.figures`).
def _size_label(v: float, _: object) -> str:
    return format_size(round(v))


def _plain_label(v: float, _: object) -> str:
    return f"{v:g}"


def _no_label(v: float, _: object) -> str:
    return ""


def size_axis(ax: Any, lo_bytes: float, hi_bytes: float, *, which: str = "x") -> None:
    """A log2 axis of message sizes over the data's range, ticks at powers of 2 (every 2nd,
    4th, ... power as needed for at most :data:`MAX_TICKS`) labelled ``1K``, ``4M``."""
    lo, hi = max(1.0, lo_bytes), max(1.0, hi_bytes, lo_bytes)
    first, last = math.ceil(math.log2(lo)), math.floor(math.log2(hi))
    stride = 1
    while (last - first) // stride + 1 > MAX_TICKS:
        stride *= 2
    ticks = [2.0**k for k in range(first, last + 1) if (k - first) % stride == 0]
    (ax.set_xscale if which == "x" else ax.set_yscale)("log", base=2)
    axis = _axis(ax, which)
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(_size_label))
    axis.set_minor_locator(NullLocator())
    (ax.set_xlim if which == "x" else ax.set_ylim)(lo / 1.4, hi * 1.4)


def count_axis(ax: Any, counts: Sequence[float], *, which: str = "x", log: bool = True) -> None:
    """GPU (or node) counts: ticks at the counts themselves, plain numbers, no minor ticks;
    :func:`thin_ticks` then drops labels that would overlap once drawn."""
    values = sorted({float(c) for c in counts if c > 0})
    if log and len(values) > 1:
        (ax.set_xscale if which == "x" else ax.set_yscale)("log", base=2)
    axis = _axis(ax, which)
    axis.set_major_locator(FixedLocator(values))
    axis.set_major_formatter(FuncFormatter(_plain_label))
    axis.set_minor_locator(NullLocator())


def plain_log_axis(ax: Any, *, which: str = "y") -> None:
    """A log axis labelled with plain numbers (``20``, ``0.5``) rather than ``2 x 10^1``."""
    axis = _axis(ax, which)
    axis.set_major_formatter(FuncFormatter(_plain_label))
    axis.set_minor_formatter(FuncFormatter(_no_label))


def _inside(box: Any, frame: Any) -> bool:
    """Whether window extent ``box`` lies within ``frame`` (the axes')."""
    return box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0 and box.y1 <= frame.y1


def _overlap(a: Any, b: Any, pad: float = 2.0) -> bool:
    return not (
        a.x1 + pad <= b.x0 or b.x1 + pad <= a.x0 or a.y1 + pad <= b.y0 or b.y1 + pad <= a.y0
    )


def thin_ticks(fig: Any) -> Any:
    """On every axis of ``fig``, keep the first tick label and each next one that does not
    overlap the last kept (labels measured in the drawn figure): long counts such as ``12288``
    next to ``16384`` would print on top of each other. Returns the renderer it drew with."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        for which in ("x", "y"):
            axis = _axis(ax, which)
            labels = [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
            if len(labels) < 2:
                continue
            kept, last = [], None
            for label in labels:
                box = label.get_window_extent(renderer)
                if last is None or not _overlap(last, box):
                    kept.append(label.get_position()[0 if which == "x" else 1])
                    last = box
            final = labels[-1].get_position()[0 if which == "x" else 1]
            if len(kept) > 1 and kept[-1] != final:  # the largest count is worth its label
                kept[-1] = final
            if len(kept) < len(labels):
                axis.set_major_locator(FixedLocator(kept))
    return renderer


def place_labels(
    ax: Any, points: Sequence[tuple[float, float]], texts: Sequence[str], *, fontsize: float = 7
) -> list[int]:
    """Label each point next to it, on the first side (right, left, above, below) where the
    label stays inside the axes and clear of the labels placed before it; returns the indices
    of the points left unlabelled (no room). Points are labelled in the order given, so put
    the important ones first."""
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    placed: list[Any] = []
    skipped = []
    sides = (((5, 0), "left", "center"), ((-5, 0), "right", "center"),
             ((0, 5), "center", "bottom"), ((0, -5), "center", "top"))  # fmt: skip
    for i, (xy, text) in enumerate(zip(points, texts, strict=True)):
        for offset, ha, va in sides:
            note = ax.annotate(text, xy, xytext=offset, textcoords="offset points", ha=ha, va=va,
                               fontsize=fontsize)  # fmt: skip
            box = note.get_window_extent(renderer)
            if _inside(box, frame) and not any(_overlap(box, other) for other in placed):
                placed.append(box)
                break
            note.remove()
        else:
            skipped.append(i)
    return skipped


def slide_texts(
    ax: Any,
    texts: Sequence[Any],
    spots: Sequence[Sequence[tuple[float, float]]],
    *,
    keep_clear: Sequence[Any] = (),
) -> list[int]:
    """Move each of ``texts`` to the first of its ``spots`` (data coordinates, e.g. points along
    the line it labels) where it stays inside the axes and clear of ``keep_clear`` and of the
    texts placed before it; hide it where no spot is clear. Returns the indices of the texts
    hidden. Texts are placed in the order given, so put the important ones first."""
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    placed = [t.get_window_extent(renderer) for t in keep_clear if t.get_visible()]
    hidden = []
    for i, (text, candidates) in enumerate(zip(texts, spots, strict=True)):
        for spot in candidates:
            text.set_position(spot)
            box = text.get_window_extent(renderer)
            if _inside(box, frame) and not any(_overlap(box, other) for other in placed):
                placed.append(box)
                break
        else:
            text.set_visible(False)
            hidden.append(i)
    return hidden


def legend_beside(ax: Any, **kwargs: Any) -> Any:
    """The legend to the right of the axes, where it hides no data (the figure's constrained
    layout, or a tight bounding box when saved, makes room for it)."""
    kwargs.setdefault("fontsize", 8)
    return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **kwargs)
