"""Calibration profiles: the fitted physical parameters of one system, as a YAML data file.

A profile says which topology it was fitted for (catalog name, nodes, GPUs per node), the fitted
parameters -- per link class (``nvlink``, ``pci``, ``net``: NCCL's ``hwLat`` rows) a bandwidth
efficiency (achieved / datasheet rate), a latency scale (multiplying the route latency and the
protocols' per-hop latency on that class) and, where fitted, a duplex efficiency (what both
directions carry together, relative to twice the rate), a launch floor (the host's cost to issue
one call to one GPU -- a thread driving N GPUs issues N -- under which back-to-back calls cannot
go) and the host's cost of each point-to-point operation a call posts (a priori, recorded so
the file says what was assumed), a per-call base latency, and a small table of
size-dependent bandwidth efficiency keyed by message size (interpolated in log2 size, as SimGrid's
piecewise-linear network factors; Velho et al., "On the validity of flow-level TCP network
models", ACM TOMACS 2013), whether tree all-reduces take NCCL's medium-size correction
(``tree_correction``; fits record true, files without the key were fitted without it) -- the
fit's provenance and its in-sample error. No dates: the same
fit writes the same file.

:meth:`Profile.params` turns it into the analytic model's
:class:`~collsim.model.params.ModelParams`;
:meth:`Profile.apply_to_topology` scales the topology's links instead, so the discrete-event
engine sees the same calibrated fabric. Malformed files fail with one line naming the file, the
field and the value (the topology loader's pydantic machinery).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, ValidationError

from collsim.errors import CalibrationError
from collsim.io import atomic_write_text, yaml_load
from collsim.model.params import DEFAULT_PARAMS, HOST_P2P_OP_S, ModelParams, ProtocolParams
from collsim.tables import plural
from collsim.topology.fabric import _HW_CLASS
from collsim.topology.input_errors import one_line
from collsim.topology.spec import Topology, with_duplex

CLASSES = ("nvlink", "pci", "net")
FORMAT_VERSION = 2
"""2: ``launch_floor_us`` is one launch's host cost (a thread driving N GPUs pays it N times);
format 1 stored the floor of the measured calls whatever the GPUs per thread, so it is refused
(refit: the logs say how many GPUs each thread drove)."""


def _number(value: object) -> object:
    """A number is a number: pydantic's lax mode would read ``true`` as 1 and ``'5'`` as 5."""
    if isinstance(value, bool | str):
        raise ValueError("expected a number")
    return value


Num = Annotated[float, BeforeValidator(_number)]
Int = Annotated[int, BeforeValidator(_number)]


class _Strict(BaseModel):
    """Unknown keys are errors (numbers are :data:`Num` / :data:`Int`, wherever they sit)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class TopologyRef(_Strict):
    name: str
    nodes: Int = Field(ge=1)
    gpus_per_node: Int = Field(ge=1)
    links: dict[str, str] | None = None
    """Fingerprints of the GPU model and of each kind of link's datasheet figures
    (:func:`link_fingerprint`): a kind's is the same at every scale of one system (a scale
    without that kind, e.g. one GPU per node, just lacks it), different for another file that
    borrows the name."""

    @classmethod
    def of(cls, topology: Topology) -> TopologyRef:
        """The reference a profile fitted (or made) on ``topology`` records."""
        return cls(
            name=topology.name,
            nodes=topology.nodes,
            gpus_per_node=topology.gpus_per_node,
            links=link_fingerprint(topology),
        )


def link_fingerprint(topology: Topology) -> dict[str, str]:
    """8 hex digits for the GPU model (``gpu``) and for each link kind over its distinct (rate,
    latency, duplex rate): node counts do not change them, edited figures do."""
    import hashlib

    def digest(value: object) -> str:
        return hashlib.sha256(repr(value).encode()).hexdigest()[:8]

    figures: dict[str, set[tuple[float, float, float]]] = {}
    for lk in topology.links:
        figures.setdefault(lk.kind, set()).add(
            (lk.bandwidth_bytes_per_s, lk.latency_s, lk.duplex_bandwidth_bytes_per_s or 0.0)
        )
    out = {"gpu": digest(topology.gpu.model)}
    out.update({kind: digest(sorted(f)) for kind, f in sorted(figures.items())})
    return out


class LinkClass(_Strict):
    bandwidth_efficiency: Num = Field(ge=0.001, le=10)
    latency_scale: Num = Field(ge=0, le=1000)
    duplex_efficiency: Num | None = Field(default=None, ge=0.5, le=1)
    """Both directions together carry 2 x this x the rate (absent: full duplex)."""


class Provenance(_Strict):
    logs: list[str]
    collectives: list[str]
    ranks: list[Int]
    method: str
    fitted: list[str]
    nccl_releases: dict[str, str] = {}
    """Per log, the NCCL release whose choices the fit predicted it with (the log's own, or the
    one given for it: ``calibrate fit --nccl-version``, the dataset index); a log not listed:
    none known, the newest behaviour."""
    at_bounds: list[str] = []
    """Parameters the fit left at a bound (``name = value (lower|upper bound)``): the data
    pushed them further than a physical value goes, so the model misses something there."""


class Identified(_Strict):
    """How far the logs a profile was fitted on pin one parameter down (``calibrate fit`` prints
    it): ``status`` ``constrained`` (the data outweigh the prior), ``weak`` (the prior outweighs
    the data; the value is pulled toward it) or ``prior`` (no row moves with it: kept exactly at
    ``prior``, the uncalibrated value); ``sensitivity``: the largest relative change of a
    predicted time per relative change of the parameter (1: proportional); ``logs`` and
    ``sizes_bytes`` (smallest, largest): the logs and the rows it moves by 0.1% per 10%."""

    status: Literal["constrained", "weak", "prior"]
    value: Num
    prior: Num
    sensitivity: Num = Field(ge=0)
    logs: list[str] = []
    sizes_bytes: list[Int] = []


class Prior(_Strict):
    """What a parameter is without calibration (the uncalibrated model: datasheet links at
    NCCL's achievable fraction, NCCL's base latency): where the fit could not see a link class, and
    at another scale for the scale-bound parameters (base latency, size efficiency), the profile
    gives these; ``width_ln``: the prior's width (one standard deviation, natural log)."""

    bandwidth_efficiency: dict[Literal["nvlink", "pci", "net"], Num]
    base_latency_us: Num = Field(ge=0, le=1e6)
    width_ln: Num = Field(gt=0)


class FitError(_Strict):
    mape: Num = Field(ge=0)
    median_mape: Num = Field(ge=0)
    per_log: dict[str, Num]


class ProfileDoc(_Strict):
    """The YAML document (``extra="forbid"``: unknown keys are errors)."""

    collsim_profile: Literal[2]
    topology: TopologyRef
    link_classes: dict[Literal["nvlink", "pci", "net"], LinkClass]
    base_latency_us: Num = Field(ge=0, le=1e6)
    launch_floor_us: Num = Field(default=0.0, ge=0, le=1e6)
    p2p_op_us: Num = Field(default=round(HOST_P2P_OP_S * 1e6, 4), ge=0, le=1e3)
    """Host cost per point-to-point operation a call enqueues (a priori, not fitted)."""
    memory_efficiency: Num = Field(default=1.0, ge=0.001, le=4)
    size_efficiency: list[tuple[Num, Num]] = []
    tree_correction: StrictBool = False
    """Whether tree all-reduces take NCCL's medium-size correction (fits since it existed do;
    files without the key were fitted without it)."""
    provenance: Provenance
    fit_error: FitError | None = None
    prior: Prior | None = None
    identifiability: dict[str, Identified] = {}
    """Per fitted parameter, how far the logs constrain it (:class:`Identified`)."""


@dataclasses.dataclass(frozen=True)
class Profile:
    """A loaded profile (see the module docstring)."""

    doc: ProfileDoc
    file: str | None = None

    @property
    def topology_name(self) -> str:
        return self.doc.topology.name

    def other_scale(self, topology: Topology) -> bool:
        """Whether ``topology`` is another scale (nodes x GPUs per node) than the fit's."""
        ref = self.doc.topology
        return (topology.nodes, topology.gpus_per_node) != (ref.nodes, ref.gpus_per_node)

    def carries(
        self, name: str, topology: Topology | None, classes: Collection[str] | None
    ) -> bool:
        """Whether parameter ``name`` (an ``identifiability`` key) applies on ``topology``, whose
        routes cross link ``classes`` (see :meth:`params`)."""
        if self.doc.prior is None or topology is None or not self.other_scale(topology):
            return True
        seen = self.doc.identifiability.get(name)
        fitted = set(self.doc.link_classes)
        return (
            classes is not None
            and fitted < set(classes)
            and (seen is None or seen.status == "constrained")
            and (not name.endswith(".latency_scale") or self.saw_several_step_counts())
        )

    def saw_several_step_counts(self) -> bool:
        """Whether the fit's logs ran at more than one rank count. A link class's per-step
        latency and the per-call base latency trade off on logs of one rank count (each
        algorithm's step count is fixed there, so ``steps x latency + base`` moves as one):
        only logs at several counts tell them apart, and only then does a latency scale
        describe the link rather than that scale's calls (a one-node Snellius all_gather fit
        put 2.5x on NVLink's step latency and made two nodes worse)."""
        return len(set(self.doc.provenance.ranks)) > 1

    def params(
        self,
        base: ModelParams = DEFAULT_PARAMS,
        topology: Topology | None = None,
        classes: Collection[str] | None = None,
    ) -> ModelParams:
        """The analytic model's parameters under this profile; on ``topology`` (whose GPUs'
        routes cross link ``classes``), where given.

        A link class the fit did not see takes the profile's prior (else ``base``'s). On another
        scale than the fit's (:meth:`other_scale`) the profile applies only what it knows holds
        there, the rest is the prior's (the uncalibrated model), so that a profile is never a
        worse guess than none: the per-call base latency and the size-dependent efficiency
        absorb whatever one scale's calls cost beyond its links (a network proxy's start, a
        node's NVLink warm-up) and describe that scale only; a link class's efficiency and
        latency scale, and the memory's efficiency, carry over where the logs constrained them
        (``identifiability`` status ``constrained``) and the other scale crosses every class the
        fit's logs crossed and more -- a fit that saw NVLink only mixed with the network (two
        nodes) has split what it measured between them in a way one node cannot check, and one
        at the same classes but another scale (Polaris at 2 and 8 nodes) has absorbed that
        scale's misfits of structure (routes, hops, rings) into them, while one that saw NVLink
        alone (one node) measured it apart from the network another scale adds. The host's
        launch floor carries over (the same host at every scale). A profile without a prior
        (older files) applies as fitted."""
        prior = self.doc.prior
        eff = list(base.bandwidth_efficiency)
        if prior is not None:
            for name, value in prior.bandwidth_efficiency.items():
                eff[CLASSES.index(name)] = value
        lat = [1.0, 1.0, 1.0]
        duplex = list(base.duplex_efficiency)
        for name, cls in self.doc.link_classes.items():
            k = CLASSES.index(name)
            if self.carries(f"{name}.bandwidth_efficiency", topology, classes):
                eff[k] = cls.bandwidth_efficiency
                duplex[k] = cls.duplex_efficiency or duplex[k]
            if self.carries(f"{name}.latency_scale", topology, classes):
                lat[k] = cls.latency_scale
        memory = self.doc.memory_efficiency
        if not self.carries("memory_efficiency", topology, classes):
            memory = 1.0
        protocols = tuple(
            ProtocolParams(
                p.name,
                p.bandwidth_fraction,
                tuple(h * s for h, s in zip(p.hop_latency_s, lat, strict=True)),  # type: ignore[arg-type]
            )
            for p in base.protocols
        )
        bound = prior is not None and topology is not None and self.other_scale(topology)
        base_latency_us = prior.base_latency_us if bound and prior else self.doc.base_latency_us
        sizes = [] if bound else self.doc.size_efficiency
        return dataclasses.replace(
            base,
            protocols=protocols,
            base_latency_s=base_latency_us * 1e-6,
            launch_floor_s=self.doc.launch_floor_us * 1e-6,
            p2p_op_s=self.doc.p2p_op_us * 1e-6,
            reduce_efficiency=base.reduce_efficiency * memory,
            copy_efficiency=base.copy_efficiency * memory,
            channel_efficiency=base.channel_efficiency * memory,
            route_latency_scale=tuple(lat),  # type: ignore[arg-type]
            bandwidth_efficiency=tuple(eff),  # type: ignore[arg-type]
            duplex_efficiency=tuple(duplex),  # type: ignore[arg-type]
            size_factors=tuple((float(s), float(f)) for s, f in sizes),
            tree_correction=self.doc.tree_correction,
            source=f"profile {self.file or self.topology_name}",
        )

    def check_topology(self, topology: Topology) -> list[str]:
        """Raise if ``topology`` is another system; return notes (e.g. another scale)."""
        ref = self.doc.topology
        if topology.name != ref.name:
            raise CalibrationError(
                f"profile fitted for topology {ref.name} ({plural(ref.nodes, 'node')} x "
                f"{ref.gpus_per_node} GPUs) cannot be used with topology {topology.name}",
                file=self.file,
                field="topology.name",
                value=ref.name,
            )
        notes = []
        now = link_fingerprint(topology)
        if ref.links and any(now[k] != v for k, v in ref.links.items() if k in now):
            notes.append(
                f"topology {topology.name}'s GPU or link figures differ from those the profile was "
                "fitted on (another file of that name, or an edited one): its efficiencies are "
                "relative to the old figures"
            )
        if (topology.nodes, topology.gpus_per_node) != (ref.nodes, ref.gpus_per_node):
            notes.append(
                f"profile fitted on {ref.nodes}x{ref.gpus_per_node}, applied to "
                f"{topology.nodes}x{topology.gpus_per_node} ("
                + (
                    "the launch floor carries over, and the link-class parameters the fit pinned "
                    "down where this scale crosses more link classes than the fit's; the rest is "
                    "the prior's"
                    if self.doc.prior
                    else "applied as fitted"
                )
                + ")"
            )
        return notes

    def apply_to_topology(
        self, topology: Topology, classes: Collection[str] | None = None
    ) -> Topology:
        """``topology`` with every link's bandwidth x its class's efficiency, latency x its
        latency scale and both directions' shared capacity (duplex efficiency): what the
        discrete-event engine can express of the profile.

        On another scale than the fit's, by the rule of :meth:`params` (``classes``: the link
        classes the GPUs' routes cross there): a class's efficiency or latency scale the fit
        could not pin down for that scale is left as the datasheet has it, which is the
        uncalibrated engine's reading."""
        self.check_topology(topology)
        fitted = self.doc.link_classes
        cls = {}
        for name, c in fitted.items():
            bw = self.carries(f"{name}.bandwidth_efficiency", topology, classes)
            lat = self.carries(f"{name}.latency_scale", topology, classes)
            if bw or lat:
                cls[name] = c.model_copy(
                    update={
                        "bandwidth_efficiency": c.bandwidth_efficiency if bw else 1.0,
                        "latency_scale": c.latency_scale if lat else 1.0,
                    }
                )
        duplex = self.params(topology=topology, classes=classes).duplex_by_kind()
        topology = with_duplex(topology, duplex)
        links = []
        for link in topology.links:
            name = CLASSES[_HW_CLASS.get(link.kind, 2)]
            c = cls.get(name)  # type: ignore[call-overload]
            if c is None:
                links.append(link)
                continue
            duplex = link.duplex_bandwidth_bytes_per_s
            links.append(
                dataclasses.replace(
                    link,
                    bandwidth_bytes_per_s=link.bandwidth_bytes_per_s * c.bandwidth_efficiency,
                    latency_s=link.latency_s * c.latency_scale,
                    duplex_bandwidth_bytes_per_s=(
                        None if duplex is None else duplex * c.bandwidth_efficiency
                    ),
                )
            )
        shared = []
        for sh in topology.shared:
            c = cls.get(CLASSES[_HW_CLASS.get(sh.kind, 2)])  # type: ignore[call-overload]
            scale = c.bandwidth_efficiency if c is not None else 1.0
            shared.append(
                dataclasses.replace(sh, bandwidth_bytes_per_s=sh.bandwidth_bytes_per_s * scale)
            )
        devices = []
        for dev in topology.devices:  # forwarding latency: in a node intra-node, else network
            intra = [cls.get(k) for k in ("nvlink", "pci")]  # type: ignore[call-overload]
            c = cls.get("net") if dev.node is None else next((x for x in intra if x), None)  # type: ignore[call-overload]
            scale = c.latency_scale if c is not None else 1.0
            devices.append(dataclasses.replace(dev, latency_s=dev.latency_s * scale))
        return dataclasses.replace(
            topology, links=tuple(links), devices=tuple(devices), shared=tuple(shared)
        )

    def to_dict(self) -> dict[str, Any]:
        return self.doc.model_dump(mode="json", exclude_none=True)

    def to_yaml(self) -> str:
        header = (
            f"# collsim calibration profile for {self.topology_name} "
            "(collsim calibrate fit; see collsim/model/profile.py)\n"
        )
        return header + yaml.safe_dump(self.to_dict(), sort_keys=False, width=100)

    def save(self, path: str | Path) -> None:
        """YAML, or JSON where the name ends in ``.json`` (every reader takes either)."""
        if Path(path).suffix.lower() == ".json":
            atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")
        else:
            atomic_write_text(path, self.to_yaml())


def profile_from_dict(data: Any, file: str | None = None) -> Profile:
    """Validate a parsed document (one-line errors naming file, field and value)."""
    if not isinstance(data, dict):
        raise CalibrationError(
            "a profile must be a YAML mapping", file=file, value=type(data).__name__
        )
    if data.get("collsim_profile") == 1:
        raise CalibrationError(
            "a format 1 profile (its launch floor is per call, not per GPU launch); refit it "
            "with 'collsim calibrate fit'",
            file=file,
            field="collsim_profile",
            value=1,
        )
    try:
        doc = ProfileDoc.model_validate(data)
    except ValidationError as exc:
        err = one_line(exc, ProfileDoc)
        raise CalibrationError(
            err.message, file=file, field=err.field, value=err.value, has_value=err.has_value
        ) from None
    pts = [p for p in doc.size_efficiency]
    finite = all(math.isfinite(s) and math.isfinite(f) for s, f in pts)
    sizes = [s for s, _ in pts]
    ordered = sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
    if not finite or any(s <= 0 or not 0.01 <= f <= 10 for s, f in pts) or not ordered:
        raise CalibrationError(
            "size_efficiency must be [size_bytes > 0, 0.01 <= factor <= 10] pairs sorted by size, "
            "one per size",
            file=file,
            field="size_efficiency",
            value=doc.size_efficiency,
        )
    return Profile(doc, file)


def load_profile(path: str | Path) -> Profile:
    """Read a profile file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise CalibrationError(
            f"cannot read the profile: {exc.strerror or exc}", file=str(p)
        ) from None
    try:
        data = yaml_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise CalibrationError(f"malformed YAML{where}: {problem}", file=str(p)) from None
    return profile_from_dict(data, str(p))


def datasheet_profile(topology: Topology, base_latency_us: float = 0.0) -> Profile:
    """The uncalibrated profile: datasheet rates and latencies, a given launch latency."""
    doc = ProfileDoc(
        collsim_profile=FORMAT_VERSION,
        topology=TopologyRef.of(topology),
        link_classes={},
        base_latency_us=base_latency_us,
        provenance=Provenance(logs=[], collectives=[], ranks=[], method="datasheet", fitted=[]),
    )
    return Profile(doc)
