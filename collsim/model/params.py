"""The analytic model's physical parameters: one frozen, serialisable set the formulas read.

Defaults are *datasheet physics*, exactly what the discrete-event engine assumes (so the two agree
where nothing contends dynamically): link capacities and latencies as the topology states them,
NCCL's protocol payload fractions and per-hop latencies (:mod:`collsim.protocols`, NCCL
``hwLat``), reductions at memory bandwidth / 3 and copies at / 2, no launch latency.

A calibration (a later issue: ``collsim/model/profile.py``) fits these knobs to nccl-tests
measurements and stores them with :meth:`ModelParams.to_dict`; :meth:`ModelParams.from_dict`
loads them back. Per link class (index :data:`~collsim.protocols.HW_NVLINK` / ``HW_PCI`` /
``HW_NET``, NCCL's ``hwLat`` rows):

* ``route_latency_scale`` multiplies the latency of every link of that class on a route, and the
  forwarding latency of the devices (switches, host staging) on routes whose slowest class it is;
* ``bandwidth_efficiency`` multiplies the capacity of every link of that class (achieved /
  datasheet bandwidth);
* ``duplex_efficiency`` (0.5 to 1) caps what both directions of a link of that class carry
  together at ``2 x duplex x`` its capacity: 1 is full duplex (the datasheet), 0.5 half duplex.
  Host-staged or GPUDirect paths through a PCIe root complex fall in between; a value below 1
  adds a shared capacity to those links (:func:`collsim.topology.spec.with_duplex`);

per protocol (``protocols``): payload fraction of the wire and per-hop latency by class; globally:
``base_latency_s`` (a per-call cost on the GPUs' critical path, NCCL's ``baseLat``),
``launch_floor_s`` (the host's cost to issue one call to one GPU: a *floor* under the time, not
an addend, since the host issues the next call while the GPUs run this one, so calls that follow
each other -- as nccl-tests times them -- complete no faster than the host issues them; a host
thread driving several GPUs, nccl-tests ``-g``, issues each call to all of them in turn, so its
floor is that many launches: :class:`collsim.calibration.predict.HostThread`), ``p2p_op_s`` (the
host's cost of each point-to-point operation a call enqueues, added to its launch in the floor:
an all-to-all posts a send and a receive per rank, :func:`p2p_ops`), reduction and copy
efficiencies, and ``size_factors``: (size_bytes, factor) points, interpolated in log2(size), that
scale the bandwidth term (``time = latency + bytes / (bandwidth * factor(size))``), so
size-dependent effects (protocol warm-up, small-message inefficiency) are data, not code; and
``tree_correction``: whether a tree all-reduce runs at NCCL's measured fractions of its
modelled bandwidth, as NCCL's tuner assumes: 0.92 at every size (``busBw * .92``,
:func:`collsim.model.nccl.tree_efficiency`) times 0.4-1 at medium sizes
(``treeCorrectionFactor``, :func:`collsim.model.nccl.tree_correction`: which sizes depending on
the protocol; 1 from 512 MiB on), both as the release in ``nccl_release`` has them.
Off in the datasheet defaults (the discrete-event engine has no such factor); on in the
uncalibrated model and in fitted profiles.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from collsim.errors import CalibrationError, ScheduleError
from collsim.model.nccl import tree_correction, tree_efficiency
from collsim.protocols import PROTOCOLS, Protocol
from collsim.topology.fabric import _HW_CLASS
from collsim.topology.spec import LINK_KINDS
from collsim.units import TIME_RANGE_S

_CLASSES = 3  # nvlink, pci, net


@dataclass(frozen=True)
class ProtocolParams:
    """One protocol: payload fraction of wire bytes, per-hop latency by link class (seconds)."""

    name: str
    bandwidth_fraction: float
    hop_latency_s: tuple[float, float, float]

    @classmethod
    def of(cls, protocol: Protocol) -> ProtocolParams:
        lat = protocol.hop_latency_s
        triple = (float(lat),) * 3 if np.isscalar(lat) else tuple(float(x) for x in lat)  # type: ignore[arg-type]
        return cls(protocol.name, float(protocol.bandwidth_fraction), triple)  # type: ignore[arg-type]


HOST_LAUNCH_S = 5e-6
"""A typical host cost of issuing one GPU operation (CUDA launch + dispatch), a priori: the
uncalibrated launch floor per GPU a host thread drives (:class:`ModelParams`), and the cost of
each copy launch in :mod:`collsim.training.zero3`."""


HOST_P2P_OP_S = 0.4e-6
"""Host cost of one point-to-point operation (``ncclSend`` / ``ncclRecv``) in a group, beyond the
call's launch: NCCL appends a task per operation and schedules each over channels and peers when
the group ends, on the issuing thread. Estimated from two nccl-tests ``-g`` logs of the bundled
dataset as (all-to-all plateau - collectives' plateau) / operations the thread issued: A100
superbench 52 us / (8 GPUs x 16) = 0.41 us, RTX 2080 Ti 2.4-3 us / (2 x 4) = 0.3-0.38 us. Not
fitted per system (an all_reduce log cannot show it); a profile records the value it used."""


def p2p_ops(collective: str, nranks: int) -> int:
    """Point-to-point operations one rank enqueues per call: an all-to-all posts a send and a
    receive to every rank, itself included (nccl-tests ``alltoall.cu``, torch's
    ``all_to_all_single`` on NCCL), a send/receive one of each; NCCL's collectives none."""
    if collective == "alltoall":
        return 2 * nranks
    if collective == "sendrecv":
        return 2
    return 0


def under_floor(times_s: np.ndarray, floor_s: float) -> np.ndarray:
    """Times of back-to-back calls: no call faster than the host's ``floor_s``, except empty
    ones (time 0), for which NCCL launches nothing."""
    t = np.asarray(times_s, dtype=np.float64)
    return np.where(t > 0, np.maximum(floor_s, t), t)


def _default_protocols() -> tuple[ProtocolParams, ...]:
    return tuple(ProtocolParams.of(p) for p in PROTOCOLS.values())


@dataclass(frozen=True)
class ModelParams:
    """Every physical knob of the analytic model (see the module docstring). Hashable: it keys
    the model's structure cache."""

    protocols: tuple[ProtocolParams, ...] = field(default_factory=_default_protocols)
    base_latency_s: float = 0.0
    launch_floor_s: float = 0.0
    p2p_op_s: float = 0.0
    route_latency_scale: tuple[float, float, float] = (1.0, 1.0, 1.0)
    bandwidth_efficiency: tuple[float, float, float] = (1.0, 1.0, 1.0)
    duplex_efficiency: tuple[float, float, float] = (1.0, 1.0, 1.0)
    reduce_efficiency: float = 1.0
    copy_efficiency: float = 1.0
    channel_efficiency: float = 1.0
    """Factor on NCCL's per-channel rate ceiling (:mod:`collsim.channel_rates`): one channel is
    one thread block copying (and reducing), so a calibration moves it with the GPU's copy rate
    (a profile's ``memory_efficiency``); 1 uncalibrated."""
    size_factors: tuple[tuple[float, float], ...] = ()
    tree_correction: bool = False
    source: str = "datasheet defaults (what the discrete-event engine assumes)"
    nccl_release: tuple[int, int, int] | None = None
    """The NCCL release (major, minor, patch) whose tree figures ``tree_correction`` follows
    (None: the newest). Not a calibrated knob: the release a log ran
    (:class:`collsim.calibration.predict.Predictor` sets it per prediction), so neither
    :meth:`to_dict` nor a profile stores it."""

    def __post_init__(self) -> None:
        for name in ("route_latency_scale", "bandwidth_efficiency"):
            value = tuple(float(x) for x in getattr(self, name))
            if len(value) != _CLASSES or any(not np.isfinite(x) or x < 0 for x in value):
                raise CalibrationError(
                    "needs three non-negative numbers (nvlink, pci, net)", field=name, value=value
                )
            object.__setattr__(self, name, value)
        duplex = tuple(float(x) for x in self.duplex_efficiency)
        if len(duplex) != _CLASSES or any(not 0.5 <= x <= 1.0 for x in duplex):
            raise CalibrationError(
                "needs three numbers from 0.5 (half duplex) to 1 (full duplex)",
                field="duplex_efficiency",
                value=self.duplex_efficiency,
            )
        object.__setattr__(self, "duplex_efficiency", duplex)
        if any(x <= 0 for x in self.bandwidth_efficiency):
            raise CalibrationError(
                "bandwidth efficiencies must be positive",
                field="bandwidth_efficiency",
                value=self.bandwidth_efficiency,
            )
        for name in ("reduce_efficiency", "copy_efficiency", "channel_efficiency"):
            if not float(getattr(self, name)) > 0:
                raise CalibrationError("must be positive", field=name, value=getattr(self, name))
        for name in ("base_latency_s", "launch_floor_s", "p2p_op_s"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise CalibrationError("must be a non-negative time", field=name, value=value)
        pts = tuple((float(s), float(f)) for s, f in self.size_factors)
        if any(s <= 0 or f <= 0 for s, f in pts) or list(pts) != sorted(pts):
            raise CalibrationError(
                "size_factors must be (size_bytes > 0, factor > 0) pairs sorted by size",
                field="size_factors",
                value=self.size_factors,
            )
        object.__setattr__(self, "size_factors", pts)
        if not isinstance(self.tree_correction, bool):
            raise CalibrationError(
                "must be true or false", field="tree_correction", value=self.tree_correction
            )

    def floor_s(self, collective: str, nranks: int) -> float:
        """The host's cost to issue one call of ``collective`` to one GPU: its launch and its
        point-to-point operations (the floor under back-to-back calls)."""
        return self.launch_floor_s + p2p_ops(collective, nranks) * self.p2p_op_s

    def protocol(self, name: str | Protocol) -> ProtocolParams:
        """The parameters of protocol ``name`` (LL, LL128, Simple; any case)."""
        if isinstance(name, Protocol):
            name = name.name
        for p in self.protocols:
            if p.name.lower() == str(name).lower():
                return p
        raise ScheduleError(
            f"unknown protocol (choose from {', '.join(p.name for p in self.protocols)})",
            field="protocol",
            value=name,
        )

    def duplex_by_kind(self) -> dict[str, float]:
        """``duplex_efficiency`` keyed by link kind (what :func:`with_duplex` takes); empty when
        every class is full duplex."""
        if min(self.duplex_efficiency) >= 1.0:
            return {}
        return {k: self.duplex_efficiency[_HW_CLASS.get(k, _CLASSES - 1)] for k in LINK_KINDS}

    def stretch(
        self,
        collective: str,
        algorithm: str,
        protocol: str,
        size_bytes: np.ndarray,
        factors: tuple[tuple[float, float], ...] | None = None,
    ) -> np.ndarray | float:
        """What each size's bytes are multiplied by in the bandwidth term: 1 / (the size
        factors -- these, or ``factors`` where given: a calibration's -- x NCCL's tree
        efficiency and tree correction where on, of :attr:`nccl_release`)."""
        pts = self.size_factors if factors is None else factors
        tree = self.tree_correction and algorithm == "tree" and collective == "all_reduce"
        if not pts and not tree:
            return 1.0
        size_bytes = np.asarray(size_bytes, dtype=np.float64)
        factor = np.ones_like(size_bytes)
        if pts:
            xs = np.log2([s for s, _ in pts])
            factor = np.interp(np.log2(np.maximum(size_bytes, 1.0)), xs, [f for _, f in pts])
        if tree:
            rel = self.nccl_release
            factor = factor * tree_efficiency(rel) * tree_correction(protocol, size_bytes, rel)
        return 1.0 / factor

    # -- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/YAML-ready data; :meth:`from_dict` reads it back to an equal object."""
        return {
            "source": self.source,
            "base_latency_s": self.base_latency_s,
            "launch_floor_s": self.launch_floor_s,
            "p2p_op_s": self.p2p_op_s,
            "route_latency_scale": list(self.route_latency_scale),
            "bandwidth_efficiency": list(self.bandwidth_efficiency),
            "duplex_efficiency": list(self.duplex_efficiency),
            "reduce_efficiency": self.reduce_efficiency,
            "copy_efficiency": self.copy_efficiency,
            "channel_efficiency": self.channel_efficiency,
            "size_factors": [list(p) for p in self.size_factors],
            "tree_correction": self.tree_correction,
            "protocols": {
                p.name: {
                    "bandwidth_fraction": p.bandwidth_fraction,
                    "hop_latency_s": list(p.hop_latency_s),
                }
                for p in self.protocols
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelParams:
        """Parameters from :meth:`to_dict`'s form. Every value is checked for its type and for
        the physical range a fitted profile allows (:mod:`collsim.model.profile`), one error
        naming the field and value: a hand-written file is read here too (``collsim step
        --profile``)."""
        if not isinstance(data, Mapping):
            raise CalibrationError("model parameters must be a mapping", field="params", value=data)
        known = [*_RANGES, "size_factors", "protocols", "tree_correction", "source"]
        extra = sorted(set(data) - set(known), key=str)
        if extra:
            raise CalibrationError(
                f"unknown model parameter; expected one of: {', '.join(known)}",
                field=str(extra[0]),
            )
        kwargs: dict[str, Any] = {}
        for key, (count, lo, hi) in _RANGES.items():
            if key in data:
                kwargs[key] = _numbers(data[key], key, count, lo, hi)
        if "tree_correction" in data:
            kwargs["tree_correction"] = data["tree_correction"]
        if "source" in data:
            kwargs["source"] = str(data["source"])
        if "size_factors" in data:
            pts = data["size_factors"]
            if not isinstance(pts, list | tuple):
                raise CalibrationError(
                    "needs a list of [size_bytes, factor] pairs", field="size_factors", value=pts
                )
            kwargs["size_factors"] = tuple(_size_factor(p, i) for i, p in enumerate(pts))
        if "protocols" in data:
            kwargs["protocols"] = _protocols(data["protocols"])
        return cls(**kwargs)


_RANGES: dict[str, tuple[int, float, float]] = {
    "base_latency_s": (0, *TIME_RANGE_S),
    "launch_floor_s": (0, *TIME_RANGE_S),
    "p2p_op_s": (0, 0.0, 1e-3),
    "route_latency_scale": (3, 0.0, 1000.0),
    "bandwidth_efficiency": (3, 0.001, 10.0),
    "duplex_efficiency": (3, 0.5, 1.0),
    "reduce_efficiency": (0, 0.001, 10.0),
    "copy_efficiency": (0, 0.001, 10.0),
    "channel_efficiency": (0, 0.001, 10.0),
}
"""Per numeric parameter read from a file: how many numbers (0: one scalar) and their range, as
a fitted profile's schema bounds them (times up to 10 s, as a topology's)."""


def _numbers(value: Any, name: str, count: int, lo: float, hi: float) -> Any:
    """``value`` checked: a number in [lo, hi] (``count`` 0) or a list of ``count`` of them."""
    items = [value] if count == 0 else value
    shape = "a number" if count == 0 else f"a list of {count} numbers"
    if count and (not isinstance(value, list | tuple) or len(value) != count):
        raise CalibrationError(f"needs {shape}", field=name, value=value)
    for x in items:
        if isinstance(x, bool) or not isinstance(x, int | float):
            raise CalibrationError(f"needs {shape}", field=name, value=value)
        if not (np.isfinite(x) and lo <= x <= hi):
            raise CalibrationError(f"needs {shape} from {lo:g} to {hi:g}", field=name, value=value)
    return float(value) if count == 0 else tuple(float(x) for x in value)


def _size_factor(pair: Any, i: int) -> tuple[float, float]:
    """One ``[size_bytes, factor]`` point: a size up to 1 EB, a factor up to 10 (as a profile's
    efficiencies)."""
    size, factor = _numbers(pair, f"size_factors[{i}]", 2, 0.0, 1e18)
    if factor > 10.0:
        raise CalibrationError(
            "a size factor is at most 10", field=f"size_factors[{i}]", value=pair
        )
    return size, factor


def _protocols(data: Any) -> tuple[ProtocolParams, ...]:
    """``protocols: {NAME: {bandwidth_fraction, hop_latency_s: [nvlink, pci, net]}}``."""
    if not isinstance(data, Mapping):
        raise CalibrationError(
            "needs a mapping of protocol name to {bandwidth_fraction, hop_latency_s}",
            field="protocols",
            value=data,
        )
    out = []
    for name, p in data.items():
        where = f"protocols.{name}"
        if not isinstance(p, Mapping) or set(p) != {"bandwidth_fraction", "hop_latency_s"}:
            raise CalibrationError(
                "needs exactly bandwidth_fraction and hop_latency_s", field=where, value=p
            )
        fraction = _numbers(p["bandwidth_fraction"], f"{where}.bandwidth_fraction", 0, 0.001, 1)
        hops = _numbers(p["hop_latency_s"], f"{where}.hop_latency_s", 3, *TIME_RANGE_S)
        out.append(ProtocolParams(str(name), fraction, hops))
    return tuple(out)


DEFAULT_PARAMS = ModelParams()
"""The engine's physics; the model agrees with the engine under these."""
