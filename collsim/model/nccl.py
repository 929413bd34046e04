"""NCCL's own cost model (``--model nccl``): the baseline the calibrated model has to beat.

A faithful transcription of ``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime`` in NCCL's
``src/graph/tuning.cc``, revision ``b6475625fbcaa2c3c0e50eed2fa1255d7514d4a2`` of NVIDIA/nccl
(the v2.19-v2.21 series: NVLS / NVLS-Tree, MNNVL, ``ringbdw``, ``numPipeOps``; the same ``hwLat``
Ring row that :mod:`collsim.protocols` quotes). Per (collective, algorithm, protocol)::

    busBw   = nChannels * (nNodes <= 2 ? bwIntra : bwInter)            # per-channel GB/s
    ring LL:    busBw = min(llMaxBw, busBw * (nNodes > 1 || AR || Reduce ? 1/4 : 1/3))
    ring LL128: busBw = min(busBw * (ppn < 2 ? 0.7 : 0.92), nChannels * perChMaxRingLL128Bw)
    tree:       busBw = min(busBw * .92, nChannels * perChMaxTreeBw)
    tree LL:    busBw = min(busBw / 3.8, llMaxBw)
    tree LL128: busBw = min(busBw * (nNodes == 1 ? 7/9 : 120/128), nChannels * perChMaxTreeLL128Bw)
    algBw   = busBw * (ring: nRanks / nsteps; NVLS: 5/6; tree: 1/2)
    lat     = baseLat + ring: (nsteps - nInterSteps) * max(intraLat, netOverhead)
                              + nInterSteps * interLat
                        tree: 2 * ((nRanks/nNodes - 1) * intraLat + log2(nNodes) * interLat)
    time_us = lat [x1.4 ring/Simple AR plateau] + nBytes / (1000 * algBw [x treeCorrectionFactor])

NCCL's bandwidth inputs (``bwIntra``/``bwInter`` per channel, ``nChannels``) come from its topology
search, which is not part of the tuning model; :func:`inputs_from_topology` maps a collsim topology
onto them (documented there and in ``docs/architecture.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from collsim.errors import ScheduleError
from collsim.metrics import effective_bytes
from collsim.model.mapping import intra_inter_bandwidth
from collsim.model.system import why_not
from collsim.protocols import HW_NET, HW_NVLINK, HW_PCI
from collsim.topology.spec import Topology

NCCL_SOURCE = (
    "NVIDIA/nccl src/graph/tuning.cc @ b6475625fbcaa2c3c0e50eed2fa1255d7514d4a2 (v2.19-2.21)"
)

TREE, RING, NVLS, NVLS_TREE = "tree", "ring", "nvls", "nvls_tree"
PROTOS = ("LL", "LL128", "Simple")
_P = {p: i for i, p in enumerate(PROTOS)}

BASE_LAT_US = {TREE: (6.8, 14.0, 0.0), RING: (6.6, 14.0, 8.4), NVLS: (0.0, 0.0, 0.0),
               NVLS_TREE: (0.0, 0.0, 0.0)}  # fmt: skip
"""``baseLat[algo][proto]`` (us)."""

HW_LAT_US = {
    HW_NVLINK: {TREE: (0.6, 1.25, 28.0), RING: (0.6, 1.9, 3.4), NVLS: (0, 0, 23.0),
                NVLS_TREE: (0, 0, 23.0)},
    HW_PCI: {TREE: (1.0, 1.9, 28.0), RING: (1.0, 2.5, 5.7), NVLS: (0, 0, 0), NVLS_TREE: (0, 0, 0)},
    HW_NET: {TREE: (5.0, 8.5, 28.0), RING: (2.7, 4.0, 14.0), NVLS: (0, 0, 18.0),
             NVLS_TREE: (0, 0, 14.0)},
}  # fmt: skip
"""``hwLat[hw][algo][proto]`` (us)."""

VOLTA, AMPERE, HOPPER = 0, 1, 2
LL_MAX_BWS = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (87.7, 22.5, 19.0))
PER_CH_MAX_RING_LL128_BWS = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7))
PER_CH_MAX_TREE_LL128_BWS = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0))
PER_CH_MAX_TREE_BWS = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0))
"""``llMaxBws`` / ``perChMax*Bws[compCapIndex][min(nNodes, 3) - 1]`` (GB/s)."""

TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0,
     1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9,
     1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
)  # fmt: skip
"""``treeCorrectionFactor[proto][log2(nBytes >> 6)]``, 64 B to 256 MB (from ``v2.10.3-1`` on;
``v2.29.2-1`` adds a 24th column that only NVLS-Tree reads)."""

TREE_CORRECTION_BY_RELEASE: tuple[tuple[tuple[int, int, int], tuple | None], ...] = (
    ((0, 0, 0), None),
    ((2, 6, 0), (
        (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .5, .5, .6, .7, .8, .9, .9, 1.0,
         1.0, 1.0),
        (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .8, .7, .7, .7, .6, .6, .7, .7, .8, .8, .9, .9,
         1.0),
        (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .5, .5, .6, .6, .7, .8, .9),
    )),
    ((2, 7, 0), (
        (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
         1.0, 1.0),
        (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .5, .6, .6, .7, .7, .8, .9, .9,
         1.0),
        (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .5, .5, .6, .6, .7, .8, .9),
    )),
    ((2, 8, 0), (
        TREE_CORRECTION[0],
        (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .5, .6, .6, .7, .7, .8, .9, .9,
         .92, .92),
        TREE_CORRECTION[2],
    )),
    ((2, 10, 0), TREE_CORRECTION),
)  # fmt: skip
"""``treeCorrectionFactor`` by the first release that carries each table (``git show
<tag>:src/graph/tuning.cc`` over every tag of the mirror; rows LL, LL128, Simple): none before
``v2.6.4-1`` (``v2.5.6-1`` has no such table); 22 columns (64 B to 128 MB) in ``v2.6.4-1`` and
``v2.7.3-1``-``v2.7.8-1``; from ``v2.8.3-1`` through ``v2.9.9-1`` 23 columns whose LL128 row ends
``.92, .92`` at 128 and 256 MB, where ``v2.10.3-1`` and later have ``1.0, 1.0`` -- so those
releases price the LL128 tree below the Simple tree at 256 MB (``0.915 x .92`` against ``.9``)
and switch to Simple there, where the later table keeps LL128."""

TREE_EFFICIENCY_BY_RELEASE: tuple[tuple[tuple[int, int, int], float], ...] = (
    ((0, 0, 0), 1.0),
    ((2, 5, 0), 0.9),
    ((2, 8, 0), 0.92),
)
"""The fraction of its graph bandwidth NCCL's tuner gives its tree at every size and protocol
(``ncclTopoTuneModel``: ``busBw = min(busBw * .92, nChannels * perChMaxTreeBw)``, ``v2.8.3-1``
line 127, ``v2.9.9-1`` 129, ``v2.22.3-1`` 180, ``v2.30.7-1`` 331; ``busBw * .9`` in ``v2.5.6-1``
line 109 and ``v2.7.8-1`` 118), by the first release that carries it. NCCL 2.4 has no tuning
model (``src/init.cc``'s tree threshold): 1."""


def _by_release(table: tuple, release: tuple[int, int, int] | None) -> object:
    """The entry of a ``(first release, value)`` table that ``release`` (None: the newest)
    follows."""
    if release is None:
        return table[-1][1]
    found = table[0][1]
    for first, value in table:
        if tuple(release[:3]) >= first:
            found = value
    return found


def tree_efficiency(release: tuple[int, int, int] | None = None) -> float:
    """NCCL's tree efficiency for ``release`` (:data:`TREE_EFFICIENCY_BY_RELEASE`; None: the
    newest, 0.92)."""
    return float(_by_release(TREE_EFFICIENCY_BY_RELEASE, release))  # type: ignore[arg-type]


def tree_correction(
    proto: str, n_bytes: np.ndarray, release: tuple[int, int, int] | None = None
) -> np.ndarray:
    """NCCL's measured shortfall of its tree all-reduce from its own bandwidth model, per size
    (``treeCorrectionFactor``: "Trees are not perfectly sticking to the model for medium sizes",
    ``tuning.cc``): the factor that multiplies the tree's bandwidth, 1 from 512 MiB on, in the
    table of NCCL ``release`` (major, minor, patch; None: the newest;
    :data:`TREE_CORRECTION_BY_RELEASE`: none before 2.6, 1 past 128 MB before 2.8).
    ``proto``: LL, LL128 or Simple (any case, or a :class:`collsim.protocols.Protocol`); another
    protocol has no NCCL figure, so no correction."""
    names = {p.lower(): i for i, p in enumerate(PROTOS)}
    row = names.get(str(getattr(proto, "name", proto)).lower())
    nb = np.asarray(n_bytes, dtype=np.int64)
    rows = _by_release(TREE_CORRECTION_BY_RELEASE, release)
    if row is None or rows is None:
        return np.ones(nb.shape)
    table = np.asarray(rows[row])  # type: ignore[index]
    log = np.array([_log2i(int(x) >> 6) for x in nb.reshape(-1)], dtype=np.int64).reshape(nb.shape)
    return np.where(log < len(table), table[np.minimum(log, len(table) - 1)], 1.0)


NCCL_FUNCS = ("broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce")
_ALGO_OF = {
    ("all_reduce", "ring"): RING, ("all_reduce", "tree"): TREE, ("all_reduce", "in_network"): NVLS,
    ("all_reduce", "nvls_tree"): NVLS_TREE,
    ("all_gather", "ring"): RING, ("reduce_scatter", "ring"): RING,
    ("broadcast", "chain"): RING, ("reduce", "chain"): RING,
}  # fmt: skip
"""collsim (collective, algorithm) -> NCCL algorithm (broadcast/reduce run as a chain on the
ring; in-network all-reduce is NVLS in one node, NVLS-Tree across nodes)."""


@dataclass(frozen=True)
class NcclInputs:
    """What ``ncclTopoTuneModel`` reads: the communicator and its ring/tree graphs."""

    n_ranks: int
    n_nodes: int
    comp_cap: int  # e.g. 70, 80, 90
    n_channels: int
    bw_intra_gbps: float  # per channel (graph->bwIntra)
    bw_inter_gbps: float  # per channel (graph->bwInter)
    intra_nvlink: bool = True  # graph->typeIntra == LINK_NVL
    cpu_amd: bool = False  # net overhead 2 us (AMD) instead of 1 us (Intel)
    latency_inter_us: float = 0.0  # graph->latencyInter
    same_channels: bool = True  # ringGraph->sameChannels
    ll128_enabled: bool = True

    @property
    def cc_index(self) -> int:
        return HOPPER if self.comp_cap >= 90 else AMPERE if self.comp_cap >= 80 else VOLTA


def _log2i(x: int) -> int:
    out = 0
    while x > 1:
        x >>= 1
        out += 1
    return out


def tune_table(inp: NcclInputs, coll: str, algo: str, proto: str) -> tuple[float, float]:
    """(latency us, algorithm bandwidth GB/s) of one entry of NCCL's tuning table."""
    p = _P[proto]
    n, nn, nch = inp.n_ranks, inp.n_nodes, inp.n_channels
    idx2 = nn - 1 if nn <= 2 else 2
    idx1 = inp.cc_index if nn == 1 else (1 if inp.cpu_amd else 0)
    ll_max = LL_MAX_BWS[idx1][idx2]
    ci = inp.cc_index
    ppn = n / nn
    nsteps = (
        2 * (n - 1)
        if coll == "all_reduce"
        else n - 1
        if coll in ("all_gather", "reduce_scatter")
        else n
    )
    if coll == "all_reduce":
        inter_steps = 2 * nn if nn > 1 else 0
    else:
        inter_steps = nn - 1 if coll in ("all_gather", "reduce_scatter") else nn
    bw = inp.bw_intra_gbps if nn <= 2 else inp.bw_inter_gbps
    if algo == NVLS:
        bw = min(inp.bw_intra_gbps, inp.bw_inter_gbps)
    if algo == NVLS_TREE:
        bw = min(inp.bw_intra_gbps, inp.bw_inter_gbps if nn <= 2 else inp.bw_inter_gbps / 2)
    bus = nch * bw
    if algo == RING and proto == "LL":
        bus = min(ll_max, bus * (0.25 if nn > 1 or coll in ("all_reduce", "reduce") else 1 / 3))
    if algo == RING and proto == "LL128":
        bus = min(bus * (0.7 if ppn < 2 else 0.92), nch * PER_CH_MAX_RING_LL128_BWS[ci][idx2])
    if algo == TREE:
        bus = min(bus * 0.92, nch * PER_CH_MAX_TREE_BWS[ci][idx2])
    if algo == TREE and proto == "LL":
        bus = min(bus / 3.8, ll_max)
    if algo == TREE and proto == "LL128":
        bus = min(
            bus * (7 / 9 if nn == 1 else 120 / 128), nch * PER_CH_MAX_TREE_LL128_BWS[ci][idx2]
        )
    ratio = n / nsteps if algo == RING else 5 / 6 if algo in (NVLS, NVLS_TREE) else 0.5
    alg_bw = bus * ratio
    intra_hw = HW_NVLINK if inp.intra_nvlink else HW_PCI
    hw = intra_hw if nn == 1 else HW_NET
    lat = BASE_LAT_US[algo][p]
    intra = HW_LAT_US[intra_hw][algo][p]
    inter = HW_LAT_US[HW_NET][algo][p] + inp.latency_inter_us
    if proto == "Simple":
        inter += inp.latency_inter_us
    if algo == RING:
        hop = HW_LAT_US[hw][algo][p]
        if coll in ("reduce", "broadcast"):
            if inp.same_channels:
                lat += hop
            else:
                lat += nsteps * (HW_LAT_US[hw][TREE][p] if proto == "Simple" else hop)
        else:
            overhead = (
                (2.0 if inp.cpu_amd else 1.0) * (3 if proto == "Simple" else 1) if nn > 1 else 0.0
            )
            lat += (nsteps - inter_steps) * max(intra, overhead) + inter_steps * inter
    elif algo == TREE:
        lat += 2 * ((n // nn - 1) * intra + _log2i(nn) * inter)
    elif algo == NVLS:
        lat = intra + (inter if nn > 1 else 0.0)
    else:
        lat += intra + 2 * _log2i(nn) * inter
    return lat, alg_bw


def algo_time_us(
    inp: NcclInputs, coll: str, algo: str, proto: str, n_bytes: np.ndarray
) -> np.ndarray:
    """``ncclTopoGetAlgoTime`` (one pipelined op): microseconds for each ``n_bytes``."""
    lat, bw = tune_table(inp, coll, algo, proto)
    nb = np.asarray(n_bytes, dtype=np.int64)
    bw_s = np.full(nb.shape, bw, dtype=np.float64)
    if algo == TREE:
        bw_s = bw_s * tree_correction(proto, nb)
    lat_s = np.full(nb.shape, lat)
    if algo == RING and proto == "Simple" and inp.n_nodes > 1 and coll == "all_reduce":
        plateau = nb / (inp.n_channels * inp.n_ranks) >= 64
        lat_s = np.where(plateau, lat * (1.9 if inp.comp_cap < 80 else 1.4), lat_s)
    with np.errstate(divide="ignore"):
        return np.where(bw_s > 0, lat_s + nb / (1000.0 * bw_s), np.inf)


def compute_capability(gpu_model: str) -> int:
    """CUDA compute capability from a GPU model name (non-NVIDIA parts: 80, the Ampere row that
    RCCL and other NCCL ports keep)."""
    name = gpu_model.lower()
    for key, cc in (("b200", 100), ("gb200", 100), ("b300", 103), ("h100", 90), ("h200", 90),
                    ("gh200", 90), ("a100", 80), ("a10", 86), ("3090", 86), ("4090", 89),
                    ("6000d", 120), ("v100", 70), ("2080", 75), ("t4", 75)):  # fmt: skip
        if key in name:
            return cc
    return 80


NIC_PATHS_FOR_LL128 = frozenset({"pix", "pxb"})
"""GPU-to-NIC PCIe paths (``nvidia-smi topo -m`` labels) on which NCCL runs LL128 across nodes."""


def ll128_by_default(
    nvlink: bool, comp_cap: int, multi_node: bool = False, nic_gpu_path: str = "pix"
) -> bool:
    """NCCL enables LL128 by default only with NVLink between the GPUs and on compute capability
    7.0, 8.0 or 9.0, and across nodes only where the graph's GPU reaches its NIC through PCIe
    switches alone (NVIDIA/nccl v2.21.5 ``src/graph/tuning.cc`` ``ncclTopoTuneModel``: "Enable
    LL128 by default only on Volta/Ampere/Hopper+NVLink. Other cases are not tested and may cause
    silent data corruption", ``pEnable &= (graphs[a]->typeInter <= PATH_PXB || (minCompCap >= 90
    && graphs[a]->typeInter <= PATH_PXN))``). ``typeInter`` is the GPU-to-NIC path of the
    graph; a single-node graph keeps its initial ``PATH_PIX`` (``search.cc``). PXN (a GPU
    reaching a NIC through an NVLink peer) needs that peer at PXB or better (``paths.cc``), so
    with ``nic_gpu_path`` the best GPU-to-NIC path of a node the rule is ``pix`` or ``pxb`` for
    every compute capability. ALCF Polaris' NICs sit behind the host bridge (``phb``): NCCL runs
    LL and Simple only across its nodes."""
    if multi_node and nic_gpu_path not in NIC_PATHS_FOR_LL128:
        return False
    return nvlink and comp_cap in (70, 80, 90)


def inputs_from_topology(topology: Topology, n_channels: int) -> NcclInputs:
    """Map a collsim topology onto NCCL's tuning inputs.

    * ``bwIntra`` = the GPU's intra-node bandwidth (its fattest route to another GPU of its node,
      bottleneck capacity) / channels; ``bwInter`` = the node's network bandwidth (per GPU: the
      NIC bottleneck on its route off the node, divided among the GPUs sharing that NIC; times
      the GPUs of a node) / channels: NCCL's channels leave a node through different NICs, so
      ``nChannels x bwInter`` is what all its NICs carry, as a ring's busbw across nodes is;
    * ``typeIntra`` NVLink when intra-node routes are NVLink/xGMI-class; compute capability from
      the GPU model (:func:`compute_capability`); Intel CPUs; ``latencyInter`` 0;
      ``sameChannels`` true; LL128 as NCCL enables it (NVLink and compute capability 70/80/90).
    """
    intra_bps, inter_bps, nvlink = intra_inter_bandwidth(topology)
    cc = compute_capability(topology.gpu.model)
    return NcclInputs(
        n_ranks=topology.n_gpus,
        n_nodes=topology.nvlink_domains,
        comp_cap=cc,
        n_channels=n_channels,
        bw_intra_gbps=intra_bps / 1e9 / n_channels,
        bw_inter_gbps=(inter_bps * topology.nvlink_domain_gpus if inter_bps > 0 else intra_bps)
        / 1e9
        / n_channels,
        intra_nvlink=nvlink,
        ll128_enabled=ll128_by_default(
            nvlink, cc, topology.nvlink_domains > 1, topology.nic_gpu_path
        ),
    )


class NcclModel:
    """NCCL's estimate of collective times on a collsim topology (same interface as
    :class:`~collsim.model.analytic.AnalyticModel` for the algorithms NCCL has)."""

    def __init__(
        self, topology: Topology, can_run: Callable[[str, str], bool] | None = None
    ) -> None:
        self.topology = topology
        self.can_run = can_run
        self.nranks = topology.n_gpus
        self.has_in_network = topology.reduces_for_all_gpus
        self._inputs: dict[int, NcclInputs] = {}

    description = "NCCL's tuning model (tuning.cc, v2.19-2.21)"
    """What prices with this model, in words (for the tables and JSON that name it)."""

    def inputs(self, channels: int) -> NcclInputs:
        if channels not in self._inputs:
            self._inputs[channels] = inputs_from_topology(self.topology, channels)
        return self._inputs[channels]

    def candidates(self, collective: str) -> list[str]:
        out = [a for (c, a), algo in _ALGO_OF.items() if c == collective]
        if not self.has_in_network:
            out = [a for a in out if a != "in_network"]
        if "nvls_tree" in out and why_not(self.topology, collective, "nvls_tree") is not None:
            out.remove("nvls_tree")
        if self.can_run is not None:
            out = [a for a in out if self.can_run(collective, a)]
        return out

    def no_estimate(self, collective: str) -> ScheduleError | None:
        """Why this model prices none of ``collective``'s algorithms (None where it prices one):
        NCCL runs all-to-all and send/receive as point-to-point sends, outside its tuner."""
        if self.candidates(collective):
            return None
        return ScheduleError(
            f"NCCL's tuning model has no estimate for {collective} (NCCL runs it as "
            "point-to-point sends, outside its tuner); use --model collsim",
            field="model",
            value="nccl",
        )

    def nccl_algorithm(self, collective: str, algorithm: str) -> str:
        algo = _ALGO_OF.get((collective, algorithm))
        if algo is None:
            raise ScheduleError(
                f"NCCL's tuning model has no estimate for {collective}/{algorithm}; it models "
                + ", ".join(f"{c}/{a}" for c, a in _ALGO_OF),
                field="algorithm",
                value=algorithm,
            )
        if algo == NVLS and self.topology.nvlink_domains > 1:
            algo = NVLS_TREE
        return algo

    def enabled(self, collective: str, algorithm: str, protocol: str, channels: int = 1) -> bool:
        """Whether NCCL would consider this protocol (LL128 only where NCCL enables it; NVLS
        only with Simple)."""
        algo = self.nccl_algorithm(collective, algorithm)
        if algo in (NVLS, NVLS_TREE) and protocol != "Simple":
            return False
        if algorithm == "nvls_tree" and channels < 2:  # "NVLS/NVLStree needs at least 2 channels"
            return False
        return protocol != "LL128" or self.inputs(channels).ll128_enabled

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
    ) -> np.ndarray:
        """NCCL's predicted time (seconds) per size (NCCL's model has no launch floor, so
        ``floor`` changes nothing)."""
        if self.nranks == 1:
            raise ScheduleError(
                "NCCL's tuning model prices no single rank (NCCL copies the "
                "buffer there): use --model collsim",
                field="model",
                value="nccl",
            )
        proto = {p.lower(): p for p in PROTOS}.get(str(protocol).lower())
        if proto is None:
            raise ScheduleError("unknown protocol (choose from LL, LL128, Simple)",
                                field="protocol", value=protocol)  # fmt: skip
        algo = self.nccl_algorithm(collective, algorithm)
        inp = self.inputs(channels)
        if algo == NVLS_TREE and proto != "Simple":
            return np.full(np.shape(np.atleast_1d(sizes_bytes)), np.inf)
        nb = effective_bytes(collective, np.atleast_1d(sizes_bytes), elem_bytes, self.nranks)
        t = algo_time_us(inp, collective, algo, proto, nb.astype(np.int64)) * 1e-6
        return np.where(nb == 0, 0.0, t)  # NCCL launches nothing for an empty call


def with_channels(inp: NcclInputs, n_channels: int) -> NcclInputs:
    """The same graph bandwidth spread over ``n_channels`` channels."""
    scale = inp.n_channels / n_channels
    return replace(
        inp,
        n_channels=n_channels,
        bw_intra_gbps=inp.bw_intra_gbps * scale,
        bw_inter_gbps=inp.bw_inter_gbps * scale,
    )


__all__ = [
    "NCCL_SOURCE",
    "NcclInputs",
    "NcclModel",
    "algo_time_us",
    "compute_capability",
    "inputs_from_topology",
    "ll128_by_default",
    "tune_table",
    "with_channels",
]
