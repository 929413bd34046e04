"""The analytic cost model: every algorithm of the registry as a closed form over the topology.

``AnalyticModel(topology).predict(collective, algorithm, sizes)`` returns the time of each size,
vectorised. It reads the same things the discrete-event engine reads -- the schedules' structure
(ring orders, trees, hypercube pairs, rounds), the routes of :class:`TopologyFabric`, the protocol
tables -- and the physical knobs of :class:`~collsim.model.params.ModelParams`.

How a prediction is made (and why it is fast):

1. *Structure, once per (collective, algorithm, protocol, channels)*: the family module
   (:mod:`~collsim.model.rings`, :mod:`~collsim.model.trees`, :mod:`~collsim.model.exchange`)
   turns the algorithm's communication pattern into waves of concurrent flows, each flow's
   latency and max-min bandwidth share, and the critical-path recurrence of the schedule.
2. *Lines*: all costs are affine in the size, so the time is a convex piecewise-linear function;
   :func:`~collsim.model.envelope.discover` finds its pieces (a few evaluations of the
   recurrence), merged with the link-load bound (every link must carry its bytes).
3. *Sizes*: ``T(S) = max(floor, base + max_i(a_i + b_i S / f(S)))`` -- a vectorised max over a
   handful of lines (``f``: the calibratable size factor, 1 by default; ``base`` a per-call cost
   on the GPUs' path; ``floor`` the host's cost to issue a call, which overlaps the GPUs' work on
   the previous one when calls follow each other, as nccl-tests times them; both 0 by default,
   see :class:`~collsim.model.params.ModelParams`).

Sizes are rounded as nccl-tests (and :func:`collsim.whatif.element_count`) round them: whole
elements, and for all_gather / reduce_scatter / alltoall a multiple of the rank count.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from collsim.collectives.crossnode import head_ranks
from collsim.collectives.registry import algorithms_for, build_schedule, needs_in_network
from collsim.collectives.verify import COLLECTIVES
from collsim.errors import ScheduleError
from collsim.metrics import effective_bytes
from collsim.model.crossnode import cross_node
from collsim.model.envelope import Lines, discover, evaluate, upper_envelope
from collsim.model.exchange import (
    alltoall_direct,
    alltoall_hierarchical,
    direct,
    in_network,
    rhd,
    sendrecv,
)
from collsim.model.flows import FlowCosts
from collsim.model.mapping import intra_inter_bandwidth
from collsim.model.nccl import compute_capability, ll128_by_default
from collsim.model.nccl_channels import NcclChannels, nccl_channels
from collsim.model.params import DEFAULT_PARAMS, ModelParams, ProtocolParams, under_floor
from collsim.model.rd import rd_gather_scatter
from collsim.model.rings import (
    Oracle,
    flat_ring,
    hierarchical_gather_scatter,
    two_level_all_reduce,
)
from collsim.model.shares import Shares
from collsim.model.system import System
from collsim.model.trees import Pipeline, double_tree, rooted
from collsim.nvls import nvls_channels
from collsim.topology.fabric import TopologyFabric
from collsim.topology.spec import Topology, with_duplex


@dataclass(frozen=True)
class Structure:
    """What one (collective, algorithm, protocol, channels) costs, as lines over the size."""

    collective: str
    algorithm: str
    protocol: str
    channels: int
    lines: Lines
    """The whole time for families that are lines (``max(path, load)``); unused when pipelined."""
    path_lines: Lines
    load_lines: Lines
    pipeline: Pipeline | None = None
    """Chunk-pipelined families (trees, chains): per-chunk fill and step lines."""
    serial_chunks: SerialChunks | None = None
    """Per size, what an NVLS all-reduce's chunks add beyond its lines (:class:`SerialChunks`)."""

    def time_s(
        self,
        size_bytes: np.ndarray,
        latency: float = 1.0,
        bandwidth: float = 1.0,
        chunk_bytes: int | None = None,
        stretch: np.ndarray | float = 1.0,
    ) -> np.ndarray:
        """Time at each (effective) size; ``latency`` scales intercepts, ``bandwidth`` divides
        slopes (a calibration profile's link-class factors); ``chunk_bytes`` overrides the
        pipeline's chunk (its per-chunk lines hold for any chunk size); ``stretch`` multiplies
        each size's bytes (a profile's size efficiency, 1 / factor), while a pipeline still cuts
        the true size into chunks."""
        stretched = np.asarray(size_bytes, dtype=np.float64) * stretch
        load = Lines(self.load_lines.a_s * latency, self.load_lines.b_s_per_byte / bandwidth)
        if self.pipeline is not None:
            pipe = self.pipeline
            if chunk_bytes is not None:
                pipe = dataclasses.replace(pipe, chunk_bytes=int(chunk_bytes))
            out = np.maximum(pipe.time_s(size_bytes, latency, bandwidth, stretch),
                             evaluate(load, stretched))  # fmt: skip
            if self.serial_chunks is not None:
                out = out + latency * self.serial_chunks.time_s(size_bytes)
            return out
        lines = Lines(self.lines.a_s * latency, self.lines.b_s_per_byte / bandwidth)
        out = evaluate(lines, stretched)
        if self.serial_chunks is not None:
            out = out + latency * self.serial_chunks.time_s(size_bytes)
        return out


@dataclass(frozen=True)
class SerialChunks:
    """NCCL's NVLS chunks' round trips: each NVLS channel moves its share one chunk after
    another and pays one in-network route latency per chunk that its data does not overlap
    (:mod:`collsim.nvls`; the engine adds the same to the reductions' latency: NVLS's one,
    NVLS+tree's node reduces). The count depends on the size (NCCL picks the chunk per call),
    so it is no line; the slowest of ``groups`` (one per node for NVLS+tree) sets it."""

    count: Callable[[np.ndarray, np.ndarray, int], int]
    """Chunks per channel of one reduction (sources, destinations) for a call of that many
    bytes (``TopologyFabric.in_network_chunks``)."""
    groups: tuple[tuple[tuple[int, ...], tuple[int, ...], float], ...]
    """(sources, destinations, route latency) of each reduction that pays them."""

    def time_s(self, size_bytes: np.ndarray) -> np.ndarray:
        sizes = np.asarray(size_bytes)
        flat = sizes.reshape(-1)
        out = np.zeros(flat.shape, dtype=np.float64)
        for srcs, dsts, latency in self.groups:
            s, d = np.asarray(srcs), np.asarray(dsts)
            chunks = np.array([self.count(s, d, int(x)) for x in flat], dtype=np.float64)
            out = np.maximum(out, chunks * latency)
        return out.reshape(sizes.shape)


class AnalyticModel:
    """Closed-form collective times on one topology under one parameter set (cached structures)."""

    def __init__(self, topology: Topology | object, params: ModelParams = DEFAULT_PARAMS) -> None:
        self.system = topology if isinstance(topology, System) else System(topology)  # type: ignore[arg-type]
        duplex = params.duplex_by_kind()
        if duplex:  # links short of full duplex share a capacity both ways (a rebuilt fabric)
            self.system = System(with_duplex(self.system.topology, duplex))
        self.topology = self.system.topology
        self.fabric = self.system.fabric
        self.layout = self.system.layout
        self.nranks = self.topology.n_gpus
        self.params = params
        self._cache: dict[tuple[str, str, str, int], Structure] = {}
        self._loads: dict[tuple[str, str, str, int], Lines] = {}  # load_lines without structure
        self._shares: Shares | None = None  # flow shares, across protocols (set on first use)
        self._nccl_channels: NcclChannels | None = None
        self._both: dict[tuple[str, str], tuple[bool, int]] = {}  # see _both_ways

    @property
    def description(self) -> str:
        """What prices with this model, in words (for the tables and JSON that name it)."""
        if self.params == DEFAULT_PARAMS:
            return "collsim's analytic model"
        return f"collsim's analytic model ({self.params.source})"

    def nccl_channels(self, collective: str) -> int:
        """The channel count NCCL runs ``collective`` on here (:mod:`collsim.model.nccl_channels`),
        what the tuner offers as NCCL's choice."""
        if self._nccl_channels is None:
            self._nccl_channels = nccl_channels(self.topology, self.system.network)
        return self._nccl_channels.for_collective(collective)

    def candidates(self, collective: str) -> list[str]:
        """The algorithms of ``collective`` this topology can run (as ``WhatIf.candidates``)."""
        return self.system.candidates(collective)

    def structure(
        self, collective: str, algorithm: str, *, protocol: str = "Simple", channels: int = 1
    ) -> Structure:
        """The cached lines of one configuration (built on first use)."""
        proto, key = self._key(collective, algorithm, protocol, channels)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        self._check(collective, algorithm)
        both, trees = self._both_ways(collective, algorithm)
        costs = self._flow_costs(proto, both, trees)
        oracle = self._oracle(costs, collective, algorithm, channels)
        pipeline = oracle if isinstance(oracle, Pipeline) else None
        path = pipeline.fill if pipeline is not None else discover(oracle)
        a, b = costs.load_lines()
        load = upper_envelope(a, b)  # one line per link: keep the few that are ever the max
        serial = self._serial_chunks(collective, algorithm)
        merged = path.merge(load)
        found = Structure(
            collective, algorithm, proto.name, channels, merged, path, load, pipeline, serial
        )
        self._cache[key] = found
        return found

    def _both_ways(self, collective: str, algorithm: str) -> tuple[bool, int]:
        """Whether the algorithm's ranks send and receive at once, and the concurrent trees of
        one channel, as the engine reads them off the schedule (``Schedule.copies_both_ways``,
        ``meta["trees"]``); asked only where some link class is staged through host memory
        (``TopologyFabric.host_staged``), the only place they change a ceiling, or where some
        receive is flushed (the trees then share a channel's flushes, ``route_flush``). The schedule
        is built once, at one element per rank pair."""
        staged = bool(getattr(self.fabric, "host_staged", ()))
        flushing = bool(np.any(np.asarray(getattr(self.fabric, "flush_s_per_byte", 0.0)) > 0))
        if not staged and not flushing:  # trees also set a flushed receive's serial share
            return False, 0
        key = (collective, algorithm)
        if key not in self._both:
            schedule = build_schedule(
                collective, algorithm, nranks=self.nranks, count=self.nranks * self.nranks,
                layout=self.layout,
            )  # fmt: skip
            self._both[key] = (schedule.copies_both_ways(), int(schedule.meta.get("trees", 0)))
        both, trees = self._both[key]
        return both and staged, trees

    def _serial_chunks(self, collective: str, algorithm: str) -> SerialChunks | None:
        """The chunk round trips of an NVLS or NVLS+tree all-reduce here (None where there
        are none: SHARP, GPUs without NCCL's NVLS, other algorithms)."""
        count = getattr(self.fabric, "in_network_chunks", None)
        if count is None or collective != "all_reduce":
            return None
        if algorithm == "in_network":
            ranks = tuple(range(self.nranks))
            pairs = [(ranks, ranks)]
        elif algorithm == "nvls_tree":
            lay, heads = self.layout, head_ranks(self.layout)
            g = lay.ranks_per_node
            pairs = [
                (tuple(range(m * g, m * g + lay.node_size(m))), (int(heads[m, 0]),))
                for m in range(lay.nnodes)
            ]
        else:
            return None
        for srcs, dsts in pairs:
            if count(np.asarray(srcs), np.asarray(dsts), 1) == 0:  # not NVLS: SHARP, or no
                return None  # NCCL NVLS on these GPUs
        latency = self.fabric.in_network_many(pairs).latency_s.tolist()  # type: ignore[attr-defined]
        groups = tuple((s, d, lat) for (s, d), lat in zip(pairs, latency, strict=True))
        return SerialChunks(count, groups)

    def load_lines(
        self, collective: str, algorithm: str, *, protocol: str = "Simple", channels: int = 1
    ) -> Lines:
        """The link-load bound of one configuration alone: per link, its first latency plus the
        wire bytes the algorithm puts on it per collective byte over its capacity; no schedule of
        it finishes before ``max_i(a_i + b_i S)``. The structure's own where it is built, else
        only the flows (no critical path: a fraction of :meth:`structure`'s cost at scale, which
        is what a bound on every printed row needs)."""
        proto, key = self._key(collective, algorithm, protocol, channels)
        hit = self._cache.get(key)
        if hit is not None:
            return hit.load_lines
        found = self._loads.get(key)
        if found is None:
            self._check(collective, algorithm)
            both, trees = self._both_ways(collective, algorithm)
            costs = self._flow_costs(proto, both, trees)
            self._oracle(costs, collective, algorithm, channels)
            found = upper_envelope(*costs.load_lines())
            self._loads[key] = found
        return found

    def _flow_costs(self, proto: ProtocolParams, both: bool = False, trees: int = 0) -> FlowCosts:
        """The flows of this system under this model's parameters and ``proto``: their max-min
        results shared with every protocol and channel count of this model, and with the other
        models of this system whose link capacities are the same (:class:`WaveShares`)."""
        shares = self._shares if self._shares is not None else self.system.wave_shares
        costs = FlowCosts(self.fabric, self.params, proto, shares, both_ways=both, trees=trees)
        self._shares = costs.cache
        return costs

    def _key(
        self, collective: str, algorithm: str, protocol: str, channels: int
    ) -> tuple[ProtocolParams, tuple[str, str, str, int]]:
        """The protocol's parameters and the cache key of one configuration (checked)."""
        proto = self.params.protocol(protocol)
        if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
            raise ScheduleError("must be an integer >= 1", field="channels", value=channels)
        return proto, (collective, algorithm, proto.name, channels)

    def _check(self, collective: str, algorithm: str) -> None:
        """Refuse a collective, an algorithm of it or an in-network one this system lacks."""
        if collective not in COLLECTIVES:
            raise ScheduleError(
                f"unknown collective; valid: {', '.join(COLLECTIVES)}",
                field="collective",
                value=collective,
            )
        if algorithm not in algorithms_for(collective):
            raise ScheduleError(
                f"unknown {collective} algorithm; valid: {', '.join(algorithms_for(collective))}",
                field="algorithm",
                value=algorithm,
            )
        problem = self.system.why_not(collective, algorithm) if needs_in_network(algorithm) or (
            algorithm == "pat") else None  # fmt: skip
        if problem is not None:
            raise ScheduleError(problem, field="algorithm", value=algorithm)

    def _oracle(
        self, costs: FlowCosts, collective: str, algorithm: str, channels: int
    ) -> Oracle | Pipeline:
        n, lay = self.nranks, self.layout
        if algorithm == "ring":
            return flat_ring(costs, collective, channels, lay)
        if collective == "all_reduce":
            if algorithm == "tree":
                return double_tree(costs, lay, channels)
            if algorithm == "rhd":
                groups = np.arange(n)[None, :]
                return rhd(costs, groups, 1.0 / channels, in_place=False, channels=channels)
            if algorithm == "hierarchical":
                return two_level_all_reduce(costs, channels, lay, lay.ranks_per_node, "rhd")
            if algorithm == "ring2d":
                _, cols = lay.grid2d()
                return two_level_all_reduce(costs, channels, lay, cols, "ring")
            if algorithm == "direct":
                return direct(costs, collective, n, channels)
            if algorithm in ("nvls_tree", "collnet"):
                return cross_node(costs, algorithm, lay, channels)
            return in_network(costs, n)
        if collective in ("all_gather", "reduce_scatter"):
            if algorithm in ("rd", "pat"):  # PAT: timed with recursive doubling's schedule
                return _rd(costs, collective, n, channels)
            if algorithm == "direct":
                return direct(costs, collective, n, channels)
            return hierarchical_gather_scatter(costs, collective, channels, lay)
        if collective in ("broadcast", "reduce"):
            return rooted(costs, collective, algorithm, lay, channels)
        if collective == "alltoall":
            if algorithm == "direct":
                return alltoall_direct(costs, n, channels, lay.ranks_per_node)
            return alltoall_hierarchical(costs, n, lay.ranks_per_node, channels)
        return sendrecv(costs, n, channels)

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
        chunk_bytes: int | None = None,
    ) -> np.ndarray:
        """Predicted time (seconds) of ``collective`` by ``algorithm`` at each size (without the
        launch floor if ``floor`` is false: what ranks algorithms below it); ``chunk_bytes``:
        the pipelining chunk of trees and chains (default the schedules' own)."""
        sizes = np.atleast_1d(np.asarray(sizes_bytes))
        if sizes.size and (sizes.min() < 0):
            raise ScheduleError("sizes must not be negative", field="sizes", value=int(sizes.min()))
        st = self.structure(collective, algorithm, protocol=protocol, channels=channels)
        eff = effective_bytes(collective, sizes, elem_bytes, self.nranks)
        stretch = self.params.stretch(collective, algorithm, protocol, eff)
        p = self.params
        if self.nranks == 1:  # a lone rank copies its buffer, whatever the algorithm
            rate = float(self.fabric.copy_bytes_per_s[0]) * p.copy_efficiency
            busy = eff * stretch / rate
        else:
            busy = st.time_s(eff, chunk_bytes=chunk_bytes, stretch=stretch)
        t = np.where(eff == 0, 0.0, p.base_latency_s + busy)
        return under_floor(t, self.floor_s(collective)) if floor else t

    def floor_s(self, collective: str) -> float:
        """The host's cost to issue one call to one GPU (:meth:`ModelParams.floor_s`)."""
        return self.params.floor_s(collective, self.nranks)

    def enabled(self, collective: str, algorithm: str, protocol: str, channels: int = 1) -> bool:
        """Whether NCCL would consider ``protocol`` here by default (the tuner's candidates; an
        explicit ``predict`` still times any protocol): LL128 only where
        :func:`collsim.model.nccl.ll128_by_default` says; elsewhere NCCL runs LL and Simple.
        NVLS+tree on two channels at least (``tuning.cc``: "NVLS/NVLStree needs at least 2
        channels"; one would run one of its two trees only), and where NCCL runs NVLS on these
        GPUs, on no fewer than its NVLS thread blocks across domains: NCCL sizes no NVLS+tree
        call down, it always runs ``nc = comm->nvlsChannels`` (``src/enqueue.cc``
        ``topoGetAlgoInfo``, v2.26.2 l.1750, v2.28.7 l.1884; the ring's channel tuning by size
        is skipped for NVLS and NVLS+tree), 32 on Blackwell (:func:`collsim.nvls.nvls_channels`)."""
        if algorithm == "nvls_tree" and channels < 2:
            return False
        if algorithm == "nvls_tree":
            nvls = nvls_channels(self.topology.gpu.model, several_domains=True)
            if nvls is not None and channels < nvls:
                return False
        return str(protocol).upper() != "LL128" or self.ll128_default

    @cached_property
    def ll128_default(self) -> bool:
        """NCCL enables LL128 by default on this system (see :meth:`enabled`)."""
        network = getattr(self.fabric, "network", None)  # every GPU, not just this group's
        whole = TopologyFabric(network) if network is not None else None
        _, _, nvlink = intra_inter_bandwidth(self.topology, whole)
        return ll128_by_default(
            nvlink,
            compute_capability(self.topology.gpu.model),
            self._spans_nodes(network),
            self.topology.nic_gpu_path,
        )

    def _spans_nodes(self, network: object) -> bool:
        """This group's GPUs sit in more than one NCCL node (server or NVLink domain)."""
        if network is None:
            return self.topology.nvlink_domains > 1
        per = max(1, self.topology.nvlink_domain_nodes)
        devices, index = network.devices, network.index  # type: ignore[attr-defined]
        nodes = {(devices[index[g]].node or 0) // per for g in self.fabric.gpus}
        return len(nodes) > 1


def _rd(costs: FlowCosts, collective: str, n: int, channels: int) -> Oracle:
    """Recursive doubling all_gather / halving reduce_scatter: the halves of ``rhd``."""
    return rd_gather_scatter(costs, collective, n, channels)
