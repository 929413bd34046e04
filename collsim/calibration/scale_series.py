"""Scale series of the dataset and how the validation report carries a fit across them.

A *series* is one system and one collective measured at several node counts: the dataset
index's entries with the same catalog topology, collective and source repository (one cluster,
one document, one set of settings), at two scales or more. Cross-scale validation of a series
fits a profile on its logs at :data:`FIT_MAX_NODES` nodes or fewer and predicts every larger one.
Issue 28's target counts the series whose predicted logs all lie in :data:`PREDICT_NODES` (the
scales users plan from a few measured nodes); a series with no log at :data:`FIT_MAX_NODES` nodes
or fewer, or no larger log, is fitted at its smallest scale instead and shown beside the target,
not in it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from collsim.calibration.dataset import DatasetEntry

FIT_MAX_NODES = 8
"""Cross-scale fits use a series' logs at this many nodes or fewer (issue 28: "fit <= 8 nodes")."""
PREDICT_NODES = (16, 540)
"""Node counts (inclusive) of the predicted logs of a series that counts toward the target."""


@dataclass(frozen=True)
class SeriesLog:
    name: str
    nodes: int
    ranks: int


@dataclass(frozen=True)
class Series:
    """One system and collective at several scales, and the logs its cross-scale fit uses."""

    name: str
    topology: str
    collective: str
    source: str
    logs: tuple[SeriesLog, ...]  # by (nodes, ranks, name)
    fit_on: tuple[str, ...]
    predict: tuple[str, ...]
    in_target: bool
    note: str = ""

    def nodes_of(self, names: Iterable[str]) -> list[int]:
        wanted = set(names)
        return sorted({log.nodes for log in self.logs if log.name in wanted})

    @property
    def slug(self) -> str:
        return self.name.replace(" ", "-")


def _repository(source: str) -> str:
    """``github.com/owner/name`` of an index ``source`` (``repository : path (...)``)."""
    return source.split(" : ", 1)[0].strip()


def _common_stem(names: Sequence[str]) -> str:
    """The dash-separated words every log name starts with, without the collective's (the
    system's name as the files spell it: ``a100-polaris-slingshot``)."""
    words = [n.split("-") for n in names]
    same = 0
    while all(len(w) > same + 1 and w[same] == words[0][same] for w in words):
        same += 1
    return "-".join(words[0][:same]) or names[0]


def split(logs: Sequence[SeriesLog]) -> tuple[list[SeriesLog], list[SeriesLog], str]:
    """(fit on, predict, note): the logs at :data:`FIT_MAX_NODES` nodes or fewer and the larger
    ones; where either is empty, the smallest scale (by ranks) and the others, with a note
    saying why the series is outside the target."""
    small = [g for g in logs if g.nodes <= FIT_MAX_NODES]
    large = [g for g in logs if g.nodes > FIT_MAX_NODES]
    if small and large:
        return small, large, ""
    least = min(g.ranks for g in logs)
    fit = [g for g in logs if g.ranks == least]
    rest = [g for g in logs if g.ranks != least]
    why = "every log is at" if small else "no log is at"
    note = f"{why} {FIT_MAX_NODES} nodes or fewer: fitted at its fewest ranks ({least})"
    return fit, rest, note


def series_of(entries: Iterable[DatasetEntry]) -> list[Series]:
    """Every series among ``entries`` (module docstring), in a fixed order (by name)."""
    groups: dict[tuple[str, str, str], list[DatasetEntry]] = {}
    for e in entries:
        groups.setdefault((e.topology, e.collective, _repository(e.source)), []).append(e)
    out = []
    for (topology, collective, source), group in groups.items():
        logs = sorted(
            (SeriesLog(e.name, e.nodes, e.ranks) for e in group),
            key=lambda g: (g.nodes, g.ranks, g.name),
        )
        if len({(g.nodes, g.ranks) for g in logs}) < 2:
            continue
        fit, rest, note = split(logs)
        lo, hi = PREDICT_NODES
        in_target = not note and all(lo <= g.nodes <= hi for g in rest)
        if not note and not in_target:
            note = f"predicted logs outside {lo}-{hi} nodes"
        name = f"{_common_stem([g.name for g in logs])} {collective}"
        out.append(Series(name, topology, collective, source, tuple(logs),
                          tuple(g.name for g in fit), tuple(g.name for g in rest), in_target,
                          note))  # fmt: skip
    return sorted(out, key=lambda s: s.name)


PANEL_SIZES_BYTES = (1024**2, 64 * 1024**2)
"""Message sizes of a series plot's panels, with the largest size >= :data:`LARGE_PANEL_BYTES`
the series' logs share (or most of them have)."""
LARGE_PANEL_BYTES = 256 * 1024**2


@dataclass(frozen=True)
class ScalePanel:
    """busbw (GB/s) against nodes at one message size; None where a log has no prediction."""

    size_bytes: int
    nodes: tuple[int, ...]
    measured_gbps: tuple[float, ...]
    uncalibrated_gbps: tuple[float | None, ...]
    calibrated_gbps: tuple[float | None, ...]


@dataclass(frozen=True)
class ScalePlot:
    """Panels against nodes -- or against ranks (``axis``) where every log ran on as many
    nodes (GPUs of one machine) -- with the fit's values of that axis."""

    title: str
    fit_nodes: tuple[int, ...]
    panels: tuple[ScalePanel, ...]
    axis: str = "nodes"


def _busbw_at(result: Any, size: int, measured: bool = False) -> float | None:
    """busbw at the log's row nearest ``size`` within a factor sqrt(2) (a log whose sizes are
    multiples of its rank count, 8640 x 2^k on 2160 ranks, has no row at exactly 1 MiB)."""
    rows = [p for p in (result.points if result is not None else ())
            if abs(math.log2(p.bytes / size)) <= 0.5]  # fmt: skip
    if not rows:
        return None
    p = min(rows, key=lambda q: abs(math.log2(q.bytes / size)))
    return p.measured_busbw_gbps if measured else p.predicted_busbw_gbps


def scale_plot(series: Series, results: Mapping[str, Mapping[str, Any]]) -> ScalePlot:
    """The data of a series' busbw-vs-nodes plot: ``results`` mode -> log -> LogResult
    (``uncalibrated``; ``cross_scale`` for the predicted logs, ``cross_scale_fit`` for those
    fitted on)."""
    by_ranks = len({g.nodes for g in series.logs}) == 1
    scale = {g.name: g.ranks if by_ranks else g.nodes for g in series.logs}
    unc = results.get("uncalibrated", {})
    sizes_of = [{p.bytes for p in unc[g.name].points} for g in series.logs if g.name in unc]
    large = sorted({b for s in sizes_of for b in s if b >= LARGE_PANEL_BYTES},
                   key=lambda b: (sum(b in s for s in sizes_of), b))  # fmt: skip
    panels = []
    for size in (*PANEL_SIZES_BYTES, *large[-1:]):
        rows = []
        for g in series.logs:
            measured = _busbw_at(unc.get(g.name), size, measured=True)
            if measured is None:
                continue
            mode = "cross_scale_fit" if g.name in series.fit_on else "cross_scale"
            rows.append((scale[g.name], measured, _busbw_at(unc.get(g.name), size),
                         _busbw_at(results.get(mode, {}).get(g.name), size)))  # fmt: skip
        if rows:
            cols = list(zip(*rows, strict=True))
            panels.append(ScalePanel(size, *map(tuple, cols)))  # type: ignore[arg-type]
    fit = sorted({scale[n] for n in series.fit_on})
    return ScalePlot(series.name, tuple(fit), tuple(panels), "ranks" if by_ranks else "nodes")
