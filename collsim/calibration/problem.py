"""The fit's residual function over one system's logs: parameters, priors, the model cache.

``x = [memory efficiency, latency scale, base_us, floor_us, size factors...]``, the GPU
memory's efficiency scaling every rate and the reference link class's latency scale (the lowest
class the logs cross: NVLink, else PCIe, else the network) every latency, then for each class the
logs cross its bandwidth efficiency relative to the memory's (``rel:K``) and, for the classes
other than the reference, its latency scale relative to the reference's (``rel_lat:K``), and a
duplex efficiency where identifiable. One set per class and the memory apart, so that what the
logs say of one (the PCIe path to the NIC, or the reductions in memory, at two nodes) is not
carried to another (the NVLink between a node's GPUs at one). Only the relative factors and the
duplex efficiency change the model's structure (a rebuild); the others scale its lines
(where the logs cross one class only, its efficiency is ``x[0]`` and the memory's moves with it,
as the two cannot be told apart there and no rebuild is then needed)
(:class:`~collsim.calibration.predict.Scale`). :meth:`Problem.phys` gives every class's own
values, on which the priors sit and which :mod:`.identify` moves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from collsim.calibration.log_context import elem_bytes
from collsim.calibration.predict import (
    NCCL_ACHIEVABLE_FRACTION,
    NCCL_BASE_LATENCY_S,
    Predictor,
    Scale,
)
from collsim.model.params import HOST_LAUNCH_S, HOST_P2P_OP_S, ModelParams, ProtocolParams, p2p_ops
from collsim.model.profile import CLASSES
from collsim.units import format_size

SIZE_KNOTS_BYTES = (64 * 1024, 1024**2, 16 * 1024**2)
SIZE_ANCHOR_BYTES = 256 * 1024**2
"""Where the size-dependent efficiency is fitted; from the anchor on it is 1 (asymptotic)."""
BOUNDS = {
    "eff": (0.02, 1.2),
    "lat": (0.05, 50.0),
    "base": (0.0, 1000.0),
    "floor": (0.0, 1000.0),
    "size": (0.05, 2.0),
    "rel": (0.05, 5.0),
    "rel_lat": (0.05, 5.0),
    "duplex": (0.5, 1.0),
}
"""Per kind of parameter; ``rel`` and ``rel_lat`` (a link class's efficiency and latency scale
relative to the reference class's) are ``rel:K`` / ``rel_lat:K`` for class K."""  # fmt: skip
ONE_WAY = frozenset({"broadcast", "reduce"})
"""Collectives whose traffic crosses each link one way; the others load both directions."""
DUPLEX_CLASSES = (1, 2)
"""Link classes (pci, net) whose duplex efficiency is fitted; NVLink stays full duplex."""
START_POINTS = ((1.0, 1.0), (0.625, 0.3), (1.25, 3.0))
"""(every rate, latency scale) relative to the prior: starts; the best fit wins (the tuner's
choices make the cost piecewise smooth, with local minima)."""
REF_ROWS = 30.0
LOSS_SCALE = 0.1
FLOOR_NOISE = 0.15
"""How far above the fastest call measured a fitted launch floor may go (run-to-run noise of
nccl-tests' averages)."""
FLOOR_PENALTY = 10.0
"""Residual per unit of relative excess of the floor over that limit (a wall, not a prior)."""
PRIOR_WEIGHT = 0.1
"""Weight of the priors. The link parameters, size factors and duplex efficiency have a prior in
log space centred on the uncalibrated model (:func:`.predict.uncalibrated_params`:
datasheet rates at NCCL's achievable fraction, datasheet latencies, size-independent, full duplex),
residual ``PRIOR_WEIGHT * ln(value / prior)``. Under the Cauchy loss of scale ``LOSS_SCALE``
(10%, the data's noise) that is a ridge on the log-parameters of width ``PRIOR_WIDTH_LN`` =
``LOSS_SCALE / PRIOR_WEIGHT`` = 1 (one standard deviation is a factor e: wide enough that one
log's 30 rows at 1% sensitivity outweigh it, narrow enough that a parameter no row sees much
stays near the datasheet instead of wandering to absorb another parameter's misfit; heavy
tailed, so a system truly far off its datasheet is not held back). Why the uncalibrated model
is the prior: it is the mechanism, not a curve -- the rates the hardware is specified to carry,
less what NCCL's own topology model expects its protocols to lose -- so it is the best guess
wherever the logs are silent, and the same guess at every scale.
The per-call costs have priors of attribution instead: a fixed cost is the host's launch floor
rather than a per-call GPU cost (residual ``PRIOR_WEIGHT * base / smallest time measured``), and
the floor is the fastest call measured per launch, or a launch's a-priori cost
(``HOST_LAUNCH_S``) if less (``PRIOR_WEIGHT * (floor / that - 1)``: where the logs cannot place
the floor -- an all_reduce whose ring latencies exceed it at every size -- it stays where the
measurements of other collectives would put it, no higher than a launch costs: a floor fitted
on one GPU per thread multiplies on logs whose thread drives several). Where the data can tell
(a 1% misfit over one log's rows outweighs a factor 1.2), it decides; where it cannot -- a
fixed ~35 us is as well explained by a launch floor as by 14 slower ring hops or an additive
base when only all_reduce was measured -- the priors put it in the floor, up to a launch's
cost, and the rest in the per-call base. A parameter no row moves at all
(:mod:`.identify`) is set to its prior exactly after the fit."""
PRIOR_WIDTH_LN = LOSS_SCALE / PRIOR_WEIGHT
RIDGE_KINDS = ("eff", "lat", "size", "rel", "rel_lat", "duplex")
"""Kinds with the log-space prior (``rel`` and ``rel_lat`` on their class's own values)."""


def duplex_identifiable(samples: Sequence[Any]) -> bool:
    """Whether the logs can tell a link's one-way rate from what both ways carry together: they
    hold both a one-way collective (broadcast, reduce) and one loading both directions. Otherwise
    the duplex efficiency is not fitted (it stays at the datasheet's full duplex)."""
    kinds = {s.log.collective in ONE_WAY for s in samples if s.log.ranks > 1}
    return kinds == {True, False}


class Problem:
    """The residual function over one system's samples, with the model cache (module docstring)."""

    def __init__(
        self,
        samples: Sequence[Any],
        classes: list[int],
        base: ModelParams,
        systems: Sequence[Any] | None = None,
    ) -> None:
        self.samples = samples
        # Each sample's system (a WhatIf), or its topology: every model rebuilt for a new
        # structural parameter shares the system's routes instead of routing again.
        self.systems = list(systems) if systems is not None else [s.topology for s in samples]
        self.classes = classes
        # The fit owns the host's floor (x[3] per launch, HOST_P2P_OP_S per operation): a base
        # that carries one already (an uncalibrated or fitted profile) would count it twice.
        self.base = dataclasses.replace(base, launch_floor_s=0.0, p2p_op_s=0.0)
        self.ref = classes[0] if classes else 2
        self.others = [k for k in classes if k != self.ref]
        # NVLink's lanes are per direction end to end; what falls short of full duplex is the host
        # side: PCIe root complexes, host-memory staging, NICs reading and writing GPU memory.
        self.duplex = duplex_identifiable(samples) and any(k in classes for k in DUPLEX_CLASSES)
        self._models: dict[tuple[float, ...], list[Predictor]] = {}
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
        # One class: its efficiency is x[0], the memory's in proportion (no rebuilds).
        self.tied = len(classes) <= 1
        for k in classes if not self.tied else ():
            self.kinds += [f"rel:{k}"] + ([f"rel_lat:{k}"] if k != self.ref else [])
        if self.duplex:
            self.kinds += ["duplex"]
        # The prior (the uncalibrated model) on the physical values (:meth:`phys`).
        self.frac = NCCL_ACHIEVABLE_FRACTION
        centre = {"eff": self.frac[self.ref] if self.tied else 1.0, "lat": 1.0,
                  "base": NCCL_BASE_LATENCY_S * 1e6, "floor": self.floor_prior_us, "size": 1.0,
                  "rel_lat": 1.0, "duplex": 1.0}  # fmt: skip
        self.prior_phys = np.array(
            [self.frac[self.cls(k)] if k.startswith("rel:") else centre[k.split(":")[0]]
             for k in self.kinds]
        )  # fmt: skip
        self.ridge = np.array([k.split(":")[0] in RIDGE_KINDS for k in self.kinds])
        self.bounds = [BOUNDS[k.split(":")[0]] for k in self.kinds]

    @staticmethod
    def cls(kind: str) -> int:
        return int(kind.split(":")[1])

    def labels(self) -> list[str]:
        """Each parameter's name as printed and recorded (its physical meaning, :meth:`phys`)."""
        knots = iter(SIZE_KNOTS_BYTES)
        ref = CLASSES[self.ref]
        eff = f"{ref}.bandwidth_efficiency" if self.tied else "memory_efficiency"
        names = {"eff": eff, "lat": f"{ref}.latency_scale",
                 "base": "base_latency_us", "floor": "launch_floor_us",
                 "duplex": "duplex_efficiency"}  # fmt: skip
        out = []
        for k in self.kinds:
            if k == "size":
                out.append(f"size_efficiency@{format_size(next(knots))}")
            elif ":" in k:
                what = "bandwidth_efficiency" if k.startswith("rel:") else "latency_scale"
                out.append(f"{CLASSES[self.cls(k)]}.{what}")
            else:
                out.append(names[k])
        return out

    def phys(self, x: np.ndarray) -> np.ndarray:
        """``x`` as physical values: every class's own efficiency and latency scale, not
        relative to the reference class (what the priors and the identifiability speak of)."""
        out = np.array(x, dtype=np.float64)
        for i, k in enumerate(self.kinds):
            if ":" in k:
                out[i] *= x[0] if k.startswith("rel:") else x[1]
        return out

    def x_of(self, phys: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`phys`."""
        out = np.array(phys, dtype=np.float64)
        for i, k in enumerate(self.kinds):
            if ":" in k:
                out[i] /= phys[0] if k.startswith("rel:") else phys[1]
        return out

    def structural(self, x: np.ndarray) -> tuple[float, ...]:
        """Per class: efficiency and latency relative to the reference; then the duplex: what
        rebuilds the model."""
        rel = [1.0] * 3
        rel_lat = [1.0] * 3
        duplex = 1.0
        for v, k in zip(x, self.kinds, strict=True):
            if k.startswith("rel:"):
                rel[self.cls(k)] = float(v)
            elif k.startswith("rel_lat:"):
                rel_lat[self.cls(k)] = float(v)
            elif k == "duplex":
                duplex = float(v)
        return (*rel, *rel_lat, duplex)

    def models(self, x: np.ndarray) -> list[Any]:
        """Each sample's model at ``x``'s structural values, unscaled."""
        return [p.model for p in self.predictors(x)]

    def predictors(self, x: np.ndarray) -> list[Predictor]:
        """Each sample's :class:`Predictor` at ``x``'s structural values (cached), unscaled."""
        key = self.structural(x)
        if key not in self._models:
            if len(self._models) > 32:
                self._models.clear()
            rel, lat, duplex = key[:3], key[3:6], key[6]
            tied = self.frac[self.ref] if self.tied else 1.0
            params = dataclasses.replace(
                self.base,
                reduce_efficiency=self.base.reduce_efficiency / tied,
                copy_efficiency=self.base.copy_efficiency / tied,
                # a channel is a thread block copying: its ceiling moves with the memory's
                # efficiency (x[0] / tied once the Scale divides every slope by x[0]), as the
                # profile applies it (Profile.params)
                channel_efficiency=self.base.channel_efficiency / tied,
                bandwidth_efficiency=rel,  # type: ignore[arg-type]
                route_latency_scale=lat,  # type: ignore[arg-type]
                duplex_efficiency=tuple(duplex if k in DUPLEX_CLASSES else 1.0 for k in range(3)),
                protocols=tuple(
                    ProtocolParams(
                        q.name,
                        q.bandwidth_fraction,
                        tuple(h * s for h, s in zip(q.hop_latency_s, lat, strict=True)),  # type: ignore[arg-type]
                    )
                    for q in self.base.protocols
                ),
            )
            self._models[key] = [Predictor(system, params) for system in self.systems]
        return self._models[key]

    def scale(self, x: np.ndarray) -> Scale:
        return Scale(
            latency=float(x[1]),
            bandwidth=float(x[0]),
            base_latency_s=float(x[2]) * 1e-6,
            launch_floor_s=float(x[3]) * 1e-6,
            p2p_op_s=HOST_P2P_OP_S,
            size_factors=tuple(size_table(x[4 : 4 + len(SIZE_KNOTS_BYTES)])),
        )

    def predict(self, x: np.ndarray) -> list[np.ndarray]:
        scale = self.scale(x)
        out = []
        for predictor, s in zip(self.predictors(x), self.samples, strict=True):
            # the system's predictor, so each log is predicted as validation predicts it: with
            # its NCCL release's tables and its tree's up-then-down NICs (Predictor.predict)
            t, _ = predictor.rescaled(scale).predict(
                s.log.collective,
                s.sizes,
                env=s.env,
                elem=elem_bytes(s.log),
                gpus_per_thread=s.log.gpus_per_thread,
                nccl_version=s.nccl_version,
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
        ridge = np.log(self.phys(x)[self.ridge] / self.prior_phys[self.ridge])
        r = np.concatenate(
            [*parts, PRIOR_WEIGHT * ridge, [PRIOR_WEIGHT * base_share],
             [PRIOR_WEIGHT * (floor / self.floor_prior_us - 1.0)], [FLOOR_PENALTY * over]]
        )  # fmt: skip
        return np.where(np.isfinite(r), r, 10.0)

    def link_classes(self, x: np.ndarray) -> dict[str, tuple[float, float, float | None]]:
        """Per class the logs cross: (bandwidth efficiency, latency scale, duplex or None)."""
        phys = self.phys(x)
        duplex = self.structural(x)[6]
        out = {}
        for k in self.classes:
            i = 0 if self.tied else self.kinds.index(f"rel:{k}")
            j = 1 if k == self.ref else self.kinds.index(f"rel_lat:{k}")
            d = duplex if self.duplex and k in DUPLEX_CLASSES else None
            out[CLASSES[k]] = (float(phys[i]), float(phys[j]), d)
        return out

    def memory_efficiency(self, x: np.ndarray) -> float:
        return float(x[0]) / (self.frac[self.ref] if self.tied else 1.0)


def size_table(factors: np.ndarray) -> list[tuple[float, float]]:
    pts = [(float(s), float(f)) for s, f in zip(SIZE_KNOTS_BYTES, factors, strict=True)]
    return [*pts, (float(SIZE_ANCHOR_BYTES), 1.0)]
