"""The YAML topology format as pydantic models: what a file may say, with units parsed on entry.

Two shapes share one top level: a *template* (``node`` + ``fabric`` + ``nodes``) or an *explicit*
graph (``devices`` + ``links``). Unknown keys are rejected (a typo must not silently become a
default). ``docs/topology-format.md`` documents every field with an example.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from collsim import units
from collsim.errors import UnitError
from collsim.topology.spec import DEVICE_KINDS, LINK_KINDS, NIC_PATHS_THROUGH_CPU
from collsim.transports import DEFAULT_TRANSPORT, TRANSPORTS


def _unit(parse):  # type: ignore[no-untyped-def]
    def convert(value: object) -> object:
        try:
            return parse(value)  # type: ignore[arg-type]
        except UnitError as exc:
            raise ValueError(exc.message) from None

    return BeforeValidator(convert)


def _link_kind(value: str) -> str:
    if value not in LINK_KINDS:
        raise ValueError(f"unknown link kind {value!r}; known kinds: {', '.join(LINK_KINDS)}")
    return value


def _transport(value: str) -> str:
    if value not in TRANSPORTS:
        raise ValueError(f"unknown transport {value!r}; known transports: {', '.join(TRANSPORTS)}")
    return value


def _device_kind(value: str) -> str:
    if value not in DEVICE_KINDS:
        raise ValueError(f"unknown device kind {value!r}; known kinds: {', '.join(DEVICE_KINDS)}")
    return value


def _within(low: float, high: float, what: str, show: Any = None) -> AfterValidator:
    """A physical range: outside it a figure is a slip of the unit, whose times would overflow,
    print 300 digits or make a link 1000x faster than any built. ``show`` renders the value as
    read (its unit), so the error says what the file's figure came to."""

    def check(value: float) -> float:
        if not low <= value <= high:
            read = f"reads as {show(value)}: " if show else ""
            raise ValueError(f"{read}must be from {what}")
        return value

    return AfterValidator(check)


Rate = Annotated[
    float, _unit(units.parse_rate), Field(gt=0),
    _within(*units.LINK_RATE_RANGE_BYTES_PER_S, "1kB/s to 10TB/s per direction (NVLink 5 carries "
            "0.9TB/s)", units.format_rate_si),
]  # fmt: skip
"""One direction of a link, in bytes per second (``400Gbps``, ``50GB/s``): 1 kB/s to 10 TB/s."""
DuplexRate = Annotated[
    float, _unit(units.parse_rate), Field(gt=0),
    _within(*units.DUPLEX_RATE_RANGE_BYTES_PER_S, "1kB/s to 20TB/s", units.format_rate_si),
]  # fmt: skip
"""Both directions of a link, or a capacity several directions share: 1 kB/s to 20 TB/s."""
MemoryRate = Annotated[
    float, _unit(units.parse_rate), Field(gt=0),
    _within(*units.MEMORY_RATE_RANGE_BYTES_PER_S, "1GB/s to 100TB/s (B200 has 7.7TB/s)",
            units.format_rate_si),
]  # fmt: skip
"""A GPU's memory bandwidth: 1 GB/s to 100 TB/s."""
Time = Annotated[
    float,
    _unit(functools.partial(units.parse_time, unit_required=True)),
    Field(ge=0),
    _within(*units.TIME_RANGE_S, "0 to 10s"),
]
"""Seconds (``1.5us``, ``130ns``), from 0 to 10 s; a bare number other than 0 is an error."""
Size = Annotated[int, _unit(functools.partial(units.parse_size, unit_required=True)), Field(gt=0)]
"""Bytes, strictly positive (``80GB``, ``80GiB``); a bare number is an error."""
LinkKind = Annotated[str, AfterValidator(_link_kind)]
DeviceKind = Annotated[str, AfterValidator(_device_kind)]
Source = Annotated[str | None, Field(default=None, min_length=3)]
Routing = Literal["ecmp", "dmodk", "spray", "adaptive"]
"""A scale-out fabric's routing (:data:`collsim.topology.spec.ROUTINGS`)."""


def _duplex_within(value: float | None, info: ValidationInfo) -> float | None:
    """``duplex_bandwidth`` runs from half duplex (the link's ``bandwidth``: both directions
    share one direction's rate) to full duplex (twice it); outside that range it would also cap
    one-way traffic, or never bind."""
    bandwidth = info.data.get("bandwidth")
    if (
        value is not None
        and bandwidth
        and not bandwidth * (1 - 1e-9) <= value <= 2 * bandwidth * (1 + 1e-9)
    ):
        raise ValueError(
            f"must lie between the link's bandwidth ({bandwidth / 1e9:g} GB/s, half duplex) and "
            f"twice it ({2 * bandwidth / 1e9:g} GB/s, full duplex)"
        )
    return value


def _takes_bool(annotation: object) -> bool:
    """Whether a field's type takes true/false itself: ``bool`` (or ``Any``) anywhere in it, or
    a nested model (which checks its own fields)."""
    if annotation is bool or annotation is Any:
        return True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(_takes_bool(a) for a in get_args(annotation))


def _has_bool(value: object) -> bool:
    """``value`` is true/false, or a list (at any depth) or a mapping's values hold one (a mapping
    inside a list is a nested model's, which checks its own fields)."""
    if isinstance(value, bool):
        return True
    if isinstance(value, dict):
        return any(isinstance(v, bool) for v in value.values())
    return isinstance(value, list | tuple) and any(
        isinstance(v, bool | list | tuple) and _has_bool(v) for v in value
    )


class Strict(BaseModel):
    """Base: unknown keys are errors, values are not coerced from the wrong type (pydantic's lax
    mode would read ``gpus: true`` as 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: object, info: ValidationInfo) -> object:
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and _has_bool(value) and not _takes_bool(field.annotation):
            raise ValueError("expected a number or a name, not true/false")
        return value


TFlops = Annotated[float, Field(gt=0, le=1e5, allow_inf_nan=False)]
"""A GPU's dense TFLOP/s for one data type: positive, at most 100 PFLOP/s (the fastest
datasheet figure today, B200 FP4 with sparsity, is 18 PFLOP/s)."""


class GpuIn(Strict):
    model: str
    peak_tflops: dict[str, TFlops]
    memory: Size
    memory_bandwidth: MemoryRate
    matmul_tflops: dict[str, TFlops] | None = None
    """Measured maximum achievable matmul TFLOP/s by dtype (optional; see
    :attr:`collsim.topology.spec.GpuModel.matmul_flops`)."""
    sms: Annotated[int, Field(ge=1, le=4096)] | None = None
    """Streaming multiprocessors (optional; see :attr:`collsim.topology.spec.GpuModel.sms`)."""
    source: Source = None

    @field_validator("memory")
    @classmethod
    def _memory_plausible(cls, value: int) -> int:
        """100 MB to 10 TB: a bare ``80`` is 80 bytes, a unit slip rather than a GPU."""
        if not 100e6 <= value <= 10e12:
            raise ValueError(
                f"{value:,} bytes is not a GPU's memory (collsim takes 100 MB to 10 TB): give a "
                "unit, e.g. 80GB"
            )
        return value

    @field_validator("matmul_tflops")
    @classmethod
    def _below_peak(cls, value: dict[str, float] | None, info: ValidationInfo) -> object:
        """A measured rate names a dtype the GPU has a peak for and does not exceed it."""
        peak = info.data.get("peak_tflops") or {}
        for key, rate in (value or {}).items():
            if key not in peak:
                raise ValueError(
                    f"{key!r} has no peak_tflops entry (has: {', '.join(peak) or 'none'})"
                )
            if rate > peak[key] * (1 + 1e-9):
                raise ValueError(
                    f"{key}: {rate:g} TFLOP/s exceeds the peak ({peak[key]:g}); a measured "
                    "matmul rate cannot"
                )
        return value


class LinkClassIn(Strict):
    """A class of identical links: technology, per-direction bandwidth, latency."""

    kind: LinkKind
    bandwidth: Rate
    latency: Time = 0.0
    duplex_bandwidth: DuplexRate | None = None
    source: Source = None

    _duplex = field_validator("duplex_bandwidth")(_duplex_within)


class IntraIn(Strict):
    kind: Literal["nvswitch", "mesh", "hybrid_cube_mesh", "pcie", "none"]
    link: LinkClassIn | None = None
    links_per_pair: Annotated[int, Field(ge=1)] = 1
    pairs: list[tuple[int, int, int]] | None = None
    switch_latency: Time = 0.0
    in_network_reduction: bool = False
    in_network_efficiency: Annotated[float, Field(gt=0, le=1)] = 1.0
    p2p: bool = True
    pcie_switches: Annotated[int, Field(ge=1)] = 1
    sockets: Annotated[int, Field(ge=1)] = 1
    cpu_link: LinkClassIn | None = None
    host_latency: Time = 0.0
    host_p2p_bandwidth: DuplexRate | None = None
    """What each CPU's root complex forwards peer-to-peer between its root ports, both directions
    together (GPUDirect RDMA to a NIC on another root port, GPU to GPU across root ports): a
    shared capacity over the directions entering a CPU from its PCIe links. None: unlimited."""
    source: Source = None


class NicsIn(Strict):
    """A node's scale-out NICs: ``count`` of them, or ``per_gpu`` (2: two per GPU, 0.5: one per
    two GPUs), which ``--gpus-per-node`` scales with the GPUs (a GB300 tray's NICs come with
    its GPUs; a DGX's ``count: 8`` stays 8 whatever GPUs a job uses)."""

    count: Annotated[int, Field(ge=1)] | None = None
    per_gpu: Annotated[float, Field(gt=0, le=64)] | None = None
    link: LinkClassIn
    attach: Literal["pcie", "integrated"] = "pcie"
    transport: Annotated[str, AfterValidator(_transport)] | None = None
    """The net transport NCCL drives these NICs with (:mod:`collsim.transports`); default: the
    usual one for the link kind (verbs on IB/RoCE, aws-ofi-nccl on EFA/Slingshot, sockets)."""
    gpu_path: Literal["pix", "pxb", "phb", "node", "sys"] = "pix"
    """The PCIe path from a GPU to its nearest NIC, as ``nvidia-smi topo -m`` labels it: ``pix``
    (one PCIe switch, how collsim builds the node), ``pxb`` (several switches), ``phb`` / ``node``
    (through the CPU's host bridge), ``sys`` (across sockets). NCCL runs LL128 across nodes only
    where it is ``pix`` or ``pxb`` (:func:`collsim.model.nccl.ll128_by_default`). With
    ``intra.host_p2p_bandwidth`` given, ``phb``, ``node`` and ``sys`` build the NICs on a CPU's
    root ports, so GPU-NIC traffic shares that forwarding capacity (the socket link is not on
    that path); without it the NICs stay beside their GPUs."""
    source: Source = None

    @model_validator(mode="after")
    def _one_count(self) -> NicsIn:
        if (self.count is None) == (self.per_gpu is None):
            raise ValueError("give the NICs as either count or per_gpu (one of the two)")
        if self.gpu_path in NIC_PATHS_THROUGH_CPU and self.attach == "integrated":
            raise ValueError(
                f"gpu_path {self.gpu_path!r} puts the NICs on the CPU's PCIe root ports; an "
                "integrated NIC is on the accelerator (attach: pcie, or leave gpu_path out)"
            )
        if self.transport is not None and self.link.kind not in DEFAULT_TRANSPORT:
            raise ValueError(
                f"transport {self.transport!r} needs a network link kind "
                f"({', '.join(DEFAULT_TRANSPORT)}), not {self.link.kind!r}"
            )
        return self

    def count_for(self, gpus: int) -> int | None:
        """NICs in a node of ``gpus`` GPUs; ``None`` where ``per_gpu`` gives no whole number."""
        if self.count is not None:
            return self.count
        total = (self.per_gpu or 0.0) * gpus
        whole = round(total)
        return whole if whole >= 1 and abs(total - whole) < 1e-9 else None


class NodeIn(Strict):
    gpus: Annotated[int, Field(ge=1)]
    intra: IntraIn
    nics: NicsIn | None = None
    pcie: LinkClassIn | None = None
    source: Source = None


class FabricIn(Strict):
    kind: Literal[
        "none", "single_switch", "fat_tree", "rail_optimized", "dragonfly", "torus", "ring"
    ] = "none"
    link: LinkClassIn | None = None
    switch_latency: Time = 0.0
    radix: Annotated[int, Field(ge=2)] = 64
    tiers: Literal[2, 3] = 2
    oversubscription: Annotated[float, Field(ge=1)] = 1.0
    in_network_reduction: bool = False
    in_network_efficiency: Annotated[float, Field(gt=0, le=1)] = 1.0
    dims: list[Annotated[int, Field(ge=1)]] | None = None
    attach: Literal["nic", "gpu"] = "nic"
    routers_per_group: Annotated[int, Field(ge=1, le=256)] = 8
    nics_per_router: Annotated[int, Field(ge=1, le=256)] = 16
    """Dragonfly sizes: Slingshot has 32 routers per group and 16 NICs per router, Aries 96
    routers per group; 256 bounds both (a group is one router's all-to-all)."""
    global_links_per_router: Annotated[int, Field(ge=1)] = 1
    routing: Routing | None = None
    """How the switches spread traffic (``docs/topology-format.md``); none given: by link kind."""
    source: Source = None

    @field_validator("oversubscription")
    @classmethod
    def _leaf_can_split(cls, value: float, info: ValidationInfo) -> float:
        """A leaf of ``radix`` ports keeps at least one up: at most ``radix - 1`` down per up."""
        radix = info.data.get("radix")
        if radix is not None and value > radix - 1:
            raise ValueError(
                f"a leaf switch of radix {radix} has at most {radix - 1} ports down per port up "
                f"(oversubscription up to {radix - 1})"
            )
        return value


class FaultIn(Strict):
    """A what-if fault (``docs/faults.md``): exactly one of ``link``/``nic``/``switch``/``gpu``/
    ``background`` names the target; a plain string is the ``--fault`` text
    (``switch:spine1:fail``). Rates and times are parsed by ``collsim.topology.faults``."""

    fault: str | None = None
    link: str | None = None
    nic: str | None = None
    switch: str | None = None
    gpu: str | None = None
    background: str | None = None
    nodes: list[Annotated[int, Field(ge=0)]] | None = None
    bw: float | None = None
    lat: str | float | None = None
    fail: bool = False
    slow: float | None = None
    rate: str | float | None = None
    source: Source = None

    @model_validator(mode="before")
    @classmethod
    def _text(cls, data: object) -> object:
        return {"fault": data} if isinstance(data, str) else data


NVLINK_DOMAIN_MAX_GPUS = 576
"""The most GPUs one NVLink domain joins: NVLink 5's NVLink Switch System reaches 576 GPUs
(NVIDIA Blackwell architecture technical brief; the announced NVL576 rack)."""


class NvlinkDomainIn(Strict):
    """A multi-node NVLink domain (GB200/GB300 NVL72): ``nodes`` consecutive nodes (trays) whose
    GPUs all meet on one level of NVLink switch chips, ``switch_trays`` x ``switches_per_tray``
    of them with ``ports_per_switch`` NVLink ports each; every GPU brings ``links_per_gpu``
    links of ``link``, spread evenly over the chips. The nodes keep their NICs on the fabric."""

    nodes: Annotated[int, Field(ge=1, le=NVLINK_DOMAIN_MAX_GPUS)]
    switch_trays: Annotated[int, Field(ge=1)]
    switches_per_tray: Annotated[int, Field(ge=1)] = 2
    ports_per_switch: Annotated[int, Field(ge=1)] = 72
    links_per_gpu: Annotated[int, Field(ge=1)] = 18
    link: LinkClassIn
    switch_latency: Time = 0.0
    in_network_reduction: bool = False
    in_network_efficiency: Annotated[float, Field(gt=0, le=1)] = 1.0
    source: Source = None

    @field_validator("link")
    @classmethod
    def _nvlink(cls, value: LinkClassIn) -> LinkClassIn:
        if value.kind != "nvlink":
            raise ValueError(f"an NVLink domain's links are nvlink, not {value.kind!r}")
        return value

    @property
    def switches(self) -> int:
        """NVLink switch chips in the domain."""
        return self.switch_trays * self.switches_per_tray


class TemplateIn(Strict):
    name: str
    description: str = ""
    source: Source = None
    nodes: Annotated[int, Field(ge=1)] = 1
    gpu: GpuIn
    node: NodeIn
    nvlink_domain: NvlinkDomainIn | None = None
    fabric: FabricIn = FabricIn()
    faults: tuple[FaultIn, ...] = ()


class DeviceIn(Strict):
    name: str
    kind: DeviceKind
    node: Annotated[int, Field(ge=0)] | None = None
    index: Annotated[int, Field(ge=0)] | None = None
    latency: Time = 0.0
    in_network_reduction: bool = False
    in_network_efficiency: Annotated[float, Field(gt=0, le=1)] = 1.0
    tier: Annotated[int, Field(ge=0)] = 0
    forwards: bool | None = None


class LinkIn(Strict):
    a: str
    b: str
    kind: LinkKind
    bandwidth: Rate
    latency: Time = 0.0
    duplex_bandwidth: DuplexRate | None = None
    source: Source = None

    _duplex = field_validator("duplex_bandwidth")(_duplex_within)


class SharedIn(Strict):
    """A capacity several link directions share (:class:`~collsim.topology.spec.SharedCapacity`)."""

    name: str
    kind: LinkKind
    bandwidth: DuplexRate
    directions: Annotated[list[tuple[str, str]], Field(min_length=1)]
    source: Source = None


class ExplicitIn(Strict):
    name: str
    description: str = ""
    source: Source = None
    gpu: GpuIn
    devices: list[DeviceIn]
    links: list[LinkIn]
    shared: list[SharedIn] = []
    routing: Routing | None = None
    """How the switches (devices of kind ``switch``) spread traffic; none given: by link kind."""
    gpu_p2p: bool = True
    """False: the GPUs cannot reach each other's memory, so NCCL stages their traffic through
    host memory (its SHM transport); see ``node.intra.p2p`` of a template."""
    faults: tuple[FaultIn, ...] = ()
