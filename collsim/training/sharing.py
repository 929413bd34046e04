"""How many concurrent groups share a group's links: the contention per-group timers leave out.

The step model times one representative group of each kind (rank 0's TP, DP, EP group, its
pipeline neighbour) alone on the network (:mod:`collsim.training.comm`). In a real step its
sibling groups run the same collective at the same moment: the TP ranks of a stage all-reduce
their gradient shards together, every TP rank of a stage sends its slice to the next stage, all
expert-parallel groups exchange tokens at once. Where siblings cross the same links as the
representative -- GPUs sharing a NIC (4 NICs for 8 GPUs, one NIC per node), PCIe switch uplinks
that several groups' rings cross -- each gets a share of them; with a NIC per GPU and NVSwitch
inside the node (DGX, rail-optimised clusters) none do.

:func:`link_share` is that factor: the representative group's ring rate alone over its rate
when the links of its first node are shared in proportion to every concurrent group's crossings
(a shared link that stays faster than the ring's own bottleneck costs nothing). The timers then
run the group's collective with its rates divided by it (:func:`collsim.training.comm.make_timer`):
the bandwidth a fair share leaves, the latencies unchanged.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Sequence

from collsim.topology.graph import Network
from collsim.training.layout import Groups, Layout

KINDS = ("tp", "dp", "pp", "ep", "dp_expert", "cp")


def concurrent_groups(layout: Layout, names: Sequence[str], kind: str) -> list[list[str]]:
    """Every group of ``kind`` that runs together with rank 0's (that one first), by GPU name.

    ``tp``: every TP group (each layer, on every replica, context rank and stage); ``cp``: every
    CP group (each layer); ``dp``: the DP groups (``dp x cp`` GPUs) of the first stage's TP ranks
    (they reduce at the end of the same backward; other stages finish theirs at other times);
    ``pp``: every (TP rank, context rank, replica) pair of the first two stages; ``ep`` /
    ``dp_expert``: the expert-parallel groups and the groups holding the same experts, on the
    first stage."""
    t, d, p, e, c = layout.tp, layout.dp, layout.pp, max(1, layout.ep), layout.cp
    r = layout.rank
    if kind == "tp":
        return [[names[r(i, j, k, x)] for i in range(t)]
                for j in range(d) for k in range(p) for x in range(c)]  # fmt: skip
    if kind == "cp":
        return [[names[r(i, j, k, x)] for x in range(c)]
                for j in range(d) for k in range(p) for i in range(t)]  # fmt: skip
    if kind == "dp":
        return [[names[r(i, j, 0, x)] for j in range(d) for x in range(c)] for i in range(t)]
    if kind == "pp":
        if p < 2:
            return []
        return [[names[r(i, j, 0, x)], names[r(i, j, 1, x)]]
                for j in range(d) for i in range(t) for x in range(c)]  # fmt: skip
    if kind == "dp_expert" and e == 1:  # the same experts are everywhere: the DP groups
        return concurrent_groups(layout, names, "dp")
    if kind == "ep":
        return [[names[r(i, j0 + k, 0)] for k in range(e)]
                for j0 in range(0, d - e + 1, e) for i in range(t)]  # fmt: skip
    if kind == "dp_expert":
        return [[names[r(i, j, 0)] for j in range(j0, d, e)] for j0 in range(e) for i in range(t)]
    raise ValueError(f"unknown group kind {kind!r} (one of {', '.join(KINDS)})")


def group_shares(layout: Layout, groups: Groups, network: Network) -> dict[tuple[str, ...], float]:
    """:func:`link_share` of each of rank 0's groups (:func:`collsim.training.layout.place`),
    keyed by its GPUs (where two kinds are the same GPUs, the larger share)."""
    names = [g.name for g in network.topology.gpus]
    mine = {"tp": groups.tp, "dp": groups.dp, "pp": groups.pp_pair, "ep": groups.ep,
            "dp_expert": groups.dp_expert, "cp": groups.cp}  # fmt: skip
    out: dict[tuple[str, ...], float] = {}
    for kind, gpus in mine.items():
        if len(gpus) > 1:
            share = link_share(concurrent_groups(layout, names, kind), network)
            out[tuple(gpus)] = max(share, out.get(tuple(gpus), 1.0))
    return out


def link_share(groups: list[list[str]], network: Network) -> float:
    """How much slower the first group's ring runs beside the others, as a divisor of its
    links' rates: its ring's rate alone, ``min(capacity / own crossings)`` over the links
    it crosses, over its rate when each link is shared in proportion to the crossings of all
    groups, ``min(capacity / all crossings)`` (1: no sibling crosses a link that then limits
    it; a link the siblings cross that stays faster than the ring's own bottleneck costs
    nothing). A ring in rank order stands for each group's traffic: its hops out of and into
    the node cross the NICs and their PCIe paths, its hops inside the node the node's GPU links.
    Only the links of the first group's first GPU's node count (its GPUs', PCIe switches', NICs'
    and their cables; on a symmetric cluster every node is alike): where flows meet inside the
    switched fabric depends on its routing, left to the engine."""
    if not groups:
        return 1.0
    node_of, dev_node = _nodes(network)
    node = node_of[groups[0][0]]

    def here(link: int) -> bool:  # a link of the node: its GPUs, PCIe, NICs and their cables
        return node in (dev_node[network.link_src[link]], dev_node[network.link_dst[link]])

    def load(group: list[str]) -> dict[int, float]:
        out: dict[int, float] = defaultdict(float)
        if len(group) < 2:
            return out
        for a, b in zip(group, [*group[1:], group[0]], strict=True):
            if node_of[a] != node and node_of[b] != node:
                continue
            route = network.route(a, b)
            for link in route.links[: route.hops]:
                if here(link):
                    out[link] += 1.0
        return out

    own = load(groups[0])
    if not own:
        return 1.0
    total: dict[int, float] = defaultdict(float)
    for group in groups:
        for link, x in load(group).items():
            if link in own:
                total[link] += x
    cap = network.capacity_bytes_per_s
    alone = min(cap[link] / x for link, x in own.items())
    shared = min(cap[link] / total[link] for link in own)
    return float(max(1.0, alone / shared)) if shared > 0 else 1.0


_NODES: dict[int, tuple[weakref.ref[Network], dict[str, int | None], list[int | None]]] = {}


def _nodes(network: Network) -> tuple[dict[str, int | None], list[int | None]]:
    """(GPU name -> node, device index -> node), once per network."""
    hit = _NODES.get(id(network))
    if hit is None or hit[0]() is not network:
        hit = _NODES[id(network)] = (
            weakref.ref(network),
            {g.name: g.node for g in network.topology.gpus},
            [d.node for d in network.devices],
        )
    return hit[1], hit[2]
