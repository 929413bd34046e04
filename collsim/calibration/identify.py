"""Identifiability: how far the logs of a fit constrain each of its parameters.

At the fitted values, each parameter is moved by ``STEP`` (10% of itself; the per-call costs,
which may rest at 0, by 10% of the smallest time measured) and every row's predicted time is
recomputed: a row *sees* the parameter where its time moves by more than ``SEES`` of the step
(0.1% per 10%). The outcome per parameter (:class:`Seen`):

* ``prior`` -- no row sees it (the network's efficiency in a one-node log; the per-hop latency
  in a log of large sizes only): the logs say nothing about it, so the fit sets it exactly to its
  prior, the uncalibrated value (:data:`collsim.calibration.problem.PRIOR_WEIGHT`);
* ``weak`` -- rows see it, but the data do not pin it down on its own: its marginal posterior
  width (a Laplace approximation: the inverse of the data's information ``J^T J`` -- the
  sensitivities over the data's noise, each log weighted as in the fit -- plus the prior's
  ``1 / width^2``) is more than half the prior's. Either few rows see it, or those that do are
  as well explained by another parameter (an NVLink efficiency seen only at the medium sizes of a
  two-node log, where the size efficiency acts too): the value is not the data's alone, so
  :meth:`collsim.model.profile.Profile.params` uses the prior for it at another scale;
* ``constrained`` -- the data outweigh the prior.

A forward difference rather than the optimiser's Jacobian: the tuner's choices make the times
piecewise smooth, and a 10% step says whether a parameter matters at all, which is the question;
the optimiser's Jacobian is also scaled by its robust loss. Deterministic: fixed steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from collsim.units import format_size

STEP = 0.1
SEES = 0.01
"""A row sees a parameter whose ``STEP`` moves its time by more than ``SEES x STEP``."""


@dataclass(frozen=True)
class Seen:
    """One parameter: status, its value and prior, the largest sensitivity of a row (relative
    change of time per relative change of the parameter), the logs and size range that see it."""

    name: str
    status: str
    value: float
    prior: float
    sensitivity: float
    logs: tuple[str, ...] = ()
    sizes_bytes: tuple[int, ...] = ()
    sd_ln: float | None = None
    """Marginal posterior width (natural log; the prior's where no row sees it)."""


def identified_text(name: str, seen: Any) -> str:
    """One line for ``calibrate fit``'s output, from a :class:`Seen` or a profile's
    :class:`~collsim.model.profile.Identified` record."""
    head = f"{name} = {seen.value:.4g}"
    if seen.status == "prior":
        return f"{head}: not constrained by these logs, kept at its prior"
    lo, hi = seen.sizes_bytes
    by = f"{', '.join(seen.logs)} ({format_size(lo)} to {format_size(hi)})"
    if seen.status == "weak":
        return f"{head}: weakly constrained by {by}; pulled toward its prior {seen.prior:.4g}"
    return f"{head}: constrained by {by}"


def identify(
    names: Sequence[str],
    values: np.ndarray,
    priors: np.ndarray,
    additive: Sequence[float | None],
    predict: Callable[[np.ndarray], list[np.ndarray]],
    measured: Sequence[np.ndarray],
    sizes: Sequence[np.ndarray],
    logs: Sequence[str],
    weights: Sequence[float],
    noise: float,
    width_ln: float,
) -> list[Seen]:
    """Each parameter of ``values`` (physical values; ``additive[i]``: the step's scale for one
    that moves additively, None for a relative step) as seen by ``predict(values)`` -> predicted
    seconds per log; ``weights``, ``noise``: the fit's per-log weights and residual scale."""
    base = predict(values)
    out = []
    columns = []
    for i, name in enumerate(names):
        moved = np.array(values, dtype=np.float64)
        if additive[i] is not None:
            moved[i] += STEP * float(additive[i])  # type: ignore[arg-type]
        else:
            moved[i] *= np.exp(-STEP)  # downward: the upper bounds (duplex 1) stay valid
        after = predict(moved)
        column: list[np.ndarray] = []
        best = 0.0
        seen_logs: list[str] = []
        seen_sizes: list[int] = []
        for p0, p1, m, s, log, w in zip(base, after, measured, sizes, logs, weights, strict=True):
            sens = np.abs(p1 - p0) / np.maximum(p0, 1e-30) / STEP
            column.append(w * (p1 - p0) / m / STEP / noise)
            best = max(best, float(sens.max(initial=0.0)))
            rows = sens > SEES
            if rows.any():
                seen_logs.append(log)
                seen_sizes += [int(s[rows].min()), int(s[rows].max())]
        columns.append(np.concatenate(column))
        span = (min(seen_sizes), max(seen_sizes)) if seen_sizes else ()
        out.append(
            Seen(name, "prior", float(values[i]), float(priors[i]), best, tuple(seen_logs), span)
        )
    jac = np.column_stack(columns)
    info = jac.T @ jac + np.eye(len(names)) / width_ln**2
    sd = np.sqrt(np.diag(np.linalg.pinv(info)))
    for i, seen in enumerate(out):
        if seen.logs:
            status = "constrained" if sd[i] <= width_ln / 2 else "weak"
            out[i] = dataclasses.replace(seen, status=status, sd_ln=float(sd[i]))
    return out
