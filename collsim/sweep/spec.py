"""Sweep specs: a YAML grid -> validated :class:`SweepSpec` -> coarse :class:`Task` s.

A spec (``collsim sweep SPEC.yaml``)::

    name: h100-vs-b200            # optional, names the report
    topologies: [dgx-h100, hgx-b200]   # catalog names or files
    nodes: [2, 4, 8]              # optional; default: each topology's own node count
    collectives: [all_reduce, all_gather]   # any spelling: allreduce, all_gather_perf, ...
    algorithms: [all]             # all (every algorithm the system can run), auto (the tuner's
                                  # pick per size) or names; a name applies where it exists
    sizes: {min: 8, max: 1G, factor: 2}   # or a list: [1K, 1M, 1G]
    engines: [analytic]           # analytic and/or des
    model: collsim                # collsim or nccl (analytic engine and the auto tuner)
    dtype: float                  # nccl-tests' name or an alias (bf16, fp16, ...)
    protocol: Simple
    channels: 1
    faults:                       # optional: what-if scenarios (docs/faults.md), each a list
      - []                        #   of --fault texts; [] is the healthy system (the default)
      - [nic:n1.nic0:bw=0.25]     #   (a fault's target must exist at every node count)
    steps:                        # optional: training step times
      workloads: [gpt3-175b]
      layouts: [{tp: 8, pp: 8}, {tp: 8, pp: 16}]   # optional; default: each workload's own
      efficiency: 0.5             # optional: GEMM efficiency (default: the workload's own)

A point is one (topology, nodes, engine, collective, algorithm, size) or one (topology, nodes,
engine, workload, layout). Points are grouped into tasks that share a topology (one ``WhatIf`` /
analytic model per task: building them is the expensive part), so executors get coarse work.
Every problem in a spec is one line naming the file, the field and the value.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, model_validator

from collsim import units
from collsim.collectives.registry import MAX_CHANNELS, algorithms_for
from collsim.dtypes import canonical_dtype
from collsim.errors import CollsimError
from collsim.io import beside
from collsim.metrics import canonical_collective
from collsim.protocols import get_protocol
from collsim.topology.input_errors import one_line
from collsim.topology.loader import load_topology, read_yaml, resolve
from collsim.topology.schema import Strict
from collsim.training.workload import load_workload
from collsim.training.workload import resolve as resolve_workload
from collsim.whatif import WhatIf

ENGINES = ("analytic", "des")
MAX_SIZES = 10_000
"""Most sizes a ``{min, max, factor}`` range may expand to (a factor of 1.0000001 would not fit
in memory)."""
SPECIAL_ALGORITHMS = ("all", "auto")


class SweepError(CollsimError):
    """A sweep spec, or a results directory, that cannot be used."""


def _size(value: object) -> object:
    try:
        return units.parse_size(value)  # type: ignore[arg-type]
    except CollsimError as exc:
        raise ValueError(exc.message) from None


Size = Annotated[int, BeforeValidator(_size), Field(ge=1)]
Pos = Annotated[int, Field(ge=1)]


class SizesIn(Strict):
    """``{min, max, factor}`` (nccl-tests' ``-b -e -f``) or ``{values: [...]}``."""

    min: Size | None = None
    max: Size | None = None
    factor: Annotated[float, Field(gt=1)] = 2.0
    values: list[Size] | None = None

    @model_validator(mode="after")
    def _range(self) -> SizesIn:
        if self.values is None:
            if self.min is None or self.max is None:
                raise ValueError("give min and max (and optionally factor), or a list of sizes")
            if self.max < self.min:
                raise ValueError(f"max ({self.max}) is smaller than min ({self.min})")
            count = math.floor(math.log(self.max / self.min) / math.log(self.factor)) + 1
            if count > MAX_SIZES:
                raise ValueError(
                    f"min {self.min}, max {self.max} and factor {self.factor} give {count} sizes; "
                    f"at most {MAX_SIZES} (use a larger factor)"
                )
        elif not self.values:
            raise ValueError("the list of sizes is empty")
        elif self.min is not None or self.max is not None:
            raise ValueError("give either min/max/factor or values, not both")
        return self

    def expand(self) -> list[int]:
        if self.values is not None:
            return sorted(set(self.values))
        out, size = [], float(self.min)  # type: ignore[arg-type]
        while size <= self.max * (1 + 1e-9):  # type: ignore[operator]
            out.append(round(size))
            size *= self.factor
        return sorted(set(out))


class LayoutIn(Strict):
    """Changes to a workload's ``parallel`` section (checked against the workload at run time)."""

    tp: Pos | None = None
    pp: Pos | None = None
    dp: Pos | Literal["auto"] | None = None
    ep: Pos | None = None
    cp: Pos | None = None
    schedule: Literal["1f1b", "gpipe", "interleaved"] | None = None
    virtual_stages: Pos | None = None
    sequence_parallel: bool | None = None
    zero: Literal[0, 1, 2, 3] | None = None
    fsdp: bool | None = None

    def changes(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class StepsIn(Strict):
    workloads: Annotated[list[str], Field(min_length=1)]
    layouts: tuple[LayoutIn, ...] = ()
    efficiency: Annotated[float, Field(gt=0, le=1)] | None = None


class SweepIn(Strict):
    name: str = "sweep"
    topologies: Annotated[list[str], Field(min_length=1)]
    nodes: Annotated[list[Pos], Field(min_length=1)] | None = None
    collectives: tuple[str, ...] = ()
    algorithms: Annotated[tuple[str, ...], Field(min_length=1)] = ("all",)
    sizes: SizesIn | None = None
    engines: Annotated[tuple[Literal["analytic", "des"], ...], Field(min_length=1)] = ("analytic",)
    model: Literal["collsim", "nccl"] = "collsim"
    dtype: str = "float"
    protocol: str = "Simple"
    channels: Annotated[int, Field(ge=1, le=MAX_CHANNELS)] = 1
    faults: Annotated[tuple[tuple[str, ...] | str, ...], Field(min_length=1)] = ((),)
    steps: StepsIn | None = None

    @model_validator(mode="before")
    @classmethod
    def _size_list(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("sizes"), list):
            data = {**data, "sizes": {"values": data["sizes"]}}
        return data


@dataclass(frozen=True)
class Task:
    """A group of points that share one topology: what one worker computes in one go."""

    kind: str  # "collective" or "step"
    topology: str  # the topology's name (for rows and sorting)
    topology_path: str  # the file the worker loads
    nodes: int
    engine: str
    model: str
    collective: str = ""
    algorithms: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()
    dtype: str = "float"
    protocol: str = "Simple"
    channels: int = 1
    workload: str = ""
    workload_path: str = ""
    layouts: tuple[tuple[tuple[str, Any], ...], ...] = ()
    efficiency: float | None = None
    faults: tuple[str, ...] = ()
    """What-if faults (``--fault`` texts) applied to the topology."""
    n_points: int = field(default=0, compare=False)

    @property
    def key(self) -> str:
        """A stable identity of the task's inputs (its results file is named after it)."""
        data = asdict(self)
        data.pop("n_points")
        if not data["faults"]:  # healthy tasks keep the keys they had before faults existed
            data.pop("faults")
        for name in ("topology_path", "workload_path"):  # their contents, not where they lie
            path = data.pop(name)
            data[name] = hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else ""
        text = json.dumps(data, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def sort_key(self) -> tuple[Any, ...]:
        return (
            self.kind, self.topology, self.nodes, self.collective, self.workload, self.engine,
            self.faults,
        )  # fmt: skip


@dataclass
class SweepSpec:
    """A validated spec and the tasks it expands to (in a deterministic order)."""

    name: str
    file: str | None
    data: dict[str, Any]
    tasks: list[Task]

    @property
    def n_points(self) -> int:
        return sum(t.n_points for t in self.tasks)


def _fail(message: str, file: str | None, field: str, value: Any = None) -> SweepError:
    return SweepError(message, file=file, field=field, value=value, has_value=value is not None)


def _did_you_mean(word: str, known: list[str] | tuple[str, ...]) -> str:
    hint = difflib.get_close_matches(word, list(known), n=1)
    return f"; did you mean {hint[0]!r}?" if hint else f" (choose from {', '.join(known)})"


def load_spec(path: str | Path) -> SweepSpec:
    """Read, validate and expand a sweep spec file."""
    p = Path(path)
    if not p.is_file():
        raise SweepError("no such sweep spec file", file=str(p))
    try:
        data = read_yaml(p)
    except CollsimError as exc:
        raise SweepError(exc.message, file=str(p)) from None
    return spec_from_dict(data, file=str(p), base=p.parent)


def spec_from_dict(data: Any, *, file: str | None = None, base: Path | None = None) -> SweepSpec:
    """Validate a parsed spec and expand it into tasks (topologies and workloads are loaded)."""
    if not isinstance(data, dict):
        raise SweepError(
            "a sweep spec must be a mapping with 'topologies' and 'collectives' and/or 'steps'",
            file=file,
            value=type(data).__name__,
        )
    try:
        spec = SweepIn.model_validate(data)
    except ValidationError as exc:
        err = one_line(exc, SweepIn)
        raise SweepError(
            err.message, file=file, field=err.field, value=err.value, has_value=err.has_value
        ) from None
    _no_repeats(data, file, "")  # before any topology or workload is loaded
    if not spec.collectives and spec.steps is None:
        raise _fail("nothing to sweep: give 'collectives' (with 'sizes') and/or 'steps'", file, "")
    spec = _check_collectives(spec, file)
    tasks = _collective_tasks(spec, file, base) + _step_tasks(spec, file, base)
    tasks.sort(key=Task.sort_key)
    keys = [t.key for t in tasks]
    if len(set(keys)) != len(keys):
        again = next(t for i, t in enumerate(tasks) if t.key in keys[:i])
        what = f"{again.topology} x {again.nodes}, {again.collective or again.workload}, "
        raise _fail(
            "the grid repeats a point (the same topology file under two names, or one fault "
            "scenario spelled two ways)", file, "topologies/faults", what + again.engine,
        )  # fmt: skip
    return SweepSpec(spec.name, file, spec.model_dump(mode="json"), tasks)


def _no_repeats(data: Any, file: str | None, where: str) -> None:
    """A list that names one value twice would sweep its points twice: name the list and value."""
    if isinstance(data, dict):
        for key, value in data.items():
            _no_repeats(value, file, f"{where}.{key}" if where else str(key))
    elif isinstance(data, list):
        seen: list[Any] = []
        for item in data:
            if isinstance(item, (str, int, float)) and item in seen:
                raise _fail("a list names the same value twice", file, where, item)
            seen.append(item)


def _check_collectives(spec: SweepIn, file: str | None) -> SweepIn:
    """``spec`` with its collectives and data type by their canonical names (any alias is taken:
    ``allreduce``, ``all_reduce_perf``, ``bf16``), once checked."""
    names: list[str] = []
    for i, coll in enumerate(spec.collectives):
        try:
            name = canonical_collective(coll)
        except CollsimError as exc:
            raise _fail(exc.message, file, f"collectives.{i}", coll) from None
        if name in names:
            raise _fail(f"names {name} twice", file, f"collectives.{i}", coll)
        names.append(name)
    try:
        dtype = canonical_dtype(spec.dtype)
    except CollsimError as exc:
        raise _fail(exc.message, file, "dtype", spec.dtype) from None
    spec = spec.model_copy(update={"collectives": tuple(names), "dtype": dtype})
    if spec.collectives and spec.sizes is None:
        raise _fail("required with 'collectives' (e.g. {min: 8, max: 1G, factor: 2})", file,
                    "sizes")  # fmt: skip
    known = sorted({a for c in spec.collectives for a in algorithms_for(c)})
    for i, algo in enumerate(spec.algorithms):
        if algo in SPECIAL_ALGORITHMS:
            continue
        if algo not in known:
            raise _fail(
                f"not an algorithm of {', '.join(spec.collectives) or 'any collective'}"
                + _did_you_mean(algo, [*SPECIAL_ALGORITHMS, *known]),
                file,
                f"algorithms.{i}",
                algo,
            )
    try:
        get_protocol(spec.protocol)
    except CollsimError as exc:
        raise _fail(exc.message, file, "protocol", spec.protocol) from None
    return spec


def _topologies(
    spec: SweepIn, file: str | None, base: Path | None
) -> list[tuple[str, str, Any, tuple[str, ...]]]:
    """(label, file, topology, faults) of every topology x node count x fault scenario, checked
    by loading each one. A faulty scenario's label is ``NAME [FAULT; ...]``."""
    out = []
    named: dict[str, tuple[int, str]] = {}  # rows carry the topology's name: one file per name
    for i, name in enumerate(spec.topologies):
        try:
            path = str(resolve(beside(name, base)))
        except CollsimError as exc:
            raise _fail(exc.message, file, f"topologies.{i}", name) from None
        for j, nodes in enumerate(spec.nodes or [None]):  # type: ignore[list-item]
            try:
                topo = load_topology(path, nodes=nodes)
            except CollsimError as exc:
                where = f"nodes.{j}" if exc.field in ("--nodes", "--gpus-per-node") else None
                raise _fail(
                    f"{name}: {exc.message}",
                    file,
                    where or f"topologies.{i}",
                    nodes if where else name,
                ) from None
            first, first_path = named.setdefault(topo.name, (i, path))
            if first_path != path:
                raise _fail(f"names its topology {topo.name!r}, as topologies.{first} does: "
                            "results would be mixed up (rename one)", file,
                            f"topologies.{i}", name)  # fmt: skip
            for k, scenario in enumerate(spec.faults):
                faults = (scenario,) if isinstance(scenario, str) else tuple(scenario)
                if not faults:
                    out.append((topo.name, path, topo, faults))
                    continue
                try:
                    faulty = load_topology(path, nodes=nodes, faults=faults)
                except CollsimError as exc:
                    raise _fail(f"{name}: {exc.message}", file, f"faults.{k}", exc.value) from None
                label = f"{topo.name} [{'; '.join(faulty.faults)}]"
                # As applied (one spelling per fault: bw=.25 is bw=0.25), so a scenario written
                # twice in two ways is one point, refused as a repeat.
                out.append((label, path, faulty, tuple(faulty.faults)))
    return out


def _collective_tasks(spec: SweepIn, file: str | None, base: Path | None) -> list[Task]:
    if not spec.collectives:
        return []
    sizes = tuple(spec.sizes.expand())  # type: ignore[union-attr]
    tasks = []
    for name, path, topo, faults in _topologies(spec, file, base):
        nodes = topo.nodes
        for coll in spec.collectives:
            algos = _algorithms(spec.algorithms, coll, topo)
            if not algos:
                continue
            for engine in spec.engines:
                tasks.append(
                    Task(
                        kind="collective", topology=name, topology_path=path, nodes=nodes,
                        engine=engine, model=spec.model, collective=coll, algorithms=algos,
                        sizes=sizes, dtype=spec.dtype, protocol=spec.protocol,
                        channels=spec.channels, faults=faults,
                        n_points=len(algos) * len(sizes),
                    )
                )  # fmt: skip
    return tasks


def _algorithms(requested: tuple[str, ...], collective: str, topo: Any) -> tuple[str, ...]:
    """The algorithms of ``collective`` a task runs: ``all`` is every algorithm the system can
    run (``WhatIf.candidates``, which needs no routes), names only where they exist."""
    from types import SimpleNamespace

    out: list[str] = []
    for algo in requested:
        if algo == "all":
            proxy = SimpleNamespace(topology=topo, has_in_network=topo.reduces_for_all_gpus)
            names = WhatIf.candidates(proxy, collective)  # type: ignore[arg-type]
        else:
            names = [algo] if algo == "auto" or algo in algorithms_for(collective) else []
        out += [a for a in names if a not in out]
    return tuple(out)


def _step_tasks(spec: SweepIn, file: str | None, base: Path | None) -> list[Task]:
    if spec.steps is None:
        return []
    workloads = []
    for i, name in enumerate(spec.steps.workloads):
        try:
            path = str(resolve_workload(beside(name, base)))
            w = load_workload(path)
        except CollsimError as exc:
            raise _fail(exc.message, file, f"steps.workloads.{i}", name) from None
        workloads.append((w.name, path))
    layouts = tuple(tuple(sorted(lay.changes().items())) for lay in spec.steps.layouts) or ((),)
    tasks = []
    for name, path, topo, faults in _topologies(spec, file, base):
        nodes = topo.nodes
        for wname, wpath in workloads:
            for engine in spec.engines:
                tasks.append(
                    Task(
                        kind="step", topology=name, topology_path=path, nodes=nodes,
                        engine=engine, model=spec.model, workload=wname, workload_path=wpath,
                        layouts=layouts, efficiency=spec.steps.efficiency, faults=faults,
                        n_points=len(layouts),
                    )
                )  # fmt: skip
    return tasks


def layout_text(changes: tuple[tuple[str, Any], ...]) -> str:
    """``tp=8 pp=4`` for a layout's changes; ``own`` for the workload's own layout."""
    if not changes:
        return "own"
    return " ".join(f"{k}={json.dumps(v) if isinstance(v, bool) else v}" for k, v in changes)
