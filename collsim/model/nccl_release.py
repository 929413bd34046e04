"""What a prediction changes with the NCCL release a log ran.

NCCL's choices are not the same in every release. collsim's tuner ranks NCCL's algorithms and
protocols by collsim's own cost model; where a release offers fewer choices or picks by another
rule, the prediction has to follow that release. Each rule here is read off NVIDIA/nccl's source
at the tag named (the mirror's ``git show <tag>:<path>``):

* **LL128 exists from 2.5.** ``v2.4.6-1`` has LL and Simple only (``git grep LL128 v2.4.6-1 --
  src`` finds nothing); the protocol and the ``tuning.cc`` tables arrive with ``v2.5.6-1``
  (commit 299c554d, ``src/graph/tuning.cc``). A 2.4 log is predicted without LL128.
* **2.4 picks tree or ring by a size threshold, not by its cost model.** ``src/init.cc`` at
  ``v2.4.6-1`` (``ncclTreeThreshold``, lines 353-376) sets ``comm->treeThreshold`` once per
  communicator, and ``src/enqueue.cc`` (line 236) runs an all-reduce as a tree when ``nBytes <=
  treeThreshold``, else as a ring. With NVLink and two nodes the tree's modelled bandwidth is
  ``2 x 3/4`` of the ring's, so the tree runs at every size; ``NCCL_TREE_THRESHOLD`` overrides
  it (0: never a tree). From 2.5 the variable is gone (no ``TREE_THRESHOLD`` in ``v2.5.6-1`` or
  ``v2.9.9-1`` ``src/``): the cost model (``ncclTopoGetAlgoTime``) picks per call, which is
  what collsim's tuner does with its own model.

Not a version rule: at two nodes every release from 2.4 on prefers the tree for large all-reduces
(2.4 by the threshold above; 2.5+ because the topology search raises the tree graph's ``bwIntra``
to up to twice its ``bwInter`` -- ``search.cc`` pass 2, "increase speedIntra for trees (2 nodes
or collnet)", present in ``v2.9.9-1`` and ``v2.22.3-1`` alike -- and ``tuning.cc`` prices a 2-node
tree on ``bwIntra``). So the p4d logs (NCCL 2.8.3 / 2.9.9), whose busbw stays below the ring's
NIC bound, ran a tree that reached 0.35-0.47 of its bound, not a ring; a version-keyed switch to
the ring would contradict NCCL's source. Why that tree fell short is the next rule. (Where the
doubled ``bwIntra`` meets ``perChMaxTreeBw``, NCCL's table ranks the ring first even on two
nodes -- ALCF Polaris, Ampere at 24 GB/s a channel: :mod:`collsim.model.nccl_choice`.)

* **The Simple tree all-reduce runs its reduce, then its broadcast, through 2.9 -- and later
  where NCCL was built with CUDA 11.2 or 11.3 for an Ampere or newer GPU.** ``v2.8.3-1`` and
  ``v2.9.9-1`` ``src/collectives/device/all_reduce.h`` (lines 114-149, ``#if 1``): every
  thread first runs the up loop over the whole buffer (``recvReduceSend`` towards the root), then
  the down loop (``directRecvCopySend``); the split version, half the threads on each phase at
  once, sits in the ``#else``. From ``v2.10.3-1`` (line 268, unchanged through ``v2.26.2-1``
  ``src/device/all_reduce.h`` line 243) ``runTreeSplit`` is the rule and ``runTreeUpDown`` the
  exception ``CUDART_VERSION >= 11020 && CUDART_VERSION < 11040 && __CUDA_ARCH__ >= 800``. The
  log's ``NCCL version 2.9.9+cuda11.2`` line names the CUDA release NCCL was built with. Where
  the phases run in turn, a channel's network hop carries one direction's data at a time: each
  NIC direction serves half the connections it would with the phases overlapped (on two p4d
  nodes, 8 tree channels over 4 NICs, one instead of two; the log's ``Channel 00 : 8[101c0] ->
  0[101c0] [receive] via NET/AWS Libfabric/1/GDRDMA`` lines pin each channel pair to one NIC).
  That costs nothing where one connection fills a NIC, and half the NIC where it cannot: see
  :attr:`collsim.transports.Transport.connection_fraction` and
  :func:`tree_connections_per_nic`.

* **GPUDirect receive flush.** Before the GPU reads a Simple-protocol network receive that the
  NIC wrote into its memory, NCCL's proxy asks the net plugin to flush it (``ncclNetIflush``: a
  loopback RDMA read of the buffer, which PCIe orders behind the NIC's writes), and hands the
  step to the GPU only when that completes (``v2.8.3-1`` ``src/transport/net.cc`` lines
  407-425, "Don't pass data to the GPU yet, flush first", for ``size > 0 && protocol ==
  NCCL_PROTO_SIMPLE && useGdr``). Through 2.14 NCCL asks on every GPU and the plugin decides:
  ``net_ib`` reads unless ``NCCL_GDR_FLUSH_DISABLE=1`` (``net_ib.cc`` v2.8.3 lines 476-518),
  aws-ofi-nccl issues an ``fi_read`` unless ``OFI_NCCL_GDR_FLUSH_DISABLE=1`` (v1.1.x
  ``src/nccl_ofi_net.c`` ``ofi_iflush``). From 2.15 ``ncclTopoNeedFlush`` (``src/graph/
  paths.cc``) flushes below compute capability 9.0 and on Hopper or later only with
  ``NCCL_NET_FORCE_FLUSH`` (default 1 in 2.15-2.18, 0 from 2.19.1; aws-ofi-nccl sets it to 0 on
  p5, PR #314). ``NCCL_GDRCOPY_FLUSH_ENABLE=1`` (2.9 on) flushes with a CPU read through GDRCopy
  instead, not the NIC. :func:`receive_flush` is that rule; what a flush costs is the
  transport's (:attr:`collsim.transports.Transport.flush_us`).

A log that does not say its release is predicted with the newest behaviour, except that a setting
only NCCL < 2.5 reads (``NCCL_TREE_THRESHOLD``) is taken as that release's: whoever set it ran a
release that reads it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from collsim.errors import CalibrationError
from collsim.topology.spec import Topology
from collsim.transports import Transport, transport_for

_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)\.(\d+)")
_CUDA = re.compile(r"\+cuda(\d+)\.(\d+)")
_CODE = re.compile(r"^\s*(\d{4,6})\s*$")


@dataclass(frozen=True, order=True)
class NcclVersion:
    """An NCCL release (major, minor, patch)."""

    major: int
    minor: int
    patch: int
    cuda: tuple[int, int] | None = field(default=None, compare=False)
    """The CUDA release NCCL was built with (``+cuda11.2`` in its version line); None: unknown.
    Not part of the ordering: it is the build's, not the release's."""

    def __str__(self) -> str:
        build = f"+cuda{self.cuda[0]}.{self.cuda[1]}" if self.cuda else ""
        return f"{self.major}.{self.minor}.{self.patch}{build}"

    @property
    def has_ll128(self) -> bool:
        """LL128 exists (from 2.5: ``v2.5.6-1`` ``src/graph/tuning.cc``; none in ``v2.4.6-1``)."""
        return self >= NcclVersion(2, 5, 0)

    @property
    def tree_by_threshold(self) -> bool:
        """The all-reduce's tree/ring choice is a size threshold (``NCCL_TREE_THRESHOLD`` or
        ``ncclTreeThreshold``), as before 2.5 (``v2.4.6-1`` ``src/init.cc``, ``enqueue.cc``)."""
        return self < NcclVersion(2, 5, 0)

    def tree_up_then_down(self, compute_capability: int | None, protocol: str = "Simple") -> bool:
        """The tree all-reduce of ``protocol`` runs its reduce over the whole buffer, then its
        broadcast, on a GPU of ``compute_capability`` (None: not an NVIDIA GPU, no rule). Before
        2.10, Simple and LL (``v2.9.9-1`` ``all_reduce.h``: ``#if 1`` at line 114, the LL tree's
        up and down loops at 383-401); LL128 splits its threads in every release
        (``NCCL_LL128_SPLIT``, line 515). From 2.10 only Simple, and only when built with CUDA
        11.2 or 11.3 for compute capability 8.0 or above (``v2.10.3-1`` ``all_reduce.h`` line
        268); an unknown build counts as another."""
        name = protocol.lower()
        if compute_capability is None or name == "ll128":
            return False
        if self < NcclVersion(2, 10, 0):
            return True
        return (
            name == "simple"
            and self.cuda is not None
            and (11, 2) <= self.cuda < (11, 4)
            and compute_capability >= 80
        )


NEWEST = NcclVersion(2, 30, 7)
"""The newest release whose behaviour collsim follows where a log does not say (the mirror's
newest tag, ``v2.30.7-1``)."""

OLD_ONLY_ENV = ("NCCL_TREE_THRESHOLD",)
"""NCCL settings only releases before 2.5 read."""


def parse_nccl_version(text: str | None, *, field: str = "nccl_version",
                       file: str | None = None) -> NcclVersion | None:  # fmt: skip
    """``2.9.9+cuda11.2``, ``2.26.2 (nccl-headers=22602 ...)``, ``v2.21.5-1`` or a version code
    (``22602``, ``2906`` as ``NCCL_VERSION_CODE`` writes them) -> :class:`NcclVersion`; None or
    empty -> None. Anything else is a :class:`CalibrationError` naming ``field`` and the text."""
    if text is None or not str(text).strip():
        return None
    s = str(text)
    found = _VERSION.match(s)
    if found:
        cuda = _CUDA.search(s)
        build = (int(cuda.group(1)), int(cuda.group(2))) if cuda else None
        return NcclVersion(*(int(g) for g in found.groups()), cuda=build)
    code = _CODE.match(s)
    if code:
        n = int(code.group(1))
        # NCCL_VERSION_CODE: major*10000 + minor*100 + patch from 2.9, major*1000 + ... before
        if n >= 20900:
            return NcclVersion(n // 10000, (n // 100) % 100, n % 100)
        if 2000 <= n < 3000:
            return NcclVersion(n // 1000, (n // 100) % 10, n % 100)
    raise CalibrationError(
        "not an NCCL version (give major.minor.patch, e.g. 2.9.9, or a version code such as 22602)",
        file=file,
        field=field,
        value=text,
    )


def effective_version(version: NcclVersion | None, env: dict[str, str]) -> NcclVersion:
    """The release whose behaviour a prediction follows: ``version`` where known; else 2.4 when
    ``env`` sets something only NCCL < 2.5 reads; else :data:`NEWEST`."""
    if version is not None:
        return version
    if any(k in env for k in OLD_ONLY_ENV):
        return NcclVersion(2, 4, 8)
    return NEWEST


def tree_threshold_bytes(
    n_nodes: int, n_ranks: int, n_channels: int, nvlink: bool, env: dict[str, str]
) -> float:
    """NCCL 2.4's all-reduce tree threshold in bytes (tree up to and including it, ring above):
    ``NCCL_TREE_THRESHOLD`` where set, else ``ncclTreeThreshold`` (``v2.4.6-1`` ``src/init.cc``
    lines 353-376: its bandwidths in MB/s and latencies in us, a line-for-line transcription);
    ``inf`` for "every size", 0 for "never"."""
    raw = env.get("NCCL_TREE_THRESHOLD", "").strip()
    if raw:
        try:
            return float(int(raw))
        except ValueError:
            raise CalibrationError(
                "NCCL_TREE_THRESHOLD takes a size in bytes", field="--nccl-env",
                value=f"NCCL_TREE_THRESHOLD={raw}",
            ) from None  # fmt: skip
    ringbw = 5000.0 * n_channels if nvlink else 5000.0
    treebw = ringbw * 3 / 4 * (2 if n_nodes == 2 else 1) if nvlink else ringbw * 2 / 3
    ringlat = 6.0 * (n_ranks - 1)
    treelat = 15.0 * int(math.log2(max(n_nodes, 1))) + 4.0 * (n_ranks // max(n_nodes, 1) - 1)
    if n_nodes < 2 or ringlat <= treelat:
        return 0.0
    if treebw > ringbw:
        return math.inf
    return float(int(ringbw * treebw / (ringbw - treebw) * (ringlat - treelat)))


FLUSH_ENV = (
    "NCCL_NET_FORCE_FLUSH",
    "NCCL_GDR_FLUSH_DISABLE",
    "NCCL_GDRCOPY_FLUSH_ENABLE",
    "OFI_NCCL_GDR_FLUSH_DISABLE",
)
"""The settings :func:`receive_flush` reads: NCCL's (integers, non-zero on) and aws-ofi-nccl's."""


def _set(env: dict[str, str], name: str) -> bool | None:
    """Whether ``env`` turns ``name`` on (True), off (False) or leaves it unset (None)."""
    raw = env.get(name)
    if raw is None:
        return None
    text = raw.strip()
    return int(text) != 0 if text.lstrip("-").isdecimal() else text.lower() in ("true", "yes")


def receive_flush(
    release: NcclVersion,
    compute_capability: int | None,
    transport: Transport | None,
    env: dict[str, str],
) -> bool:
    """Whether NCCL ``release`` flushes each Simple network receive into a GPU of
    ``compute_capability`` with the NIC's loopback read, through ``transport`` under ``env``
    (the NCCL and plugin settings a log records): the module's rule. No GPUDirect transport
    (sockets, host-staged EFA: the NIC writes host memory), no flush."""
    if transport is None or transport.name in ("socket", "efa_host"):
        return False
    plugin_off = "NCCL_GDR_FLUSH_DISABLE" if transport.name == "ib_verbs" else (
        "OFI_NCCL_GDR_FLUSH_DISABLE"
    )  # fmt: skip
    if _set(env, plugin_off) or _set(env, "NCCL_GDRCOPY_FLUSH_ENABLE"):
        return False
    if release < NcclVersion(2, 15, 0) or compute_capability is None or compute_capability < 90:
        return True
    forced = _set(env, "NCCL_NET_FORCE_FLUSH")
    return forced if forced is not None else release < NcclVersion(2, 19, 1)


def with_receive_flushes(topology: Topology, flushes: float) -> Topology:
    """``topology`` with each Simple network receive step paying ``flushes`` serial flushes
    (:attr:`~collsim.topology.spec.Topology.receive_flushes`)."""
    return replace(topology, receive_flushes=float(flushes))


def _nic_cables(topology: Topology) -> list[int]:
    """Indices of ``topology``'s links between a NIC and the network (a scale-out link kind)."""
    kinds = {d.name: d.kind for d in topology.devices}
    return [
        i
        for i, link in enumerate(topology.links)
        if "nic" in (kinds.get(link.a), kinds.get(link.b))
        and transport_for(link.kind, topology.transport) is not None
    ]


def nic_transport(topology: Topology) -> Transport | None:
    """The net transport of ``topology``'s scale-out NICs; None on one node or without NICs."""
    cables = _nic_cables(topology)
    if topology.nodes < 2 or not cables:
        return None
    return transport_for(topology.links[cables[0]].kind, topology.transport)


def tree_connections_per_nic(topology: Topology, channels: int, up_then_down: bool) -> int:
    """NCCL connections that drive one direction of one NIC at once in a tree all-reduce on
    ``channels`` channels: each channel's network hop is one connection per direction and the
    channels leave a node by its NICs in turn, ``channels / NICs`` of them per NIC; with the
    reduce and the broadcast in turn (:meth:`NcclVersion.tree_up_then_down`) a direction carries
    one phase's connection of the channel's pair, half as many (at least one)."""
    nics = sum(1 for d in topology.devices if d.kind == "nic") // max(topology.nodes, 1)
    per_nic = max(1, channels // max(nics, 1))
    return max(1, per_nic // 2) if up_then_down else per_nic


def tree_nic_share(topology: Topology, channels: int, up_then_down: bool) -> float:
    """The fraction of its modelled rate a NIC reaches in ``topology``'s tree all-reduce: its
    connections at once times what one connection attains
    (:attr:`~collsim.transports.Transport.connection_fraction`), at most 1. 1 off the network."""
    cables = _nic_cables(topology)
    if topology.nodes < 2 or not cables:
        return 1.0
    link = topology.links[cables[0]]
    transport = transport_for(link.kind, topology.transport)
    fraction = transport.connection_fraction if transport is not None else 1.0
    k = tree_connections_per_nic(topology, channels, up_then_down)
    return min(1.0, k * fraction)


def with_nic_share(topology: Topology, share: float) -> Topology:
    """``topology`` with every NIC's network cable delivering ``share`` of its rate each way
    (the what-if fault mechanism, :attr:`~collsim.topology.spec.Link.bandwidth_factor`)."""
    links = list(topology.links)
    for i in _nic_cables(topology):
        a, b = links[i].bandwidth_factor
        links[i] = replace(links[i], bandwidth_factor=(a * share, b * share))
    return replace(topology, links=tuple(links))


__all__ = [
    "FLUSH_ENV",
    "NEWEST",
    "OLD_ONLY_ENV",
    "NcclVersion",
    "effective_version",
    "nic_transport",
    "parse_nccl_version",
    "receive_flush",
    "tree_connections_per_nic",
    "tree_nic_share",
    "tree_threshold_bytes",
    "with_nic_share",
    "with_receive_flushes",
]
