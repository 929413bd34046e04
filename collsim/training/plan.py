"""Capacity planning: rank cluster options (topology x nodes x searched layout) for a workload by
step time, time to train a token budget and cost, discarding layouts that do not fit in memory.

The candidates file (YAML, validated like every collsim input)::

    tokens: 300B                 # training budget
    clusters:
      - {name: dgx-h100 x 64, topology: dgx-h100, nodes: [32, 64], gpu_hour_usd: 3.5}
    search:                      # every combination is tried (valid ones only)
      tp: [1, 2, 4, 8]
      pp: [1, 2, 4, 8]
      micro_batch: [1, 2]
      zero: [0, 1]
      recompute: [selective, full]

Cost = GPUs x hours x price per GPU-hour. When the workload has a ``resilience`` section, each
option also gets its expected goodput under failures (:mod:`collsim.training.resilience`, with
the elastic option priced by whole data-parallel replicas) and the goodput-adjusted time and cost
(``days_failures``, ``cost_failures_usd``), which then rank the options and form the Pareto
front. The Pareto front is the options no other option beats on both time and cost.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BeforeValidator, Field, PrivateAttr, ValidationError, field_validator

from collsim.errors import CollsimError
from collsim.io import beside
from collsim.model.profile import load_profile
from collsim.topology import loader as _topo_loader
from collsim.topology.input_errors import one_line
from collsim.topology.loader import load_topology
from collsim.topology.schema import Strict
from collsim.training.comm import make_timer
from collsim.training.resilience import ResilienceError, dp_step_time, for_job
from collsim.training.step import StepModel, StepResult
from collsim.training.tp_span import SpanCost, span_cost
from collsim.training.workload import WorkloadError, WorkloadIn, parse_count, with_changes
from collsim.whatif import profile_classes

Pos = Annotated[int, Field(ge=1)]
T = TypeVar("T")
Choices = Annotated[list[T], Field(min_length=1)]
"""Values to search: at least one (an empty list is an error, not "search nothing")."""


def _listed(value: Any) -> Any:
    """One node count is a list of one (so ``nodes: 0`` reads as a bad count, not a bad list)."""
    return value if isinstance(value, list) else [value]


class ClusterIn(Strict):
    name: str | None = None
    topology: str
    nodes: Annotated[Choices[Pos], BeforeValidator(_listed)]
    gpu_hour_usd: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]

    _path: str | None = PrivateAttr(default=None)
    """Where its topology file is, found beside the candidates file (:func:`load_candidates`)."""

    @property
    def label(self) -> str:
        """Its name, else its topology as the candidates file writes it."""
        return self.name or self.topology

    @property
    def source(self) -> str:
        """What to load: the file found beside the candidates file, else the name as written."""
        return self._path or self.topology

    def node_counts(self) -> list[int]:
        """The node counts to try, each once, smallest first."""
        return sorted(set(self.nodes))


class SearchIn(Strict):
    tp: Choices[Pos] | None = None
    pp: Choices[Pos] | None = None
    cp: Choices[Pos] | None = None
    cp_comm: Choices[Literal["allgather", "p2p"]] | None = None
    micro_batch: Choices[Pos] | None = None
    zero: Choices[Literal[0, 1, 2, 3]] | None = None
    sequence_parallel: Choices[bool] | None = None
    recompute: Choices[Literal["none", "selective", "full"]] | None = None
    schedule: Choices[Literal["1f1b", "gpipe", "interleaved"]] | None = None
    virtual_stages: Choices[Pos] | None = None


MAX_LAYOUTS = 20_000
"""The most layouts one search may span (each is evaluated on every cluster and node count)."""


class CandidatesIn(Strict):
    tokens: Annotated[
        float, BeforeValidator(parse_count), Field(gt=0, le=1e18, allow_inf_nan=False)
    ] = 1e9
    clusters: Annotated[list[ClusterIn], Field(min_length=1)]
    search: SearchIn = SearchIn()

    @field_validator("clusters")
    @classmethod
    def _names_unique(cls, clusters: list[ClusterIn]) -> list[ClusterIn]:
        names = [c.name for c in clusters if c.name]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"two clusters are named {twice[0]!r}: their rows would look alike")
        return clusters

    @field_validator("search")
    @classmethod
    def _search_bounded(cls, search: SearchIn) -> SearchIn:
        """Refused before hours of evaluations with no output."""
        axes = {k: v for k, v in search.model_dump().items() if v}
        total = math.prod(len(v) for v in axes.values())
        if total > MAX_LAYOUTS:
            sizes = " x ".join(f"{len(v)} {k}" for k, v in axes.items())
            raise ValueError(
                f"the search spans {total:,} layouts ({sizes}), more than the {MAX_LAYOUTS:,} a "
                "plan evaluates on every cluster and node count: search fewer values"
            )
        return search


def load_candidates(path: str | os.PathLike[str]) -> CandidatesIn:
    """Read and validate a candidates file (errors: one line with file, field, value)."""
    p = Path(path)
    if not p.is_file():
        raise WorkloadError("no such candidates file", file=str(p))
    try:
        data = _topo_loader.read_yaml(p)
    except CollsimError as exc:
        raise WorkloadError(exc.message, file=str(p)) from None
    if not isinstance(data, dict):
        raise WorkloadError("a candidates file must be a mapping with 'clusters'", file=str(p))
    try:
        cand = CandidatesIn.model_validate(data)
    except ValidationError as exc:
        err = one_line(exc, CandidatesIn)
        raise WorkloadError(
            err.message, file=str(p), field=err.field, value=err.value, has_value=err.has_value
        ) from None
    for i, cl in enumerate(cand.clusters):  # a misspelt topology, named before any work
        found = beside(cl.topology, p.parent)  # wherever plan runs
        cl._path = found if found != cl.topology else None
        try:
            _topo_loader.resolve(cl.source)
        except CollsimError as exc:
            raise WorkloadError(exc.message, file=str(p), field=f"clusters.{i}.topology",
                                value=cl.topology) from None  # fmt: skip
    return cand


@dataclass
class Rejected:
    """Layouts the search discarded: how many do not fit in memory, and those that cannot run
    at all, with the first reasons (a layout rule, the batch, the GPUs)."""

    memory: int = 0
    reasons: dict[str, list[str]] = field(default_factory=dict)  # reason -> layouts
    notes: list[str] = field(default_factory=list)
    """What the search noted on its inputs (a profile applied to another scale, or not to a
    cluster of another system)."""

    def invalid(self, what: str, why: str) -> None:
        self.reasons.setdefault(why, []).append(what)

    @property
    def count(self) -> int:
        return self.memory + sum(len(v) for v in self.reasons.values())

    def summary(self, limit: int = 3) -> str:
        """One line: the memory count, then the commonest reasons a layout could not run."""
        parts = [f"{self.memory} layout(s) do not fit in memory"]
        common = sorted(self.reasons.items(), key=lambda kv: -len(kv[1]))[:limit]
        parts += [f"{len(v)} cannot run: {why} (e.g. {v[0]})" for why, v in common]
        return "; ".join(parts)


@dataclass
class Option:
    """One evaluated cluster option."""

    cluster: str
    topology: str
    nodes: int
    result: StepResult
    hours: float
    cost_usd: float
    pareto: bool = False
    rank: int = 0
    """1 = the fastest to train (with failures) of the options that fit; set by :func:`plan`."""
    goodput: float | None = None
    """Expected goodput under failures (the workload's ``resilience``), else None."""
    tp_split: SpanCost | None = None
    """Where a tensor-parallel group spans nodes: how many, and what its collectives cost."""

    @property
    def tp_nodes(self) -> int:
        """The most nodes one tensor-parallel group spans (1: inside a node)."""
        return 1 if self.tp_split is None else self.tp_split.span.nodes

    @property
    def expected_hours(self) -> float:
        """Time to train with failures (checkpoints, rework, restarts, repairs): hours / goodput."""
        return self.hours / (self.goodput or 1.0)

    @property
    def expected_cost_usd(self) -> float:
        return self.cost_usd / (self.goodput or 1.0)

    def row(self) -> dict[str, Any]:
        r = self.result
        return {
            "cluster": self.cluster,
            "nodes": self.nodes,
            "gpus": r.n_gpus,
            "layout": r.layout.label(),
            "recompute": r.details.get("recompute", ""),
            "step_s": r.step_time_s,
            "tokens_s_per_gpu": r.tokens_per_step / r.step_time_s / r.n_gpus,
            "tflops_per_gpu": r.tflops_per_gpu,
            "mfu_%": 100 * r.mfu,
            "mem_GB": r.memory.total / 1e9,
            "fits": "yes" if r.fits else "no",
            "days": self.hours / 24,
            "cost_usd": self.cost_usd,
            **(
                {}
                if self.goodput is None
                else {
                    "goodput_%": 100 * self.goodput,
                    "days_failures": self.expected_hours / 24,
                    "cost_failures_usd": self.expected_cost_usd,
                }
            ),
            "pareto": "*" if self.pareto else "",
            "rank": self.rank,
        }


def rank_options(options: list[Option]) -> None:
    """Sort ``options`` and number them: those that fit first, then by time to train (with
    failures), cost, step time, and names (cluster, nodes, layout) so that ties are ranked the
    same way on every run."""
    options.sort(
        key=lambda o: (
            not o.result.fits, o.expected_hours, o.expected_cost_usd, o.result.step_time_s,
            o.cluster, o.nodes, o.result.layout.label(),
        )
    )  # fmt: skip
    for i, o in enumerate(options, start=1):
        o.rank = i


def layouts(w: WorkloadIn, search: SearchIn, rejected: Rejected | None = None) -> list[WorkloadIn]:
    """Every combination of the searched values (the workload's own where a list is absent);
    a combination the workload rules refuse is recorded in ``rejected`` with its reason. FSDP
    stays on where the workload has it, unless a ZeRO stage it cannot be (1, 2) is searched."""
    par = w.parallel
    axes: dict[str, list[Any]] = {
        "tp": search.tp or [par.tp],
        "pp": search.pp or [par.pp],
        "cp": search.cp or [par.cp],
        "cp_comm": search.cp_comm or [par.cp_comm],
        "micro_batch": search.micro_batch or [w.micro_batch],
        "zero": search.zero or [par.zero],
        "sequence_parallel": search.sequence_parallel or [par.sequence_parallel],
        "recompute": search.recompute or [w.recompute],
        "schedule": search.schedule or [par.schedule],
        "virtual_stages": search.virtual_stages or [par.virtual_stages],
    }
    out = []
    seen: set[tuple[Any, ...]] = set()
    for combo in itertools.product(*axes.values()):
        c = dict(zip(axes, combo, strict=True))
        if (c["schedule"] == "interleaved" and c["virtual_stages"] == 1) or c["pp"] == 1:
            c["schedule"] = "1f1b"  # one virtual stage, or no pipeline: the same schedule
        if c["schedule"] != "interleaved":
            c["virtual_stages"] = 1
        if c["tp"] == 1:  # nothing to split a sequence over, or to overlap: the same layout
            c["sequence_parallel"] = False
        if c["cp"] == 1:  # no context parallelism: its communication style is moot
            c["cp_comm"] = par.cp_comm
        # The workload's FSDP stays where its ZeRO stage is kept; a searched stage is that stage
        # (3 with FSDP's per-layer collectives, 0 plain data parallelism).
        fsdp = par.fsdp and (c["zero"] == 3 or (not search.zero and c["zero"] in (0, 3)))
        key = (*c.values(), fsdp)
        if key in seen:
            continue
        seen.add(key)
        overlap = par.tp_overlap and c["tp"] > 1 and c["sequence_parallel"]
        try:
            out.append(
                with_changes(
                    w,
                    parallel={
                        "tp": c["tp"], "pp": c["pp"], "cp": c["cp"], "dp": "auto",
                        "cp_comm": c["cp_comm"],
                        "zero": c["zero"],
                        "fsdp": fsdp, "sequence_parallel": c["sequence_parallel"],
                        "tp_overlap": overlap,
                        "schedule": c["schedule"], "virtual_stages": c["virtual_stages"],
                    },
                    micro_batch=c["micro_batch"],  # type: ignore[arg-type]
                    recompute=c["recompute"],  # type: ignore[arg-type]
                )
            )  # fmt: skip
        except WorkloadError as exc:
            if rejected is not None:
                rejected.invalid(_label(**c, fsdp=fsdp), exc.message)
    return out


def _label(
    *,
    tp: int,
    pp: int,
    cp: int,
    virtual_stages: int,
    cp_comm: str = "allgather",
    sequence_parallel: bool,
    fsdp: bool,
    zero: int,
    micro_batch: int,
    recompute: str,
    **_: Any,
) -> str:
    """A searched layout in a few characters (for the reasons a layout cannot run)."""
    v = f"-v{virtual_stages}" if virtual_stages > 1 else ""
    sp = "-sp" if sequence_parallel else ""
    cp_ = (f"-cp{cp}" + ("r" if cp_comm == "p2p" else "")) if cp > 1 else ""
    z = "-fsdp" if fsdp else f"-zero{zero}"
    return f"tp{tp}-pp{pp}{cp_}{v}{sp}{z}-mb{micro_batch}-{recompute}"


def _workload_label(w: WorkloadIn) -> str:
    """:func:`_label` of a workload's layout."""
    p = w.parallel
    return _label(
        tp=p.tp, pp=p.pp, cp=p.cp, cp_comm=p.cp_comm, sequence_parallel=p.sequence_parallel,
        fsdp=p.fsdp,
        virtual_stages=p.virtual_stages if p.schedule == "interleaved" else 1, zero=p.zero,
        micro_batch=w.micro_batch, recompute=w.recompute,
    )  # fmt: skip


def plan(
    w: WorkloadIn,
    cand: CandidatesIn,
    *,
    engine: str = "analytic",
    efficiency: float | None = None,
    force_efficiency: float | None = None,
    params: Any = None,
    keep: str = "best",
    profile: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[Option], Rejected]:
    """Evaluate every cluster x node count x layout; returns the options that fit, fastest
    first (``keep="best"``: the fastest layout per cluster size; ``"all"``: every layout), and
    what was discarded: layouts that do not fit in memory, and those that cannot run (why).
    ``progress(done, total)`` counts cluster sizes (each one's layouts) as they are priced.

    ``efficiency`` is the profile's (below the workload's own), ``force_efficiency`` overrides
    both (``--efficiency``); a fitted ``profile`` file must match each cluster's topology."""
    options: list[Option] = []
    rejected = Rejected()
    tokens_per_step = w.global_batch * (w.model.seq_len if w.model.kind == "transformer" else 1)
    steps = math.ceil(cand.tokens / tokens_per_step)
    variants = layouts(w, cand.search, rejected)
    if "tokens" not in cand.model_fields_set:
        rejected.notes.append(
            f"the candidates file gives no 'tokens': time and cost are for {cand.tokens:.3g} "
            "tokens (the default)"
        )
    fitted = None  # a fitted profile file: checked against, and scaling, each cluster's links
    if profile and params is not None and str(params.source).startswith("profile "):
        fitted = load_profile(profile)
    sizes_done, sizes_total = 0, sum(len(cl.node_counts()) for cl in cand.clusters)
    if progress is not None:
        progress(sizes_done, sizes_total)
    for cl in cand.clusters:
        node_counts = cl.node_counts()
        biggest = load_topology(cl.source, nodes=max(node_counts))
        simulated, cluster_params = None, params
        if fitted is not None:
            if fitted.doc.topology.name != biggest.name:  # a profile is one system's
                cluster_params = None
                rejected.notes.append(
                    f"{cl.label}: not calibrated (the profile is {fitted.doc.topology.name}'s)"
                )
            else:
                rejected.notes += [f"{cl.label}: {note}"
                                   for note in fitted.check_topology(biggest)]  # fmt: skip
                classes = profile_classes(fitted, biggest)  # at another scale: what carries
                cluster_params = fitted.params(topology=biggest, classes=classes)
                if engine == "des":
                    simulated = fitted.apply_to_topology(biggest, classes)
        timer = make_timer(engine, biggest, params=cluster_params, simulated=simulated)
        model = StepModel(biggest, timer, efficiency)
        model.force_efficiency = force_efficiency
        for nodes in node_counts:
            n = nodes * biggest.gpus_per_node
            found: list[tuple[Option, WorkloadIn]] = []
            for v in variants:
                try:
                    res = model.evaluate_if_fits(v, n)
                except WorkloadError as exc:
                    where = f"{cl.label} x {nodes}: {_workload_label(v)}"
                    rejected.invalid(where, exc.message)
                    continue
                if res is None:
                    rejected.memory += 1
                    continue
                res.details["recompute"] = v.recompute
                hours = steps * res.step_time_s / 3600
                gpn = biggest.gpus_per_node
                replica = res.layout.replica_gpus
                try:
                    fail = for_job(v, n, gpn, dp_step_time(res.step_time_s, n, gpn, replica))
                except ResilienceError as exc:  # this cluster size never completes the job
                    rejected.invalid(f"{cl.label} x {nodes}: {_workload_label(v)}", exc.message)
                    continue
                found.append((
                    Option(
                        cluster=cl.name or f"{cl.label} x {nodes}",
                        topology=cl.source,
                        nodes=nodes,
                        result=res,
                        hours=hours,
                        cost_usd=hours * n * cl.gpu_hour_usd,
                        goodput=None if fail is None else fail.expected_goodput,
                    ),
                    v,
                ))  # fmt: skip
            # The best layout of a cluster size is the one ranked first overall: by time to
            # train with failures (goodput), not by the bare step time.
            found.sort(key=lambda ov: (ov[0].expected_hours, ov[0].expected_cost_usd))
            for o, v in found if keep == "all" else found[:1]:
                o.tp_split = span_cost(model, v, o.result)  # priced only where TP spans nodes
                options.append(o)
            sizes_done += 1
            if progress is not None:
                progress(sizes_done, sizes_total)
    rank_options(options)
    mark_pareto(options)
    return options, rejected


def mark_pareto(options: list[Option]) -> None:
    """Flag the options no other option beats on both time and cost."""
    for o in options:
        t, c = o.expected_hours, o.expected_cost_usd
        o.pareto = not any(
            (p.expected_hours <= t and p.expected_cost_usd <= c)
            and (p.expected_hours < t or p.expected_cost_usd < c)
            for p in options
        )
