"""The training step model: a workload on a cluster -> step time, its breakdown, memory per GPU.

Per micro-batch and pipeline stage (one GPU's view; ``b`` sequences, TP size ``t``):

* compute (:mod:`collsim.training.kernels`): each linear GEMM by its shape at the GPU's best
  measured matmul rate (:func:`matmul_flops`) x ``efficiency``, forward and its dgrad/wgrad
  backward; fused attention at measured kernel rates; non-GEMM bytes x ``elementwise_traffic``
  / memory bandwidth; recomputation adds a forward (full) or the attention core (selective) to
  the backward (FLOPs: :mod:`collsim.training.transformer`);
* tensor parallelism (:mod:`collsim.training.stage_comm`): per layer 2 all-reduces of the
  layer output forward and 2 backward (reduce-scatter + all-gather pairs with sequence
  parallelism), not overlapped as in Megatron-LM's papers, unless ``parallel.tp_overlap`` with
  sequence parallelism (Transformer Engine / NeMo userbuffers chunk them behind the GEMMs around
  them): then only what outlasts the layers' GEMMs per micro-batch is exposed;
* pipeline (Narayanan et al. 2021, section 2.2): with ``m`` micro-batches, ``p`` stages and ``v``
  virtual stages, ``m x max(stage) + (p-1)/v x mean(stage)``: the bubble fraction
  ``(p-1)/(m+p-1)`` for GPipe and 1F1B, ``/v`` interleaved; each micro-batch sends ``b s h``
  elements forward and back (``/t`` per rank with the scatter/gather optimisation, plus an
  all-gather inside the TP group; with sequence parallelism ``/t`` and no all-gather, the
  activations being split by sequence already), ``m v + p - 1`` times on the critical path;
* data parallelism: gradients (the fullest stage's parameters) all-reduced in buckets that
  overlap the last micro-batch's backward (PyTorch DDP; Li et al. 2020, arXiv:2006.15704): with
  ``n`` buckets of ``c`` seconds each in a backward of ``W``, ``max(n c - W (1 - 1/n), c)`` is
  exposed; without overlap one all-reduce of all gradients. ZeRO-1/2: reduce-scatter + all-gather
  (the all-reduce's volume); ZeRO-3/FSDP: all-gather weights in the forward and again in the
  backward, reduce-scatter gradients (1.5x the all-reduce's volume; Rajbhandari et al. 2020,
  section 7), per micro-batch and layer, one collective per tensor (DeepSpeed) or per layer
  (FSDP), ``max(0, comm - compute)`` exposed per layer with overlap
  (:mod:`collsim.training.zero3`);
* context parallelism over ``c`` GPUs: each computes ``1 / c`` of every sequence (FLOPs,
  activations, TP and pipeline messages ``/ c``); the keys and values move per layer as an
  exposed all-gather or as ring attention behind the attention (``parallel.cp_comm``,
  :mod:`collsim.training.stage_comm`); gradients are reduced over the ``dp x c`` GPUs holding
  the same weights;
* expert parallelism: 2 all-to-alls (dispatch, combine) forward and 2 backward per MoE layer;
* each kind of group is timed on rank 0's group, with the share of its links that the sibling
  groups running the same collective at once leave it (:mod:`collsim.training.sharing`);
* optimizer: memory-bound (Adam: 34 bytes per local parameter, SGD: 14);
* stragglers: per-GPU compute multipliers (mean 1, seeded), the synchronous step waits for the
  slowest of all GPUs: ``(E[max] - 1) x (compute + bubble)``; a replica's own GPUs (TP, CP, PP)
  meet every step whatever the sync mode (:func:`~.dataparallel.straggler_multiplier`);
* local SGD divides the data-parallel time by the period, and its replicas wait for the
  slowest one only at the averaging step, over ``k`` steps whose noise partly cancels;
  asynchronous training (``staleness >= 1``) hides it behind ``staleness`` steps and its
  replicas wait for no other (with staleness 0 it is synchronous); compression divides
  gradient bytes by the ratio and adds encode + decode time.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from collsim.topology.spec import Topology
from collsim.training.comm import CommTimer
from collsim.training.dataparallel import (
    data_parallel,
    expected_max_multiplier,
    overlapped_buckets,
    straggler_multiplier,
)
from collsim.training.kernels import (
    attention_seconds,
    flash_fractions,
    launch_floor_s,
    stage_linear_seconds,
)
from collsim.training.layout import (
    Groups,
    Layout,
    Memory,
    place,
    resolve_layout,
    sharded_params,
)
from collsim.training.precision import cast_seconds, linear_flops_per_s
from collsim.training.sharing import group_shares
from collsim.training.stage_comm import stage_comm
from collsim.training.stage_memory import worst_stage_memory
from collsim.training.step_result import (
    BREAKDOWN_KEYS,
    DEFAULT_EFFICIENCY,
    OPTIMIZER_BYTES,
    StepResult,
    bubble_fraction,
    matmul_flops,
    peak_flops,
    stage_layer_counts,
)
from collsim.training.transformer import (
    LayerCosts,
    generic_layer_costs,
    is_moe_layer,
    layer_costs,
    logits_flops,
    model_flops_per_sample,
)
from collsim.training.workload import DTYPE_BYTES, WorkloadError, WorkloadIn
from collsim.training.zero3 import expert_tails, stage_tensors

COMPUTE_PARTS = (
    "gemm", "attention", "memory_bound", "launch", "quantisation", "recompute", "logits_loss"
)  # fmt: skip
"""The parts of a stage's compute time :meth:`StepModel._stage` keeps (they sum to it)."""


class StepModel:
    """Step times of workloads on one topology, timing collectives with ``timer``."""

    def __init__(self, topology: Topology, timer: CommTimer, efficiency: float | None = None):
        self.topology = topology
        self.timer = timer
        self.efficiency = efficiency
        self.force_efficiency: float | None = None
        """Overrides the workload's own ``compute.efficiency`` (``--efficiency``)."""
        self._shares: dict[tuple[str, ...], float] = {}
        """Link shares of the current layout's groups (:meth:`_place`)."""

    def _efficiency(self, w: WorkloadIn) -> float:
        """``--efficiency`` > the workload's > the profile's > :data:`DEFAULT_EFFICIENCY`."""
        for eff in (self.force_efficiency, w.compute.efficiency, self.efficiency):
            if eff is not None:
                return eff
        return DEFAULT_EFFICIENCY

    def _coll(self, collective: str, gpus: list[str], size: float, algorithm: str) -> float:
        share = self._shares.get(tuple(gpus), 1.0)
        if share > 1.0:
            return self.timer.time_s(collective, gpus, size, algorithm, share=share)
        return self.timer.time_s(collective, gpus, size, algorithm)

    def _place(self, lay: Layout) -> Groups:
        """Rank 0's groups on the topology, and how many concurrent groups share the links each
        one crosses (:mod:`collsim.training.sharing`): its collectives are timed with that share
        of each link class."""
        groups = place(lay, self.topology)
        network = getattr(self.timer, "network", None)
        self._shares = group_shares(lay, groups, network) if network is not None else {}
        return groups

    def evaluate(self, w: WorkloadIn, n_gpus: int | None = None) -> StepResult:
        """The step of ``w`` on the first ``n_gpus`` GPUs (default: all) of the topology."""
        result = self._evaluate(w, n_gpus, fitting_only=False)
        assert result is not None
        return result

    def evaluate_if_fits(self, w: WorkloadIn, n_gpus: int | None = None) -> StepResult | None:
        """:meth:`evaluate`, or ``None`` when the layout does not fit in memory, found before
        the step is priced: a search discards such layouts without paying for their data
        parallelism (a 175B model's pure data parallelism over 1536 GPUs took 23 s to price,
        to be thrown away)."""
        return self._evaluate(w, n_gpus, fitting_only=True)

    def _evaluate(self, w: WorkloadIn, n_gpus: int | None, fitting_only: bool) -> StepResult | None:
        n = n_gpus if n_gpus is not None else self.topology.n_gpus
        lay = resolve_layout(w, n)
        groups = self._place(lay)
        eff = self._efficiency(w)
        peak = peak_flops(self.topology, w.dtype)
        mem_bw = self.topology.gpu.memory_bandwidth_bytes_per_s
        elem = DTYPE_BYTES[w.value_dtype]
        algo = w.training.algorithm
        b = lay.micro

        costs, ranges, stages = self._stages(w, lay, groups)
        mem = worst_stage_memory(
            w, lay, stages, costs, ranges, float(self.topology.gpu.memory_bytes)
        )
        if fitting_only and not mem.fits:
            return None
        per_mb = np.array([s["total"] for s in stages])
        slow = int(np.argmax(per_mb))
        crit = stages[slow]
        p, m, v = lay.pp, lay.m, lay.v
        bubble = (p - 1) / v * float(per_mb.mean())
        pp_comm = 0.0
        if p > 1:
            act = self._stage_bytes(w, b, elem) / lay.cp
            # Sequence parallelism leaves the activations split by sequence already: each rank
            # sends its 1/tp and the next stage starts on it (Megatron-LM gathers nothing then).
            split = lay.sequence_parallel or w.parallel.scatter_gather
            per_rank = act / lay.tp if split and lay.tp > 1 else act
            hop = self._coll("sendrecv", groups.pp_pair, per_rank, algo)
            if per_rank < act and not lay.sequence_parallel:
                hop += self._coll("all_gather", groups.tp, act, algo)
            pp_comm = (m * v + p - 1) * 2 * hop
        compute = m * crit["compute"]
        tp_comm = m * crit["tp"]
        cp_comm = m * crit["cp"]
        ep_comm = m * crit["ep"]

        # Data parallelism on the stage holding the most parameters.
        fullest = max(range(lay.pp), key=lambda i: stages[i]["params"])
        params_gpu = stages[fullest]["params"]
        tensors = stage_tensors(w, lay, fullest, ranges[fullest]) if lay.zero >= 3 else None
        tails = expert_tails(w, lay, fullest, ranges[fullest]) if lay.zero >= 3 else None
        dp_comm, compression, dp_detail = data_parallel(
            self._coll, w, lay, groups, params_gpu, crit, m, algo, tensors,
            expert_params_gpu=stages[fullest]["expert_params"], expert_tails=tails,
        )  # fmt: skip
        local_params = sharded_params(lay, params_gpu, stages[fullest]["expert_params"], 1)
        optimizer = local_params * OPTIMIZER_BYTES[w.training.optimizer] / mem_bw

        sync = w.training.sync
        strag = w.training.stragglers
        mult = straggler_multiplier(sync, strag, lay.dp, lay.replica_gpus)
        wait = (mult - 1.0) * (compute + bubble)
        breakdown = {
            "compute": compute,
            "tp_comm": tp_comm,
            "cp_comm": cp_comm,
            "ep_comm": ep_comm,
            "pp_comm": pp_comm,
            "bubble": bubble,
            "dp_comm": dp_comm,
            "optimizer": optimizer,
            "compression": compression,
            "straggler_wait": wait,
        }
        step = sum(breakdown.values())
        if not np.isfinite(step):  # an input beyond what the schemas bound (never a NaN printed)
            part = next(k for k, v in breakdown.items() if not np.isfinite(v))
            raise WorkloadError(
                f"the step's {part} time is not a finite number: an input of the workload or "
                "topology is far outside physical values",
                field=f"breakdown.{part}",
                value=breakdown[part],
            )
        samples = w.global_batch
        if w.model.kind == "transformer":
            model_flops = samples * model_flops_per_sample(w.model)
            tokens = samples * w.model.seq_len
        else:
            model_flops = samples * w.model.flops_per_sample
            tokens = float(samples)
        hw = model_flops + m * lay.shards * lay.tp * sum(s["recompute_flops"] for s in stages)
        details = {
            "efficiency": eff,
            "micro_batches": m,
            "bubble_fraction": bubble_fraction(p, m, v) if p > 1 else 0.0,
            "slowest_stage": slow,
            "stage_time_s": [float(x) for x in per_mb],
            "params_per_gpu": params_gpu,  # the stage holding the most (experts: one GPU's)
            "expert_params_per_gpu": stages[fullest]["expert_params"],
            "straggler_max_multiplier": mult,
            "sync": sync.mode,
            **dp_detail,
            "compute_parts_s": {k: m * crit[k] for k in COMPUTE_PARTS},
            "comm_total_s": {
                "tp_comm": m * crit["tp_total"],
                "cp_comm": m * crit["cp_total"],
                "ep_comm": ep_comm,
                "pp_comm": pp_comm,
                "dp_comm": dp_detail.pop("dp_total_s", dp_comm),
            },
        }
        if sync.mode == "async":
            details["staleness_steps"] = sync.staleness
        return StepResult(
            workload=w.name,
            topology=self.topology.name,
            layout=lay,
            step_time_s=step,
            breakdown=breakdown,
            model_flops=model_flops,
            hardware_flops=hw,
            peak_flops=peak * self.topology.gpu.slowdown,  # MFU against the datasheet
            memory=mem,
            tokens_per_step=tokens,
            details=details,
            unit="tokens" if w.model.kind == "transformer" else "samples",
        )

    def memory(self, w: WorkloadIn, n_gpus: int | None = None) -> Memory:
        """Memory per GPU of ``w`` on ``n_gpus`` GPUs (its fullest stage), as :meth:`evaluate`
        reports it, without pricing the step."""
        n = n_gpus if n_gpus is not None else self.topology.n_gpus
        lay = resolve_layout(w, n)
        costs, ranges, stages = self._stages(w, lay, self._place(lay))
        return worst_stage_memory(
            w, lay, stages, costs, ranges, float(self.topology.gpu.memory_bytes)
        )

    def one_layer(
        self, w: WorkloadIn, n_gpus: int | None = None, slowest: bool = False
    ) -> dict[str, float]:
        """:meth:`_stage`'s parts for ONE transformer layer and one micro-batch: the first layer,
        or with ``slowest`` the first of the slowest stage (:mod:`collsim.training.breakdown`)."""
        n = n_gpus if n_gpus is not None else self.topology.n_gpus
        lay = resolve_layout(w, n)
        groups = self._place(lay)
        eff = self._efficiency(w)
        costs = self._layer_costs(w, lay, DTYPE_BYTES[w.value_dtype])
        first = 0
        if slowest:
            _, ranges, stages = self._stages(w, lay, groups)
            first = ranges[int(np.argmax([s["total"] for s in stages]))][0]
        return self._stage(
            w, lay, groups, [costs[first]], -1, lay.micro,
            matmul_flops(self.topology, w.dtype) * eff,
            self.topology.gpu.memory_bandwidth_bytes_per_s, w.compute.elementwise_traffic,
            matmul_flops(self.topology, w.value_dtype) * eff,
        )  # fmt: skip

    def layer_times(self, w: WorkloadIn, n_gpus: int | None = None) -> tuple[float, float]:
        """Forward and backward (recomputation included) seconds of ONE transformer layer for
        one micro-batch, TP communication included: what Korthikanti et al. 2022 Table 4 lists."""
        one = self.one_layer(w, n_gpus)
        tp_fwd = one["tp"] * 2 / (4 + (2 if w.recomputes == "full" else 0))
        fwd = one["fwd"] + tp_fwd + one["cp_fwd"]
        return fwd, one["bwd"] + one["tp"] - tp_fwd + one["cp"] - one["cp_fwd"]

    def tp_comm_s(self, w: WorkloadIn, n_gpus: int, stage: int, tp_group: list[str]) -> float:
        """Tensor-parallel seconds per step of pipeline ``stage`` with rank 0's TP group on
        ``tp_group`` instead of where the layout puts it: what the TP collectives would cost on
        other GPUs (:mod:`collsim.training.tp_span` prices a group split over nodes inside one)."""
        lay = resolve_layout(w, n_gpus)
        groups = replace(self._place(lay), tp=list(tp_group))
        return lay.m * self._stages(w, lay, groups)[2][stage]["tp"]

    # -- pieces --------------------------------------------------------------------------------

    def _stages(
        self, w: WorkloadIn, lay: Layout, groups: Groups
    ) -> tuple[list[LayerCosts], list[range], list[dict[str, float]]]:
        """Every layer's costs, each pipeline stage's layers and its per-micro-batch times."""
        eff = self._efficiency(w)
        flops_s = matmul_flops(self.topology, w.dtype) * eff
        wide_s = matmul_flops(self.topology, w.value_dtype) * eff
        mem_bw = self.topology.gpu.memory_bandwidth_bytes_per_s
        traffic = w.compute.elementwise_traffic
        costs = self._layer_costs(w, lay, DTYPE_BYTES[w.value_dtype])
        stages = []
        ranges = []
        first = 0
        for i, count in enumerate(stage_layer_counts(w.model.layers, lay.pp)):
            idx = range(first, first + count)
            ranges.append(idx)
            first += count
            mine = [costs[j] for j in idx]
            stages.append(
                self._stage(w, lay, groups, mine, i, lay.micro, flops_s, mem_bw, traffic, wide_s)
            )
        return costs, ranges, stages

    def _layer_costs(self, w: WorkloadIn, lay: Layout, elem: int) -> list[LayerCosts]:
        model = w.model
        if model.kind == "generic":
            one = generic_layer_costs(model, tp=lay.tp, elem_bytes=elem)
            return [one] * model.layers
        cache: dict[bool, LayerCosts] = {}
        out = []
        for i in range(model.layers):
            moe = is_moe_layer(model, i)
            if moe not in cache:
                cache[moe] = layer_costs(
                    model, tp=lay.tp, sequence_parallel=lay.sequence_parallel,
                    recompute=w.recomputes, elem_bytes=elem, moe=moe, cp=lay.cp,
                )  # fmt: skip
            out.append(cache[moe])
        return out

    def _stage_bytes(self, w: WorkloadIn, b: int, elem: int) -> float:
        """Bytes of one micro-batch's activations between two stages (``b s h`` elements)."""
        if w.model.kind == "generic":
            return float(w.model.activation_bytes) * b
        return float(b * w.model.seq_len * w.model.hidden * elem)

    def _stage(
        self,
        w: WorkloadIn,
        lay: Layout,
        groups: Groups,
        layers: list[LayerCosts],
        index: int,
        b: int,
        flops_s: float,
        mem_bw: float,
        traffic: float,
        wide_s: float | None = None,
    ) -> dict[str, float]:
        """One micro-batch on one stage: compute, TP and EP communication, parameters.

        ``flops_s`` prices the linear layers' GEMMs (the training type's rate); ``wide_s`` the
        attention core and the output layer, which low-precision recipes keep in 16 bits
        (:mod:`collsim.training.precision`; default: ``flops_s``). The attention core is counted
        whole, as Megatron-LM counts it, at the 16-bit GEMM rate: a causal FlashAttention kernel
        skips the masked half but runs below the GEMMs' rate, and the two roughly cancel
        (reports/steptime_validation.md, the Llama 3 section)."""
        wide_s = wide_s or flops_s
        flops_s = linear_flops_per_s(w.recipe, flops_s, wide_s)
        gemm = sum(c.fwd_flops for c in layers) * b
        core = sum(c.attn_core_flops for c in layers) * b
        if w.model.kind == "transformer" and w.model.flash_attention:
            core_s, core_bwd = attention_seconds(
                core, w.model.seq_len / lay.cp, w.model.hidden / w.model.heads, wide_s,
                flash_fractions(self.topology.gpu.model),
            )  # fmt: skip
        else:  # the score matrix materialised: its GEMMs at the 16-bit rate
            core_s, core_bwd = core / wide_s, 2 * core / wide_s
        elementwise = sum(c.elementwise_bytes for c in layers) * b * traffic
        if w.model.kind == "transformer":  # each GEMM priced by its shape (:mod:`.kernels`)
            moe = sum(c.moe for c in layers)
            lin_fwd, lin_bwd = stage_linear_seconds(
                w.model, tokens=b * w.model.seq_len / lay.cp, tp=lay.tp, ep=lay.ep,
                dense_layers=len(layers) - moe, moe_layers=moe, rate_flops_s=flops_s,
                mem_bw_bytes_s=mem_bw, elem_bytes=DTYPE_BYTES[w.dtype], sms=self.topology.gpu.sms,
            )  # fmt: skip
        else:
            lin_fwd = (gemm - core) / flops_s
            lin_bwd = 2 * lin_fwd
        fwd_plain = lin_fwd + core_s + elementwise / mem_bw
        bwd_plain = lin_bwd + core_bwd + 2 * elementwise / mem_bw
        floor_fwd, floor_bwd = launch_floor_s(len(layers)) if layers else (0.0, 0.0)
        launch_fwd = max(0.0, floor_fwd - fwd_plain)
        launch = launch_fwd + max(0.0, floor_bwd - bwd_plain)
        cast_fwd, cast_bwd = (
            cast_seconds(w.model, w.recipe, lay.tp, lay.sequence_parallel, lay.cp, b, mem_bw)
            if w.model.kind == "transformer"
            else (0.0, 0.0)
        )
        cast_fwd, cast_bwd = cast_fwd * len(layers), cast_bwd * len(layers)
        fwd = fwd_plain + cast_fwd
        recompute_flops = 0.0
        if w.recomputes == "full":
            recompute_flops = gemm
            redo = fwd
        elif w.recomputes == "selective":
            recompute_flops = core
            redo = core_s
            redo += sum(c.attn_elementwise_bytes for c in layers) * b * traffic / mem_bw
        else:
            redo = 0.0
        params = sum(c.params for c in layers)
        extra = 0.0
        if w.model.kind == "transformer":
            model = w.model
            embed = model.vocab * model.hidden / lay.tp
            last = index == lay.pp - 1
            if index == 0:
                params += embed + model.seq_len * model.hidden / lay.tp
            if last:  # the output layer and loss run on this GPU's 1 / cp of the tokens
                lg = logits_flops(model, lay.tp) * b / lay.cp
                soft = 4.0 * model.seq_len * model.vocab * b / lay.tp / lay.cp * traffic
                extra = 3 * lg / wide_s + 3 * soft / mem_bw
                if lay.pp > 1 or not model.tied_embeddings:
                    params += embed
        compute = fwd_plain + bwd_plain + launch + cast_fwd + cast_bwd + redo + extra
        comm = stage_comm(self._coll, w, lay, groups, layers, b, (core_s, core_bwd))
        tp, cp, cp_fwd, ep = comm["tp"], comm["cp"], comm["cp_fwd"], comm["ep"]
        experts = sum(c.expert_params for c in layers) / lay.ep
        params -= experts * (lay.ep - 1)
        tp_total = tp  # before overlap: the breakdown shows total, hidden and exposed
        if w.parallel.tp_overlap:  # chunked behind the layers' GEMMs that produce / consume them
            tp = max(0.0, tp - (lin_fwd + lin_bwd + core_s + core_bwd + recompute_flops / flops_s))
        return {
            "compute": compute,
            # compute's parts (they sum to it): matmuls, memory-bound kernels, recomputation,
            # the output layer and loss; read by :mod:`collsim.training.breakdown`
            "gemm": lin_fwd + lin_bwd,
            "gemm_fwd": lin_fwd,
            "attention": core_s + core_bwd,
            "attention_fwd": core_s,
            "memory_bound": 3 * elementwise / mem_bw,
            "launch": launch,
            "launch_fwd": launch_fwd,
            "quantisation": cast_fwd + cast_bwd,
            "quantisation_fwd": cast_fwd,
            "recompute": redo,
            "logits_loss": extra,
            "tp_total": tp_total,
            "fwd": fwd + launch_fwd + extra / 3,
            "bwd": bwd_plain + launch - launch_fwd + cast_bwd + redo + 2 * extra / 3,
            "tp": tp,
            "cp": cp,
            "cp_fwd": cp_fwd,
            "cp_total": comm["cp_total"],
            "ep": ep,
            "total": compute + tp + cp + ep,
            "params": params,
            "expert_params": experts,
            "layers": float(len(layers)),
            "recompute_flops": recompute_flops,
        }


def step(
    w: WorkloadIn, topology: Topology, timer: CommTimer, efficiency: float | None = None
) -> StepResult:
    """One-call form of :meth:`StepModel.evaluate` on every GPU of ``topology``."""
    return StepModel(topology, timer, efficiency).evaluate(w)


def evaluate_layout(model: StepModel, w: WorkloadIn, n_gpus: int) -> StepResult | None:
    """:meth:`StepModel.evaluate`, or ``None`` when the layout is invalid for ``n_gpus``."""
    try:
        return model.evaluate(w, n_gpus)
    except WorkloadError:
        return None


__all__ = [
    "BREAKDOWN_KEYS",
    "DEFAULT_EFFICIENCY",
    "StepModel",
    "StepResult",
    "bubble_fraction",
    "evaluate_layout",
    "expected_max_multiplier",
    "overlapped_buckets",
    "resolve_layout",
    "step",
]
