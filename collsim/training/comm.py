"""Timing one collective on a group of GPUs: the single abstraction the step model uses.

``timer.time_s(collective, gpus, size_bytes)`` is the time of ``collective`` over ``size_bytes``
(nccl-tests' size convention) among ``gpus`` (topology GPU names), with the group alone on the
network, or with ``1 / share`` of its links' rates where concurrent groups cross the same links
(:mod:`collsim.training.sharing`). Two implementations:

* :class:`AnalyticTimer` -- :class:`collsim.model.analytic.AnalyticModel` on the group (closed
  forms, milliseconds per new group shape, then microseconds): the default for ``step``,
  ``scale`` and ``plan``, which need thousands of evaluations;
* :class:`DesTimer` -- :func:`collsim.collectives.registry.build_schedule` +
  :func:`collsim.engine.simulate` on ``TopologyFabric(network, gpus=group)`` (exact, with
  contention; seconds for large groups).

Algorithm choice (``algorithm``): ``nccl`` (default) lets the tuner choose among the algorithms
NCCL itself has (ring/tree all-reduce, ring all-gather/reduce-scatter, direct all-to-all, and
NVLS/SHARP where the topology reduces in the network), over protocols and 1-8 channels; ``auto``
among all of collsim's algorithms; any other value names one algorithm. Both timers cache by
(collective, group shape, size, algorithm): on symmetric topologies groups of the same shape cost
the same, so the first group of a shape stands for all of them.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, Protocol

from collsim.collectives.layout import RankLayout
from collsim.collectives.registry import (
    NCCL_ALGORITHMS,
    algorithms_for,
    build_schedule,
    needs_in_network,
)
from collsim.engine import simulate
from collsim.errors import ScheduleError
from collsim.model.analytic import AnalyticModel
from collsim.model.params import DEFAULT_PARAMS
from collsim.model.shares import WaveShares
from collsim.model.tuner import Tuner
from collsim.topology.fabric import TopologyFabric
from collsim.topology.graph import Network
from collsim.topology.spec import Topology
from collsim.whatif import WhatIf, element_count

ENGINES = ("analytic", "des")

_LARGE_GROUP = 64
"""Above this many ranks ``auto`` skips the O(n^2)-flow direct algorithms (slow to model)."""


class CommTimer(Protocol):
    """Anything that times a collective on a group of GPUs."""

    def time_s(
        self,
        collective: str,
        gpus: Sequence[str],
        size_bytes: float,
        algorithm: str = "nccl",
        share: float = 1.0,
    ) -> float: ...


def links_shared(topology: Topology, share: float) -> Topology:
    """``topology`` with every link at ``1 / share`` of its rate: what a group gets while
    concurrent groups load its links (:mod:`collsim.training.sharing`)."""
    import dataclasses

    def scaled(lk: Any) -> Any:
        duplex = lk.duplex_bandwidth_bytes_per_s
        return dataclasses.replace(
            lk,
            bandwidth_bytes_per_s=lk.bandwidth_bytes_per_s / share,
            duplex_bandwidth_bytes_per_s=None if duplex is None else duplex / share,
        )

    return dataclasses.replace(topology, links=tuple(scaled(lk) for lk in topology.links))


def group_layout(topology: Topology, gpus: Sequence[str]) -> RankLayout:
    """The group's node structure: ranks per node, and a (nodes x per-node) grid when even.

    A node is NCCL's: a server, or a whole multi-node NVLink domain (GB200/GB300 NVL72's 18
    trays of 4 GPUs), as :func:`collsim.model.system.layout_for` lays out a whole topology. A
    TP group of 8 on two trays of one NVL72 rack is one node of 8 ranks on NVLink, not 2 nodes
    of 4 joined by NICs (NCCL puts the GPUs of one NVLink clique in one node of its topology)."""
    where = _where(topology)
    per_node: dict[int, int] = {}
    for g in gpus:
        per_node[where[g][0]] = per_node.get(where[g][0], 0) + 1
    counts = set(per_node.values())
    rpn = max(counts)
    even = len(counts) == 1
    grid = (len(per_node), rpn) if even and len(per_node) > 1 and rpn > 1 else None
    return RankLayout(nranks=len(gpus), ranks_per_node=rpn, grid=grid)


_WHERE: dict[int, tuple[weakref.ref[Topology], dict[str, tuple[int, int]]]] = {}


def _where(topology: Topology) -> dict[str, tuple[int, int]]:
    """(NCCL node, local index) of every GPU, cached per topology object: the node is the
    GPU's NVLink domain (its server, or ``nvlink_domain_nodes`` consecutive trays), the index
    its place among the domain's GPUs. Keyed by ``id`` with a weak reference to check it: a
    freed topology's id is reused by new objects."""
    key = id(topology)
    hit = _WHERE.get(key)
    if hit is None or hit[0]() is not topology:
        per = max(1, topology.nvlink_domain_nodes)
        gpn = topology.gpus_per_node
        where = {}
        for g in topology.gpus:
            node = g.node if g.node is not None else 0
            where[g.name] = (node // per, (node % per) * gpn + g.index)
        hit = _WHERE[key] = (weakref.ref(topology), where)
    return hit[1]


def group_shape(topology: Topology, gpus: Sequence[str]) -> tuple[Any, ...]:
    """A key equal for groups that cost the same on a symmetric topology: ranks, the local GPU
    indices used on each node, the number of nodes and the node stride."""
    where = _where(topology)
    nodes = sorted({where[g][0] for g in gpus})
    locals_ = tuple(sorted(where[g][1] for g in gpus if where[g][0] == nodes[0]))
    stride = nodes[1] - nodes[0] if len(nodes) > 1 else 0
    return (len(gpus), locals_, len(nodes), stride)


class _Cached:
    """Shared cache and algorithm policy; subclasses implement :meth:`_time`."""

    def __init__(self, topology: Topology, network: Network | None = None, params: Any = None):
        self.topology = topology
        self.network = network if network is not None else Network(topology)
        self.simulated = self.network  # what the des engine runs on (see make_timer)
        self._shared: dict[float, Network] = {}
        self.params = params
        self.has_in_network = any(d.in_network_reduction for d in topology.devices)
        self._cache: dict[tuple[Any, ...], float] = {}
        self._models: dict[tuple[Any, ...], Any] = {}
        self.evaluations = 0

    def time_s(
        self,
        collective: str,
        gpus: Sequence[str],
        size_bytes: float,
        algorithm: str = "nccl",
        share: float = 1.0,
    ) -> float:
        """Seconds for ``collective`` of ``size_bytes`` on ``gpus`` (0 for one GPU or 0 bytes),
        with ``1 / share`` of its links' rates (concurrent groups on the same links)."""
        if len(gpus) <= 1 or size_bytes <= 0:
            return 0.0
        size = int(size_bytes)
        key = (collective, group_shape(self.topology, gpus), size, algorithm, share)
        hit = self._cache.get(key)
        if hit is None:
            self.evaluations += 1
            hit = self._cache[key] = self._time(collective, list(gpus), size, algorithm, share)
        return hit

    def model_for(self, gpus: Sequence[str], share: float = 1.0) -> Any:
        """The analytic model of this group's shape (built once per shape and share)."""
        key = (group_shape(self.topology, gpus), share)
        if key not in self._models:
            params = self.params
            if share > 1.0:
                import dataclasses

                base = params if params is not None else DEFAULT_PARAMS
                eff = tuple(e / share for e in base.bandwidth_efficiency)
                params = dataclasses.replace(base, bandwidth_efficiency=eff)
            self._models[key] = group_analytic_model(
                self.topology, self.network, list(gpus), params
            )
        return self._models[key]

    def algorithms(self, collective: str, n: int, algorithm: str) -> list[str]:
        """The candidate algorithms of the policy ``algorithm`` for ``collective``."""
        every = list(algorithms_for(collective))
        if algorithm == "nccl":
            algos = [a for a in NCCL_ALGORITHMS.get(collective, every[:1]) if a in every]
        elif algorithm == "auto":
            algos = [a for a in every if not (a == "direct" and n > _LARGE_GROUP)] or every[:1]
        else:
            if algorithm not in every:
                raise ScheduleError(
                    f"unknown {collective} algorithm; valid: nccl, auto, {', '.join(every)}",
                    field="algorithm",
                    value=algorithm,
                )
            algos = [algorithm]
        if not self.has_in_network:
            algos = [a for a in algos if not needs_in_network(a)] or algos
        return algos

    def choose(
        self,
        collective: str,
        gpus: list[str],
        size: int,
        algorithm: str,
        share: float = 1.0,
    ) -> Any:
        """The tuner's (algorithm, protocol, channels) and its predicted time."""
        model = self.model_for(gpus, share)
        tuning = Tuner(model).tune(
            collective, [size], algorithms=self.algorithms(collective, len(gpus), algorithm)
        )
        return tuning.choice_at(0), float(tuning.best_s[0])

    def _time(
        self, collective: str, gpus: list[str], size: int, algorithm: str, share: float
    ) -> float:
        raise NotImplementedError


class AnalyticTimer(_Cached):
    """Closed-form collective times from :mod:`collsim.model` (the tuner's best choice)."""

    def _time(
        self, collective: str, gpus: list[str], size: int, algorithm: str, share: float
    ) -> float:
        return self.choose(collective, gpus, size, algorithm, share)[1]


class DesTimer(_Cached):
    """Discrete-event times: the tuner's choice, simulated on the group's fabric."""

    def _time(
        self, collective: str, gpus: list[str], size: int, algorithm: str, share: float
    ) -> float:
        choice, _ = self.choose(collective, gpus, size, algorithm, share)
        n = len(gpus)
        schedule = build_schedule(
            collective,
            choice.algorithm,
            nranks=n,
            count=element_count(collective, size, 2, n),
            elem_bytes=2,
            layout=group_layout(self.topology, gpus),
            channels=choice.channels,
        )
        net = self.simulated
        if share > 1.0:
            if share not in self._shared:
                self._shared[share] = Network(links_shared(net.topology, share))
            net = self._shared[share]
        fabric = TopologyFabric(net, gpus=gpus)
        return float(simulate(schedule, fabric, protocol=choice.protocol).time_s)


def make_timer(
    engine: str,
    topology: Topology,
    network: Network | None = None,
    params: Any = None,
    simulated: Topology | None = None,
) -> _Cached:
    """The timer for ``--engine`` (``analytic`` or ``des``). ``simulated``: what the des engine
    runs on when it differs from what the tuner's model sees -- a calibration profile's scaled
    links (:meth:`collsim.model.profile.Profile.apply_to_topology`), while the model takes the
    profile's parameters on the topology's own links (scaling both would count them twice)."""
    if engine not in ENGINES:
        raise ScheduleError(
            f"unknown engine (choose from {', '.join(ENGINES)})", field="--engine", value=engine
        )
    cls = AnalyticTimer if engine == "analytic" else DesTimer
    timer = cls(topology, network, params)
    if simulated is not None:
        timer.simulated = Network(simulated)
    return timer


def group_analytic_model(
    topology: Topology, network: Network, gpus: list[str], params: Any = None
) -> Any:
    """THE analytic hook: :class:`collsim.model.analytic.AnalyticModel` restricted to ``gpus``.

    ``AnalyticModel`` models a whole topology (a :class:`collsim.whatif.WhatIf`); a group is
    modelled by giving it a ``WhatIf`` whose fabric places ranks on the group's GPUs only and
    whose layout is the group's. If the model's API changes, this is the one place to adapt.
    """
    view = WhatIf.__new__(WhatIf)
    view.topology = topology
    view.network = network
    view.fabric = TopologyFabric(network, gpus=gpus)
    view.layout = group_layout(topology, gpus)
    view.has_in_network = topology.reduces_for(gpus)
    view._models = {}
    view.wave_shares = WaveShares()  # the group's fabric: its own waves
    model = AnalyticModel(view, params if params is not None else DEFAULT_PARAMS)
    model.nranks = len(gpus)
    return model
