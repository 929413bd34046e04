"""What-if simulation over message sizes: topology + collective + algorithm -> nccl-tests rows.

This is the library call behind ``collsim simulate`` and ``collsim demo``: it places one rank on
every GPU of the topology (node-major, as NCCL numbers ranks), builds each size's schedule, replays
it on the engine and returns one :class:`Point` per size, as nccl-tests would print it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from collsim.collectives.registry import (
    MAX_CHANNELS,
    build_schedule,
    needs_in_network,
    runs_protocol,
)
from collsim.collectives.schedule import Schedule
from collsim.dtypes import DTYPE_BYTES, canonical_dtype
from collsim.engine import SimResult, simulate
from collsim.errors import ScheduleError
from collsim.metrics import algbw_gbps, busbw_gbps, canonical_collective
from collsim.model.analytic import AnalyticModel
from collsim.model.bounds import BusbwBounds
from collsim.model.nccl import NcclModel
from collsim.model.params import DEFAULT_PARAMS
from collsim.model.profile import CLASSES, Profile
from collsim.model.system import System
from collsim.model.system import layout_for as layout_for  # re-exported: the ranks of a WhatIf
from collsim.model.tuner import model_description, nccl_tuning, tuned_algorithms
from collsim.protocols import get_protocol
from collsim.topology.spec import Topology

ROUNDED_TO_RANKS = frozenset({"all_gather", "reduce_scatter", "alltoall"})
"""Collectives whose element count nccl-tests rounds down to a multiple of the rank count."""

ENGINES = ("des", "analytic")
"""``des``: the discrete-event engine (exact, with contention); ``analytic``: the closed forms."""
MODELS = ("collsim", "nccl")
"""Cost models for ``--engine analytic`` and the ``auto`` tuner: collsim's analytic model or
NCCL's own tuning model (the baseline)."""


def element_count(collective: str, size_bytes: int, elem_bytes: int, nranks: int) -> int:
    """The element count nccl-tests uses for ``size_bytes`` (rounded to ranks where it does)."""
    count = size_bytes // elem_bytes
    if collective in ROUNDED_TO_RANKS:
        count = count // nranks * nranks
    return count


def printed_count(collective: str, elements: int, nranks: int) -> int:
    """The count nccl-tests prints for a buffer of ``elements``: per rank for all_gather,
    reduce_scatter and alltoall (their ``sendcount``), the whole buffer for the others."""
    return elements // nranks if collective in ROUNDED_TO_RANKS else elements


@dataclass(frozen=True)
class Point:
    """One size of a sweep, as nccl-tests prints it, plus the algorithm that ran."""

    size_bytes: int
    count: int
    algorithm: str
    time_s: float
    algbw_gbps: float
    busbw_gbps: float
    protocol: str = "Simple"
    channels: int = 1
    busbw_bound_gbps: float | None = None
    """The most busbw this (algorithm, protocol, channels) can reach on the topology's links
    (:mod:`collsim.model.bounds`); None where there is none (a lone rank, a busbw of 0)."""
    exceeds_bound: bool = False
    """Whether :attr:`busbw_gbps` passes that bound (a cost model's number no run can reach)."""

    def as_json(self) -> dict[str, Any]:
        return {
            "bytes": self.size_bytes,
            "count": self.count,
            "algorithm": self.algorithm,
            "protocol": self.protocol,
            "channels": self.channels,
            "time_us": self.time_s * 1e6,
            "algbw_gbps": self.algbw_gbps,
            "busbw_gbps": self.busbw_gbps,
            "busbw_bound_gbps": self.busbw_bound_gbps,
            "exceeds_bound": self.exceeds_bound,
        }


@dataclass
class Sweep:
    """The points of one what-if, and the detailed result of its largest size."""

    collective: str
    algorithm: str
    topology: str
    ranks: int
    nodes: int
    dtype: str
    protocol: str | None
    channels: int | None
    """The protocol and channel count asked for; ``None`` when :attr:`tuned` (each point's own)."""
    tuned: bool = False
    """Whether the tuner picked the algorithm, protocol and channels per size (``--tuned``)."""
    faults: tuple[str, ...] = ()
    """What-if faults of the topology (``--fault``), in the order applied."""
    engine: str = "des"
    timed_by: str = "the discrete-event engine"
    """What produced the times, in words: the engine, or the cost model that estimated them."""
    question: str | None = None
    """With ``auto`` or :attr:`tuned`: which choice per size the rows show, in words (what NCCL
    would run, or collsim's fastest algorithm); None for an algorithm given."""
    chosen_by: str | None = None
    """The cost model that made those choices, in words."""
    points: list[Point] = field(default_factory=list)
    last: SimResult | None = None
    last_schedule: Schedule | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "collective": self.collective,
            "algorithm": self.algorithm,
            "topology": self.topology,
            "ranks": self.ranks,
            "nodes": self.nodes,
            "dtype": self.dtype,
            "protocol": self.protocol,
            "channels": self.channels,
            "tuned": self.tuned,
            **({"faults": list(self.faults)} if self.faults else {}),
            "engine": self.engine,
            "timed_by": self.timed_by,
            "question": self.question,
            "chosen_by": self.chosen_by,
            "points": [p.as_json() for p in self.points],
        }


class WhatIf(System):
    """One topology, ready to time any collective at any size (routes are cached across calls)."""

    def __init__(self, topology: Topology) -> None:
        super().__init__(topology)
        self._models: dict[str, Any] = {}
        self._bounds: BusbwBounds | None = None

    def cost_model(self, name: str = "collsim") -> Any:
        """The analytic model ``name`` (``collsim`` or ``nccl``) of this topology (cached)."""
        if name not in MODELS:
            raise ScheduleError(
                f"unknown model (choose from {', '.join(MODELS)})", field="model", value=name
            )
        if name not in self._models:
            if name == "nccl":
                self._models[name] = NcclModel(self.topology, can_run=self._can_run)
            else:
                self._models[name] = AnalyticModel(self)
        return self._models[name]

    def bounds(self) -> BusbwBounds:
        """The busbw bounds of this topology's links (cached): from the collsim model where it
        has the default parameters (sharing its flows), else from one that has (a profile's
        efficiencies are not the hardware's limit)."""
        if self._bounds is None:
            model = self.cost_model("collsim")
            if getattr(model, "params", None) != DEFAULT_PARAMS:
                model = AnalyticModel(self)
            self._bounds = BusbwBounds(model)
        return self._bounds

    def _can_run(self, collective: str, algorithm: str) -> bool:
        """Whether this system can run ``algorithm`` (in-network needs a reachable switch)."""
        if self.why_not(collective, algorithm) is not None:
            return False
        if not needs_in_network(algorithm):
            return True
        try:
            self.cost_model("collsim").structure(collective, algorithm)
        except ScheduleError:
            return False
        return True

    def run(
        self,
        collective: str,
        algorithm: str,
        size_bytes: int,
        *,
        elem_bytes: int = 4,
        channels: int = 1,
        protocol: str = "Simple",
        chunk_bytes: int | None = None,
    ) -> tuple[SimResult, Schedule]:
        """Simulate one collective of ``size_bytes`` with one algorithm."""
        n = self.topology.n_gpus
        count = element_count(collective, size_bytes, elem_bytes, n)
        schedule = build_schedule(
            collective,
            algorithm,
            nranks=n,
            count=count,
            elem_bytes=elem_bytes,
            layout=self.layout,
            channels=channels,
            chunk_bytes=chunk_bytes,
        )
        return simulate(schedule, self.fabric, protocol=protocol), schedule

    def sweep(
        self,
        collective: str,
        algorithm: str,
        sizes: Sequence[int],
        *,
        dtype: str = "float",
        channels: int = 1,
        protocol: str = "Simple",
        chunk_bytes: int | None = None,
        engine: str = "des",
        model: str = "collsim",
        progress: Callable[[int, int], None] | None = None,
        tuned: bool = False,
    ) -> Sweep:
        """nccl-tests-style rows for every size.

        ``algorithm="auto"``: the tuner (:mod:`collsim.model.tuner`, over ``model``'s
        predictions, with this protocol and channel count) picks each size's algorithm.
        ``tuned``: it picks the algorithm, protocol and channel count per size among NCCL's
        own (:func:`collsim.model.tuner.nccl_choices`): what NCCL would run; ``algorithm``
        must be ``auto`` and ``protocol`` / ``channels`` are not used.
        ``engine``: ``des`` times it on the discrete-event engine, ``analytic`` with ``model``.
        ``progress(done, total)`` is called as each size is timed.
        """
        collective = canonical_collective(collective)
        dtype = canonical_dtype(dtype)  # rows print nccl-tests' name whatever the caller wrote
        elem = DTYPE_BYTES[dtype]
        proto = get_protocol(protocol).name
        if not 1 <= channels <= MAX_CHANNELS:
            raise ScheduleError(f"must be from 1 to {MAX_CHANNELS} (NCCL's MAXCHANNELS)",
                                field="channels", value=channels)  # fmt: skip
        if engine not in ENGINES:
            raise ScheduleError(
                f"unknown engine (choose from {', '.join(ENGINES)})", field="engine", value=engine
            )
        # Sizes that round to the same element count are the same call (nccl-tests -b 1 -e 8
        # on floats: 1 and 2 bytes are both empty): one row each.
        first: dict[int, int] = {}
        for size in sizes:
            first.setdefault(element_count(collective, size, elem, self.topology.n_gpus), size)
        sizes = list(first.values())
        cost = self.cost_model(model)
        if chunk_bytes is not None and engine == "analytic" and model != "collsim":
            raise ScheduleError(
                "NCCL's tuning model has no pipelining chunk; --chunk-bytes applies to the des "
                "engine and to collsim's model",
                field="chunk_bytes",
                value=chunk_bytes,
            )
        extra = {"chunk_bytes": chunk_bytes} if chunk_bytes is not None else {}
        choices: list[tuple[str, int]] = [(proto, channels)] * len(sizes)
        question = None
        if tuned:
            if algorithm != "auto":
                raise ScheduleError(
                    "a tuned sweep picks the algorithm itself; leave --algorithm auto",
                    field="algorithm",
                    value=algorithm,
                )
            if chunk_bytes is not None:
                raise ScheduleError(
                    "a tuned sweep runs NCCL's own chunking; --chunk-bytes does not apply",
                    field="chunk_bytes",
                    value=chunk_bytes,
                )
            tuning = nccl_tuning(cost, collective, list(sizes), elem_bytes=elem)
            picked = [tuning.choice_at(i) for i in range(len(sizes))]
            picks = [c.algorithm for c in picked]
            choices = [(c.protocol, c.channels) for c in picked]
            question = tuning.question()
        elif algorithm == "auto":
            picks = tuned_algorithms(
                cost, collective, list(sizes), elem_bytes=elem, protocol=proto, channels=channels,
                **extra,
            )  # fmt: skip
            question = (
                f"the fastest algorithm per size of those the model prices here "
                f"({', '.join(cost.candidates(collective))}) with {proto} on {channels} "
                "channel(s), not necessarily what NCCL runs (--tuned: what NCCL would run)"
            )
        else:
            picks = [algorithm] * len(sizes)
        if algorithm != "auto" and not runs_protocol(algorithm, proto):
            raise ScheduleError(
                f"{algorithm} runs the Simple protocol only, as in NCCL (in-network reductions "
                "and PAT)",
                field="protocol",
                value=proto,
            )
        problem = self.why_not(collective, algorithm) if algorithm != "auto" else None
        if problem is not None:
            raise ScheduleError(problem, field="algorithm", value=algorithm)
        result = Sweep(
            collective=collective,
            algorithm=algorithm,
            topology=self.topology.name,
            ranks=self.topology.n_gpus,
            nodes=self.topology.nodes,
            dtype=dtype,
            protocol=None if tuned else proto,
            channels=None if tuned else channels,
            tuned=tuned,
            faults=self.topology.faults,
            engine=engine,
            timed_by="the discrete-event engine" if engine == "des" else model_description(cost),
            question=question,
            chosen_by=model_description(cost) if question is not None else None,
        )
        bounds = self.bounds()
        n = self.topology.n_gpus
        for i, (size, name, (run_proto, run_channels)) in enumerate(
            zip(sizes, picks, choices, strict=True)
        ):
            if progress is not None:
                progress(i, len(sizes))
            if engine == "des":
                sim, sched = self.run(
                    collective, name, size, elem_bytes=elem, channels=run_channels,
                    protocol=run_proto, chunk_bytes=chunk_bytes,
                )  # fmt: skip
                time_s, count = sim.time_s, sched.count
                result.last, result.last_schedule = sim, sched
            else:
                count = element_count(collective, size, elem, n)
                time_s = float(
                    cost.predict(
                        collective, name, [size], elem_bytes=elem, protocol=run_proto,
                        channels=run_channels, **extra,
                    )[0]
                )  # fmt: skip
            size_out = count * elem
            busbw = busbw_gbps(collective, n, size_out, time_s) if time_s > 0 else 0.0
            bound = bounds.bound(collective, name, run_proto, run_channels) if size_out else None
            result.points.append(
                Point(
                    size_bytes=size_out,
                    count=printed_count(collective, count, n),
                    algorithm=name,
                    time_s=time_s,
                    algbw_gbps=algbw_gbps(size_out, time_s) if time_s > 0 else 0.0,
                    busbw_gbps=busbw,
                    protocol=run_proto,
                    channels=run_channels,
                    busbw_bound_gbps=bound.busbw_gbps if bound is not None else None,
                    exceeds_bound=bound is not None and bound.exceeded_by(busbw),
                )
            )
        if progress is not None:
            progress(len(sizes), len(sizes))
        return result


def profile_classes(
    profile: Profile, topology: Topology, whatif: WhatIf | None = None
) -> list[str] | None:
    """The link classes ``topology``'s GPU routes cross, where ``profile`` needs them to decide
    what carries over (another scale than the fit's, :meth:`Profile.params`); else None. The
    probe routes the GPUs, so a ``whatif`` already built for ``topology`` is reused."""
    if not profile.other_scale(topology):
        return None
    return [CLASSES[k] for k in (whatif or WhatIf(topology)).link_classes_used()]


def whatif_with_profile(topology: Topology, profile: Profile, engine: str = "analytic") -> WhatIf:
    """A :class:`WhatIf` that sees ``profile``: for the analytic engine its collsim cost model
    runs under :meth:`Profile.params`; for the discrete-event engine the links are scaled
    (:meth:`Profile.apply_to_topology`; memory efficiency, which scales the per-channel
    ceiling, base latency, launch floor, size factors and the tree correction are analytic
    only). Both apply the same rule at another scale than the fit's:
    only what the fit pinned down for the classes this system's routes cross."""
    profile.check_topology(topology)
    whatif = WhatIf(topology)
    classes = profile_classes(profile, topology, whatif)
    if engine == "analytic":
        params = profile.params(topology=topology, classes=classes)  # at another scale: see there
        whatif._models["collsim"] = AnalyticModel(whatif, params)  # the model cache
        return whatif
    return WhatIf(profile.apply_to_topology(topology, classes))
