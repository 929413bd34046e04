"""How fast one NCCL channel moves data: the per-channel rate ceiling of every flow.

An NCCL channel is driven by one thread block (CTA) per peer connection: its threads load the
data, (reduce it,) and store it into the peer's buffer, a chunk at a time, with a flag per chunk.
One thread block cannot fill an NVSwitch port or a fast NIC on its own, so a collective on one
channel is bounded by the channel, not by the link, and NCCL runs many channels at once (24 in
one DGX H100 or DGX A100, 16 across nodes). The engine and the analytic model treat the limit
the same way: every flow (one channel's transfer) has a rate ceiling, a private link of that
capacity in max-min sharing, so ``C`` channels over a link of capacity ``B`` run at
``min(B, C x ceiling)`` between them.

The per-channel figures are NCCL's own (``src/graph/tuning.cc``, the ``perChMax*`` tables of
``ncclTopoTuneModel``, NVIDIA/nccl ``master`` of 2026-06, unchanged since v2.19 for Volta to
Hopper), payload GB/s per channel, row by GPU generation as NCCL indexes them
(``compCapIndex``: compute capability >= 100 Blackwell, >= 90 Hopper, >= 80 Ampere, else
Volta), column ``N1`` (one node; the other columns describe NCCL's tree across nodes, not one
channel's copy rate):

===========  ==================================  ======================================
generation   Simple (``perChMaxTreeBws``, N1)    LL128 (``perChMaxRingLL128Bws``, N1)
===========  ==================================  ======================================
Volta        26.5                                20.0
Ampere       24.0                                20.0
Hopper       38.7                                36.7
Blackwell    70.0                                40.0
===========  ==================================  ======================================

LL: NCCL prices a ring's LL bandwidth at half of what the channels give Simple
(``busBw = min(llMaxBw, busBw * .5)``), so an LL channel carries half Simple's payload: the
same wire bytes (each 8-byte line holds 4 bytes of data). NCCL's ``llMaxBws`` caps the total
over all channels, not one channel, and is not modelled here.

The ceiling is the channel's, whatever link class the flow crosses (NVLink, PCIe or network:
the thread block copies into a network buffer too), with one exception: NCCL's point-to-point
operations (send/recv, all-to-all) over the network get at most ``P2P_PER_CHANNEL_NET_BW`` =
14 GB/s per channel (``src/graph/paths.cc``: the figure NCCL sizes its channels per network
peer by, ``max(NICs, ceil(NIC GB/s / 14))``). Non-NVIDIA accelerators (AMD, Intel Gaudi, TPU,
CPU processes) have no NCCL channels and no ceiling.

**Host-staged copies.** Where NCCL cannot let one GPU write into another's memory (no PCIe
peer-to-peer) it falls back to its SHM transport (``src/transport/shm.cc``): the buffers are in
pinned host memory, and by default (``direct``; the copy engine only with
``NCCL_SHM_USE_CUDA_MEMCPY=1``, shm.cc v2.18) a channel's thread block stores each chunk it
sends into the receiver's host buffer across PCIe, and the receiver's block loads it out of
there. A block that only receives (or only sends) moves data at the link's pace: the 2-GPU
no-P2P broadcast and reduce logs reach 11.1 GB/s on 2 channels over a Gen3 x16 link (0.70 of
it), which the link already gives. A block that receives *and* sends each step (a ring, a
tree, all-to-all, any rank of a chain that passes data on) alternates a PCIe read of the
received chunk, which waits a round trip to host memory, with stores of the outgoing chunk
across the same link and, before posting each step, a system-scope fence that waits for them
(``prims_simple.h`` ``postPeer``: ``fence_acq_rel_sys()`` when data was stored, v2.18). Its
rate is then neither link's: :data:`HOST_STAGED_GBPS` per channel, each way. That figure is
**measured across logs**, not derived: per channel and direction at >= 256 MiB, RTX 2080 Ti
pair without P2P (PCIe Gen3) all_reduce 2.00, all_gather 1.90, alltoall 2.30, and an RTX 4090
pair on different root ports (Gen4; rtx4090-kalavai-2gpu-all_reduce-2) 1.91: median 1.95,
entered as 2.0. It is the same on a Gen3 and a Gen4 link, as a latency-bound copy loop's rate
would be and a link's would not. It is not applied to networks without GPUDirect RDMA: the one
such log (a100pcie-ib-2n1g-nogdr, A100) moves 12.6 GB/s on 2 channels up to 470 MB and
5.5 GB/s from 556 MB on, which no per-channel figure explains.
"""

from __future__ import annotations

import numpy as np

from collsim.protocols import HW_NET

GB = 1e9

SIMPLE_GBPS = {"volta": 26.5, "ampere": 24.0, "hopper": 38.7, "blackwell": 70.0}
"""Payload GB/s of one Simple channel (``tuning.cc`` ``perChMaxTreeBws``, column N1)."""
LL128_GBPS = {"volta": 20.0, "ampere": 20.0, "hopper": 36.7, "blackwell": 40.0}
"""Payload GB/s of one LL128 channel (``tuning.cc`` ``perChMaxRingLL128Bws``, column N1)."""
LL_SHARE = 0.5
"""An LL channel's payload rate relative to Simple's (``tuning.cc``: ring LL ``busBw * .5``)."""
HOST_STAGED_GBPS = 2.0
"""Payload GB/s of one channel that both receives and sends through host memory, each way
(measured across four logs of two systems; see the module doc)."""
P2P_NET_GBPS = 14.0
"""Payload GB/s of one point-to-point channel over the network (``paths.cc``
``P2P_PER_CHANNEL_NET_BW``)."""

_CC_KEYS = (("gb300", 103), ("b300", 103), ("gb200", 100), ("b200", 100), ("gh200", 90),
            ("h100", 90), ("h200", 90), ("h800", 90), ("a100", 80), ("a800", 80), ("a10", 86),
            ("a40", 86), ("3090", 86), ("4090", 89), ("l40", 89), ("6000d", 120), ("v100", 70),
            ("2080", 75), ("t4", 75))  # fmt: skip
"""GPU model name fragments -> CUDA compute capability (NVIDIA parts only; first match wins)."""


def nvidia_compute_capability(gpu_model: str) -> int | None:
    """CUDA compute capability of an NVIDIA GPU model name; ``None`` for anything else."""
    name = gpu_model.lower()
    for key, cc in _CC_KEYS:
        if key in name:
            return cc
    return None


def generation(compute_capability: int) -> str:
    """NCCL's GPU-generation row for a compute capability (``compCapIndex``)."""
    if compute_capability >= 100:
        return "blackwell"
    if compute_capability >= 90:
        return "hopper"
    if compute_capability >= 80:
        return "ampere"
    return "volta"


def channel_payload_bytes_per_s(
    gpu_model: str,
    protocol: str,
    *,
    point_to_point: bool = False,
    host_staged: tuple[int, ...] = (),
    flows_per_channel: int = 1,
) -> np.ndarray | None:
    """Payload bytes/s one channel moves, per NCCL link class ``(nvlink, pci, net)`` (see the
    module doc); ``None`` where the GPU has no NCCL channels (no ceiling). ``host_staged``: the
    classes whose flows a channel copies both ways through host memory, held to
    :data:`HOST_STAGED_GBPS` (half that for LL, whose lines carry half data), split over the
    ``flows_per_channel`` concurrent flows one channel's thread block drives each way (a tree
    all-reduce's: its child's and its parent's, on each of its two trees)."""
    cc = nvidia_compute_capability(gpu_model)
    if cc is None:
        return None
    gen = generation(cc)
    name = protocol.lower()
    if name == "ll128":
        per = LL128_GBPS[gen]
    elif name == "ll":
        per = LL_SHARE * SIMPLE_GBPS[gen]
    else:
        per = SIMPLE_GBPS[gen]
    rates = np.full(3, per * GB)
    if point_to_point:
        rates[HW_NET] = min(per, P2P_NET_GBPS) * GB
    staged = HOST_STAGED_GBPS * (LL_SHARE if name == "ll" else 1.0) * GB / flows_per_channel
    for cls in host_staged:
        rates[cls] = min(rates[cls], staged)
    return rates
