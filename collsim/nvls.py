"""How NCCL cuts an NVLink SHARP (NVLS) all-reduce into chunks, and what each chunk costs.

NCCL runs NVLS on its own thread blocks (``nvlsChannels``), not on the ring's channels
(``src/enqueue.cc`` ``topoGetAlgoInfo``: ``nc = comm->nvlsChannels`` for NVLS), and picks the
chunk per call from the size (``calcCollChunking``). Each channel's scatter and gather warps
then move its share one chunk at a time, one head after the other (``src/device/all_reduce.h``,
``RunWorkColl<..., NCCL_ALGO_NVLS, ...>``; ``prims_simple.h`` ``ScatterGatherOp``: "Loop over
peers", a wait on the peer's slot before and a fence and flag after each chunk). A chunk's
flag round trip through the switch is not overlapped with its data, so a channel pays it once
per chunk: small chunks (NCCL halves the chunk for sizes below ``64 x`` channels x heads x
128 KiB) run slower. That is the ramp the GB300 NVL72 logs show, with a step where NCCL's chunk
changes (two trays: busbw 725 GB/s at 1 GiB on 64 KiB chunks, 823 at 2 GiB on 128 KiB).

NCCL 2.28 (``src/transport/nvls.cc``, ``src/enqueue.cc``, ``src/include/device.h``):

* channels: ``NVLS_NCHANNELS_SM90`` = 16 on Hopper; on Blackwell ``NVLS_NCHANNELS_SM100_NVL``
  = 24 inside one (multi-node) NVLink domain, ``NVLS_NCHANNELS_SM100`` = 32 across domains
  (NCCL 2.26 ran 32 in both cases);
* heads: one per GPU of the domain, at most ``NCCL_MAX_NVLS_ARITY`` = 32 (the NVLS search's
  ``maxChannels``, ``src/graph/search.cc``);
* chunk: ``NCCL_NVLS_CHUNKSIZE`` = 128 KiB, halved to 64 KiB below ``64 x channels x heads x
  chunk`` bytes, to 32 KiB below ``8 x`` and to 16 KiB below ``2 x`` (each test on the chunk
  the previous one left).

NCCL's NVLS+tree all-reduce (several nodes) runs the same scatter and gather loop in every node,
on ``NVLS_NCHANNELS_SM100`` = 32 blocks on Blackwell, with its own chunk rule
(:func:`nvls_tree_chunk_bytes`); collsim charges its chunks' trips on the node reduce.

The call's latency is NCCL's NVLS figure (:data:`NVLS_LATENCY_S`), not the ring's per-hop one.
The time one chunk costs its channel is the in-network route's latency (GPU to switch and back:
:meth:`collsim.topology.fabric.TopologyFabric.in_network_chunk_s`): a fit of ``T = L + S /
R + K x t`` (``K`` = chunks per channel by the rules above) to the GB300 two- and sixteen-tray
logs together gives ``t`` = 1.52 us, where the catalog's NVLink 5 route is 0.7 + 0.1 + 0.7 =
1.5 us.
"""

from __future__ import annotations

import math

from collsim.channel_rates import generation, nvidia_compute_capability

NVLS_LATENCY_S = 25e-6
"""NCCL's latency of an NVLS all-reduce in one node: ``hwLat[NVLINK][NVLS][Simple]`` = 25 us
(``src/graph/tuning.cc``, v2.28; 23 in v2.19-2.21), which NCCL charges once per call in place
of the ring's per-step figure (``latencies = intraLat``, NVLS's ``baseLat`` being 0). The
GB300 two-tray log's smallest sizes take 30 us (16 trays: 66 us)."""
NVLS_CHUNK_BYTES = 128 * 1024
"""``NCCL_NVLS_CHUNKSIZE`` default (``nvlsChunkSize``, ``src/transport/nvls.cc``)."""
MAX_HEADS = 32
"""``NCCL_MAX_NVLS_ARITY`` (``src/include/device.h``): the most heads of one NVLS group."""
CHANNELS = {"hopper": (16, 16), "blackwell": (24, 32)}
"""NVLS thread blocks per generation: (inside one NVLink domain, across domains)
(``NVLS_NCHANNELS_SM90``; ``NVLS_NCHANNELS_SM100_NVL`` and ``NVLS_NCHANNELS_SM100``)."""


def nvls_channels(gpu_model: str, *, several_domains: bool = False) -> int | None:
    """The thread blocks NCCL runs NVLS on for ``gpu_model``; ``None`` where NCCL has no NVLS
    (non-NVIDIA parts, generations before Hopper)."""
    cc = nvidia_compute_capability(gpu_model)
    if cc is None:
        return None
    counts = CHANNELS.get(generation(cc))
    if counts is None:
        return None
    return counts[1] if several_domains else counts[0]


def nvls_heads(gpus: int) -> int:
    """Heads of an NVLS group of ``gpus`` GPUs (one per GPU, at most :data:`MAX_HEADS`)."""
    return max(1, min(MAX_HEADS, int(gpus)))


def nvls_chunk_bytes(nbytes: int, channels: int, heads: int) -> int:
    """The chunk NCCL's NVLS all-reduce uses for a call of ``nbytes`` (``calcCollChunking``)."""
    ops = int(channels) * int(heads)
    chunk = NVLS_CHUNK_BYTES
    for factor, smaller in ((64, 65536), (8, 32768), (2, 16384)):
        if nbytes < factor * ops * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def nvls_chunks(nbytes: int, channels: int, heads: int) -> int:
    """Chunks one NVLS channel moves, one after another, for a call of ``nbytes``: its share
    ``nbytes / channels`` in chunks of :func:`nvls_chunk_bytes` (0 for an empty call)."""
    if nbytes <= 0:
        return 0
    return math.ceil(nbytes / (channels * nvls_chunk_bytes(nbytes, channels, heads)))


def nvls_tree_chunk_bytes(nbytes: int, channels: int, heads: int, nodes: int) -> int:
    """The chunk NCCL's NVLS+tree all-reduce uses for a call of ``nbytes`` across ``nodes``
    nodes (``calcCollChunking``, ``NCCL_ALGO_NVLS_TREE``): 128 KiB, at most 64 KiB from four
    nodes on (``NCCL_NVLSTREE_MAX_CHUNKSIZE`` default), halved to 64 KiB below ``4 x``
    channels x heads x the chunk and to 32 KiB below ``1 x``."""
    ops = int(channels) * int(heads)
    chunk = min(NVLS_CHUNK_BYTES, 65536 if nodes >= 4 else NVLS_CHUNK_BYTES)
    for factor, smaller in ((32, 262144), (16, 131072), (4, 65536), (1, 32768)):
        if nbytes < factor * ops * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def nvls_tree_chunks(nbytes: int, channels: int, heads: int, nodes: int) -> int:
    """Chunks one NVLS+tree channel moves through its node's switch, one after another (its
    scatter and gather warps run NVLS's loop over heads in every node)."""
    if nbytes <= 0:
        return 0
    return math.ceil(nbytes / (channels * nvls_tree_chunk_bytes(nbytes, channels, heads, nodes)))
