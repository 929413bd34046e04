"""Tensor-parallel groups that span nodes, and what that costs.

Tensor parallelism exchanges activations several times per layer (:mod:`collsim.training.step`),
so Megatron-LM keeps a TP group inside one server, where NVLink is an order of magnitude faster
than the network. A layout whose TP size exceeds the GPUs of a node (``tp 8`` on 4-GPU GH200
nodes), or whose groups straddle a node boundary (``tp 4`` on 6-GPU nodes), sends those
exchanges over the scale-out network instead. A node here is an NVLink domain: a server, or
the 18 trays of 4 GPUs of a GB200/GB300 NVL72 rack (``nvlink_domain``), where ``tp 8`` to
``tp 64`` stays on NVLink through the rack's switch trays.
:func:`tp_span` finds such groups (ranks are placed as :mod:`collsim.training.layout` places
them: TP ranks consecutive, rank ``r`` on the topology's ``r``-th GPU); :func:`span_cost`
prices the TP collectives as placed and, where the group fits in one node, as they would cost
inside node 0, so a warning can say what the placement costs.
"""

from __future__ import annotations

from dataclasses import dataclass

from collsim.topology.spec import Topology
from collsim.training.layout import Layout
from collsim.training.step import StepModel, StepResult
from collsim.training.workload import WorkloadIn
from collsim.units import format_time


@dataclass(frozen=True)
class TpSpan:
    """How a layout's tensor-parallel groups sit on nodes."""

    tp: int
    nodes: int
    """The most nodes one TP group spans (1: every group inside a node)."""
    split_groups: int
    """TP groups spread over more than one node."""
    groups: int
    gpus_per_node: int
    """GPUs of the fullest node (how large a TP group one node could hold)."""
    widest_group: tuple[str, ...] = ()
    """The GPUs of the first group spanning the most nodes."""

    @property
    def spans(self) -> bool:
        return self.nodes > 1


def domain_of(topology: Topology, node: int | None) -> int | None:
    """The NVLink domain of a node (the node itself, where each node is its own domain)."""
    return None if node is None else node // max(1, topology.nvlink_domain_nodes)


def tp_span(layout: Layout, topology: Topology) -> TpSpan:
    """NVLink domains (servers, or NVL72 racks) spanned by the layout's TP groups (consecutive
    ranks on node-major GPUs)."""
    gpus = topology.gpus[: layout.n_gpus]
    per_node: dict[int | None, int] = {}
    for g in topology.gpus:
        d = domain_of(topology, g.node)
        per_node[d] = per_node.get(d, 0) + 1
    widest, split, example = 1, 0, ()
    groups = len(gpus) // max(1, layout.tp)
    if layout.tp > 1:
        for k in range(groups):
            members = gpus[k * layout.tp : (k + 1) * layout.tp]
            nodes = len({domain_of(topology, g.node) for g in members})
            if nodes > widest:
                widest, example = nodes, tuple(g.name for g in members)
            split += nodes > 1
    most = max(per_node.values(), default=1)
    return TpSpan(layout.tp, widest, split, groups, most, example)


@dataclass(frozen=True)
class SpanCost:
    """The TP collectives' seconds per step as placed, their share of the step, and inside one
    node (None where a node holds fewer GPUs than the group)."""

    span: TpSpan
    tp_comm_s: float
    share: float
    in_node_s: float | None

    def as_json(self) -> dict[str, object]:
        return {
            "tp": self.span.tp,
            "nodes": self.span.nodes,
            "split_groups": self.span.split_groups,
            "groups": self.span.groups,
            "gpus_per_node": self.span.gpus_per_node,
            "tp_comm_s": self.tp_comm_s,
            "share_of_step": self.share,
            "in_node_tp_comm_s": self.in_node_s,
        }

    def message(self, where: str = "") -> str:
        """One line for a ``# warning:``."""
        s = self.span
        if s.split_groups == s.groups:
            which = f"{'the' if s.groups == 1 else 'every'} tensor-parallel group ({s.tp} GPUs) "
            which += f"spans {s.nodes} nodes"
        else:
            which = f"{s.split_groups} of {s.groups} tensor-parallel groups ({s.tp} GPUs) span "
            which += f"{s.nodes} nodes"
        text = (
            f"{where}{which} ({s.gpus_per_node} GPUs per node): their TP communication takes "
            f"{format_time(self.tp_comm_s)} per step ({100 * self.share:.1f}% of the step)"
        )
        if self.in_node_s is None:
            return text + f"; a node holds only {s.gpus_per_node} GPUs: tp <= {s.gpus_per_node} " \
                "keeps it on the node's own links"  # fmt: skip
        return text + f", {format_time(self.in_node_s)} inside one node"


def span_cost(model: StepModel, w: WorkloadIn, result: StepResult) -> SpanCost | None:
    """What a TP group split over nodes costs (None when every group sits inside a node)."""
    span = tp_span(result.layout, model.topology)
    if not span.spans:
        return None
    stage = int(result.details.get("slowest_stage", 0))
    tp_s = result.breakdown["tp_comm"]  # rank 0's group, the one the step model times
    if result.layout.tp > 1 and tp_span_of_rank0(result.layout, model.topology) == 1:
        tp_s = model.tp_comm_s(w, result.n_gpus, stage, list(span.widest_group))
    topo = model.topology
    first = domain_of(topo, topo.gpus[0].node)
    node0 = [g.name for g in topo.gpus if domain_of(topo, g.node) == first]
    in_node = None
    if len(node0) >= span.tp:
        in_node = model.tp_comm_s(w, result.n_gpus, stage, node0[: span.tp])
    return SpanCost(span, tp_s, tp_s / result.step_time_s, in_node)


def tp_span_of_rank0(layout: Layout, topology: Topology) -> int:
    """NVLink domains rank 0's TP group spans (the group the step model times)."""
    return len({domain_of(topology, g.node) for g in topology.gpus[: layout.tp]})
