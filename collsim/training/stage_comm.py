"""Tensor-, context- and expert-parallel communication of one pipeline stage's layers for one
micro-batch (what :meth:`collsim.training.step.StepModel._stage` adds to its compute).

* tensor parallelism: per layer 2 all-reduces forward and 2 backward of the layer output (a
  reduce-scatter + all-gather pair each with sequence parallelism), 2 more with full
  recomputation (Shoeybi et al. 2019; Korthikanti et al. 2022, section 4.2.2);
* context parallelism, ``cp_comm: allgather``: the whole sequence's keys and values all-gathered
  before the attention, again for its backward (and a full recomputation's forward), their
  gradients reduce-scattered, all exposed (Llama 3, Dubey et al. 2024, section 3.3.2);
  ``cp_comm: p2p`` (ring attention, Transformer Engine's ``AttnFuncWithCPAndKVP2P``): ``cp - 1``
  steps a layer, each sending the K/V chunk a rank holds to the next while attending to it,
  the backward sending K/V and their gradients: only what a step's transfer outlasts its share
  of the attention is exposed;
* expert parallelism: 2 all-to-alls (dispatch, combine) forward and 2 backward per MoE layer.
"""

from __future__ import annotations

from collections.abc import Callable

from collsim.training.layout import Groups, Layout
from collsim.training.transformer import LayerCosts
from collsim.training.workload import WorkloadIn

Coll = Callable[[str, list[str], float, str], float]


def stage_comm(
    coll: Coll,
    w: WorkloadIn,
    lay: Layout,
    groups: Groups,
    layers: list[LayerCosts],
    b: int,
    attention_s: tuple[float, float],
) -> dict[str, float]:
    """Seconds of the stage's TP (before any overlap), CP (exposed, its forward part, total)
    and EP communication for a micro-batch of ``b`` sequences; ``attention_s``: the stage's
    attention forward and backward seconds (what ring attention hides behind)."""
    algo = w.training.algorithm
    full = w.recomputes == "full"
    calls = 4 + (2 if full else 0)
    tp = ep = cp = cp_fwd = cp_total = 0.0
    attn_fwd, attn_bwd = attention_s
    for c in layers:
        if lay.cp > 1 and c.cp_bytes > 0 and w.parallel.cp_comm == "p2p":
            hop = coll("sendrecv", groups.cp[:2], c.cp_bytes * b / lay.cp, algo)
            steps = lay.cp - 1
            per = len(layers) * lay.cp  # one ring step's share of the stage's attention
            step_f = steps * max(0.0, hop - attn_fwd / per)
            step_b = steps * max(0.0, 2 * hop - attn_bwd / per)
            cp_fwd += step_f
            cp += (2 if full else 1) * step_f + step_b
            cp_total += steps * ((2 if full else 1) * hop + 2 * hop)
        elif lay.cp > 1 and c.cp_bytes > 0:
            gather = coll("all_gather", groups.cp, c.cp_bytes * b, algo)
            reduce = coll("reduce_scatter", groups.cp, c.cp_bytes * b, algo)
            cp_fwd += gather
            cp += (3 if full else 2) * gather + reduce
            cp_total += (3 if full else 2) * gather + reduce
        if lay.tp > 1 and c.tp_bytes > 0:
            size = c.tp_bytes * b
            if lay.sequence_parallel:
                one = coll("reduce_scatter", groups.tp, size, algo)
                one += coll("all_gather", groups.tp, size, algo)
            else:
                one = coll("all_reduce", groups.tp, size, algo)
            tp += calls * one
        if lay.ep > 1 and c.moe_tokens_bytes > 0:
            ep += calls * coll("alltoall", groups.ep, c.moe_tokens_bytes * b, algo)
    return {"tp": tp, "cp": cp, "cp_fwd": cp_fwd, "cp_total": cp_total, "ep": ep}
