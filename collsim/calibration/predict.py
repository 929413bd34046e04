"""Predicting a measured nccl-tests log: the model's time per row.

A prediction is what NCCL would do on the modelled system: per size, the tuner
(:mod:`collsim.model.tuner`) picks the fastest (algorithm, protocol, channels) among *NCCL's*
algorithms (ring and tree all-reduce, NVLS where the switch reduces, ring all-gather /
reduce-scatter, chain broadcast / reduce, point-to-point all-to-all and send/receive; NCCL,
``src/enqueue.cc`` ``topoGetAlgoInfo``), honouring the ``NCCL_ALGO`` / ``NCCL_PROTO`` /
``NCCL_TREE_THRESHOLD`` / ``NCCL_{MIN,MAX}_NCHANNELS`` settings the log records (NCCL's
``docs/env.rst``), so a log measured with ``NCCL_ALGO=Ring`` is predicted with the ring; and LL128
only where NCCL enables it by default (:meth:`collsim.model.analytic.AnalyticModel.enabled`) or the
log's ``NCCL_PROTO`` names it.

The log's system, settings and rows (:func:`~.log_context.topology_for_log`,
:func:`~.log_context.constraints`, :func:`~.log_context.measured_points`) are
:mod:`collsim.calibration.log_context`'s.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from collsim.calibration.log_context import (
    asked_for_ll128,
    constraints,
    elem_bytes,
    log_env,
    measured_points,
)
from collsim.calibration.nccltests import NcclTestsLog
from collsim.channel_rates import nvidia_compute_capability
from collsim.errors import CalibrationError
from collsim.model.analytic import AnalyticModel, effective_bytes
from collsim.model.mapping import intra_inter_bandwidth
from collsim.model.nccl_release import (
    NcclVersion,
    effective_version,
    parse_nccl_version,
    tree_nic_share,
    tree_threshold_bytes,
    with_nic_share,
)
from collsim.model.params import (
    DEFAULT_PARAMS,
    HOST_LAUNCH_S,
    HOST_P2P_OP_S,
    ModelParams,
    p2p_ops,
    under_floor,
)
from collsim.model.tuner import (
    Tuner,
    host_floor_s,
    nccl_algorithms,
    nccl_channel_options,
)
from collsim.topology.spec import Topology
from collsim.whatif import WhatIf

NCCL_BASE_LATENCY_S = 6.6e-6
"""NCCL's per-launch ``baseLat`` for ring/LL, the protocol small messages run with (``tuning.cc``,
:data:`collsim.model.nccl.BASE_LAT_US`): the uncalibrated model's launch latency."""


NCCL_ACHIEVABLE_FRACTION = (0.8, 12.0 / 15.75, 1.0)
"""What NCCL's own topology model expects a link to deliver, as a fraction of its datasheet
rate, per link class (NCCL ``src/graph/topo.h``, v2.19+): NVLink ``SM70/SM80_NVLINK_BW`` = 20 GB/s
(``SM90`` 20.6) per link of 25 GB/s a direction; PCIe ``PCI_BW`` = 12 GB/s for a Gen3 x16 of
15.75 GB/s (NCCL scales other generations and widths by the same ``width x speed / 80``); the
network at the NIC's reported speed. The datasheet counts the wire, not the payload (flit and TLP
headers, flow control). Classes are NCCL's latency classes, so xGMI and ICI take NVLink's fraction
and UPI PCIe's (NCCL has its own CPU-interconnect figures; collsim's catalog gives those links'
usable rates directly)."""


def uncalibrated_params() -> ModelParams:
    """Datasheet link latencies and rates at NCCL's achievable fraction, NCCL's per-hop and
    launch latencies and its tree all-reduce's medium-size correction, the host's a-priori
    launch and point-to-point costs: what collsim predicts before any calibration."""
    import dataclasses

    return dataclasses.replace(
        DEFAULT_PARAMS,
        base_latency_s=NCCL_BASE_LATENCY_S,
        tree_correction=True,
        launch_floor_s=HOST_LAUNCH_S,
        p2p_op_s=HOST_P2P_OP_S,
        bandwidth_efficiency=NCCL_ACHIEVABLE_FRACTION,
        source="uncalibrated: datasheet links at NCCL's achievable fraction, NCCL hwLat per hop, "
        "NCCL baseLat per launch, NCCL treeCorrectionFactor",
    )


@dataclass(frozen=True)
class Scale:
    """Uniform scaling of a model's times: every latency x ``latency``, every rate (links and
    memory) x ``bandwidth``, the bandwidth term divided by the size factors, ``base_latency_s``
    added to the time and ``launch_floor_s`` (and ``p2p_op_s`` per point-to-point operation) to the
    floor under it. Exact: the model's lines are
    ``a + b S`` with ``a`` sums of latencies and ``b`` of seconds per byte at max-min shares,
    which scale linearly with all rates (so a fit can move these without rebuilding the model)."""

    latency: float = 1.0
    bandwidth: float = 1.0
    base_latency_s: float = 0.0
    launch_floor_s: float = 0.0
    p2p_op_s: float = 0.0
    size_factors: tuple[tuple[float, float], ...] = ()


class ScaledModel:
    """An :class:`~collsim.model.analytic.AnalyticModel` seen through a :class:`Scale` (the
    tuner's model interface: ``candidates``, ``predict``)."""

    def __init__(self, model: Any, scale: Scale) -> None:
        self.model = model
        self.scale = scale
        self.nranks = model.nranks

    def candidates(self, collective: str) -> list[str]:
        return self.model.candidates(collective)

    def predict(
        self,
        collective: str,
        algorithm: str,
        sizes_bytes: np.ndarray | list[int] | int,
        *,
        elem_bytes: int = 4,
        protocol: str = "Simple",
        channels: int = 1,
        floor: bool = True,
    ) -> np.ndarray:
        st = self.model.structure(collective, algorithm, protocol=protocol, channels=channels)
        sizes = np.atleast_1d(np.asarray(sizes_bytes))
        eff = effective_bytes(collective, sizes, elem_bytes, self.nranks)
        sc = self.scale
        p = self.model.params
        stretch = p.stretch(collective, algorithm, protocol, eff, sc.size_factors)
        t = (
            p.base_latency_s
            + sc.base_latency_s
            + st.time_s(eff, sc.latency, sc.bandwidth, stretch=stretch)
        )
        t = np.where(eff == 0, 0.0, t)  # an empty call launches nothing
        return under_floor(t, self.floor_s(collective)) if floor else t

    def floor_s(self, collective: str) -> float:
        sc = self.scale
        ops = p2p_ops(collective, self.nranks)
        return self.model.floor_s(collective) + sc.launch_floor_s + ops * sc.p2p_op_s

    def enabled(self, collective: str, algorithm: str, protocol: str, channels: int = 1) -> bool:
        return bool(self.model.enabled(collective, algorithm, protocol, channels))

    def nccl_channels(self, collective: str) -> int:
        return int(self.model.nccl_channels(collective))


class HostThread:
    """A model as seen by one host thread that issues every call to ``gpus`` GPUs in turn
    (nccl-tests ``-g``, a process per node): calls then follow each other no faster than ``gpus``
    launches, so the launch floor -- one launch's host cost -- counts ``gpus`` times. Everything
    else is the wrapped model's."""

    def __init__(self, model: Any, gpus: int) -> None:
        self.model = model
        self.gpus = gpus
        self.nranks = model.nranks

    def __getattr__(self, name: str) -> Any:
        if name == "model":  # not yet set (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.model, name)

    def floor_s(self, collective: str) -> float:
        return host_floor_s(self.model, collective) * self.gpus

    def predict(self, collective: str, *args: Any, floor: bool = True, **kwargs: Any) -> np.ndarray:
        t = self.model.predict(collective, *args, floor=False, **kwargs)
        return under_floor(t, self.floor_s(collective)) if floor else t


def _release_key(release: NcclVersion) -> tuple[int, int, int]:
    """``release`` as :attr:`ModelParams.nccl_release` takes it."""
    return (release.major, release.minor, release.patch)


class Predictor:
    """Per-row predictions of logs on one system under one parameter set (or NCCL's model)."""

    def __init__(
        self,
        topology: Topology | Any,
        params: ModelParams = DEFAULT_PARAMS,
        model: str = "collsim",
        scale: Scale | None = None,
    ) -> None:
        self.whatif = topology if isinstance(topology, WhatIf) else WhatIf(topology)
        self.model_name = model
        if model == "nccl":
            self.model = self.whatif.cost_model("nccl")
        elif model == "collsim":
            self.model = AnalyticModel(self.whatif, params)
            if scale is not None:
                self.model = ScaledModel(self.model, scale)
        else:
            raise CalibrationError("unknown model (choose collsim or nccl)", field="--model",
                                   value=model)  # fmt: skip

    @classmethod
    def wrap(cls, model: Any, name: str = "collsim") -> Predictor:
        """A predictor over an already built model (no topology work)."""
        self = cls.__new__(cls)
        self.whatif = None
        self.model_name = name
        self.model = model
        return self

    def algorithms(self, collective: str, allowed: tuple[str, ...] | None) -> list[str]:
        return nccl_algorithms(self.model, collective, allowed)

    def predict(
        self,
        collective: str,
        sizes_bytes: np.ndarray,
        *,
        env: dict[str, str] | None = None,
        elem: int = 4,
        gpus_per_thread: int = 1,
        nccl_version: NcclVersion | str | None = None,
    ) -> tuple[np.ndarray, list[str]]:
        """(predicted seconds, chosen 'algorithm/protocol/Nch' label) per size, with one host
        thread issuing each call to ``gpus_per_thread`` GPUs (:class:`HostThread`), as the NCCL
        release ``nccl_version`` would choose (:mod:`collsim.model.nccl_release`: no LL128
        before 2.5; 2.4's tree threshold; None: the newest behaviour)."""
        env = dict(env or {})
        version = (
            nccl_version
            if isinstance(nccl_version, NcclVersion)
            else parse_nccl_version(nccl_version, field="--nccl-version")
        )
        release = effective_version(version, env)
        if not release.tree_by_threshold:
            env.pop("NCCL_TREE_THRESHOLD", None)  # gone from 2.5: NCCL ignores it
        cons = constraints(env, collective, nccl_channel_options(self.model, collective))
        channels = cons.channels  # NCCL's per-channel caps need its channel count too
        protocols = cons.protocols
        if not release.has_ll128:
            protocols = tuple(p for p in protocols if p != "LL128") or ("Simple",)
        # NCCL_PROTO naming LL128 enables it wherever it can run, past NCCL's defaults.
        forced = self.model_name == "collsim" and asked_for_ll128(env) and release.has_ll128
        base = self._of_release(release)
        model = base if gpus_per_thread == 1 else HostThread(base, gpus_per_thread)
        tuner = Tuner(model, protocols=protocols, channels=channels, defaults=not forced)
        sizes = np.asarray(sizes_bytes, dtype=np.int64)
        algos = self.algorithms(collective, cons.algorithms)
        threshold = (
            self._tree_threshold(collective, algos, env) if release.tree_by_threshold else None
        )
        if threshold is None:
            result = tuner.tune(collective, sizes, elem_bytes=elem, algorithms=algos)
            labels = [result.choice_at(i).label() for i in range(len(sizes))]
            best = result.best_s
        else:  # NCCL 2.4: tree up to the threshold (the whole buffer's bytes), ring above
            tree = tuner.tune(collective, sizes, elem_bytes=elem, algorithms=["tree"])
            ring = tuner.tune(collective, sizes, elem_bytes=elem, algorithms=["ring"])
            use_tree = sizes <= threshold
            best = np.where(use_tree, tree.best_s, ring.best_s)
            labels = [(tree if t else ring).choice_at(i).label() for i, t in enumerate(use_tree)]
        return self._up_then_down(collective, sizes, best, labels, release, elem,
                                  gpus_per_thread), labels  # fmt: skip

    def _up_then_down(
        self, collective: str, sizes: np.ndarray, best: np.ndarray, labels: list[str],
        release: NcclVersion, elem: int, gpus_per_thread: int,
    ) -> np.ndarray:  # fmt: skip
        """``best`` with each tree all-reduce re-timed where ``release`` runs its reduce, then its
        broadcast (:meth:`NcclVersion.tree_up_then_down`) and so drives each NIC
        direction with fewer connections than fill it (:func:`tree_nic_share`): on NICs at that
        share of their rate. NCCL's own model knows nothing of it, so the choice stays."""
        topology = self.whatif.topology if self.whatif is not None else None
        if collective != "all_reduce" or topology is None or self.model_name != "collsim":
            return best
        cc = nvidia_compute_capability(topology.gpu.model)
        out = np.array(best, dtype=np.float64)
        for label in sorted(set(labels)):
            algorithm, protocol, count = label.split("/")
            if algorithm != "tree" or not release.tree_up_then_down(cc, protocol):
                continue
            channels = int(count.removesuffix("ch"))
            share = tree_nic_share(topology, channels, up_then_down=True)
            if share >= 1.0:
                continue
            model = self._at_nic_share(topology, share, release)
            model = model if gpus_per_thread == 1 else HostThread(model, gpus_per_thread)
            rows = np.flatnonzero([x == label for x in labels])
            tuner = Tuner(model, protocols=(protocol,), channels=(channels,), defaults=False)
            timed = tuner.tune(collective, sizes[rows], elem_bytes=elem, algorithms=["tree"])
            out[rows] = timed.best_s
        return out

    def rescaled(self, scale: Scale) -> Predictor:
        """This predictor with its model seen through ``scale`` instead (a fit's step): the same
        system, and the models built for a release or a NIC share, which no scale changes."""
        base = self._unscaled()
        out = Predictor.wrap(ScaledModel(base, scale), self.model_name)
        out.whatif = self.whatif
        for name in ("_nic_share_models", "_release_models"):
            out.__dict__[name] = self.__dict__.setdefault(name, {})
        return out

    def _unscaled(self) -> Any:
        """This predictor's model without its :class:`Scale`."""
        return self.model.model if isinstance(self.model, ScaledModel) else self.model

    def _scaled(self, model: Any) -> Any:
        """``model`` seen through this predictor's :class:`Scale`, if it has one."""
        return (
            ScaledModel(model, self.model.scale) if isinstance(self.model, ScaledModel) else model
        )

    def _at_nic_share(self, topology: Topology, share: float, release: NcclVersion) -> Any:
        """This predictor's model (its parameters and scale, following ``release``) on
        ``topology`` with its NICs at ``share`` of their rate; built once per share and
        release."""
        cache = self.__dict__.setdefault("_nic_share_models", {})
        key = (share, _release_key(release))
        if key not in cache:
            params = replace(self._unscaled().params, nccl_release=_release_key(release))
            cache[key] = AnalyticModel(WhatIf(with_nic_share(topology, share)), params)
        return self._scaled(cache[key])

    def _of_release(self, release: NcclVersion) -> Any:
        """This predictor's model with its parameters following NCCL ``release`` (the tree's
        efficiency and correction table by release, :attr:`ModelParams.nccl_release`): a view
        that shares the model's cached structures, which the release does not change. NCCL's own
        model, and a model this predictor only wraps, as they are."""
        base = self._unscaled()
        if self.model_name != "collsim" or not isinstance(base, AnalyticModel):
            return self.model
        key = _release_key(release)
        if base.params.nccl_release == key:
            return self.model
        cache = self.__dict__.setdefault("_release_models", {})
        if key not in cache:
            view = copy.copy(base)  # shares the structure cache: the release is not in it
            view.params = replace(base.params, nccl_release=key)
            cache[key] = view
        return self._scaled(cache[key])

    def _tree_threshold(
        self, collective: str, algos: list[str], env: dict[str, str]
    ) -> float | None:
        """NCCL 2.4's tree threshold on this system (bytes), or None where it decides nothing:
        not an all-reduce, or the tree or the ring not both allowed and runnable here."""
        if collective != "all_reduce" or not {"tree", "ring"} <= set(algos):
            return None
        topology = self.whatif.topology if self.whatif is not None else None
        topology = topology or getattr(getattr(self.model, "model", self.model), "topology", None)
        if topology is None:
            return None
        nvlink = intra_inter_bandwidth(topology)[2]
        counter = getattr(self.model, "nccl_channels", None)
        channels = int(counter(collective)) if counter is not None else 1
        return tree_threshold_bytes(topology.nvlink_domains, topology.n_gpus, channels, nvlink, env)

    def predict_log(
        self, log: NcclTestsLog, env: dict[str, str] | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
        """(sizes, measured s, predicted s, choices) for the timed rows of ``log``."""
        sizes, measured = measured_points(log)
        pred, labels = self.predict(
            log.collective,
            sizes,
            env=log_env(log, env),
            elem=elem_bytes(log),
            gpus_per_thread=log.gpus_per_thread,
            nccl_version=log.nccl_version,
        )
        return sizes, measured, pred, labels
