"""The validated topology: devices and full-duplex links, with every number in base units.

Both ways of describing a system in YAML (templates and explicit graphs, see ``loader.py``) end up
as one :class:`Topology`; everything downstream (graph, routing, engine, analytic model) reads only
this. Bandwidths are bytes per second *per direction*; latencies are seconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

LINK_KINDS: tuple[str, ...] = (
    "nvlink",
    "nvlink_c2c",
    "pcie",
    "infiniband",
    "roce",
    "ethernet",
    "efa",
    "slingshot",
    "xgmi",
    "infinity_fabric",
    "ici",
    "upi",
)
"""Physical link technologies collsim knows. ``infinity_fabric`` is AMD's name for xGMI links."""

INTRA_NODE_LINK_KINDS = frozenset(
    {"nvlink", "nvlink_c2c", "pcie", "xgmi", "infinity_fabric", "upi"}
)
"""Kinds that NCCL's latency model treats as intra-node (NVLink/PCIe class) rather than network."""

ROUTINGS: tuple[str, ...] = ("ecmp", "dmodk", "spray", "adaptive")
"""How a scale-out fabric's switches spread traffic (``docs/topology-format.md``, "Routing"):
``ecmp`` hashes each flow onto one of the equal-cost paths (Ethernet/RoCE); ``dmodk`` forwards by
destination, spread evenly over the up-links (InfiniBand without adaptive routing); ``spray``
splits every flow evenly over the equal-cost paths (per-packet spraying: Spectrum-X, EFA SRD);
``adaptive`` adds non-minimal paths where the topology has them (dragonfly UGAL on Slingshot;
on a fat tree every path is minimal, so it spreads as ``spray`` does: InfiniBand AR)."""

MULTIPATH_ROUTINGS = frozenset({"spray", "adaptive"})
"""Routings that split one flow over several paths (:mod:`collsim.topology.multipath`)."""

NIC_PATHS_THROUGH_CPU = ("phb", "node", "sys")
"""``node.nics.gpu_path`` values whose GPU-NIC traffic crosses a CPU's root complex: where the
node declares ``intra.host_p2p_bandwidth``, the node builders put those NICs on the CPU
(:mod:`collsim.topology.builders`)."""

DEVICE_KINDS: tuple[str, ...] = ("gpu", "nic", "nvswitch", "pcie_switch", "cpu", "switch")
"""``switch`` is a scale-out switch; ``nvswitch`` and ``pcie_switch`` live inside nodes."""

FORWARDING_KINDS = frozenset({"nic", "nvswitch", "pcie_switch", "cpu", "switch"})
"""Devices that forward traffic. GPUs are endpoints only: routes never pass through a GPU."""


DEFAULT_MATMUL_FRACTION = 271.2 / 312
"""The fraction of its dense peak a GPU's best matrix multiply is assumed to reach where its
topology file gives no measured rate (``matmul_tflops``): the A100 SXM's, 271.2 of 312 BF16
TFLOP/s (S. Bekman, *Machine Learning Engineering Open Book*, compute/accelerator/README.md,
"Maximum Achievable Matmul FLOPS comparison table", torch 2.6 / CUDA 12.6). The step model's GEMM
efficiency was calibrated on A100s, so a GPU without a measurement keeps the rate that
calibration implies for its peak."""


@dataclass(frozen=True)
class GpuModel:
    """One accelerator model: what compute and memory it brings (datasheet figures, and the
    measured rate of its best matrix multiply where one is published)."""

    model: str
    peak_flops: dict[str, float]
    """Dense peak FLOP/s by dtype (``bf16``, ``fp16``, ``fp32``, ...)."""
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    source: str | None = None
    slowdown: float = 1.0
    """How much slower than its datasheet this GPU runs (a what-if ``gpu:...:slow=`` fault): the
    rates above are the datasheet's / ``slowdown``, so utilisation is still measured against the
    datasheet."""
    matmul_flops: dict[str, float] = field(default_factory=dict)
    """Measured maximum achievable matmul FLOP/s by dtype (the best of a search over shapes):
    what the GPU sustains at its power limit, below the peak by a fraction that differs between
    GPUs (A100 SXM 0.87, H100 SXM 0.80, B200 0.78, MI300X 0.51 in BF16). Where a dtype has none,
    :meth:`matmul_rate` assumes a fraction of the peak (:meth:`matmul_rate`)."""
    sms: int | None = None
    """Streaming multiprocessors (compute units): how many GEMM tiles run at once, which sets the
    wave quantisation of a matrix multiply (:mod:`collsim.training.kernels`); ``None``: unknown,
    no wave quantisation is modelled."""

    def matmul_rate(self, key: str) -> float:
        """FLOP/s of the GPU's best matmul in ``key`` (a ``peak_flops`` key): measured, or the
        lowest fraction of the peak its measured dtypes reach (an MI300X's FP8 is not assumed
        to reach the A100's fraction when its BF16 reaches 0.51), or
        :data:`DEFAULT_MATMUL_FRACTION` of the peak for a GPU without measurements."""
        measured = self.matmul_flops.get(key)
        if measured is not None:
            return measured
        fractions = [v / self.peak_flops[k] for k, v in self.matmul_flops.items()]
        return self.peak_flops[key] * min(fractions, default=DEFAULT_MATMUL_FRACTION)


@dataclass(frozen=True)
class Device:
    """A vertex of the system: a GPU, NIC, NVSwitch, PCIe switch, CPU or network switch."""

    name: str
    kind: str
    node: int | None = None
    """Index of the server this device sits in; ``None`` for fabric switches."""
    index: int = 0
    """Position among devices of this kind in its node (GPU local rank, NIC rail, ...)."""
    latency_s: float = 0.0
    """Forwarding latency added when a route passes through (switches)."""
    in_network_reduction: bool = False
    """Whether this switch can reduce data in flight (NVLS on NVSwitch, SHARP on IB switches)."""
    in_network_efficiency: float = 1.0
    """The fraction of its links' rate an in-flight reduction through it reaches (NVLS on Hopper
    0.85, Blackwell 0.74: NCCL ``src/tuning/nvls.cc`` ``nvlsEfficiency``)."""
    tier: int = 0
    """Fabric tier of a network switch (1 = leaf, 2 = spine, 3 = core); 0 elsewhere."""
    forwards: bool = True
    """Whether routes may pass through. GPUs are endpoints (False) except in chip-level tori."""
    speed: float = 1.0
    """A GPU's compute and memory speed relative to :attr:`Topology.gpu` (what-if faults: with a
    slow GPU, ``Topology.gpu`` holds the slowest GPU's figures and the others run faster)."""


@dataclass(frozen=True)
class Link:
    """A full-duplex link between devices ``a`` and ``b``; the figures hold in each direction."""

    a: str
    b: str
    kind: str
    bandwidth_bytes_per_s: float
    latency_s: float
    bandwidth_factor: tuple[float, float] = (1.0, 1.0)
    """What-if faults: the fraction of ``bandwidth_bytes_per_s`` each direction (``a->b``,
    ``b->a``) delivers. Routing keeps costing the nominal bandwidth (a degraded link is not
    avoided, as static IB/NCCL routing does not avoid it)."""
    extra_latency_s: tuple[float, float] = (0.0, 0.0)
    """What-if faults: latency added to each direction (``a->b``, ``b->a``)."""
    duplex_bandwidth_bytes_per_s: float | None = None
    """What both directions carry *together* when they are busy at once; ``None``: full duplex
    (each direction its own ``bandwidth_bytes_per_s``). Real paths can fall short of full duplex:
    GPU traffic staged through host memory without P2P, or GPUDirect RDMA reading and writing a
    GPU through the PCIe root complex at once (measured by a calibration, see
    :mod:`collsim.model.profile`)."""


@dataclass(frozen=True)
class SharedCapacity:
    """A capacity several link directions share: what they carry *together* never exceeds
    ``bandwidth_bytes_per_s``. A PCIe switch without peer-to-peer is the case in point: the
    GPUs below it reach each other only through host memory, so every GPU's traffic to the host
    crosses the switch's one uplink (and every GPU's traffic from the host comes back down it);
    the graph links each GPU to the host directly, and the uplink's two directions are two
    shared capacities over those links (:mod:`collsim.topology.graph` adds one to every route that
    crosses a member, as it adds the coupling of a link short of full duplex)."""

    name: str
    kind: str
    bandwidth_bytes_per_s: float
    directions: tuple[tuple[str, str], ...]
    """The ``(from device, to device)`` directions of links whose traffic it carries (a route
    crossing two of them loads it twice)."""


@dataclass(frozen=True)
class Topology:
    """A whole system: one GPU model, its devices and links, and how it was described."""

    name: str
    gpu: GpuModel
    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    nodes: int
    gpus_per_node: int
    description: str = ""
    intra_fabric: str = ""
    """Short words for the intra-node fabric (``nvswitch``, ``pcie``, ...), for tables."""
    inter_fabric: str = ""
    """Short words for the scale-out fabric (``fat_tree``, ``rail_optimized``, ...)."""
    source_file: str | None = None
    is_template: bool = False
    """Templates accept ``--nodes``/``--gpus-per-node`` overrides; explicit graphs do not."""
    default_nodes: int = 1
    grid_dims: tuple[int, ...] = ()
    """Shape of a chip-level torus (GPUs linked directly), for pictures; empty otherwise."""
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    """``source:`` notes of the file, by section, for provenance."""
    faults: tuple[str, ...] = ()
    """What-if faults applied (canonical ``--fault`` text, see :mod:`collsim.topology.faults`)."""
    shared: tuple[SharedCapacity, ...] = ()
    """Capacities that several link directions share (a no-P2P PCIe switch's uplink)."""
    routing: str | None = None
    """The scale-out fabric's routing (one of :data:`ROUTINGS`); ``None``: by link kind, as
    before the field existed (InfiniBand and EFA links ``dmodk``, the others ``ecmp``)."""
    nvlink_domain_nodes: int = 1
    """Nodes per multi-node NVLink domain (18 trays of a GB200 NVL72 rack), filled in order, the
    last one possibly partial; 1: each node is its own NVLink (or PCIe) domain."""
    transport: str = ""
    """The scale-out NICs' net transport (``node.nics.transport``, a key of
    :data:`collsim.transports.TRANSPORTS`); empty: the default for the NICs' link kind."""
    gpu_p2p: bool = True
    """Whether the GPUs of a node reach each other's memory (PCIe or NVLink peer-to-peer); False
    for a PCIe node without P2P (``intra.p2p: false``, an explicit graph's ``gpu_p2p: false``),
    where NCCL stages their traffic through host memory (its SHM transport) and a channel that
    copies both ways runs at :data:`collsim.channel_rates.HOST_STAGED_GBPS`."""
    receive_flushes: float = 0.0
    """GPUDirect receive flushes each Simple network step on a NIC pays in series, at its
    transport's :attr:`~collsim.transports.Transport.flush_us`: 0 where NCCL does not flush (or
    unknown), 1 where every receive is flushed, 2 where a tree all-reduce runs its reduce, then
    its broadcast, so that each channel receives every step twice in turn. Set by the prediction
    of a log from its NCCL release, GPU and plugin settings
    (:func:`collsim.model.nccl_release.receive_flush`), not by topology files."""
    nic_gpu_path: str = "pix"
    """The PCIe path from a GPU to its nearest NIC (``node.nics.gpu_path``: ``pix``, ``pxb``,
    ``phb``, ``node`` or ``sys``, as ``nvidia-smi topo -m`` prints it); NCCL's LL128 across nodes
    needs ``pix`` or ``pxb``."""

    @property
    def nvlink_domain_gpus(self) -> int:
        """GPUs of a (full) NVLink domain: what NCCL treats as one node when multi-node NVLink is
        on (its ranks share one clique), and what the rank layout calls a node."""
        return min(self.n_gpus, self.gpus_per_node * self.nvlink_domain_nodes)

    @property
    def nvlink_domains(self) -> int:
        """How many NVLink domains the nodes fill (the last one possibly partial)."""
        return -(-self.nodes // self.nvlink_domain_nodes)

    @property
    def gpus(self) -> list[Device]:
        """GPUs in NCCL-like rank order: node-major, then local index."""
        gpus = [d for d in self.devices if d.kind == "gpu"]
        return sorted(gpus, key=lambda d: (d.node if d.node is not None else -1, d.index, d.name))

    @property
    def n_gpus(self) -> int:
        return sum(1 for d in self.devices if d.kind == "gpu")

    def device(self, name: str) -> Device:
        for dev in self.devices:
            if dev.name == name:
                return dev
        raise KeyError(name)

    @property
    def reduces_for_all_gpus(self) -> bool:
        """Whether an in-network all-reduce over all GPUs can run (:meth:`reduces_for`)."""
        return self.reduces_for()

    def reduces_for(self, gpus: Iterable[str] | None = None) -> bool:
        """Whether some switch that reduces in the network (NVLS, SHARP) reaches each of
        ``gpus`` (default: every GPU) over forwarding devices (a node's NVSwitch reaches only
        that node's GPUs: GPUs do not forward)."""
        wanted = {d.name for d in self.devices if d.kind == "gpu"} if gpus is None else set(gpus)
        return any(wanted <= reached for reached in self.reduction_reach())

    def reduction_reach(self, kinds: frozenset[str] | None = None) -> Iterator[set[str]]:
        """Per switch that reduces in the network (of device ``kinds``, or any), in file order,
        the GPUs it reaches over forwarding devices (GPUs do not forward); lazily, so a caller
        that looks for one such switch stops at it."""
        nbrs: dict[str, list[str]] = {}
        for link in self.links:
            nbrs.setdefault(link.a, []).append(link.b)
            nbrs.setdefault(link.b, []).append(link.a)
        by_name = {d.name: d for d in self.devices}
        for start in self.devices:
            if not start.in_network_reduction or (kinds is not None and start.kind not in kinds):
                continue
            seen, todo, reached = {start.name}, [start.name], set()
            while todo:
                for nxt in nbrs.get(todo.pop(), ()):
                    if nxt in seen:
                        continue
                    seen.add(nxt)
                    dev = by_name[nxt]
                    if dev.kind == "gpu":
                        reached.add(nxt)
                    elif dev.forwards:
                        todo.append(nxt)
            yield reached


def with_duplex(topology: Topology, efficiency: dict[str, float]) -> Topology:
    """``topology`` whose links of each listed *kind* carry, both directions together, at most
    ``2 * efficiency * bandwidth`` (0.5: half duplex; 1: full duplex, unchanged). A link that
    already states a ``duplex_bandwidth_bytes_per_s`` keeps the smaller of the two."""
    import dataclasses

    links = []
    for link in topology.links:
        eff = efficiency.get(link.kind, 1.0)
        if eff < 1.0:
            shared = 2.0 * eff * link.bandwidth_bytes_per_s
            if link.duplex_bandwidth_bytes_per_s is not None:
                shared = min(shared, link.duplex_bandwidth_bytes_per_s)
            link = dataclasses.replace(link, duplex_bandwidth_bytes_per_s=shared)
        links.append(link)
    return dataclasses.replace(topology, links=tuple(links))
