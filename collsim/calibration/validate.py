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

from collections.abc import Callable, Sequence
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
from collsim.units import format_size


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
    samples: Sequence[Sample],
    params: ModelParams = DEFAULT_PARAMS,
    *,
    model: str = "collsim",
    progress: Callable[[int, int], None] | None = None,
) -> Validation:
    """Predict every sample on its system under ``params`` (or NCCL's model) and compare;
    ``progress(done, total)`` is called before the first log and after each one."""
    predictors: dict[int, Predictor] = {}
    results = []
    for done, s in enumerate(samples):
        if progress is not None:
            progress(done, len(samples))
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
    if progress is not None:
        progress(len(samples), len(samples))
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


def _common_prefix(names: list[str]) -> str:
    """The dash-separated words every name starts with, with the last dash (``a100-8gpu-``)."""
    words = [n.split("-") for n in names]
    same = 0
    while all(len(w) > same + 1 and w[same] == words[0][same] for w in words):
        same += 1
    return "".join(f"{w}-" for w in words[0][:same])


def validation_figure(validation: Validation, title: str = "") -> Any:
    """Measured (dots) and predicted (lines) busbw per size, one curve per log (at most 12):
    sizes labelled as nccl-tests prints them (``64K``, ``1G``), the logs' common name prefix
    in the title and the rest in a legend beside the axes (the labels used to be the whole
    file names in 6-point type, over the curves)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    logs = validation.logs[:12]
    names = [Path(r.file).stem for r in logs]
    common = _common_prefix(names) if len(names) > 1 else ""
    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    for i, (r, name) in enumerate(zip(logs, names, strict=True)):
        x = [p.bytes for p in r.points]
        color = f"C{i % 10}"
        ax.plot(x, [p.measured_busbw_gbps for p in r.points], "o", ms=3, color=color,
                label=f"{name[len(common):] or name} ({100 * r.mape:.0f}%)")  # fmt: skip
        ax.plot(x, [p.predicted_busbw_gbps for p in r.points], "-", color=color)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=16))  # 1, 16, 256, 4K, ...: never crowded
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_size(round(v))))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("message size")
    ax.set_ylabel("busbw (GB/s)")
    ax.grid(True, alpha=0.3)
    head = title or "measured (dots) vs predicted (lines)"
    ax.set_title(head + (f"\nlogs {common}*" if common else ""), fontsize=10)
    ax.legend(title="log (MAPE)", fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0),
              borderaxespad=0.0)  # fmt: skip
    if len(validation.logs) > len(logs):
        ax.text(1.02, 0.0, f"first {len(logs)} of {len(validation.logs)} logs drawn",
                transform=ax.transAxes, fontsize=7, va="bottom")  # fmt: skip
    return fig


def plot_validation(validation: Validation, path: str | Path, title: str = "") -> None:
    """:func:`validation_figure` written to ``path`` (PNG/SVG by suffix, atomically)."""

    save_figure(validation_figure(validation, title), path)
