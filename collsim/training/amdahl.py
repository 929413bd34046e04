"""Scaling analysis: speedup and efficiency vs GPU count, Amdahl and Gustafson fits, Karp-Flatt.

From step times ``T(n)`` (simulated or measured) at GPU counts ``n``, relative to the smallest
count ``n0`` (taken as perfectly efficient, so speedups are in units of ``n0`` GPUs' worth):

* strong scaling (fixed global batch): speedup ``S(n) = n0 T(n0) / T(n)``, efficiency ``S/n``;
  Amdahl's law ``T(n) = T1 (f + (1 - f)/n)`` (Amdahl 1967) fitted by least squares on ``1/n``
  (``T = a + b/n``, ``f = a / (a + b)``): ``f`` is the serial / communication fraction;
* weak scaling (fixed batch per GPU): efficiency ``T(n0) / T(n)``, scaled speedup
  ``n x efficiency``; Gustafson's law ``S(n) = n - f (n - 1)`` (Gustafson 1988) fitted for ``f``;
* the Karp-Flatt metric (Karp and Flatt 1990), the experimentally determined serial fraction
  ``e(n) = (1/S - 1/n) / (1 - 1/n)`` per point: constant if the loss is a serial fraction,
  growing with ``n`` if it is overhead that grows with the machine (communication).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from collsim.errors import CollsimError


@dataclass(frozen=True)
class ScalingCurve:
    """Step times against GPU counts, and everything derived from them."""

    mode: str
    n_gpus: np.ndarray
    step_time_s: np.ndarray
    speedup: np.ndarray
    efficiency: np.ndarray
    karp_flatt: np.ndarray
    serial_fraction: float
    """Amdahl's ``f`` (strong) or Gustafson's ``f`` (weak) from the fit."""
    fit_t1_s: float
    """Fitted one-GPU step time (strong scaling), ``T(n0)`` for weak scaling."""

    def predicted(self, n: np.ndarray | Sequence[float]) -> np.ndarray:
        """The fitted law at ``n``: step times (strong) or scaled speedups (weak)."""
        x = np.asarray(n, dtype=float)
        f = self.serial_fraction
        if self.mode == "strong":
            return self.fit_t1_s * (f + (1 - f) / x)
        return x - f * (x - 1)

    def as_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "serial_fraction": self.serial_fraction,
            "fit_t1_s": self.fit_t1_s,
            "points": [
                {
                    "gpus": int(n),
                    "step_time_s": float(t),
                    "speedup": float(s),
                    "efficiency": float(e),
                    "karp_flatt": None if not np.isfinite(k) else float(k),
                }
                for n, t, s, e, k in zip(
                    self.n_gpus,
                    self.step_time_s,
                    self.speedup,
                    self.efficiency,
                    self.karp_flatt,
                    strict=True,
                )
            ],
        }


def karp_flatt(speedup: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``(1/S - 1/n) / (1 - 1/n)`` per point (NaN at ``n = 1``)."""
    s = np.asarray(speedup, dtype=float)
    x = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 1, (1 / s - 1 / x) / (1 - 1 / x), np.nan)


def amdahl_fit(n: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """Least-squares ``T = a + b/n``; returns ``(f, T1)`` with ``f = a/(a+b)`` in [0, 1]."""
    x = 1 / np.asarray(n, dtype=float)
    a_mat = np.vstack([np.ones_like(x), x]).T
    (a, b), *_ = np.linalg.lstsq(a_mat, np.asarray(t, dtype=float), rcond=None)
    a, b = max(float(a), 0.0), max(float(b), 0.0)
    total = a + b
    if total <= 0:
        return 0.0, float(np.mean(t))
    return a / total, total


def gustafson_fit(n: np.ndarray, speedup: np.ndarray) -> float:
    """Least-squares ``f`` in ``S = n - f (n - 1)``, clipped to [0, 1]."""
    x = np.asarray(n, dtype=float) - 1
    gap = np.asarray(n, dtype=float) - np.asarray(speedup, dtype=float)
    denom = float(np.dot(x, x))
    return 0.0 if denom == 0 else float(np.clip(np.dot(x, gap) / denom, 0.0, 1.0))


def scaling_curve(
    n_gpus: Sequence[int], step_time_s: Sequence[float], mode: str = "strong"
) -> ScalingCurve:
    """Speedup, efficiency, Karp-Flatt and the fit, from step times at several GPU counts."""
    if mode not in ("strong", "weak"):
        raise CollsimError("mode must be strong or weak", field="--mode", value=mode)
    order = np.argsort(np.asarray(n_gpus))
    n = np.asarray(n_gpus, dtype=float)[order]
    t = np.asarray(step_time_s, dtype=float)[order]
    if n.size < 2:
        raise CollsimError("scaling needs at least two GPU counts", field="gpus", value=n.size)
    if np.any(t <= 0) or np.any(n < 1):
        raise CollsimError("step times and GPU counts must be positive", field="step_time_s")
    n0, t0 = n[0], t[0]
    if mode == "strong":
        speedup = n0 * t0 / t
        f, t1 = amdahl_fit(n, t)
    else:
        speedup = n * t0 / t
        f, t1 = gustafson_fit(n, speedup), float(t0)
    return ScalingCurve(
        mode=mode,
        n_gpus=n.astype(int),
        step_time_s=t,
        speedup=speedup,
        efficiency=speedup / n,
        karp_flatt=karp_flatt(speedup, n),
        serial_fraction=f,
        fit_t1_s=t1,
    )
