"""Which GPUs reach each other: a loaded topology must connect every GPU to every other
(:func:`check_connected`, for the loader), and a topology with failed parts names those cut off
(:func:`unreachable_gpus`, for the faults). GPUs reach each other through forwarding devices
(switches, NICs, CPUs, relaying GPUs of a chip-level torus) or a direct link, never through a
third GPU.
"""

from __future__ import annotations

import networkx as nx

from collsim.errors import TopologyError
from collsim.topology.spec import Topology


def check_connected(topo: Topology) -> None:
    """Every GPU must reach every other GPU without passing through a third GPU.

    Two GPUs reach each other when they touch the same connected component of forwarding devices
    (switches, NICs, CPUs; relaying GPUs of a chip-level torus count as forwarding) or share a
    direct link.
    """
    forwarding = {d.name for d in topo.devices if d.forwards}
    core = nx.Graph()
    core.add_nodes_from(forwarding)
    core.add_edges_from((lk.a, lk.b) for lk in topo.links if {lk.a, lk.b} <= forwarding)
    comp_of = {n: i for i, comp in enumerate(nx.connected_components(core)) for n in comp}
    gpus = [g.name for g in topo.gpus]
    comps: dict[str, set[int]] = {g: set() for g in gpus}
    direct: dict[str, set[str]] = {g: set() for g in gpus}
    for g in gpus:
        if g in comp_of:
            comps[g].add(comp_of[g])
    for lk in topo.links:
        for here, there in ((lk.a, lk.b), (lk.b, lk.a)):
            if here in comps and here not in forwarding:
                if there in comp_of:
                    comps[here].add(comp_of[there])
                else:
                    direct[here].add(there)

    def reach(a: str, b: str) -> bool:
        return bool(comps[a] & comps[b]) or b in direct[a]

    if set.intersection(*(comps[g] for g in gpus)):
        return
    first = gpus[0]
    unreachable = [g for g in gpus[1:] if not reach(first, g)]
    if unreachable:
        shown = ", ".join(unreachable[:6]) + (" ..." if len(unreachable) > 6 else "")
        raise TopologyError(
            f"{len(unreachable)} GPU(s) cannot reach {first}: {shown}",
            field="links",
            value=len(unreachable),
        )
    for i, a in enumerate(gpus[:256]):
        for b in gpus[i + 1 : 256]:
            if not reach(a, b):
                raise TopologyError(f"GPU {b} cannot reach {a}", field="links", value=b)


def unreachable_gpus(topo: Topology) -> list[str]:
    """GPUs cut off from the largest group of GPUs that reach each other through forwarding
    devices (switches, NICs, CPUs, relaying GPUs), in rank order."""
    forwarding = {d.name for d in topo.devices if d.forwards}
    core = nx.Graph()
    core.add_nodes_from(forwarding)
    core.add_edges_from((lk.a, lk.b) for lk in topo.links if {lk.a, lk.b} <= forwarding)
    comp_of = {n: i for i, comp in enumerate(nx.connected_components(core)) for n in comp}
    touches: dict[str, set[int]] = {g.name: set() for g in topo.gpus}
    for g in touches:
        if g in comp_of:
            touches[g].add(comp_of[g])
    for lk in topo.links:
        for here, there in ((lk.a, lk.b), (lk.b, lk.a)):
            if here in touches and there in comp_of:
                touches[here].add(comp_of[there])
    count: dict[int, int] = {}
    for comps in touches.values():
        for c in comps:
            count[c] = count.get(c, 0) + 1
    if not count:  # nothing forwards any more: only GPUs linked directly still reach each other
        gpus = nx.Graph()
        gpus.add_nodes_from(touches)
        gpus.add_edges_from((lk.a, lk.b) for lk in topo.links if {lk.a, lk.b} <= set(touches))
        main_group = max(
            nx.connected_components(gpus), key=lambda c: (len(c), topo.gpus[0].name in c)
        )
        return [g for g in touches if g not in main_group]
    first = touches[topo.gpus[0].name]
    main = max(count, key=lambda c: (count[c], c in first, -c))  # ties: rank 0's side
    return [g for g, comps in touches.items() if main not in comps]
