"""Issue 28's accuracy targets, computed from a validation's per-log results.

"Cross-scale on every series in the data (fit <= 8 nodes, predict 16-540 nodes): median MAPE
<= 10%, no series worse than 20%. Uncalibrated busbw at >= 256 MiB within 15% on >= 80% of
multi-node logs. In-sample median stays <= 5%; cross-collective median <= 8%."

Pure functions of plain numbers (MAPE per mode and log, busbw errors per log, the series), so
the report's target table is what these compute, never a figure written by hand, and can be
tested on made-up results. A target with nothing to measure, or a series in the target whose
prediction failed, is a MISS: a target is met by evidence only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from collsim.calibration.scale_series import Series

CROSS_SCALE_MEDIAN = 0.10
CROSS_SCALE_SERIES_MAX = 0.20
BUSBW_LARGE_BYTES = 256 * 1024**2
BUSBW_WITHIN = 0.15
BUSBW_SHARE = 0.80
IN_SAMPLE_MEDIAN = 0.05
CROSS_COLLECTIVE_MEDIAN = 0.08


@dataclass(frozen=True)
class TargetRow:
    """One target: what is measured, over how many logs, the value, the limit, and whether met."""

    name: str
    value: float | None  # None: nothing to measure
    limit: float
    over: int  # logs (or series) it was measured over
    passed: bool
    higher_is_better: bool = False  # the busbw share target is a floor, the others ceilings

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "MISS"


@dataclass(frozen=True)
class SeriesRow:
    """One series' cross-scale result: the mean MAPE over its predicted logs, uncalibrated and
    calibrated (None where a log has no result)."""

    series: Series
    uncalibrated: float | None
    calibrated: float | None
    missing: tuple[str, ...]  # predicted logs without a calibrated result

    @property
    def passed(self) -> bool | None:
        """Against :data:`CROSS_SCALE_SERIES_MAX`; None outside the target."""
        if not self.series.in_target:
            return None
        return (
            self.calibrated is not None
            and not self.missing
            and self.calibrated <= CROSS_SCALE_SERIES_MAX
        )


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


def series_rows(
    series: Sequence[Series],
    uncalibrated: Mapping[str, float],
    cross_scale: Mapping[str, float],
) -> list[SeriesRow]:
    """Per series, the mean MAPE of its predicted logs (each log counted once)."""
    out = []
    for s in series:
        missing = tuple(n for n in s.predict if n not in cross_scale)
        out.append(SeriesRow(
            s,
            _mean([uncalibrated[n] for n in s.predict if n in uncalibrated]),
            _mean([cross_scale[n] for n in s.predict if n in cross_scale]),
            missing,
        ))  # fmt: skip
    return out


def _median_target(name: str, values: Sequence[float], limit: float) -> TargetRow:
    if not values:
        return TargetRow(name, None, limit, 0, False)
    med = float(np.median(values))
    return TargetRow(name, med, limit, len(values), med <= limit)


def busbw_share(errors: Mapping[str, float]) -> TargetRow:
    """Share of logs whose uncalibrated busbw error at >= 256 MiB is within
    :data:`BUSBW_WITHIN`, against :data:`BUSBW_SHARE`."""
    name = (f"uncalibrated busbw at >= 256 MiB within {100 * BUSBW_WITHIN:.0f}% "
            "(share of multi-node logs)")  # fmt: skip
    if not errors:
        return TargetRow(name, None, BUSBW_SHARE, 0, False, higher_is_better=True)
    share = sum(e <= BUSBW_WITHIN for e in errors.values()) / len(errors)
    return TargetRow(name, share, BUSBW_SHARE, len(errors), share >= BUSBW_SHARE, True)


def issue_targets(
    mape: Mapping[str, Mapping[str, float]],
    series: Sequence[Series],
    busbw_errors: Mapping[str, float],
) -> list[TargetRow]:
    """The table of issue 28's targets. ``mape``: mode -> log -> MAPE (modes ``uncalibrated``,
    ``in_sample``, ``cross_collective``, ``cross_scale``); ``busbw_errors``: multi-node log ->
    uncalibrated busbw error at >= 256 MiB (:func:`busbw_error`)."""
    rows = series_rows(series, mape.get("uncalibrated", {}), mape.get("cross_scale", {}))
    in_target = [r for r in rows if r.series.in_target]
    scale = mape.get("cross_scale", {})
    predicted = [n for r in in_target for n in r.series.predict]
    median = _median_target(
        "cross-scale median MAPE (logs of the target's series)",
        [scale[n] for n in predicted if n in scale],
        CROSS_SCALE_MEDIAN,
    )
    if any(n not in scale for n in predicted):  # a log without a result is no evidence
        median = TargetRow(median.name, median.value, median.limit, median.over, False)
    worst_values = [r.calibrated for r in in_target if r.calibrated is not None]
    worst = TargetRow(
        "cross-scale worst series (mean MAPE of its predicted logs)",
        max(worst_values) if worst_values else None,
        CROSS_SCALE_SERIES_MAX,
        len(in_target),
        bool(in_target) and all(r.passed for r in in_target),
    )
    return [
        median,
        worst,
        busbw_share(busbw_errors),
        _median_target("in-sample median MAPE", list(mape.get("in_sample", {}).values()),
                       IN_SAMPLE_MEDIAN),
        _median_target("cross-collective median MAPE",
                       list(mape.get("cross_collective", {}).values()), CROSS_COLLECTIVE_MEDIAN),
    ]  # fmt: skip


def busbw_error(points: Sequence[tuple[int, float, float]]) -> float | None:
    """Mean |predicted - measured| / measured busbw over the rows of at least
    :data:`BUSBW_LARGE_BYTES`; ``points`` are (bytes, measured, predicted busbw). None where the
    log has no such row."""
    errs = [abs(p - m) / m for b, m, p in points if b >= BUSBW_LARGE_BYTES and m > 0]
    return float(np.mean(errs)) if errs else None
