"""Validating the model against measurements: predicted vs measured per size, and the MAPE.

For every timed out-of-place row (0-byte rows excepted, see
:func:`~collsim.calibration.log_context.measured_points`) the relative error on time is
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

from collsim.calibration.fit import Sample, classes_used
from collsim.calibration.log_context import elem_bytes
from collsim.calibration.predict import Predictor, uncalibrated_params
from collsim.errors import CalibrationError
from collsim.io import save_figure
from collsim.metrics import bus_factor
from collsim.model.params import DEFAULT_PARAMS, ModelParams
from collsim.model.profile import CLASSES, Profile
from collsim.model.system import System
from collsim.tables import plural
from collsim.topology.spec import Topology
from collsim.units import format_size
from collsim.whatif import WhatIf

WORSE_TOLERANCE = 0.005
"""How much higher a calibrated MAPE may be than the uncalibrated one before ``validate
--cross-scale`` calls the profile worse there: half a point of MAPE. A link class's efficiency
fitted at one scale is a measured value, and where that class shares the bottleneck with classes
the fit never saw it moves another scale's times by ~0.1% either way; what the flag is for is the
tens of points a profile used to cost at another scale (Snellius 2n -> 1n: 13% -> 38%)."""


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


def profile_params(profile: Profile, system: System | Topology) -> ModelParams:
    """``profile``'s parameters on ``system`` (the :class:`~collsim.model.system.System` a
    :class:`~.predict.Predictor` runs on, whose routes are then built once; or a topology), over
    the uncalibrated model: at another scale than the fit's, what the fit could not see there
    stays at the prior (:meth:`~collsim.model.profile.Profile.params`)."""
    system = system if isinstance(system, System) else WhatIf(system)
    classes = [CLASSES[k] for k in classes_used(system)]
    return profile.params(uncalibrated_params(), system.topology, classes)


def validate_samples(
    samples: Sequence[Sample],
    params: ModelParams | Profile = DEFAULT_PARAMS,
    *,
    model: str = "collsim",
    progress: Callable[[int, int], None] | None = None,
    nccl_version: str | None = None,
) -> Validation:
    """Predict every sample on its system under ``params`` (a profile: on each system as
    :func:`profile_params` gives it) or NCCL's model, and compare; ``progress(done, total)`` is
    called before the first log and after each one. Each log is predicted as its NCCL release
    would choose (:mod:`collsim.model.nccl_release`): the release the log names, else
    ``nccl_version``, else the newest."""
    predictors: dict[int, Predictor] = {}
    results = []
    for done, s in enumerate(samples):
        if progress is not None:
            progress(done, len(samples))
        key = id(s.topology)
        if key not in predictors:
            system = WhatIf(s.topology)  # one system: its routes serve the profile and the model
            on = profile_params(params, system) if isinstance(params, Profile) else params
            predictors[key] = Predictor(system, on, model=model)
        pred, labels = predictors[key].predict(
            s.log.collective,
            s.sizes,
            env=s.env,
            elem=elem_bytes(s.log),
            gpus_per_thread=s.log.gpus_per_thread,
            nccl_version=s.nccl_version or nccl_version,
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


@dataclass
class CrossScale:
    """A profile fitted on some scales of one system, validated on its others
    (``collsim validate --cross-scale``): per log, the uncalibrated and the calibrated result."""

    fitted_on: list[str]
    profile: Profile
    uncalibrated: Validation
    calibrated: Validation

    def text(self) -> str:
        out = [f"# fitted on {', '.join(self.fitted_on)}"]
        out += [f"#   {n}: in-sample MAPE {100 * m:.1f}%"
                for n, m in (self.profile.doc.fit_error.per_log.items()
                             if self.profile.doc.fit_error else ())]  # fmt: skip
        out.append(
            f"# 'worse': the calibrated MAPE exceeds the uncalibrated by more than "
            f"{100 * WORSE_TOLERANCE:g} points (WORSE_TOLERANCE)"
        )
        out.append(f"#{'log':>49} {'ranks':>5} {'nodes':>5} {'uncal %':>8} {'calib %':>8}")
        for u, c in zip(self.uncalibrated.logs, self.calibrated.logs, strict=True):
            worse = "  worse" if c.mape > u.mape + WORSE_TOLERANCE else ""
            out.append(f"{Path(u.file).name:>50} {u.ranks:>5} {u.nodes or '?':>5} "
                       f"{100 * u.mape:>8.1f} {100 * c.mape:>8.1f}{worse}")  # fmt: skip
        out.append(
            f"# other scales: uncalibrated MAPE {100 * self.uncalibrated.mape:.1f}% mean, "
            f"{100 * self.uncalibrated.median_mape:.1f}% median; calibrated "
            f"{100 * self.calibrated.mape:.1f}% mean, {100 * self.calibrated.median_mape:.1f}% "
            "median"
        )
        return "\n".join(out)

    def as_json(self) -> dict[str, Any]:
        return {
            "fitted_on": self.fitted_on,
            "profile": self.profile.to_dict(),
            "uncalibrated": self.uncalibrated.as_json(),
            "calibrated": self.calibrated.as_json(),
        }


def split_scales(
    samples: Sequence[Sample], fit_on: int | None
) -> tuple[list[Sample], list[Sample]]:
    """(logs to fit, logs to predict): those at ``fit_on`` nodes -- or ranks, where no log ran on
    that many nodes -- or, by default, at the fewest ranks. Raises where the logs are at one scale
    only, or ``fit_on`` matches none or all of them."""
    scales = sorted({(s.log.ranks, s.topology.nodes) for s in samples})
    listed = ", ".join(f"{r} ranks on {plural(n, 'node')}" for r, n in scales)
    if len(scales) < 2:
        raise CalibrationError(
            f"--cross-scale needs logs at two scales or more; these are all at {listed}",
            field="LOGS",
        )
    if fit_on is None:
        fit = [s for s in samples if s.log.ranks == scales[0][0]]
    else:
        fit = [s for s in samples if s.topology.nodes == fit_on]
        fit = fit or [s for s in samples if s.log.ranks == fit_on]
    rest = [s for s in samples if s not in fit]
    if not fit or not rest:
        raise CalibrationError(
            f"matches {'no' if not fit else 'every'} log as nodes or ranks (the logs: {listed})",
            field="--fit-on",
            value=fit_on,
        )
    return fit, rest


def cross_scale(
    samples: Sequence[Sample], fit_on: int | None = None, *, fit: Callable[..., Profile]
) -> CrossScale:
    """Fit ``fit(logs)`` on one scale of ``samples`` (:func:`split_scales`) and validate on the
    others, uncalibrated and with the profile (:func:`profile_params`)."""
    on, rest = split_scales(samples, fit_on)
    profile = fit(on)
    return CrossScale(
        [s.name for s in on],
        profile,
        validate_samples(rest, uncalibrated_params()),
        validate_samples(rest, profile),
    )
