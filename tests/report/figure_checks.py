"""What a reader of a plot would trip over, measured on the drawn figure: tick labels on top of
each other, text cut off at the figure's edge, labels over each other or outside their axes."""

from __future__ import annotations

from typing import Any

from matplotlib.text import Text


def _boxes(fig: Any, texts: list[Any]) -> list[tuple[str, Any]]:
    renderer = fig.canvas.get_renderer()
    return [(t.get_text(), t.get_window_extent(renderer)) for t in texts]


def _overlap(a: Any, b: Any) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _drawn_ticks(axis: Any) -> list[Any]:
    """The tick labels drawn: visible, non-empty, at a tick inside the axis's view."""
    lo, hi = sorted(axis.get_view_interval())
    which = 0 if axis.axis_name == "x" else 1
    return [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()
            and lo <= t.get_position()[which] <= hi]  # fmt: skip


def _undrawn_ticks(fig: Any) -> set[int]:
    out = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            drawn = {id(t) for t in _drawn_ticks(axis)}
            out |= {id(t) for t in axis.get_ticklabels() if id(t) not in drawn}
    return out


def overlapping_tick_labels(fig: Any) -> list[tuple[str, str]]:
    """Pairs of tick labels of one axis whose drawn extents overlap."""
    fig.canvas.draw()
    bad = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            labels = _drawn_ticks(axis)
            boxes = _boxes(fig, labels)
            bad += [(a[0], b[0]) for i, a in enumerate(boxes) for b in boxes[i + 1 :]
                    if _overlap(a[1], b[1])]  # fmt: skip
    return bad


def visible_texts(fig: Any) -> list[Any]:
    """Every visible, non-empty text artist of the figure (titles, labels, legends, notes;
    tick labels outside the view are not drawn)."""
    hidden = _undrawn_ticks(fig)
    return [t for t in fig.findobj(Text)
            if t.get_visible() and t.get_text().strip() and id(t) not in hidden]  # fmt: skip


def texts_outside_figure(fig: Any, tolerance_px: float = 1.0) -> list[str]:
    """Texts that reach past the figure's edge (cut off in the saved picture)."""
    fig.canvas.draw()
    frame = fig.bbox
    return [text for text, b in _boxes(fig, visible_texts(fig))
            if b.x0 < frame.x0 - tolerance_px or b.x1 > frame.x1 + tolerance_px
            or b.y0 < frame.y0 - tolerance_px or b.y1 > frame.y1 + tolerance_px]  # fmt: skip


def annotations(ax: Any) -> list[Any]:
    return [t for t in ax.texts if t.get_visible() and t.get_text().strip()]


def overlapping_texts(fig: Any, texts: list[Any]) -> list[tuple[str, str]]:
    fig.canvas.draw()
    boxes = _boxes(fig, texts)
    return [(a[0], b[0]) for i, a in enumerate(boxes) for b in boxes[i + 1 :]
            if _overlap(a[1], b[1])]  # fmt: skip


def texts_outside_axes(ax: Any, texts: list[Any]) -> list[str]:
    fig = ax.figure
    fig.canvas.draw()
    frame = ax.get_window_extent(fig.canvas.get_renderer())
    out = []
    for text, b in _boxes(fig, texts):
        if b.x0 < frame.x0 or b.x1 > frame.x1 or b.y0 < frame.y0 or b.y1 > frame.y1:
            out.append(text)
    return out
