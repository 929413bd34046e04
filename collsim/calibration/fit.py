"""Fitting a calibration profile to nccl-tests logs: few, bounded, physical parameters.

The parameters (:mod:`collsim.model.profile`, :mod:`.problem`): per link class the logs cross
(NVLink, PCIe, network) a bandwidth efficiency (achieved / datasheet; the GPU memory's moves
with the lowest class's) and a latency scale (route, switch and per-hop protocol latency), a base
latency per call and the host's launch floor under back-to-back calls (one launch's cost: a host
thread that drives several GPUs, nccl-tests ``-g``, pays it per GPU), a size-dependent bandwidth
efficiency at three fixed sizes (64 KiB, 1 MiB, 16 MiB; 1 from 256 MiB on, interpolated in log2
size), and where the logs hold both one-way (broadcast, reduce) and two-way collectives, a
duplex efficiency of the PCIe and network links -- at most 13 numbers per system, the same for
every collective, rank count and size. Predictions are the analytic model's, with the tuner
choosing NCCL's algorithm, protocol and channels per size (:mod:`.predict`), so a profile fitted
on some collectives or scales predicts the others through the same physics.

Method: ``scipy.optimize.least_squares`` (trust-region reflective, bounds) on the relative time
error ``(predicted - measured) / measured`` of every out-of-place row, with a Cauchy robust loss
(scale 10%: a log the model cannot describe, e.g. a collective it structures differently from
NCCL, does not drag the others) and each log weighted as ~30 rows whatever its length, plus a
prior: the uncalibrated model, in log space, of width 1 (:data:`.problem.PRIOR_WEIGHT` says why
that model and that width). Fixed starts (the best wins) and fixed finite-difference steps, so a
fit is deterministic. Then :mod:`.identify` measures how far the logs constrain each parameter;
one no row moves is set to its prior exactly, and the profile records, per parameter, which logs
and sizes constrain it (``identifiability``) and the prior itself (``prior``), which
:meth:`~collsim.model.profile.Profile.params` falls back to at another scale for the parameters
that describe one scale only (base latency, size efficiency).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from collsim.calibration.identify import identify
from collsim.calibration.log_context import elem_bytes, log_env, measured_points
from collsim.calibration.nccltests import NcclTestsLog
from collsim.calibration.predict import NCCL_ACHIEVABLE_FRACTION, NCCL_BASE_LATENCY_S, Predictor
from collsim.calibration.problem import (
    BOUNDS,
    LOSS_SCALE,
    PRIOR_WIDTH_LN,
    SIZE_KNOTS_BYTES,
    START_POINTS,
    Problem,
    duplex_identifiable,
    size_table,
)
from collsim.errors import CalibrationError
from collsim.model.params import DEFAULT_PARAMS, HOST_P2P_OP_S, ModelParams
from collsim.model.profile import (
    CLASSES,
    FORMAT_VERSION,
    FitError,
    Identified,
    LinkClass,
    Prior,
    Profile,
    ProfileDoc,
    Provenance,
    TopologyRef,
)
from collsim.model.system import System
from collsim.tables import plural
from collsim.topology.spec import Topology
from collsim.whatif import WhatIf

__all__ = ["FIT_BASE", "Sample", "check_log", "classes_used", "duplex_identifiable", "fit_samples"]

FIT_BASE = dataclasses.replace(DEFAULT_PARAMS, tree_correction=True)
"""What a fit starts from: the datasheet, with NCCL's medium-size tree correction as in the
uncalibrated model (:func:`collsim.model.nccl.tree_correction`), so the size efficiencies fitted
on top are the system's own, not the tree's dip."""


@dataclass
class Sample:
    """One log to fit or validate, on its sized system; ``nccl_version``: the NCCL release it ran
    (the one the log names, else the given one, e.g. the dataset index's; None: the newest), which
    the fit predicts it with as validation does (:mod:`collsim.model.nccl_release`)."""

    log: NcclTestsLog
    topology: Topology
    env: dict[str, str] = field(default_factory=dict)
    name: str = ""
    nccl_version: str | None = None

    def __post_init__(self) -> None:
        self.name = self.name or self.log.file.rsplit("/", 1)[-1]
        self.env = log_env(self.log, self.env)
        self.nccl_version = self.log.nccl_version or self.nccl_version
        self.sizes, self.measured_s = measured_points(self.log)


def check_log(log: NcclTestsLog, *, allow_anomalies: bool = False, action: str = "fit") -> None:
    """Reject logs whose rows are wrong or inconsistent (``#wrong > 0``), unless allowed
    (``action``: what is refused, for the message)."""
    if log.anomalies and not allow_anomalies:
        raise CalibrationError(
            f"{plural(len(log.anomalies), 'anomaly', 'anomalies')}, first: {log.anomalies[0]}; "
            f"refusing to {action} "
            "(pass --allow-anomalies to use it anyway)",
            file=log.file,
        )


def classes_used(system: System) -> list[int]:
    """Link classes (0 nvlink, 1 pci, 2 net) on the routes between the system's GPUs
    (:meth:`~collsim.model.system.System.link_classes_used`). It takes the system the caller's
    predictions run on, so that its routes are built once (they take minutes at thousands of
    GPUs), not again for this question."""
    return system.link_classes_used()


def _systems(samples: Sequence[Sample]) -> dict[int, WhatIf]:
    """One :class:`WhatIf` per distinct topology object of ``samples`` (keyed by its id): the
    routes every model the fit builds on it share."""
    out: dict[int, WhatIf] = {}
    for s in samples:
        out.setdefault(id(s.topology), WhatIf(s.topology))
    return out


def fit_samples(
    samples: Sequence[Sample], *, base: ModelParams = FIT_BASE, max_nfev: int = 100
) -> Profile:
    """Fit one system's profile to ``samples`` (all on the same catalog topology)."""
    from scipy.optimize import least_squares

    if not samples:
        raise CalibrationError("nothing to fit: no logs")
    names = {s.topology.name for s in samples}
    if len(names) > 1:
        raise CalibrationError(
            "logs of one fit must be on one topology", field="--topology", value=sorted(names)
        )
    samples = sorted(samples, key=lambda s: (-s.topology.n_gpus, s.name))
    systems = _systems(samples)
    classes = sorted({k for s in systems.values() for k in classes_used(s)})
    prob = Problem(samples, classes, base, systems=[systems[id(s.topology)] for s in samples])
    rows = sum(int(s.sizes.size) for s in samples)
    # Each class's own factors have a prior that holds them where the rows cannot: what the rows
    # must determine are the others (efficiency, latency, base, floor, size factors, duplex).
    own = sum(":" not in k for k in prob.kinds)
    if rows <= own:
        raise CalibrationError(
            f"{plural(rows, 'measured row')} cannot determine the fit's {own} "
            f"parameters (any values would fit them exactly); measure more sizes, e.g. "
            f"nccl-tests -b 8 -e 8G -f 2 (31 rows)",
            field="LOGS",
            value=[s.name for s in samples],
        )
    # The floor starts at the smallest time measured (per launch: a thread driving g GPUs
    # issues g), the base at none: what both explain (only the smallest sizes) goes to the
    # host's launch floor, which carries over to collectives of other step counts unchanged
    # (the per-step latencies keep their prior). Other classes start at their prior.
    floor_us = prob.floor_start_us
    starts = [np.r_[eff * prob.prior_phys[0], lat, 0.0, floor_us, [1.0] * len(SIZE_KNOTS_BYTES)]
              for eff, lat in START_POINTS]  # fmt: skip
    rel = [prob.prior_phys[i] if k.startswith("rel:") else 1.0
           for i, k in enumerate(prob.kinds) if i >= len(starts[0])]  # fmt: skip
    starts = [np.r_[x0, rel] for x0 in starts]
    # Where the largest sizes run far slower or faster than the prior says (a broken link, the
    # wrong topology), the starts scale every rate by that factor: a prediction far too fast has
    # a relative error near -1 whatever the rate, which gives the search no slope to follow.
    at_start = prob.predict(starts[0])
    ratio = float(
        np.median([p[-1] / s.measured_s[-1] for p, s in zip(at_start, samples, strict=True)])
    )
    if not 0.5 <= ratio <= 2.0:
        for x0 in starts:
            x0[0] *= ratio
            rest = x0[0] / max(x0[0], BOUNDS["eff"][0])  # what the memory's bound leaves
            x0[[k.startswith("rel:") for k in prob.kinds]] *= rest
    if prob.others:  # the network's factors rebuild the model at every step: one start
        starts = starts[:1]
    # Base and floor move on the scale of the smallest time (the floor per launch).
    kinds = np.array(prob.kinds)
    x_scale = np.where(kinds == "base", max(1.0, prob.smallest_us), 1.0)
    x_scale = np.where(kinds == "floor", max(1.0, floor_us), x_scale)
    lo = np.array([b[0] for b in prob.bounds])
    hi = np.array([b[1] for b in prob.bounds])
    result = None
    for x0 in starts:
        x0 = np.clip(x0, lo, hi)
        found = least_squares(
            prob.residuals,
            x0,
            bounds=(lo, hi),
            loss="cauchy",
            f_scale=LOSS_SCALE,
            diff_step=1e-3,
            x_scale=x_scale,
            max_nfev=max_nfev,
            method="trf",
        )
        if result is None or found.cost < result.cost:
            result = found
    assert result is not None
    labels = prob.labels()
    phys = prob.phys(result.x)
    seen = identify(
        labels, phys, prob.prior_phys,
        [{"base": prob.smallest_us, "floor": floor_us}.get(k) for k in prob.kinds],
        lambda v: prob.predict(prob.x_of(v)),
        [s.measured_s for s in samples], [s.sizes for s in samples], [s.name for s in samples],
        prob.weights, LOSS_SCALE, PRIOR_WIDTH_LN,
    )  # fmt: skip
    for i, seen_i in enumerate(seen):  # what no row sees is the prior's, exactly
        if seen_i.status == "prior":
            phys[i] = prob.prior_phys[i]
    x = prob.x_of(phys)
    exact = Profile(_doc(prob, x)).params(base)  # the error reported is the profile's own
    preds = [
        Predictor(systems[id(s.topology)], exact).predict(
            s.log.collective,
            s.sizes,
            env=s.env,
            elem=elem_bytes(s.log),
            gpus_per_thread=s.log.gpus_per_thread,
            nccl_version=s.nccl_version,
        )[0]
        for s in samples
    ]
    per_log = {
        s.name: float(np.mean(np.abs(p - s.measured_s) / s.measured_s))
        for p, s in zip(preds, samples, strict=True)
    }
    # Base and floor rest at 0, links at full duplex, and the floor at the fastest call
    # measured (the calls the host's launches pace), when the data need no more or no less:
    # physical values, not limits hit.
    physical_low = ("base", "floor")
    at_bounds = [
        f"{name} = {v_phys:.4g} ({'lower' if v <= a * (1 + 1e-3) else 'upper'} bound)"
        for name, kind, v, a, b, v_phys, seen_i in zip(
            labels, prob.kinds, result.x, lo, hi, prob.phys(result.x), seen, strict=True
        )
        if seen_i.status != "prior"
        and (
            (v <= a * (1 + 1e-3) and kind not in physical_low)
            or (v >= b * (1 - 1e-3) and kind not in ("duplex", "floor"))
        )
    ]
    doc = _doc(prob, x).model_copy(
        update={
            "provenance": Provenance(
                logs=[s.name for s in samples],
                collectives=sorted({s.log.collective for s in samples}),
                ranks=sorted({s.log.ranks for s in samples}),
                method=(
                    f"scipy.optimize.least_squares (trf, bounds, cauchy loss f_scale={LOSS_SCALE})"
                    f" on relative time error, log-space prior of width {PRIOR_WIDTH_LN:g} on the"
                    f" uncalibrated model, {result.nfev} evaluations"
                ),
                fitted=[n for n, s in zip(labels, seen, strict=True) if s.status != "prior"],
                at_bounds=at_bounds,
                nccl_releases={s.name: str(s.nccl_version) for s in samples if s.nccl_version},
            ),
            "fit_error": FitError(
                mape=round(float(np.mean(list(per_log.values()))), 6),
                median_mape=round(float(np.median(list(per_log.values()))), 6),
                per_log={k: round(v, 6) for k, v in per_log.items()},
            ),
            "prior": Prior(
                bandwidth_efficiency=dict(zip(CLASSES, NCCL_ACHIEVABLE_FRACTION, strict=True)),
                base_latency_us=round(NCCL_BASE_LATENCY_S * 1e6, 4),
                width_ln=PRIOR_WIDTH_LN,
            ),
            "identifiability": {
                s.name: Identified(
                    status=s.status,  # type: ignore[arg-type]
                    value=round(float(v), 5),
                    prior=round(s.prior, 5),
                    sensitivity=round(s.sensitivity, 4),
                    logs=list(s.logs),
                    sizes_bytes=list(s.sizes_bytes),
                )
                for s, v in zip(seen, phys, strict=True)
            },
        }
    )
    return Profile(doc)


def _doc(prob: Problem, x: np.ndarray) -> ProfileDoc:
    """The profile document of ``x`` (provenance and errors filled in by :func:`fit_samples`)."""
    topo = prob.samples[0].topology
    return ProfileDoc(
        collsim_profile=FORMAT_VERSION,
        topology=TopologyRef.of(topo),
        link_classes={
            name: LinkClass(
                bandwidth_efficiency=round(eff, 5),
                latency_scale=round(lat, 5),
                duplex_efficiency=None if duplex is None else round(duplex, 5),
            )
            for name, (eff, lat, duplex) in prob.link_classes(x).items()
        },  # type: ignore[arg-type]
        base_latency_us=round(float(x[2]), 4),
        launch_floor_us=round(float(x[3]), 4),
        p2p_op_us=round(HOST_P2P_OP_S * 1e6, 4),
        memory_efficiency=round(prob.memory_efficiency(x), 5),
        size_efficiency=[(s, round(f, 5)) for s, f in size_table(x[4 : 4 + len(SIZE_KNOTS_BYTES)])],
        tree_correction=prob.base.tree_correction,
        provenance=Provenance(logs=[], collectives=[], ranks=[], method="", fitted=[]),
    )
