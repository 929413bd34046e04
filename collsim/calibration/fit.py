"""Fitting a calibration profile to nccl-tests logs: few, bounded, physical parameters.

The parameters (:mod:`collsim.model.profile`): a bandwidth efficiency (achieved / datasheet, for
every link and the GPU memory), a latency scale (every route, switch and per-hop protocol
latency), a base latency per call and the host's launch floor under back-to-back calls (one
launch's cost: a host thread that drives several GPUs, nccl-tests ``-g``, pays it per GPU), a
size-dependent bandwidth efficiency at three fixed sizes (64 KiB, 1 MiB, 16 MiB; 1 from 256 MiB
on, interpolated in log2 size), where the logs cross both intra-node links and the network, the
network's bandwidth and latency relative to intra-node, and where the logs hold both one-way
(broadcast, reduce) and two-way collectives, a duplex efficiency of the PCIe and network links
(what both directions of a link carry together) -- at most 10 numbers per system, the same for
every collective, rank count and size.
Predictions are the analytic model's, with the tuner choosing NCCL's algorithm, protocol and
channels per size (:mod:`.predict`), so a profile fitted on some collectives or scales predicts
the others through the same physics.

Method: ``scipy.optimize.least_squares`` (trust-region reflective, bounds) on the relative time
error ``(predicted - measured) / measured`` of every out-of-place row, with a Cauchy robust loss
(scale 10%: a log the model cannot describe, e.g. a collective it structures differently from
NCCL, does not drag the others) and each log weighted as ~30 rows whatever its length; fixed
starts (the best wins) and fixed finite-difference steps, so a fit is deterministic. During the
search the model's lines are scaled (:class:`~collsim.calibration.predict.Scale`: every latency
x the latency scale, every rate x the bandwidth efficiency -- exact, as the model is affine in
both), so only the network-vs-intra-node ratios and the duplex efficiency rebuild the model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from collsim.calibration.nccltests import NcclTestsLog
from collsim.calibration.predict import (
    Predictor,
    Scale,
    ScaledModel,
    elem_bytes,
    log_env,
    measured_points,
)
from collsim.errors import CalibrationError
from collsim.model.params import (
    DEFAULT_PARAMS,
    HOST_LAUNCH_S,
    HOST_P2P_OP_S,
    ModelParams,
    ProtocolParams,
    p2p_ops,
)
from collsim.model.profile import (
    CLASSES,
    FORMAT_VERSION,
    FitError,
    LinkClass,
    Profile,
    ProfileDoc,
    Provenance,
    TopologyRef,
    link_fingerprint,
)
from collsim.tables import plural
from collsim.topology.spec import Topology
from collsim.whatif import WhatIf

SIZE_KNOTS_BYTES = (64 * 1024, 1024**2, 16 * 1024**2)
SIZE_ANCHOR_BYTES = 256 * 1024**2
"""Where the size-dependent efficiency is fitted; from the anchor on it is 1 (asymptotic)."""
BOUNDS = {"eff": (0.02, 1.2), "lat": (0.05, 50.0), "base": (0.0, 1000.0),
          "floor": (0.0, 1000.0), "size": (0.05, 2.0),
          "rel": (0.05, 5.0), "rel_lat": (0.05, 5.0), "duplex": (0.5, 1.0)}  # fmt: skip
ONE_WAY = frozenset({"broadcast", "reduce"})
"""Collectives whose traffic crosses each link one way; the others load both directions."""
DUPLEX_CLASSES = (1, 2)
"""Link classes (pci, net) whose duplex efficiency is fitted; NVLink stays full duplex."""
START_POINTS = ((0.8, 1.0), (0.5, 0.3), (1.0, 3.0))
"""(bandwidth efficiency, latency scale) starts; the best fit wins (the tuner's choices make the
cost piecewise smooth, with local minima)."""
REF_ROWS = 30.0
LOSS_SCALE = 0.1
FLOOR_NOISE = 0.15
"""How far above the fastest call measured a fitted launch floor may go (run-to-run noise of
nccl-tests' averages)."""
FLOOR_PENALTY = 10.0
"""Residual per unit of relative excess of the floor over that limit (a wall, not a prior)."""
PRIOR_WEIGHT = 0.1
"""Weight of the weak prior that the datasheet's latencies are right (latency scales 1), that
efficiency does not depend on size (size factors 1), that links are full duplex (residuals
``PRIOR_WEIGHT * ln(x)``) and that a fixed cost is the host's launch floor rather than a per-call
GPU cost (residual ``PRIOR_WEIGHT * base / smallest time measured``), and that the floor is the
fastest call measured per launch, or a launch's a-priori cost (``HOST_LAUNCH_S``) if less
(``PRIOR_WEIGHT * (floor / that - 1)``: where the logs cannot place the floor -- an all_reduce
whose ring latencies exceed it at every size -- it stays where the measurements of other
collectives would put it, not wherever the search wanders, and no higher than a launch costs:
a floor fitted on one GPU per thread multiplies on logs whose thread drives several).
Where the data can tell (a 1% misfit over one log's rows outweighs a factor 1.2), it decides;
where it cannot -- a fixed ~35 us is as well explained by a launch floor as by 14 slower ring
hops or an additive base when only all_reduce was measured -- the priors put it in the floor, up
to a launch's cost, and the rest in the per-call base, both of which carry over unchanged to
collectives with other step counts (nccl-tests' small messages cost about the same for every
collective of a system, and on one or two nodes)."""


FIT_BASE = dataclasses.replace(DEFAULT_PARAMS, tree_correction=True)
"""What a fit starts from: the datasheet, with NCCL's medium-size tree correction as in the
uncalibrated model (:func:`collsim.model.nccl.tree_correction`), so the size efficiencies fitted
on top are the system's own, not the tree's dip."""


@dataclass
class Sample:
    """One log to fit or validate, on its sized system."""

    log: NcclTestsLog
    topology: Topology
    env: dict[str, str] = field(default_factory=dict)
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or self.log.file.rsplit("/", 1)[-1]
        self.env = log_env(self.log, self.env)
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


def classes_used(topology: Topology) -> list[int]:
    """Link classes (0 nvlink, 1 pci, 2 net) on the routes between the system's GPUs."""
    fabric = WhatIf(topology).fabric
    n = topology.n_gpus
    src, dst = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    keep = src != dst
    if n > 32:  # rings and rails: each GPU to its neighbours and to the next node's peer
        src = np.r_[np.arange(n), np.arange(n)]
        dst = np.r_[(np.arange(n) + 1) % n, (np.arange(n) + topology.nvlink_domain_gpus) % n]
        keep = src != dst
    _, links, _ = fabric.routes(src[keep], dst[keep])
    kinds = np.asarray(fabric.link_kind)[np.asarray(links, dtype=np.int64)]
    return sorted({int(k) for k in kinds})


def duplex_identifiable(samples: Sequence[Sample]) -> bool:
    """Whether the logs can tell a link's one-way rate from what both ways carry together: they
    hold both a one-way collective (broadcast, reduce) and one loading both directions. Otherwise
    the duplex efficiency is not fitted (it stays at the datasheet's full duplex)."""
    kinds = {s.log.collective in ONE_WAY for s in samples if s.log.ranks > 1}
    return kinds == {True, False}


class _Problem:
    """The residual function over one system's samples, with the model cache.

    ``x = [bandwidth, latency, base_us, size factors...]`` plus, where the logs cross both
    intra-node links and the network, ``[net bandwidth, net latency]`` relative to intra-node.
    Only the last two change the model's structure (a rebuild); the others scale its lines
    (:class:`~collsim.calibration.predict.Scale`).
    """

    def __init__(self, samples: Sequence[Sample], classes: list[int], base: ModelParams) -> None:
        self.samples = samples
        self.classes = classes
        # The fit owns the host's floor (x[3] per launch, HOST_P2P_OP_S per operation): a base
        # that carries one already (an uncalibrated or fitted profile) would count it twice.
        self.base = dataclasses.replace(base, launch_floor_s=0.0, p2p_op_s=0.0)
        self.split = 2 in classes and any(k in classes for k in (0, 1))
        # NVLink's lanes are per direction end to end; what falls short of full duplex is the host
        # side: PCIe root complexes, host-memory staging, NICs reading and writing GPU memory.
        self.duplex = duplex_identifiable(samples) and any(k in classes for k in DUPLEX_CLASSES)
        self._models: dict[tuple[float, float, float], list[Any]] = {}
        self.weights = [np.sqrt(min(1.0, REF_ROWS / s.sizes.size)) for s in samples]
        self.smallest_us = min(float(s.measured_s.min()) for s in samples) * 1e6
        # No call is faster than its floor, so the fastest call measured (per launch, less the
        # host's point-to-point operations that add to it) bounds it from above, within the noise
        # of a measurement (FLOOR_NOISE): a penalty past it (a hard bound there steers the trust
        # region off the fits it finds without one). The floor starts there, and its weak prior
        # holds it there where the logs cannot place it.
        self.floor_start_us = max(1e-3, 1e6 * min(
            float(s.measured_s.min()) / s.log.gpus_per_thread
            - p2p_ops(s.log.collective, s.log.ranks) * HOST_P2P_OP_S
            for s in samples
        ))  # fmt: skip
        self.floor_max_us = self.floor_start_us * (1 + FLOOR_NOISE)
        # A launch costs the host about HOST_LAUNCH_S; a fixed cost above that where the logs
        # cannot say what it is (one all_reduce on two nodes: 17 us, of which the network's
        # hops are most) is not put in the floor, which multiplies with the GPUs a thread drives.
        self.floor_prior_us = min(self.floor_start_us, HOST_LAUNCH_S * 1e6)
        self.kinds = ["eff", "lat", "base", "floor"] + ["size"] * len(SIZE_KNOTS_BYTES)
        if self.split:
            self.kinds += ["rel", "rel_lat"]
        if self.duplex:
            self.kinds += ["duplex"]
        # Weak prior: datasheet latencies, size-independent efficiency, full duplex.
        self.prior = np.array([k in ("lat", "size", "rel_lat", "duplex") for k in self.kinds])

    def structural(self, x: np.ndarray) -> tuple[float, float, float]:
        """(net bandwidth / intra, net latency / intra, duplex): what rebuilds the model."""
        get = {k: float(v) for k, v in zip(self.kinds, x, strict=True)}
        return (get.get("rel", 1.0), get.get("rel_lat", 1.0), get.get("duplex", 1.0))

    def models(self, x: np.ndarray) -> list[Any]:
        key = self.structural(x)
        if key not in self._models:
            if len(self._models) > 32:
                self._models.clear()
            r_eff, r_lat, duplex = key
            params = dataclasses.replace(
                self.base,
                bandwidth_efficiency=(1.0, 1.0, r_eff),
                route_latency_scale=(1.0, 1.0, r_lat),
                duplex_efficiency=tuple(duplex if k in DUPLEX_CLASSES else 1.0 for k in range(3)),
                protocols=tuple(
                    ProtocolParams(
                        p.name,
                        p.bandwidth_fraction,
                        (p.hop_latency_s[0], p.hop_latency_s[1], p.hop_latency_s[2] * r_lat),
                    )
                    for p in self.base.protocols
                ),
            )
            self._models[key] = [Predictor(s.topology, params).model for s in self.samples]
        return self._models[key]

    def scale(self, x: np.ndarray) -> Scale:
        return Scale(
            latency=float(x[1]),
            bandwidth=float(x[0]),
            base_latency_s=float(x[2]) * 1e-6,
            launch_floor_s=float(x[3]) * 1e-6,
            p2p_op_s=HOST_P2P_OP_S,
            size_factors=tuple(_size_table(x[4 : 4 + len(SIZE_KNOTS_BYTES)])),
        )

    def predict(self, x: np.ndarray) -> list[np.ndarray]:
        scale = self.scale(x)
        out = []
        for model, s in zip(self.models(x), self.samples, strict=True):
            pred = Predictor.wrap(ScaledModel(model, scale))
            t, _ = pred.predict(
                s.log.collective,
                s.sizes,
                env=s.env,
                elem=elem_bytes(s.log),
                gpus_per_thread=s.log.gpus_per_thread,
            )
            out.append(t)
        return out

    def residuals(self, x: np.ndarray) -> np.ndarray:
        preds = self.predict(x)
        parts = [
            w * (p - s.measured_s) / s.measured_s
            for w, p, s in zip(self.weights, preds, self.samples, strict=True)
        ]
        base_share = x[self.kinds.index("base")] / self.smallest_us
        floor = float(x[self.kinds.index("floor")])
        over = max(0.0, floor / self.floor_max_us - 1.0)
        r = np.concatenate(
            [*parts, PRIOR_WEIGHT * np.log(x[self.prior]), [PRIOR_WEIGHT * base_share],
             [PRIOR_WEIGHT * (floor / self.floor_prior_us - 1.0)], [FLOOR_PENALTY * over]]
        )  # fmt: skip
        return np.where(np.isfinite(r), r, 10.0)

    def doc(self, x: np.ndarray) -> ProfileDoc:
        r_eff, r_lat, duplex = self.structural(x)
        link_classes = {
            CLASSES[k]: LinkClass(
                bandwidth_efficiency=round(float(x[0]) * (r_eff if k == 2 else 1.0), 5),
                latency_scale=round(float(x[1]) * (r_lat if k == 2 else 1.0), 5),
                duplex_efficiency=(
                    round(duplex, 5) if self.duplex and k in DUPLEX_CLASSES else None
                ),
            )
            for k in self.classes
        }
        topo = self.samples[0].topology
        return ProfileDoc(
            collsim_profile=FORMAT_VERSION,
            topology=TopologyRef(
                name=topo.name,
                nodes=topo.nodes,
                gpus_per_node=topo.gpus_per_node,
                links=link_fingerprint(topo),
            ),
            link_classes=link_classes,  # type: ignore[arg-type]
            base_latency_us=round(float(x[2]), 4),
            launch_floor_us=round(float(x[3]), 4),
            p2p_op_us=round(HOST_P2P_OP_S * 1e6, 4),
            memory_efficiency=round(float(x[0]), 5),
            size_efficiency=[
                (s, round(f, 5)) for s, f in _size_table(x[4 : 4 + len(SIZE_KNOTS_BYTES)])
            ],
            tree_correction=self.base.tree_correction,
            provenance=Provenance(logs=[], collectives=[], ranks=[], method="", fitted=[]),
        )


def _size_table(factors: np.ndarray) -> list[tuple[float, float]]:
    pts = [(float(s), float(f)) for s, f in zip(SIZE_KNOTS_BYTES, factors, strict=True)]
    return [*pts, (float(SIZE_ANCHOR_BYTES), 1.0)]


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
    classes = sorted({k for s in samples for k in classes_used(s.topology)})
    prob = _Problem(samples, classes, base)
    rows = sum(int(s.sizes.size) for s in samples)
    if rows <= len(prob.kinds):
        raise CalibrationError(
            f"{plural(rows, 'measured row')} cannot determine the fit's {len(prob.kinds)} "
            f"parameters (any values would fit them exactly); measure more sizes, e.g. "
            f"nccl-tests -b 8 -e 8G -f 2 (31 rows)",
            field="LOGS",
            value=[s.name for s in samples],
        )
    # The floor starts at the smallest time measured (per launch: a thread driving g GPUs
    # issues g), the base at none: what both explain (only the smallest sizes) goes to the
    # host's launch floor, which carries over to collectives of other step counts unchanged
    # (the per-step latencies keep their prior).
    floor_us = prob.floor_start_us
    starts = [np.r_[eff, lat, 0.0, floor_us, [1.0] * len(SIZE_KNOTS_BYTES)]
              for eff, lat in START_POINTS]  # fmt: skip
    extra = [1.0] * (len(prob.kinds) - len(starts[0]))  # network ratios, duplex: datasheet
    starts = [np.r_[x0, extra] for x0 in starts]
    if prob.split:  # the network ratios rebuild the model at every step: one start
        starts = starts[:1]
    # Base and floor move on the scale of the smallest time (the floor per launch).
    kinds = np.array(prob.kinds)
    x_scale = np.where(kinds == "base", max(1.0, prob.smallest_us), 1.0)
    x_scale = np.where(kinds == "floor", max(1.0, floor_us), x_scale)
    lo = np.array([BOUNDS[k][0] for k in prob.kinds])
    hi = np.array([BOUNDS[k][1] for k in prob.kinds])
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
    x = result.x
    exact = Profile(prob.doc(x)).params(base)  # the error reported is the profile's own
    preds = [
        Predictor(s.topology, exact).predict(
            s.log.collective,
            s.sizes,
            env=s.env,
            elem=elem_bytes(s.log),
            gpus_per_thread=s.log.gpus_per_thread,
        )[0]
        for s in samples
    ]
    per_log = {
        s.name: float(np.mean(np.abs(p - s.measured_s) / s.measured_s))
        for p, s in zip(preds, samples, strict=True)
    }
    fitted = ["bandwidth_efficiency (all links, memory)", "latency_scale (all links)",
              "base_latency_us", "launch_floor_us",
              *(f"size_efficiency@{s}" for s in SIZE_KNOTS_BYTES)]  # fmt: skip
    if prob.split:
        fitted += ["net bandwidth / intra-node", "net latency / intra-node"]
    if prob.duplex:
        fitted += ["duplex_efficiency (PCIe and network links)"]
    knots = iter(SIZE_KNOTS_BYTES)
    label = {"eff": "bandwidth_efficiency", "lat": "latency_scale",
             "duplex": "duplex_efficiency", "rel": "net bandwidth / intra-node",
             "rel_lat": "net latency / intra-node"}  # fmt: skip
    names = [f"size_efficiency@{next(knots)}" if k == "size" else label.get(k, k)
             for k in prob.kinds]  # fmt: skip
    # Base and floor rest at 0, links at full duplex, and the floor at the fastest call
    # measured (the calls the host's launches pace), when the data need no more or no less:
    # physical values, not limits hit.
    physical_low = ("base", "floor")
    at_bounds = [
        f"{name} = {v:.4g} ({'lower' if v <= a * (1 + 1e-3) else 'upper'} bound)"
        for name, kind, v, a, b in zip(names, prob.kinds, x, lo, hi, strict=True)
        if (v <= a * (1 + 1e-3) and kind not in physical_low)
        or (v >= b * (1 - 1e-3) and kind not in ("duplex", "floor"))
    ]
    doc = prob.doc(x).model_copy(
        update={
            "provenance": Provenance(
                logs=[s.name for s in samples],
                collectives=sorted({s.log.collective for s in samples}),
                ranks=sorted({s.log.ranks for s in samples}),
                method=(
                    f"scipy.optimize.least_squares (trf, bounds, cauchy loss f_scale={LOSS_SCALE})"
                    f" on relative time error, {result.nfev} evaluations"
                ),
                fitted=fitted,
                at_bounds=at_bounds,
            ),
            "fit_error": FitError(
                mape=round(float(np.mean(list(per_log.values()))), 6),
                median_mape=round(float(np.median(list(per_log.values()))), 6),
                per_log={k: round(v, 6) for k, v in per_log.items()},
            ),
        }
    )
    return Profile(doc)
