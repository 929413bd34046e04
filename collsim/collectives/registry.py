"""The algorithm registry and ``build_schedule``, the one entry point to every collective algorithm.

Adding an algorithm: write its builder (``BuildSpec -> Schedule``) in its family's module and add
one line to ``_REGISTRY`` below. The first algorithm listed for a collective is its default
(NCCL's choice for large messages: ring, chain for rooted collectives, pairwise all-to-all).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from collsim.collectives import (
    alltoall,
    crossnode,
    direct,
    hierarchical,
    innetwork,
    p2p,
    pipeline,
    recursive,
    ring,
    ring2d,
    tree,
)
from collsim.collectives.common import DEFAULT_CHUNK_BYTES, BuildSpec, self_copy
from collsim.collectives.layout import RankLayout
from collsim.collectives.schedule import Schedule, ScheduleBuilder
from collsim.collectives.verify import COLLECTIVES
from collsim.errors import ScheduleError

Builder = Callable[[BuildSpec], Schedule]

_REGISTRY: dict[str, dict[str, Builder]] = {
    "all_reduce": {
        "ring": ring.build_all_reduce,
        "tree": tree.build_all_reduce,
        "rhd": recursive.build_all_reduce,
        "hierarchical": hierarchical.build_all_reduce,
        "ring2d": ring2d.build_all_reduce,
        "direct": direct.build_all_reduce,
        "in_network": innetwork.build_all_reduce,
        "nvls_tree": crossnode.build_nvls_tree,
        "collnet": crossnode.build_collnet,
    },
    "all_gather": {
        "ring": ring.build_all_gather,
        "rd": recursive.build_all_gather,
        "pat": recursive.build_all_gather,
        "direct": direct.build_all_gather,
        "hierarchical": hierarchical.build_all_gather,
    },
    "reduce_scatter": {
        "ring": ring.build_reduce_scatter,
        "rd": recursive.build_reduce_scatter,
        "pat": recursive.build_reduce_scatter,
        "direct": direct.build_reduce_scatter,
        "hierarchical": hierarchical.build_reduce_scatter,
    },
    "broadcast": {
        "chain": pipeline.build_broadcast_chain,
        "tree": pipeline.build_broadcast_tree,
    },
    "reduce": {
        "chain": pipeline.build_reduce_chain,
        "tree": pipeline.build_reduce_tree,
    },
    "alltoall": {
        "direct": alltoall.build_direct,
        "hierarchical": alltoall.build_hierarchical,
    },
    "sendrecv": {
        "p2p": p2p.build_sendrecv,
    },
}

_IN_NETWORK = frozenset({"in_network", "nvls_tree", "collnet"})

NCCL_ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "in_network", "nvls_tree", "collnet"),
    "all_gather": ("ring", "pat"),
    "reduce_scatter": ("ring", "pat"),
    "broadcast": ("chain",),
    "reduce": ("chain",),
    "alltoall": ("direct",),
    "sendrecv": ("p2p",),
}
"""collsim's names for the algorithms NCCL runs per collective (its tuner's choices), each kept
only where NCCL enables it (:func:`collsim.model.system.why_not`): ``in_network`` = NVLS (one
switch reduces for every GPU), ``nvls_tree`` = NVLS_TREE (NVLS in each node, a tree across
nodes), ``collnet`` = CollNet Direct (SHARP in the scale-out switches), ``pat`` = PAT (one GPU
per node; timed with the recursive-doubling schedule, whose log-steps shape it shares)."""

__all__ = [
    "COLLECTIVES",
    "NCCL_ALGORITHMS",
    "algorithms_for",
    "build_schedule",
    "default_algorithm",
    "needs_in_network",
]


def _check_collective(collective: str) -> dict[str, Builder]:
    if collective not in _REGISTRY:
        raise ScheduleError(
            f"unknown collective; valid: {', '.join(COLLECTIVES)}",
            field="collective",
            value=collective,
        )
    return _REGISTRY[collective]


def algorithms_for(collective: str) -> tuple[str, ...]:
    """The algorithms registered for ``collective``, default first."""
    return tuple(_check_collective(collective))


def default_algorithm(collective: str) -> str:
    """The algorithm used when none is asked for."""
    return algorithms_for(collective)[0]


MAX_CHANNELS = 64
"""The most channels a collective runs on (NCCL's ``MAXCHANNELS``: 32 in older releases, 64 in
recent ones); more would only split the data finer over the same routes."""


def needs_in_network(algorithm: str) -> bool:
    """Whether ``algorithm`` needs switches that reduce in the network (NVLS / SHARP): one that
    every rank reaches (``in_network``), one per node (``nvls_tree``) or one joining the nodes
    (``collnet``)."""
    return algorithm in _IN_NETWORK


def runs_protocol(algorithm: str, protocol: str) -> bool:
    """Whether ``algorithm`` can run ``protocol``: in-network reductions (NVLS, SHARP / CollNet)
    run Simple only -- the switch reduces whole buffers, which LL and LL128 interleave with flags
    (NCCL's ``tuning.cc`` skips NVLS and CollNet with any other protocol); so does PAT."""
    name = str(getattr(protocol, "name", protocol)).lower()
    return not ((needs_in_network(algorithm) or algorithm == "pat") and name != "simple")


def _int(value: object, field: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ScheduleError(f"{field} must be an integer >= {minimum}", field=field, value=value)
    return value


def build_schedule(
    collective: str,
    algorithm: str,
    *,
    nranks: int,
    count: int,
    elem_bytes: int = 4,
    layout: RankLayout | None = None,
    channels: int = 1,
    chunk_bytes: int | None = None,
    root: int = 0,
) -> Schedule:
    """Build the schedule of ``collective`` by ``algorithm`` on ``nranks`` ranks.

    ``count``: elements as nccl-tests counts them (see :class:`Schedule`). ``channels``: parallel
    sub-schedules each carrying ~1/C of the data (NCCL channels). ``chunk_bytes``: pipelining
    granularity of tree, chain and in-network algorithms. ``layout``: node structure and grid for
    hierarchical/2D algorithms (default: nodes of up to 8 ranks). Bad requests raise
    :class:`~collsim.errors.ScheduleError` naming the field.
    """
    builders = _check_collective(collective)
    if algorithm not in builders:
        raise ScheduleError(
            f"unknown {collective} algorithm; valid: {', '.join(builders)}",
            field="algorithm",
            value=algorithm,
        )
    nranks = _int(nranks, "nranks", 1)
    count = _int(count, "count", 0)
    elem_bytes = _int(elem_bytes, "elem_bytes", 1)
    channels = _int(channels, "channels", 1)
    if channels > MAX_CHANNELS:
        raise ScheduleError(
            f"at most {MAX_CHANNELS} channels (NCCL's MAXCHANNELS)",
            field="channels",
            value=channels,
        )
    chunk = DEFAULT_CHUNK_BYTES if chunk_bytes is None else _int(chunk_bytes, "chunk_bytes", 1)
    if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < nranks:
        raise ScheduleError(f"root must be a rank in 0..{nranks - 1}", field="root", value=root)
    if layout is None:
        layout = RankLayout.default(nranks)
    elif not isinstance(layout, RankLayout) or layout.nranks != nranks:
        raise ScheduleError(
            f"layout must be a RankLayout for {nranks} ranks", field="layout", value=layout
        )
    spec = BuildSpec(
        collective=collective,
        algorithm=algorithm,
        nranks=nranks,
        count=count,
        elem_bytes=elem_bytes,
        layout=layout,
        channels=channels,
        chunk_bytes=chunk,
        root=root,
    )
    return lone_rank(spec) if nranks == 1 else builders[algorithm](spec)


def lone_rank(spec: BuildSpec) -> Schedule:
    """Any collective on one rank: a copy of the input into the output (NCCL copies an
    out-of-place buffer on a lone rank; a send to oneself is the same copy), whatever the
    algorithm, so every algorithm and both engines agree there."""
    b = ScheduleBuilder()
    zero = np.zeros(1, dtype=np.int64)
    self_copy(b, zero, np.array([spec.count]), "input", zero, "output", zero,
              np.full((1, 0), -1), 0)  # fmt: skip
    return spec.finish(b)
