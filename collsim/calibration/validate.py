"""Validating the model against measurements: predicted vs measured per size, and the MAPE.

For every timed out-of-place row (0-byte rows excepted, see
:func:`~collsim.calibration.predict.measured_points`) the relative error on time is
``|predicted - measured| / measured``; a log's MAPE is the mean over its rows (the mean absolute
percentage error of forecasting; Hyndman & Koehler, "Another look at measures of forecast
accuracy", IJF 2006), and the overall MAPE the mean over logs, so every log counts once whatever
its number of sizes. busbw follows nccl-tests' definitions (:mod:`collsim.metrics`).

JSON (``collsim validate --json``)::

    {"mape": X, "logs": [{"file", "collective", "ranks", "nodes", "mape",
      "points": [{"bytes", "measured_us", "predicted_us", "measured_busbw_gbps",
                  "predicted_busbw_gbps", "rel_err"}]}]}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from collsim.calibration.fit import Sample
from collsim.calibration.predict import Predictor, elem_bytes
from collsim.io import save_figure
from collsim.metrics import bus_factor
from collsim.model.params import DEFAULT_PARAMS, ModelParams
from collsim.tables import plural


@dataclass(frozen=True)
class Point:
    bytes: int
    measured_us: float
    predicted_us: float
    measured_busbw_gbps: float
    predicted_busbw_gbps: float
    rel_err: float
    choice: str = ""


@dataclass
class LogResult:
    file: str
    collective: str
    ranks: int
    nodes: int | None
    mape: float
    points: list[Point] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "collective": self.collective,
            "ranks": self.ranks,
            "nodes": self.nodes,
            "mape": self.mape,
            "points": [
                {
                    k: getattr(p, k)
                    for k in (
                        "bytes",
                        "measured_us",
                        "predicted_us",
                        "measured_busbw_gbps",
                        "predicted_busbw_gbps",
                        "rel_err",
                    )
                }
                for p in self.points
            ],
        }


@dataclass
class Validation:
    logs: list[LogResult]
    notes: list[str] = field(default_factory=list)

    @property
    def mape(self) -> float:
        return float(np.mean([r.mape for r in self.logs])) if self.logs else float("nan")

    @property
    def median_mape(self) -> float:
        return float(np.median([r.mape for r in self.logs])) if self.logs else float("nan")

    def as_json(self) -> dict[str, Any]:
        return {"mape": self.mape, "logs": [r.as_json() for r in self.logs]}

    def text(self, *, points: bool = True) -> str:
        """Per log: a table of sizes (predicted vs measured), then the MAPEs."""
        out: list[str] = []
        for note in self.notes:
            out.append(f"# note: {note}")
        for r in self.logs:
            nodes = plural(r.nodes, "node") if r.nodes else "? nodes"
            out.append(f"# {r.file}: {r.collective} on {plural(r.ranks, 'rank')} ({nodes})")
            if points:
                out.append(
                    f"#{'size':>13} {'meas us':>11} {'pred us':>11} {'meas busbw':>10} "
                    f"{'pred busbw':>10} {'err %':>7}  choice"
                )
                for p in r.points:
                    out.append(
                        f"{p.bytes:>14} {p.measured_us:>11.2f} {p.predicted_us:>11.2f} "
                        f"{p.measured_busbw_gbps:>10.2f} {p.predicted_busbw_gbps:>10.2f} "
                        f"{100 * p.rel_err:>7.1f}  {p.choice}"
                    )
            out.append(f"# MAPE {100 * r.mape:.1f}%")
        out.append(
            f"# overall MAPE {100 * self.mape:.1f}% (mean of {plural(len(self.logs), 'log')}; "
            "median "
            f"{100 * self.median_mape:.1f}%)"
        )
        return "\n".join(out)


def validate_samples(
    samples: Sequence[Sample], params: ModelParams = DEFAULT_PARAMS, *, model: str = "collsim"
) -> Validation:
    """Predict every sample on its system under ``params`` (or NCCL's model) and compare."""
    predictors: dict[int, Predictor] = {}
    results = []
    for s in samples:
        key = id(s.topology)
        if key not in predictors:
            predictors[key] = Predictor(s.topology, params, model=model)
        pred, labels = predictors[key].predict(
            s.log.collective,
            s.sizes,
            env=s.env,
            elem=elem_bytes(s.log),
            gpus_per_thread=s.log.gpus_per_thread,
        )
        results.append(compare(s, pred, labels))
    return Validation(results)


def compare(s: Sample, predicted_s: np.ndarray, labels: Sequence[str] = ()) -> LogResult:
    """One log's points and MAPE from its predicted times."""
    factor = bus_factor(s.log.collective, s.log.ranks)
    rel = np.abs(predicted_s - s.measured_s) / s.measured_s
    pts = []
    for i, size in enumerate(s.sizes):
        m, p = float(s.measured_s[i]), float(predicted_s[i])
        pts.append(
            Point(
                bytes=int(size),
                measured_us=m * 1e6,
                predicted_us=p * 1e6,
                measured_busbw_gbps=float(size) / m / 1e9 * factor,
                predicted_busbw_gbps=float(size) / p / 1e9 * factor if p > 0 else 0.0,
                rel_err=float(rel[i]),
                choice=labels[i] if i < len(labels) else "",
            )
        )
    nodes = s.topology.nodes  # as modelled (a flag may override the log's)
    return LogResult(s.name, s.log.collective, s.log.ranks, nodes, float(rel.mean()), pts)


def plot_validation(validation: Validation, path: str | Path, title: str = "") -> None:
    """Measured (dots) and predicted (lines) busbw per size, one curve per log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, r in enumerate(validation.logs[:12]):
        x = [p.bytes for p in r.points]
        color = f"C{i % 10}"
        ax.plot(x, [p.measured_busbw_gbps for p in r.points], "o", ms=3, color=color,
                label=f"{r.file} ({100 * r.mape:.0f}%)")  # fmt: skip
        ax.plot(x, [p.predicted_busbw_gbps for p in r.points], "-", color=color)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title or "measured (dots) vs predicted (lines)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    save_figure(fig, path)
