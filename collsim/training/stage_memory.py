"""Memory per GPU of a layout's fullest pipeline stage: each stage's weights, gradients,
optimizer state and in-flight activations (:func:`collsim.training.layout.memory_per_gpu`), the
largest of them being what must fit."""

from __future__ import annotations

from collsim.training.layout import Layout, Memory, memory_per_gpu
from collsim.training.transformer import LayerCosts, loss_logits_bytes
from collsim.training.workload import WorkloadIn
from collsim.training.zero3 import stage_tensors


def worst_stage_memory(
    w: WorkloadIn,
    lay: Layout,
    stages: list[dict[str, float]],
    costs: list[LayerCosts],
    ranges: list[range],
    capacity: float,
) -> Memory:
    """The memory of the stage that needs the most (stages differ in layers, embeddings and
    micro-batches in flight); ``capacity`` is the GPU's memory in bytes."""
    worst: Memory | None = None
    logits = loss_logits_bytes(w.model, lay.tp, lay.micro) / lay.cp
    for i in range(lay.pp):
        mine = [costs[j] for j in ranges[i]]  # dense and expert layers alike
        kept = sum(c.act_bytes_recompute for c in mine) / len(mine)
        extra = max(c.act_bytes - c.act_bytes_recompute for c in mine)
        persistent = 0.0
        if lay.zero >= 3 and not w.parallel.fsdp:  # DeepSpeed keeps small tensors whole
            limit = w.training.persistence_threshold
            tensors = stage_tensors(w, lay, i, ranges[i])
            persistent = sum(t for layer in tensors for t in layer if t < limit)
        mem = memory_per_gpu(
            w, lay, stages[i]["params"], kept, extra, len(mine), capacity,
            expert_params_per_gpu=stages[i]["expert_params"], stage=i, logits_bytes=logits,
            persistent_params=persistent,
        )  # fmt: skip
        if worst is None or mem.total > worst.total:
            worst = mem
    assert worst is not None
    return worst
