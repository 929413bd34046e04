"""A workload's parallel layout on a cluster: sizes checked, ranks placed on GPUs, memory per GPU.

Ranks are ordered as Megatron-LM orders them: tensor-parallel ranks are consecutive (so a TP group
of up to 8 sits inside one DGX node), then context-parallel, then data-parallel, then pipeline
stages outermost: ``rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))``, rank
``r`` on the ``r``-th GPU of the topology (node-major; Megatron-Core's default order
``tp-cp-ep-dp-pp``). Expert-parallel groups are the first ``ep`` ranks of a data-parallel group
(EP inside DP, as Megatron-Core and DeepSpeed-MoE place them). Context-parallel ranks hold the
same weights and see parts of the same sequences, so gradients are reduced, and ZeRO shards, over
the ``dp x cp`` GPUs that hold a copy of the weights (Megatron-Core's data-parallel group "with
context parallelism").

Memory per GPU (mixed-precision Adam, Rajbhandari et al. 2020, ZeRO, arXiv:1910.02054, section
3.1): 2 bytes of 16-bit weights, 2 of gradients (4 when gradients are reduced in fp32, as
Megatron's main grads) and 12 of fp32 optimizer state (master weights, momentum, variance) per
parameter, i.e. 16 bytes; ZeRO-1 shards the 12 over DP, ZeRO-2 also the gradients, ZeRO-3/FSDP
everything, but gathers the weights of the layer it computes and of the one it prefetches, and
holds that layer's gradients until they are reduce-scattered (FSDP's unit: a transformer block;
Zhao et al. 2023, PyTorch FSDP, arXiv:2304.11277, section 3). Activations: Korthikanti et al.
2022 (see :mod:`collsim.training.transformer`) per layer, times the layers whose activations a
stage holds: on stage ``i``, ``p - i`` micro-batches of its layers with 1F1B, ``m`` with GPipe,
Megatron-LM's warm-up count of model chunks with ``v`` interleaved stages (the first stage:
``(1 + (p-1)/(p v))`` times 1F1B's; Korthikanti 2022, section 4.2.3); the last stage also keeps
the fp32 logits of the micro-batch whose loss it computes, ``4 s b V / t`` bytes (Korthikanti
2022, section 4.3; every micro-batch's with GPipe). Every stage is checked; the fullest sets
the layout's memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from collsim.topology.spec import Topology
from collsim.training.workload import DTYPE_BYTES, WorkloadError, WorkloadIn

OPTIMIZER_STATE_BYTES = {"adam": 12.0, "sgd": 8.0, "none": 0.0}
"""fp32 master weights + moments per parameter (ZeRO's K: 12 for Adam; SGD with momentum 8)."""


def optimizer_state_bytes(w: WorkloadIn) -> float:
    """Optimizer state per parameter: :data:`OPTIMIZER_STATE_BYTES` under mixed precision; with
    32-bit weights (fp32, tf32) the weights are their own master copy, so 4 bytes fewer (Adam:
    the two moments, 8)."""
    full = OPTIMIZER_STATE_BYTES[w.training.optimizer]
    return max(0.0, full - 4.0) if DTYPE_BYTES[w.value_dtype] >= 4 else full


@dataclass(frozen=True)
class Layout:
    """Resolved parallel sizes of one workload on ``n_gpus`` GPUs."""

    n_gpus: int
    tp: int
    pp: int
    dp: int
    ep: int
    v: int
    micro: int
    m: int
    """Micro-batches per pipeline per step (``global_batch / (dp * micro)``)."""
    schedule: str
    sequence_parallel: bool
    zero: int
    fsdp: bool = False
    """ZeRO-3 as PyTorch FSDP (per-layer gathers) rather than DeepSpeed (per-tensor)."""
    cp: int = 1
    """Context-parallel size: each sequence split over ``cp`` GPUs."""
    cp_comm: str = "allgather"
    """How the CP group moves keys and values: ``allgather`` or ``p2p`` (ring attention)."""

    def rank(self, tp_rank: int, dp_rank: int, pp_rank: int, cp_rank: int = 0) -> int:
        return tp_rank + self.tp * (cp_rank + self.cp * (dp_rank + self.dp * pp_rank))

    @property
    def shards(self) -> int:
        """GPUs holding a copy of the same weights, over which gradients are reduced and ZeRO
        shards: ``dp x cp``."""
        return self.dp * self.cp

    @property
    def global_batch(self) -> int:
        """Samples per step: ``m`` micro-batches of ``micro`` on each of ``dp`` replicas."""
        return self.m * self.micro * self.dp

    @property
    def replica_gpus(self) -> int:
        """GPUs of one data-parallel replica (``tp x cp x pp``): they meet every step."""
        return self.tp * self.cp * self.pp

    def label(self) -> str:
        text = f"tp{self.tp}-pp{self.pp}-dp{self.dp}"
        if self.cp > 1:
            text += f"-cp{self.cp}" + ("r" if self.cp_comm == "p2p" else "")
        if self.v > 1:
            text += f"-v{self.v}"
        if self.ep > 1:
            text += f"-ep{self.ep}"
        if self.fsdp:
            text += "-fsdp"
        elif self.zero:
            text += f"-zero{self.zero}"
        return text + f"-mb{self.micro}"


def resolve_layout(w: WorkloadIn, n_gpus: int) -> Layout:
    """Check the layout against the GPU count and the model; fill in ``dp: auto``."""
    par = w.parallel
    split = par.tp * par.cp * par.pp
    if n_gpus % split:
        names = "tp x cp x pp" if par.cp > 1 else "tp x pp"
        raise WorkloadError(
            f"{names} = {split} does not divide the {n_gpus} GPUs",
            field="parallel",
            value=f"tp={par.tp}, pp={par.pp}" + (f", cp={par.cp}" if par.cp > 1 else ""),
        )
    dp = n_gpus // split if par.dp == "auto" else par.dp
    if split * dp != n_gpus:
        names = "tp x cp x pp x dp" if par.cp > 1 else "tp x pp x dp"
        raise WorkloadError(
            f"{names} = {split * dp}, but the cluster has {n_gpus} GPUs (use dp: auto or --nodes)",
            field="parallel.dp",
            value=par.dp,
        )
    if w.global_batch % (dp * w.micro_batch):
        raise WorkloadError(
            f"global_batch {w.global_batch} is not a multiple of dp x micro_batch = "
            f"{dp} x {w.micro_batch}",
            field="global_batch",
            value=w.global_batch,
        )
    if dp % par.ep:
        raise WorkloadError("ep must divide dp", field="parallel.ep", value=par.ep)
    experts = w.model.experts if w.model.kind == "transformer" else None
    if par.ep > 1 and (experts is None or experts.count % par.ep):
        raise WorkloadError(
            f"ep must divide the experts ({experts.count if experts else 'none'})",
            field="parallel.ep",
            value=par.ep,
        )
    v = par.virtual_stages if par.schedule == "interleaved" else 1
    model = w.model
    # Interleaved, the first model chunk may hold only the embedding and the last only the
    # output layer and loss: Llama 3 405B ran 126 layers as 16 x 8 = 128 chunks (Dubey et al.
    # 2024, section 3.3.2). Stage totals are the same (stage_layer_counts), so only this check
    # changes.
    empty = min(2, par.pp) if v > 1 else 0
    if model.layers < par.pp * v - empty:
        raise WorkloadError(
            f"{model.layers} layers cannot fill pp x virtual_stages = {par.pp * v} stages"
            + (
                f" (at least {par.pp * v - empty}: only the first and last chunk may hold no "
                "layer, the embedding and the loss)"
                if empty
                else ""
            ),
            field="parallel.pp",
            value=par.pp,
        )
    # Layers that do not divide evenly go one more to middle stages (stage_layer_counts), with or
    # without interleaving: Megatron-Core's uneven pipeline split, Llama 3 405B's 126 layers on
    # 16 interleaved stages (Dubey et al. 2024, section 3.3.2); the slowest stage sets the pace.
    if model.kind == "transformer" and model.heads % par.tp:
        raise WorkloadError(
            f"tp must divide the {model.heads} attention heads", field="parallel.tp", value=par.tp
        )
    if model.kind == "transformer" and model.kv_heads is not None and model.kv_heads % par.tp:
        raise WorkloadError(  # each TP rank holds whole key/value groups (Megatron-LM)
            f"tp must divide the {model.kv_heads} key/value heads",
            field="parallel.tp",
            value=par.tp,
        )
    ffn = (
        (model.ffn if model.ffn is not None else 4 * model.hidden)
        if model.kind == "transformer"
        else 0
    )
    if ffn % par.tp:  # the MLP's first GEMM is split by columns over TP (Megatron-LM)
        raise WorkloadError(
            f"tp {par.tp} must divide the MLP width (model.ffn {ffn})", field="parallel.tp",
            value=par.tp,
        )  # fmt: skip
    m = w.global_batch // (dp * w.micro_batch)
    if v > 1 and m % par.pp:
        raise WorkloadError(  # Megatron-LM's interleaved schedule runs micro-batches in groups of p
            f"the interleaved schedule (virtual_stages {v}) needs micro-batches per replica "
            f"({m} = global_batch / (dp x micro_batch)) divisible by pp ({par.pp})",
            field="parallel.virtual_stages",
            value=v,
        )
    zero = 3 if par.fsdp else par.zero
    return Layout(
        n_gpus=n_gpus,
        tp=par.tp,
        pp=par.pp,
        dp=dp,
        ep=par.ep,
        v=v,
        micro=w.micro_batch,
        m=m,
        schedule=par.schedule,
        sequence_parallel=par.sequence_parallel,
        zero=zero,
        fsdp=par.fsdp,
        cp=par.cp,
        cp_comm=par.cp_comm,
    )


@dataclass(frozen=True)
class Groups:
    """The representative communication groups (GPU names) of rank 0's position."""

    tp: list[str]
    dp: list[str]
    """The GPUs holding rank 0's weights (its ``dp x cp`` ranks): where gradients are reduced."""
    ep: list[str]
    pp_pair: list[str]
    dp_expert: list[str]
    """The GPUs holding the same experts as rank 0 (every ep-th of its DP group): where expert
    gradients are reduced (DeepSpeed-MoE's expert-data-parallel group)."""
    cp: list[str] = field(default_factory=list)
    """Rank 0's context-parallel group (the GPUs sharing its sequences); one GPU without CP."""


def place(layout: Layout, topology: Topology) -> Groups:
    """Rank 0's TP, CP, DP and EP groups and its pipeline neighbour, on the topology's GPUs."""
    names = [g.name for g in topology.gpus]
    if len(names) < layout.n_gpus:
        raise WorkloadError(
            f"the layout needs {layout.n_gpus} GPUs; the topology has {len(names)}",
            field="--nodes",
            value=topology.nodes,
        )
    tp = [names[layout.rank(i, 0, 0)] for i in range(layout.tp)]
    dp = [names[layout.rank(0, j, 0, c)] for j in range(layout.dp) for c in range(layout.cp)]
    cp = [names[layout.rank(0, 0, 0, c)] for c in range(layout.cp)]
    ep = [names[layout.rank(0, j, 0)] for j in range(layout.ep)]
    pp = [names[layout.rank(0, 0, k)] for k in range(min(layout.pp, 2))]
    same_experts = dp  # EP with CP is refused (ParallelIn), so ep > 1 means cp == 1
    if layout.ep > 1:
        same_experts = [names[layout.rank(0, j, 0)] for j in range(0, layout.dp, layout.ep)]
    return Groups(tp=tp, dp=dp, ep=ep, pp_pair=pp, dp_expert=same_experts, cp=cp)


@dataclass(frozen=True)
class Memory:
    """Bytes per GPU on the fullest stage."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    reserve: float
    capacity: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.reserve

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def as_json(self) -> dict[str, float]:
        gb = 1e9
        return {
            "weights": self.weights / gb,
            "gradients": self.gradients / gb,
            "optimizer": self.optimizer / gb,
            "activations": self.activations / gb,
            "reserve": self.reserve / gb,
            "total": self.total / gb,
            "capacity": self.capacity / gb,
        }


def sharded_params(
    layout: Layout, params_per_gpu: float, expert_params_per_gpu: float, from_stage: int
) -> float:
    """Parameters one GPU keeps a copy of for a ZeRO stage that shards from ``from_stage`` on
    (1: optimizer state, 2: gradients, 3: weights): dense ones over dp x cp, the experts' (part
    of ``params_per_gpu``) over the dp / ep GPUs that hold each expert."""
    if layout.zero < from_stage:
        return params_per_gpu
    dense = params_per_gpu - expert_params_per_gpu
    experts = expert_params_per_gpu / max(1, layout.shards // layout.ep)
    return dense / layout.shards + experts


def memory_per_gpu(
    w: WorkloadIn,
    layout: Layout,
    params_per_gpu: float,
    act_bytes_per_layer: float,
    recompute_extra_bytes: float,
    stage_layers: int,
    capacity_bytes: float,
    expert_params_per_gpu: float = 0.0,
    stage: int = 0,
    logits_bytes: float = 0.0,
    persistent_params: float = 0.0,
) -> Memory:
    """Weights, gradients, optimizer state and activations of one GPU of pipeline ``stage``
    (module docstring).

    ``act_bytes_per_layer``: what a layer keeps per sample for its backward, the mean over the
    stage's layers (a mixture-of-experts model alternates dense and expert layers);
    ``recompute_extra_bytes``: what the layer being recomputed regenerates on top of that (the
    largest over the stage's layers), per sample.

    ``expert_params_per_gpu`` (part of ``params_per_gpu``) are replicated over dp / ep GPUs only
    (each expert-parallel group holds every expert once), so ZeRO shards them that many ways.
    ``persistent_params`` (part of ``params_per_gpu``): what ZeRO-3 keeps whole on every GPU
    (DeepSpeed's tensors under its persistence threshold), weights unsharded.
    Micro-batches in flight on stage ``i`` of ``p`` (Megatron-LM's warm-up counts): ``p - i``
    with 1F1B; ``2 (p - i - 1) + (v - 1) p + 1`` model chunks of ``1/v`` of the stage's layers
    interleaved (``p + (p - 1)/v`` micro-batches' worth on the first stage, Narayanan et al.
    2021); every micro-batch with GPipe."""
    elem = DTYPE_BYTES[w.value_dtype]
    grad_elem = DTYPE_BYTES[w.grad_dtype]

    def sharded(bytes_per_param: float, from_stage: int) -> float:
        return sharded_params(layout, params_per_gpu, expert_params_per_gpu, from_stage) * (
            bytes_per_param
        )

    weights = sharded(elem, 3)
    grads = sharded(grad_elem, 2)
    if layout.zero >= 3 and layout.shards > 1:
        # Sharded weights are gathered a layer at a time: the layer computing and the one
        # prefetched (where there is a next) are whole (TP-sharded) at once, and its gradients
        # until reduce-scattered; never more than the stage's unsharded weights.
        unit = params_per_gpu / max(1, stage_layers)
        whole = persistent_params * (1 - 1 / layout.shards) * elem
        weights = min(weights + whole + min(2, stage_layers) * unit * elem, params_per_gpu * elem)
        grads = min(grads + unit * grad_elem, params_per_gpu * grad_elem)
    optim = sharded(optimizer_state_bytes(w), 1)
    p, m, v = layout.pp, layout.m, layout.v
    if layout.schedule == "gpipe" and p > 1:  # without a pipeline, one micro-batch at a time
        in_flight = stage_layers * m
    elif v > 1:
        in_flight = stage_layers / v * min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v)
    else:
        in_flight = stage_layers * min(p - stage, m)
    acts = act_bytes_per_layer * layout.micro * in_flight
    if w.recomputes != "none":  # the layer being recomputed regenerates what it did not keep
        acts += recompute_extra_bytes * layout.micro
    if stage == p - 1:  # the loss's fp32 logits (``logits_bytes``: one micro-batch's)
        acts += logits_bytes * (m if layout.schedule == "gpipe" and p > 1 else 1)
    return Memory(
        weights=weights,
        gradients=grads,
        optimizer=optim,
        activations=acts,
        reserve=float(w.compute.memory_reserve),
        capacity=capacity_bytes,
    )
