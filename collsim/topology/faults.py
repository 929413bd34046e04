"""What-if faults: degrade, fail or load parts of a validated :class:`Topology`.

A fault is written compactly as ``KIND:TARGET[:PARAMS]`` (``collsim simulate --fault``, repeated)
or as a mapping in a topology file's ``faults:`` list (``docs/faults.md``)::

    link:n0.nic0-leaf0:bw=0.5,lat=+2us   # both directions; ``a>b`` for one direction
    link:leaf0-spine0:fail               # remove the link (routes are recomputed)
    nic:n1.nic3:bw=0.25                  # every link of the NIC
    nic:n1.nic3:fail                     # remove the NIC and its links
    switch:spine1:fail                   # remove the switch and its links
    gpu:n1.gpu3:slow=2                   # half the peak FLOP/s and memory bandwidth
    background:leaf0-spine0:rate=100Gbps # another job's flow on a link (``a>b``: one direction)
    background:ring[2,3]:rate=50GB/s     # another job's ring over nodes 2 and 3 (``alltoall``)

:func:`apply_faults` builds a modified copy of the spec before the graph and routes are built,
so the engine and the analytic model both see the degraded system. Failures are applied first
(one at a time, each checked for a partition), then degradations, slow GPUs and background load.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from collsim import units
from collsim.errors import CollsimError, TopologyError
from collsim.topology.graph import Network
from collsim.topology.reach import check_connected, unreachable_gpus
from collsim.topology.spec import Device, Topology

T = TypeVar("T")

KINDS = ("link", "nic", "switch", "gpu", "background")
PATTERNS = ("ring", "alltoall")
BACKGROUND_FLOOR = 0.05
"""Background load never leaves a link less than this fraction of its (degraded) capacity."""
_SWITCH_KINDS = ("switch", "nvswitch", "pcie_switch")


@dataclass(frozen=True)
class Fault:
    """One what-if fault, parsed but not yet checked against a topology."""

    kind: str
    target: str
    """A device name, a link ``a-b`` (both directions) or ``a>b``, or a pattern name."""
    bw: float | None = None
    """Bandwidth factor (0.5 = half)."""
    lat_s: float = 0.0
    """Latency added to each affected direction."""
    fail: bool = False
    slow: float | None = None
    """A GPU's slowdown factor (2 = half the FLOP/s and memory bandwidth)."""
    rate_bytes_per_s: float | None = None
    """Background traffic: per link direction, or per GPU for a pattern."""
    nodes: tuple[int, ...] = ()
    """A background pattern's nodes."""
    where: str = "--fault"
    """The field it came from, for error messages (``--fault`` or ``faults.3``)."""

    @property
    def text(self) -> str:
        """The canonical ``--fault`` form (what headers and JSON show)."""
        target = self.target
        if self.nodes:
            target += "[" + ",".join(str(n) for n in self.nodes) + "]"
        params = []
        if self.fail:
            params.append("fail")
        if self.bw is not None:
            params.append(f"bw={self.bw:g}")
        if self.lat_s:
            params.append(f"lat=+{self.lat_s * 1e6:g}us")
        if self.slow is not None:
            params.append(f"slow={self.slow:g}")
        if self.rate_bytes_per_s is not None:
            params.append(f"rate={self.rate_bytes_per_s / 1e9:g}GB/s")
        return f"{self.kind}:{target}:{','.join(params)}"

    def error(self, message: str, value: object = None) -> TopologyError:
        return TopologyError(message, field=self.where, value=value if value else self.text)


# -- parsing ---------------------------------------------------------------------------------------


def parse_fault(text: str, where: str = "--fault") -> Fault:
    """``KIND:TARGET[:PARAMS]`` -> :class:`Fault` (syntax only; names are checked on apply)."""
    if not isinstance(text, str) or text.count(":") < 1:
        raise TopologyError(
            "a fault is KIND:TARGET[:PARAMS], e.g. link:n0.nic0-leaf0:bw=0.5",
            field=where,
            value=text,
        )
    kind, rest = text.strip().split(":", 1)
    target, _, params = rest.rpartition(":") if ":" in rest else (rest, "", "")
    fields: dict[str, object] = {}
    for item in filter(None, (p.strip() for p in params.split(","))):
        key, eq, value = item.partition("=")
        if key.strip() in fields:
            raise TopologyError(f"{key.strip()} is given twice", field=where, value=text)
        fields[key.strip()] = value.strip() if eq else True
    return make_fault(kind.strip(), target.strip(), fields, where, text)


def make_fault(
    kind: str, target: str, fields: dict[str, object], where: str, shown: object = None
) -> Fault:
    """Check a fault's kind and parameters (rates and times through :mod:`collsim.units`)."""
    shown = shown if shown is not None else target

    def bad(message: str, value: object = shown) -> TopologyError:
        return TopologyError(message, field=where, value=value)

    if kind not in KINDS:
        hint = difflib.get_close_matches(kind, KINDS, n=1)
        extra = f"; did you mean {hint[0]!r}?" if hint else f"; known: {', '.join(KINDS)}"
        raise bad(f"unknown fault kind{extra}", kind)
    if not target:
        raise bad(f"a {kind} fault needs a target")
    allowed = {
        "link": ("bw", "lat", "fail"),
        "nic": ("bw", "lat", "fail"),
        "switch": ("fail",),
        "gpu": ("slow",),
        "background": ("rate",),
    }[kind]
    for key in fields:
        if key not in allowed:
            hint = difflib.get_close_matches(key, allowed, n=1)
            extra = f"; did you mean {hint[0]!r}?" if hint else f"; expected: {', '.join(allowed)}"
            raise bad(f"unknown {kind} fault parameter {key!r}{extra}")
    if not fields:
        raise bad(f"a {kind} fault needs one of: {', '.join(allowed)}")
    kw: dict[str, object] = {}
    fail = fields.get("fail", False)
    if fail not in (True, False, "true", "yes"):
        raise bad("fail takes no value (write 'fail')")
    kw["fail"] = bool(fail)
    if kw["fail"] and len(fields) > 1:
        raise bad("a failed part has no other parameters")
    if "bw" in fields:
        kw["bw"] = _number(fields["bw"], "bw", bad)
    if "slow" in fields:
        kw["slow"] = _number(fields["slow"], "slow", bad)
    if "lat" in fields:
        value = fields["lat"]
        text = value.lstrip("+") if isinstance(value, str) else value
        try:
            kw["lat_s"] = units.parse_time(text, unit_required=True)  # type: ignore[arg-type]
        except CollsimError as exc:
            raise bad(f"lat: {exc.message}", value) from None
        low, high = units.TIME_RANGE_S
        if not low <= kw["lat_s"] <= high:  # type: ignore[operator]
            raise bad("lat must be from 0 to 10 s (the topology's range for latencies)", value)
    if "rate" in fields:
        try:
            kw["rate_bytes_per_s"] = units.parse_rate(fields["rate"])  # type: ignore[arg-type]
        except CollsimError as exc:
            raise bad(f"rate: {exc.message}", fields["rate"]) from None
        low, high = units.LINK_RATE_RANGE_BYTES_PER_S
        if not low <= kw["rate_bytes_per_s"] <= high:  # type: ignore[operator]
            read = units.format_rate_si(kw["rate_bytes_per_s"])  # type: ignore[arg-type]
            raise bad(f"rate reads as {read}: must be from 1kB/s to 10TB/s (a link's range)",
                      fields["rate"])  # fmt: skip
    if kind == "background" and "[" in target:
        name, _, nodes = target.partition("[")
        if name not in PATTERNS or not nodes.endswith("]"):
            raise bad(f"a background pattern is {'|'.join(PATTERNS)}[NODES], e.g. ring[2,3]")
        kw["nodes"] = _nodes(nodes[:-1], bad)
        target = name
    return Fault(kind=kind, target=target, where=where, **kw)  # type: ignore[arg-type]


def _number(value: object, name: str, bad) -> float:  # type: ignore[no-untyped-def]
    if isinstance(value, bool):
        raise bad(f"{name} takes a number ({name}=...)", value)
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise bad(f"{name} must be a number", value) from None
    if not number > 0 or number == float("inf"):
        raise bad(f"{name} must be a positive number", value)
    if name == "bw" and not 1e-6 <= number <= 1:
        raise bad("bw is a factor of the bandwidth, from 1e-6 to 1", value)
    if name == "slow" and not 1 <= number <= 1e6:
        raise bad("slow is a slowdown factor, from 1 to 1e6 (2 = half speed)", value)
    return number


def _nodes(text: str, bad) -> tuple[int, ...]:  # type: ignore[no-untyped-def]
    found: list[int] = []
    for part in filter(None, (p.strip().removeprefix("n") for p in text.split(","))):
        lo, dash, hi = part.partition("-")
        try:
            span = range(int(lo), int(hi) + 1) if dash else range(int(lo), int(lo) + 1)
        except ValueError:
            raise bad("nodes are indexes or ranges, e.g. [0,2-3]", text) from None
        found.extend(span)
    if len(set(found)) < 2:
        raise bad("a background pattern needs at least two nodes", text)
    return tuple(sorted(set(found)))


def faults_from_file(entries: Iterable[object]) -> list[Fault]:
    """A topology file's validated ``faults:`` entries (strings or :class:`FaultIn`) -> faults."""
    found = []
    for i, entry in enumerate(entries):
        where = f"faults.{i}"
        if isinstance(entry, str):
            found.append(parse_fault(entry, where))
            continue
        data = entry.model_dump(exclude_none=True)  # type: ignore[attr-defined]
        data.pop("source", None)
        if "fault" in data:
            text = data.pop("fault")
            if data.get("fail") is False:
                data.pop("fail")
            if data:
                raise TopologyError(
                    "a 'fault:' text stands alone", field=f"{where}.{next(iter(data))}"
                )
            found.append(parse_fault(text, f"{where}.fault"))
            continue
        kinds = [k for k in KINDS if k in data]
        if len(kinds) != 1:
            raise TopologyError(
                f"give exactly one of: {', '.join(KINDS)}", field=where, value=kinds or None
            )
        kind = kinds[0]
        target = str(data.pop(kind))
        if "nodes" in data:
            target += "[" + ",".join(str(n) for n in data.pop("nodes")) + "]"
        data = {k: v for k, v in data.items() if not (k == "fail" and v is False)}
        found.append(make_fault(kind, target, data, f"{where}.{kind}", target))
    return found


# -- applying --------------------------------------------------------------------------------------


def apply_faults(topology: Topology, faults: Sequence[Fault]) -> Topology:
    """A copy of ``topology`` with ``faults`` applied (failures first, then degradations)."""
    if not faults:
        return topology
    topo = topology
    for fault in faults:  # validate every name against the healthy system first
        _resolve(topology, fault)
    failed: list[Fault] = []
    for fault in (f for f in faults if f.fail):
        topo = _after(failed, _fail, topo, fault)
        failed.append(fault)
        try:
            check_connected(topo)
        except TopologyError:
            lost = unreachable_gpus(topo)
            shown = ", ".join(lost[:8]) + (" ..." if len(lost) > 8 else "")
            raise fault.error(
                f"this fault partitions the system: {len(lost)} GPU(s) unreachable: {shown}"
            ) from None
    bw = {i: [1.0, 1.0] for i in range(len(topo.links))}
    lat = {i: [0.0, 0.0] for i in range(len(topo.links))}
    gpu = topo.gpu
    slow: dict[str, float] = {}
    for fault in (f for f in faults if not f.fail and f.kind != "background"):
        if fault.kind == "gpu":
            slow[fault.target] = slow.get(fault.target, 1.0) * (fault.slow or 1.0)
            continue
        for i, direction in _after(failed, _resolve, topo, fault):
            bw[i][direction] *= fault.bw if fault.bw is not None else 1.0
            lat[i][direction] += fault.lat_s
    links = list(topo.links)
    for i, lk in enumerate(links):
        links[i] = dataclasses.replace(
            lk,
            bandwidth_factor=(lk.bandwidth_factor[0] * bw[i][0], lk.bandwidth_factor[1] * bw[i][1]),
            extra_latency_s=(lk.extra_latency_s[0] + lat[i][0], lk.extra_latency_s[1] + lat[i][1]),
        )
    topo = dataclasses.replace(topo, links=tuple(links))
    background = [f for f in faults if f.kind == "background"]
    if background:
        topo = _background(topo, background, failed)
    if slow:
        worst = max(slow.values())
        # Topology.gpu becomes the slowest GPU (what a synchronous step waits for); each GPU's
        # ``speed`` is relative to it, so healthy GPUs keep their real rates.
        gpu = dataclasses.replace(
            gpu,
            peak_flops={k: v / worst for k, v in gpu.peak_flops.items()},
            matmul_flops={k: v / worst for k, v in gpu.matmul_flops.items()},
            memory_bandwidth_bytes_per_s=gpu.memory_bandwidth_bytes_per_s / worst,
            slowdown=gpu.slowdown * worst,
        )
        devices = tuple(
            dataclasses.replace(d, speed=d.speed * worst / slow.get(d.name, 1.0))
            if d.kind == "gpu"
            else d
            for d in topo.devices
        )
        topo = dataclasses.replace(topo, gpu=gpu, devices=devices)
    return dataclasses.replace(topo, faults=topo.faults + tuple(f.text for f in faults))


def _names(topo: Topology) -> dict[str, Device]:
    return {d.name: d for d in topo.devices}


def _unknown(fault: Fault, name: str, candidates: Iterable[str], what: str) -> TopologyError:
    hint = difflib.get_close_matches(name, list(candidates), n=1)
    extra = f"; did you mean {hint[0]!r}?" if hint else ""
    return fault.error(f"no {what} named {name!r} in the topology{extra}", fault.text)


def _device(topo: Topology, fault: Fault, kinds: Sequence[str]) -> Device:
    names = _names(topo)
    dev = names.get(fault.target)
    pool = [n for n, d in names.items() if d.kind in kinds]
    if dev is None:
        raise _unknown(fault, fault.target, pool, "/".join(kinds))
    if dev.kind not in kinds:
        raise fault.error(f"{fault.target} is a {dev.kind}, not a {'/'.join(kinds)}", fault.text)
    return dev


def _split_link(topo: Topology, fault: Fault) -> tuple[str, str, bool]:
    """``a-b`` or ``a>b`` (device names may hold ``-``: every split is tried)."""
    names = _names(topo)
    text = fault.target
    for sep in (">", "-"):
        for pos in (i for i, c in enumerate(text) if c == sep):
            a, b = text[:pos], text[pos + 1 :]
            if a in names and b in names:
                return a, b, sep == ">"
    a, sep, b = text.partition(">") if ">" in text else text.partition("-")
    if not sep:
        raise fault.error("a link is A-B (both directions) or A>B (one direction)", fault.text)
    bad = a if a not in names else b
    raise _unknown(fault, bad, names, "device")


def _after(failed: list[Fault], apply: Callable[[Topology, Fault], T], topo: Topology,
           fault: Fault) -> T:  # fmt: skip
    """``apply(topo, fault)`` on the system the ``failed`` faults left. Every name resolved on the
    healthy system, so one that no longer does was removed by them: say so (the lookup's own
    "no switch named spine0; did you mean spine30?" misleads)."""
    try:
        return apply(topo, fault)
    except TopologyError:
        if not failed:
            raise
        gone = ", ".join(f.text for f in failed)
        raise fault.error(f"what it names is gone: an earlier fault ({gone}) removed it") from None


def _resolve(topo: Topology, fault: Fault) -> list[tuple[int, int]]:
    """The (link index, direction) pairs a fault touches; checks every name."""
    if fault.kind == "gpu":
        _device(topo, fault, ("gpu",))
        return []
    if fault.kind == "switch":
        _device(topo, fault, _SWITCH_KINDS)
        return []
    if fault.kind == "nic":
        dev = _device(topo, fault, ("nic",))
        return [
            (i, d) for i, lk in enumerate(topo.links) if dev.name in (lk.a, lk.b) for d in (0, 1)
        ]
    if fault.kind == "background" and fault.target in PATTERNS:
        present = {d.node for d in topo.devices if d.kind == "gpu"}
        missing = [n for n in fault.nodes if n not in present]
        if missing:
            raise fault.error(f"no node {missing[0]} (nodes are 0..{topo.nodes - 1})", fault.text)
        return []
    a, b, one_way = _split_link(topo, fault)
    for i, lk in enumerate(topo.links):
        if (lk.a, lk.b) == (a, b):
            return [(i, 0)] if one_way else [(i, 0), (i, 1)]
        if (lk.a, lk.b) == (b, a):
            return [(i, 1)] if one_way else [(i, 0), (i, 1)]
    near = sorted(f"{lk.a}-{lk.b}" for lk in topo.links if a in (lk.a, lk.b))
    return_hint = f"; links of {a}: {', '.join(near[:6])}" if near else ""
    raise fault.error(f"no link between {a} and {b}{return_hint}", fault.text)


def _fail(topo: Topology, fault: Fault) -> Topology:
    if fault.kind == "link":
        gone = {i for i, _ in _resolve(topo, fault)}
        links = tuple(lk for i, lk in enumerate(topo.links) if i not in gone)
        return _keep_shared(dataclasses.replace(topo, links=links))
    name = fault.target
    _resolve(topo, fault)
    return _keep_shared(
        dataclasses.replace(
            topo,
            devices=tuple(d for d in topo.devices if d.name != name),
            links=tuple(lk for lk in topo.links if name not in (lk.a, lk.b)),
        )
    )


def _keep_shared(topo: Topology) -> Topology:
    """Shared capacities over the links that remain (one with no member left is gone)."""
    present = {frozenset((lk.a, lk.b)) for lk in topo.links}
    shared = []
    for sh in topo.shared:
        dirs = tuple(d for d in sh.directions if frozenset(d) in present)
        if dirs:
            shared.append(dataclasses.replace(sh, directions=dirs))
    return dataclasses.replace(topo, shared=tuple(shared))


def _background(topo: Topology, faults: Sequence[Fault], failed: list[Fault]) -> Topology:
    """Subtract other jobs' load from link capacities (never below :data:`BACKGROUND_FLOOR`)."""
    net = Network(topo)
    load = np.zeros(len(net.capacity_bytes_per_s))  # coupling ids (past the cables) unused
    for fault in faults:
        rate = fault.rate_bytes_per_s or 0.0
        if fault.target not in PATTERNS:
            for i, direction in _after(failed, _resolve, topo, fault):
                load[2 * i + direction] += rate
            continue
        gpus = [g.name for g in topo.gpus if g.node in fault.nodes]
        n = len(gpus)
        if fault.target == "ring":
            pairs = [(gpus[k], gpus[(k + 1) % n], rate) for k in range(n)]
        else:
            pairs = [(s, d, rate / (n - 1)) for s in gpus for d in gpus if s != d]
        for src, dst, r in pairs:
            for link in net.route(src, dst).links:
                load[link] += r
    links = list(topo.links)
    for i, lk in enumerate(links):
        factors = list(lk.bandwidth_factor)
        for d in (0, 1):
            if load[2 * i + d] > 0:
                cap = lk.bandwidth_bytes_per_s * factors[d]
                factors[d] *= max(BACKGROUND_FLOOR, 1.0 - load[2 * i + d] / cap)
        shared = lk.duplex_bandwidth_bytes_per_s
        if shared is not None:  # what both directions carry together loses both directions' load
            used = load[2 * i] + load[2 * i + 1]
            shared = max(BACKGROUND_FLOOR * shared, shared - used)
        links[i] = dataclasses.replace(
            lk, bandwidth_factor=(factors[0], factors[1]), duplex_bandwidth_bytes_per_s=shared
        )
    # A capacity several directions share loses the load of all of them.
    index = {(lk.a, lk.b): 2 * i for i, lk in enumerate(topo.links)}
    index.update({(lk.b, lk.a): 2 * i + 1 for i, lk in enumerate(topo.links)})
    groups = []
    for sh in topo.shared:
        used = sum(load[index[d]] for d in sh.directions if d in index)
        bw = max(BACKGROUND_FLOOR * sh.bandwidth_bytes_per_s, sh.bandwidth_bytes_per_s - used)
        groups.append(dataclasses.replace(sh, bandwidth_bytes_per_s=bw))
    return dataclasses.replace(topo, links=tuple(links), shared=tuple(groups))


def parse_cli_faults(texts: Iterable[str]) -> list[Fault]:
    """``--fault`` options -> faults (each error names ``--fault`` and the text)."""
    return [parse_fault(t) for t in texts]


__all__ = [
    "BACKGROUND_FLOOR",
    "Fault",
    "apply_faults",
    "faults_from_file",
    "parse_cli_faults",
    "parse_fault",
]
