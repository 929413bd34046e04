"""Per-layer arithmetic of a GPT-style transformer: parameters, FLOPs, activation bytes.

Notation of Narayanan et al. 2021 (arXiv:2104.04473, section 5.1 and appendix): ``l`` layers,
hidden size ``h``, ``a`` heads, vocabulary ``V``, sequence length ``s``, batch ``B``.

* Forward FLOPs of one layer for one sequence: ``24 s h^2 + 4 s^2 h`` (QKV, attention scores and
  values, output projection, the 4h MLP), generalised here to grouped-query attention
  (``2 s h (h + 2 h_kv)`` for QKV), any FFN width and gated MLPs (3 matrices); logits
  ``2 s h V``. Backward = 2 x forward, so model FLOPs per iteration are
  ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))`` (Korthikanti et al. 2022, arXiv:2205.05198, App. A)
  and, with full recomputation (one more forward of every layer, not of the logits),
  ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))`` (Narayanan et al. 2021, Eq. 3). Selective
  recomputation re-runs only the attention core's forward (Korthikanti 2022, section 5):
  ``+4 B s^2 h`` per layer, hardware FLOPs ``72 B s l h^2 (1 + 2s/(9h) + V/(12 l h))``.
* Parameters: ``12 l h^2 (1 + 13/(12 h) + (V + s)/(12 l h))`` (Narayanan 2021, section 5.1).
* Activation memory of one layer for one micro-batch of ``b`` sequences, 16-bit activations
  (32-bit ones: twice),
  tensor-parallel size ``t`` (Korthikanti 2022, section 4, Eqs. 1-6):
  ``s b h (34 + 5 a s / h)`` without parallelism, ``s b h (10 + 24/t + 5 a s/(h t))`` with TP,
  ``s b h/t (34 + 5 a s / h)`` with TP + sequence parallelism, ``34 s b h / t`` with selective
  recomputation and SP, ``2 s b h`` (``/t`` with SP) with full recomputation (only the layer
  input is kept). FlashAttention (never materialising the ``a s^2`` scores) drops ``5 a s / h``.
* Context parallelism over ``c`` GPUs: each holds ``s / c`` tokens of every sequence and attends
  with them to the whole sequence's keys and values (two chunks of ``s / 2c`` tokens, one early
  and one late, so every rank gets the same share of the causal mask), so every FLOP and
  activation byte above is ``/ c``; the keys and values of the whole sequence, ``2 s h_kv``
  elements (``/ t`` with TP), are all-gathered before the attention, gathered again for its
  backward (only the local ones are kept) and their gradients reduce-scattered after it (Llama
  3's all-gather-based context parallelism, Dubey et al. 2024, section 3.3.2; Transformer
  Engine's ``AttnFuncWithCPAndKVAllGather``, which Megatron-Core runs; its ring attention moves
  the same bytes in ``c`` steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from collsim.training.workload import GenericIn, TransformerIn


@dataclass(frozen=True)
class LayerCosts:
    """One layer's costs for ONE sequence (sample) on ONE tensor-parallel rank (its ``1 / cp``
    of the sequence with context parallelism)."""

    fwd_flops: float
    """Forward GEMM FLOPs (attention core included)."""
    attn_core_flops: float
    """The part selective recomputation repeats (``4 s^2 h / t``)."""
    act_bytes: float
    """Activation bytes kept for backward (Korthikanti 2022), no recomputation."""
    act_bytes_recompute: float
    """Activation bytes kept with the workload's recomputation setting."""
    elementwise_bytes: float
    """Bytes that non-GEMM kernels (layer norm, softmax, dropout, GeLU, residual) write in the
    forward pass: the activations they produce, i.e. :attr:`act_bytes` (the proxy used here)."""
    attn_elementwise_bytes: float
    """The softmax/dropout part of it (``5 a s^2`` bytes / t), re-run by selective recompute."""
    tp_bytes: float
    """Bytes of one tensor-parallel all-reduce (``s h`` x element bytes): the layer output."""
    moe_tokens_bytes: float
    """Bytes each rank sends in one expert-parallel all-to-all (``s h top_k`` x element bytes /
    t), 0 for a dense layer."""
    params: float
    """Parameters of the layer held by one tensor-parallel rank (all experts included)."""
    expert_params: float = 0.0
    """The experts' share of :attr:`params` (divided by EP on each GPU)."""
    cp_bytes: float = 0.0
    """Bytes of the whole sequence's keys and values on one TP rank (``2 s h_kv / t`` x element
    bytes): what context parallelism all-gathers per layer; 0 without it."""
    moe: bool = False
    """The layer holds experts (its MLP is the experts')."""


def kv_width(m: TransformerIn) -> int:
    """Width of the keys (and of the values): ``h``, or ``h kv_heads / heads`` with GQA."""
    return m.hidden if m.kv_heads is None else m.hidden * m.kv_heads // m.heads


def ffn_width(m: TransformerIn) -> int:
    """The MLP's hidden width (default ``4 h``)."""
    return m.ffn if m.ffn is not None else 4 * m.hidden


def _mlp_matrices(m: TransformerIn) -> int:
    return 3 if m.gated_mlp else 2


def _mlp_params(m: TransformerIn) -> float:
    return _mlp_matrices(m) * m.hidden * ffn_width(m) + ffn_width(m) + m.hidden


def layer_params(m: TransformerIn, moe: bool = False) -> float:
    """Parameters of one layer (weights and biases, 2 layer norms): ``12 h^2 + 13 h``."""
    h, kv = m.hidden, kv_width(m)
    attn = h * (h + 2 * kv) + h * h + (h + 2 * kv) + h
    mlp = _mlp_params(m)
    if moe and m.experts is not None:
        mlp *= m.experts.count
    return attn + mlp + 4 * h


def is_moe_layer(m: TransformerIn, index: int) -> bool:
    """Whether layer ``index`` (0-based) holds experts (every ``experts.every``-th layer)."""
    return m.experts is not None and (index + 1) % m.experts.every == 0


def total_params(m: TransformerIn) -> float:
    """All parameters, embeddings (``V h + s h``) included once (tied output layer)."""
    body = sum(layer_params(m, is_moe_layer(m, i)) for i in range(m.layers))
    embed = m.vocab * m.hidden + m.seq_len * m.hidden
    if not m.tied_embeddings:
        embed += m.vocab * m.hidden
    return body + embed


def layer_costs(
    m: TransformerIn,
    *,
    tp: int,
    sequence_parallel: bool,
    recompute: str,
    elem_bytes: int,
    moe: bool = False,
    padded: bool = True,
    cp: int = 1,
) -> LayerCosts:
    """Costs of one layer for one sequence on one TP rank, its ``1 / cp`` of the tokens with
    context parallelism (see the module docstring); ``padded=False`` leaves out the experts'
    capacity padding (the model FLOPs MFU counts)."""
    h, s, a, kv, f = m.hidden, m.seq_len, m.heads, kv_width(m), ffn_width(m)
    top_k = m.experts.top_k if (moe and m.experts is not None) else 1
    # Experts run on buffers padded to capacity_factor x their even share of the tokens (GShard,
    # Lepikhin et al. 2020; Switch, Fedus et al. 2021): the all-to-all and the expert MLPs move and
    # compute the padding too (1: dropless).
    # Dropless routing (capacity factor 1) instead waits for the busiest rank's tokens.
    cf = m.experts.load_factor if (moe and padded and m.experts is not None) else 1.0
    mlp = 2 * _mlp_matrices(m) * s * h * f * top_k * cf
    core = 4 * s * s * h
    fwd = 2 * s * h * (h + 2 * kv) + core + 2 * s * h * h + mlp
    # Korthikanti's 24 s b h (the TP-split activations) is 8 (attention) + 16 (4h MLP); 10 s b h
    # (layer-norm inputs, dropout masks) is not split by TP unless sequence parallelism is on.
    # An MoE layer's experts hold the MLP activations of every token routed to them: top_k
    # copies of each, padded to the capacity factor.
    # The attention's 8 is Q and K (4), V (2) and the projection's input (2); with grouped-query
    # attention K and V are kv/h of that size: 4 + 4 kv/h.
    split = 4 + 4 * kv / h + (2 if m.gated_mlp else 1) * 4 * f / h * (top_k * cf)
    replicated = 10 / tp if sequence_parallel else 10
    scores = 0.0 if m.flash_attention else 5 * a * s / h
    # Korthikanti's counts are for 16-bit activations: 32-bit ones take twice the bytes.
    width = elem_bytes / 2
    per_sbh = (replicated + split / tp + scores / tp) * width
    act = s * h * per_sbh
    if recompute == "full":
        kept = 2 * s * h / (tp if sequence_parallel else 1) * width
    elif recompute == "selective":
        kept = s * h * (replicated + split / tp) * width
    else:
        kept = act
    return LayerCosts(
        fwd_flops=fwd / tp / cp,
        attn_core_flops=core / tp / cp,
        act_bytes=act / cp,
        act_bytes_recompute=kept / cp,
        elementwise_bytes=act / cp,
        attn_elementwise_bytes=s * h * scores / tp * width / cp,
        tp_bytes=s * h * elem_bytes / cp,
        moe_tokens_bytes=(s * h * top_k * cf * elem_bytes / tp / cp) if moe else 0.0,
        params=layer_params(m, moe) / tp,
        expert_params=(layer_params(m, True) - layer_params(m, False) + _mlp_params(m)) / tp
        if moe and m.experts is not None
        else 0.0,
        cp_bytes=2 * s * kv * elem_bytes / tp if cp > 1 else 0.0,
        moe=moe and m.experts is not None,
    )


def routing_imbalance(experts: int, tokens: float, top_k: int) -> float:
    """Expected busiest-expert load over the mean when ``tokens`` each pick ``top_k`` of
    ``experts`` uniformly at random (a balanced router at best): loads are binomial with mean
    ``mu = tokens top_k / experts``; the largest of ``experts`` such loads is about
    ``mu + sqrt(2 mu ln(experts))`` (the Gaussian extreme-value approximation)."""
    mu = tokens * top_k / experts
    if mu <= 0 or experts <= 1:
        return 1.0
    return 1.0 + math.sqrt(2.0 * math.log(experts) / mu)


def loss_logits_bytes(m: TransformerIn | GenericIn, tp: int, micro: int) -> float:
    """The fp32 logits the loss keeps for its backward on the last pipeline stage, for one
    micro-batch of ``micro`` sequences on one TP rank: ``4 s b V / t`` (Korthikanti et al. 2022,
    section 4.3); none for a generic job."""
    if m.kind != "transformer":
        return 0.0
    return 4.0 * m.seq_len * micro * m.vocab / tp  # type: ignore[union-attr]


def logits_flops(m: TransformerIn, tp: int) -> float:
    """Forward FLOPs of the output layer for one sequence on one TP rank: ``2 s h V / t``."""
    return 2 * m.seq_len * m.hidden * m.vocab / tp


def model_flops_per_sample(m: TransformerIn) -> float:
    """Model FLOPs (forward + backward, no recomputation) of one sequence:
    ``72 s l h^2 (1 + s/(6h) + V/(12 l h))`` for a plain GPT (Korthikanti 2022, App. A)."""
    fwd = sum(
        layer_costs(
            m, tp=1, sequence_parallel=False, recompute="none", elem_bytes=2,
            moe=is_moe_layer(m, i), padded=False,
        ).fwd_flops
        for i in range(m.layers)
    )  # fmt: skip
    return 3 * (fwd + logits_flops(m, 1))


def eq3_flops_per_sample(m: TransformerIn) -> float:
    """Narayanan et al. 2021 Eq. 3 divided by ``B``: ``96 s l h^2 (1 + s/(6h) + V/(16 l h))``,
    the FLOP count behind their "teraFLOP/s per GPU" (full recomputation counted)."""
    h, s, l_, v = m.hidden, m.seq_len, m.layers, m.vocab
    return 96 * s * l_ * h * h * (1 + s / (6 * h) + v / (16 * l_ * h))


def generic_layer_costs(g: GenericIn, *, tp: int, elem_bytes: int) -> LayerCosts:
    """A generic job spread evenly over its ``layers``: FLOPs and bytes per layer, /t by TP."""
    per_layer = g.flops_per_sample / 3 / g.layers
    return LayerCosts(
        fwd_flops=per_layer / tp,
        attn_core_flops=0.0,
        act_bytes=g.activation_memory_bytes / g.layers / tp,
        act_bytes_recompute=g.activation_memory_bytes / g.layers / tp,
        elementwise_bytes=0.0,
        attn_elementwise_bytes=0.0,
        tp_bytes=float(g.tp_bytes_per_layer),
        moe_tokens_bytes=0.0,
        params=g.params / g.layers / tp,
    )
