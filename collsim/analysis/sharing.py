"""How many concurrent groups share a NIC: the network contention the per-group timers leave out.

The step model times one representative group of each kind (rank 0's TP, DP, EP group, its
pipeline neighbour) alone on the network (:mod:`collsim.analysis.comm`). In a real step its
sibling groups run the same collective at the same moment: the TP ranks of a stage all-reduce
their gradient shards together, every TP rank of a stage sends its slice to the next stage, all
expert-parallel groups exchange tokens at once. Where siblings leave the node through the same
NIC as the representative -- GPUs sharing a NIC (4 NICs for 8 GPUs, one NIC per node) -- each
gets a share of it; with a NIC per GPU (DGX, rail-optimised clusters) none do.

:func:`nic_share` is that factor: over the NICs the representative group's members leave their
node through (:meth:`collsim.topology.graph.Network.nics_of`, split evenly where a GPU has
several), the largest ratio of the load of every concurrent group to the representative's own
(members that have a peer of their group on another node count; a group within one node does not
use its NICs). The timers then run the group's collective with the network's rates divided by it
(:func:`collsim.analysis.comm.make_timer`): the bandwidth a fair share leaves, the latencies
unchanged.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Sequence

from collsim.analysis.layout import Layout
from collsim.topology.graph import Network

KINDS = ("tp", "dp", "pp", "ep", "dp_expert")


def concurrent_groups(layout: Layout, names: Sequence[str], kind: str) -> list[list[str]]:
    """Every group of ``kind`` that runs together with rank 0's (that one first), by GPU name.

    ``tp``: every TP group (each layer, on every replica and stage); ``dp``: the DP groups of the
    first stage's TP ranks (they reduce at the end of the same backward; other stages finish
    theirs at other times); ``pp``: every (TP rank, replica) pair of the first two stages;
    ``ep`` / ``dp_expert``: the expert-parallel groups and the groups holding the same experts,
    on the first stage."""
    t, d, p, e = layout.tp, layout.dp, layout.pp, max(1, layout.ep)
    r = layout.rank
    if kind == "tp":
        return [[names[r(i, j, k)] for i in range(t)] for j in range(d) for k in range(p)]
    if kind == "dp":
        return [[names[r(i, j, 0)] for j in range(d)] for i in range(t)]
    if kind == "pp":
        if p < 2:
            return []
        return [[names[r(i, j, 0)], names[r(i, j, 1)]] for j in range(d) for i in range(t)]
    if kind == "ep":
        return [[names[r(i, j0 + k, 0)] for k in range(e)]
                for j0 in range(0, d - e + 1, e) for i in range(t)]  # fmt: skip
    if kind == "dp_expert":
        return [[names[r(i, j, 0)] for j in range(j0, d, e)] for j0 in range(e) for i in range(t)]
    raise ValueError(f"unknown group kind {kind!r} (one of {', '.join(KINDS)})")


def nic_share(groups: list[list[str]], network: Network) -> float:
    """The largest factor by which the groups together load a NIC the first group uses, over
    the first group's own load on it (1: no sibling shares its NICs; see the module), on the
    node of the first group's first GPU (on a symmetric cluster every node is alike)."""
    if not groups:
        return 1.0
    node_of = _node_of(network)
    node = node_of[groups[0][0]]

    def load(group: list[str]) -> dict[str, float]:
        here = [g for g in group if node_of[g] == node]
        if not here or len(here) == len(group):  # none here, or all of it: no NIC used
            return {}
        out: dict[str, float] = defaultdict(float)
        for g in here:
            nics = network.nics_of(g)
            for nic in nics:
                out[nic] += 1.0 / len(nics)
        return out

    own = load(groups[0])
    if not own:
        return 1.0
    total: dict[str, float] = defaultdict(float)
    for group in groups:
        for nic, x in load(group).items():
            if nic in own:
                total[nic] += x
    return max(1.0, max(total[nic] / own[nic] for nic in own))


_NODE_OF: dict[int, tuple[weakref.ref[Network], dict[str, int | None]]] = {}


def _node_of(network: Network) -> dict[str, int | None]:
    """GPU name -> node, once per network."""
    hit = _NODE_OF.get(id(network))
    if hit is None or hit[0]() is not network:
        hit = _NODE_OF[id(network)] = (
            weakref.ref(network),
            {g.name: g.node for g in network.topology.gpus},
        )
    return hit[1]
