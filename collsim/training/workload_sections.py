"""The sections of a training workload file (pydantic, unknown keys rejected) and the field
types and validators they share: the model (``transformer``, ``generic``, ``experts``), the
``parallel`` layout, ``training`` options (stragglers, sync, compression), ``compute`` and
``resilience``. :mod:`collsim.training.workload` puts them together into one workload and
loads files; ``docs/workload-format.md`` documents every field.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from collsim import units
from collsim.dtypes import canonical_dtype
from collsim.errors import CollsimError, UnitError
from collsim.topology.schema import Strict

_COUNT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMBT]?)\s*$")
_COUNT_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


def parse_count(value: object) -> float:
    """A count such as ``175B`` (1.75e11), ``6.7B``, ``125M``, ``1e9`` or a bare number."""
    if isinstance(value, bool):
        raise ValueError(f"expected a count, got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        match = _COUNT.match(value)
        if match:
            return float(match.group(1)) * _COUNT_SCALE[match.group(2)]
    raise ValueError(f"malformed count {value!r} (use e.g. 175B, 125M, 1.2e9)")


def _size(value: object) -> object:
    try:
        return units.parse_size(value)  # type: ignore[arg-type]
    except UnitError as exc:
        raise ValueError(exc.message) from None


def _checked(
    parse: Any, what: str, zero_ok: bool = False, longest: tuple[float, str] | None = None
) -> Any:
    """A validator that parses ``value`` (a rate or duration string) to check it, and keeps the
    text as written so that a dumped workload validates again (``with_changes``)."""

    def check(value: object) -> object:
        try:
            parsed = parse(value)
        except UnitError as exc:
            raise ValueError(exc.message) from None
        if not parsed < float("inf") or parsed < 0 or (parsed == 0 and not zero_ok):
            raise ValueError(f"{what} must be finite and {'>= 0' if zero_ok else '> 0'}")
        if longest is not None and parsed > longest[0]:
            raise ValueError(f"{what} must be at most {longest[1]}")
        return value

    return BeforeValidator(check)


_A_YEAR = (365 * 86400.0, "a year")
"""The longest restart or repair time a workload may give (seconds, words)."""


def _duration(value: object) -> float:
    return units.parse_duration_s(value)


Count = Annotated[float, BeforeValidator(parse_count), Field(gt=0)]
Size = Annotated[int, BeforeValidator(_size), Field(ge=0)]
Pos = Annotated[int, Field(ge=1)]
# Upper bounds far beyond any model built, that keep every product of them finite and within
# 64-bit integers (a hidden size of 8e12 overflowed, 1e8 layers ran for minutes).
Layers = Annotated[int, Field(ge=1, le=100_000)]
Width = Annotated[int, Field(ge=1, le=1 << 24)]
Fraction = Annotated[float, Field(gt=0, le=1)]


def _divides(value: int | None, name: str, info: ValidationInfo, whole: str) -> int | None:
    """``value`` (field ``name``) must divide the already validated field ``whole``; a field
    validator's error names ``name`` and its value (a model validator's names only the model)."""
    total = info.data.get(whole)
    if value is not None and total is not None and total % value:
        raise ValueError(f"{whole} ({total}) must be a multiple of {name} ({value})")
    return value


_TRAINING_NAME = {"bfloat16": "bf16", "half": "fp16", "float": "fp32", "f8e4m3": "fp8",
                  "f8e5m2": "fp8", "tf32": "tf32"}  # fmt: skip
"""The canonical type (:mod:`collsim.dtypes`) -> the training data type's name."""


def training_dtype(allowed: tuple[str, ...]) -> Any:
    """A validator that takes any name :func:`canonical_dtype` knows for one of the training types
    ``allowed`` (``bfloat16``, ``BF16``, ``float16``, ``float32``, ``e4m3``, ...) and keeps the
    training name (``bf16``, ``fp16``, ``fp32``, ``fp8``, ``tf32``), as the rest of the file."""
    types = tuple(t for t, name in _TRAINING_NAME.items() if name in allowed)

    def check(value: object) -> object:
        if not isinstance(value, str):
            return value  # the type check says what it is
        if "fp4" in allowed and value.strip().lower() in ("fp4", "nvfp4", "e2m1"):
            return "fp4"  # no collective carries FP4: not in collsim.dtypes
        try:
            return _TRAINING_NAME[canonical_dtype(value, types)]
        except CollsimError:
            raise ValueError(
                f"not a training data type (choose from {', '.join(allowed)}, or another name "
                "of one: bfloat16, float16, float32, e4m3, ...)"
            ) from None

    return BeforeValidator(check)


class ExpertsIn(Strict):
    """Mixture of experts: ``count`` experts, ``top_k`` per token, on every ``every``-th layer."""

    count: Width
    top_k: Pos = 2
    every: Pos = 1
    capacity_factor: Annotated[float, Field(ge=1)] = 1.0
    """Expert buffers padded to this multiple of an even share of the tokens (tokens beyond it
    dropped); 1: dropless."""
    imbalance: Annotated[float, Field(ge=1, le=64, allow_inf_nan=False)] = 1.0
    """Dropless routing (``capacity_factor: 1``): the tokens the busiest expert-parallel rank
    receives over the mean, which the step waits for (its expert GEMMs and all-to-all). 1: a
    perfectly balanced router; a random one over ``E`` experts gives about
    ``1 + sqrt(2 ln(E) E / (tokens x top_k))``
    (:func:`collsim.training.transformer.routing_imbalance`)."""

    @property
    def load_factor(self) -> float:
        """What the busiest rank's expert work is over an even share: the padded buffers, or
        without padding the routing imbalance."""
        return self.capacity_factor if self.capacity_factor > 1 else self.imbalance

    @field_validator("top_k")
    @classmethod
    def _top_k_of_count(cls, top_k: int, info: ValidationInfo) -> int:
        count = info.data.get("count")
        if count is not None and top_k > count:
            raise ValueError(f"top_k ({top_k}) exceeds the experts' count ({count})")
        return top_k

    @model_validator(mode="after")
    def _default_top_k(self) -> ExpertsIn:  # a default skips the field check above
        if self.top_k > self.count:
            raise ValueError(f"top_k ({self.top_k}, the default) exceeds the experts' count "
                             f"({self.count}): give top_k")  # fmt: skip
        return self


class TransformerIn(Strict):
    """A GPT-style decoder (Narayanan et al. 2021 notation: l, h, a, V, s)."""

    kind: Literal["transformer"] = "transformer"
    layers: Layers
    hidden: Width
    heads: Width
    kv_heads: Width | None = None
    ffn: Width | None = None
    gated_mlp: bool = False
    vocab: Annotated[int, Field(ge=1, le=1 << 30)] = 51200
    seq_len: Annotated[int, Field(ge=1, le=1 << 30)]
    tied_embeddings: bool = True
    flash_attention: bool = False
    experts: ExpertsIn | None = None

    @field_validator("heads")
    @classmethod
    def _heads_divide_hidden(cls, heads: int, info: ValidationInfo) -> int:
        return _divides(heads, "heads", info, "hidden")

    @field_validator("kv_heads")
    @classmethod
    def _kv_heads_divide_heads(cls, kv: int | None, info: ValidationInfo) -> int | None:
        return _divides(kv, "kv_heads", info, "heads")

    @field_validator("experts")
    @classmethod
    def _experts_on_some_layer(cls, ex: ExpertsIn | None, info: ValidationInfo) -> Any:
        layers = info.data.get("layers")
        if ex is not None and layers is not None and ex.every > layers:
            raise ValueError(f"experts every {ex.every} layers, but the model has {layers}")
        return ex


class GenericIn(Strict):
    """Any job: FLOPs per sample (forward + backward), parameters, bytes between stages."""

    kind: Literal["generic"]
    flops_per_sample: Annotated[Count, Field(le=1e24)]
    """At most 1e24 (a thousand times a 1T-parameter model's FLOPs on a million tokens)."""
    params: Annotated[Count, Field(ge=1, le=1e16)]
    layers: Layers = 1
    activation_bytes: Size = 0
    """Bytes per sample sent between pipeline stages."""
    activation_memory_bytes: Size = 0
    """Bytes per sample kept for the backward."""
    tp_bytes_per_layer: Size = 0
    """Bytes per sample of one tensor-parallel all-reduce per layer."""


class ParallelIn(Strict):
    """The layout. ``dp`` defaults to whatever the GPUs left over allow (``auto``)."""

    tp: Pos = 1
    pp: Pos = 1
    dp: Pos | Literal["auto"] = "auto"
    ep: Pos = 1
    cp: Pos = 1
    """Context parallelism: each sequence split over ``cp`` GPUs, which all-gather the keys and
    values of the whole sequence for attention (Llama 3's all-gather-based context parallelism;
    Dubey et al. 2024, section 3.3.2), or pass them around a ring (``cp_comm``)."""
    cp_comm: Literal["allgather", "p2p"] = "allgather"
    """How context parallelism moves keys and values: ``allgather`` (Llama 3; exposed before the
    attention) or ``p2p``, ring attention (Transformer Engine's ``AttnFuncWithCPAndKVP2P``,
    Megatron-Core's default ``cp_comm_type``): ``cp - 1`` steps, each sending the K/V chunk it
    holds to the next rank while computing attention on it; only what a step's transfer
    outlasts its attention is exposed (the backward circulates K/V and their gradients)."""
    schedule: Literal["1f1b", "gpipe", "interleaved"] = "1f1b"
    virtual_stages: Pos = 1
    sequence_parallel: bool = False
    zero: Literal[0, 1, 2, 3] = 0
    fsdp: bool = False
    scatter_gather: bool = True
    tp_overlap: bool = False
    """Sequence parallelism's reduce-scatters / all-gathers overlapped with the GEMMs around them
    (Transformer Engine / NeMo userbuffers): exposed only where they outlast the layers' GEMMs."""

    @model_validator(mode="after")
    def _interleave(self) -> ParallelIn:
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise ValueError("virtual_stages > 1 needs schedule: interleaved")
        if self.schedule == "interleaved" and self.pp == 1:
            raise ValueError("the interleaved schedule needs pp > 1 (it splits pipeline stages)")
        if self.fsdp and self.zero not in (0, 3):
            raise ValueError(f"fsdp shards everything (ZeRO-3): zero: {self.zero} contradicts it")
        if self.cp > 1 and self.ep > 1:
            raise ValueError(
                "cp > 1 with ep > 1 is not modelled: where the expert-parallel groups sit among "
                "the context-parallel ranks differs between frameworks"
            )
        if self.tp_overlap and not (self.sequence_parallel and self.tp > 1):
            raise ValueError(  # Megatron-LM: "can happen only when sequence parallelism is enabled"
                "tp_overlap needs tp > 1 and sequence_parallel: it overlaps the reduce-scatter / "
                "all-gather pairs of sequence parallelism with their GEMMs (Megatron-LM refuses it "
                "otherwise)"
            )
        return self


MAX_STRAGGLER_SAMPLES = 100_000
"""The most straggler draws a workload or ``collsim stragglers --samples`` takes (a step model
holds draws x replicas numbers; the CLI runs one discrete-event simulation per draw)."""


class StragglersIn(Strict):
    """Per-GPU compute-time multipliers (mean 1) drawn from ``distribution`` with ``cv``."""

    cv: Annotated[float, Field(ge=0)] = 0.0
    distribution: Literal["lognormal", "normal"] = "lognormal"
    seed: Annotated[int, Field(ge=0)] = 0
    samples: Annotated[int, Field(ge=1, le=MAX_STRAGGLER_SAMPLES)] = 64
    """Monte Carlo draws of the slowest GPU (memory grows with draws x replicas)."""


class SyncIn(Strict):
    """``sync`` (default), ``local_sgd`` (average every ``period`` steps) or ``async``."""

    mode: Literal["sync", "local_sgd", "async"] = "sync"
    period: Pos = 1
    staleness: Annotated[int, Field(ge=0)] = 1


class CompressionIn(Strict):
    """Gradient compression: ``ratio`` x fewer bytes; encode + decode at ``codec_gbps`` GB/s."""

    ratio: Annotated[float, Field(ge=1)] = 1.0
    codec_gbps: Annotated[float, Field(gt=0)] = 1000.0


class TrainingIn(Strict):
    optimizer: Literal["adam", "sgd", "none"] = "adam"
    grad_reduce_dtype: (
        Annotated[Literal["bf16", "fp16", "fp32"], training_dtype(("bf16", "fp16", "fp32"))] | None
    ) = None
    dp_overlap: bool = True
    bucket: Annotated[Size, Field(ge=4096)] | None = None
    """Gradient bucket bytes, at least 4 KiB; unset: the framework's default for the layout
    (:meth:`bucket_bytes`)."""
    prefetch_bucket: Size = 100_000_000
    """ZeRO-3 prefetch bytes (DeepSpeed's ``stage3_prefetch_bucket_size``); 0: none."""
    gather_copy_time: Annotated[str | float, _checked(units.parse_time, "a time", zero_ok=True)] = (
        "5us"
    )
    """ZeRO-3's per-rank copy out of each list all-gather (DeepSpeed 2021 gathers into ``n``
    tensors, one launch each; :mod:`collsim.training.zero3`, whose ``LIST_COPY_S`` is this
    default); ``0us`` for flat-buffer gathers."""
    persistence_threshold: Annotated[int, Field(ge=0)] = 100_000
    """DeepSpeed ZeRO-3 keeps parameter tensors of fewer elements whole on every rank
    (``stage3_param_persistence_threshold``, default 1e5): never gathered per pass (biases,
    layer norms); 0 gathers every tensor. FSDP (one flat unit per layer) ignores it."""
    max_reuse_distance: Annotated[int, Field(ge=0)] = 1_000_000_000
    """DeepSpeed ZeRO-3 keeps a gathered tensor for its next use only if fewer parameter
    elements are fetched in between (``stage3_max_reuse_distance``, default 1e9): with full
    recomputation the backward regathers what the recomputed forward released
    (:mod:`collsim.training.zero3`)."""
    algorithm: Literal["nccl", "auto", "ring"] = "nccl"
    stragglers: StragglersIn = StragglersIn()
    sync: SyncIn = SyncIn()
    compression: CompressionIn = CompressionIn()

    @property
    def gather_copy_s(self) -> float:
        return units.parse_time(self.gather_copy_time)

    def bucket_bytes(self, zero: int, dp: int, grad_elem_bytes: int) -> int:
        """Gradient bucket bytes: :attr:`bucket` where given; else PyTorch DDP's 25 MB
        (``bucket_cap_mb``; also ZeRO-3's reduce-scatters, as the DeepSpeed reference runs), and
        for ZeRO-1/2 (a distributed optimizer) Megatron-Core's ``max(40M, 1M x DP)`` parameters
        (``DistributedDataParallel`` in ``megatron/core/distributed``): at 128-way DP, 25 MB
        buckets would be hundreds of reduce-scatters each paying a ring's latency."""
        if self.bucket is not None:  # bytes as reduced (after any compression)
            return max(int(self.bucket), 1)
        ratio = max(self.compression.ratio, 1.0)  # a default bucket holds compressed gradients
        if zero in (1, 2):
            return max(1, int(max(40_000_000, 1_000_000 * dp) * grad_elem_bytes / ratio))
        return max(1, int(25_000_000 / ratio))


class ComputeIn(Strict):
    """How fast the GPU computes: GEMM efficiency (calibrated) and non-GEMM memory traffic."""

    efficiency: Fraction | None = None
    elementwise_traffic: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] = 2.0
    """Bytes non-GEMM kernels move per byte of stored activation: a few (read + write of each
    element-wise op); up to 100."""
    memory_reserve: Size = 2_000_000_000


class ResilienceIn(Strict):
    """Failures over a long run (:mod:`collsim.training.resilience`): node MTBF, checkpoint size
    (default: weights + optimizer state), storage bandwidth, restart and repair times. Rates and
    durations keep their text; the ``*_s`` properties give seconds and bytes per second."""

    node_mtbf_hours: Annotated[float, Field(ge=0.01, le=1e12, allow_inf_nan=False)]
    checkpoint_bytes: Annotated[int, BeforeValidator(_size), Field(gt=0)] | None = None
    storage_bandwidth: Annotated[str | float, _checked(units.parse_rate, "a bandwidth")]
    restart_time: Annotated[
        str, _checked(_duration, "a restart time", zero_ok=True, longest=_A_YEAR)
    ]
    repair_time: Annotated[str, _checked(_duration, "a repair time", longest=_A_YEAR)] | None = None
    """Restart and repair times: at most a year (:data:`_A_YEAR`)."""
    elastic: bool = False

    @field_validator("elastic")
    @classmethod
    def _elastic_needs_repair(cls, elastic: bool, info: ValidationInfo) -> bool:
        # (repair_time absent from info.data: it failed, and its own error names it)
        if elastic and "repair_time" in info.data and info.data["repair_time"] is None:
            raise ValueError(
                "elastic compares continuing on fewer nodes with waiting for a repair: give "
                "repair_time (without it spares are assumed)"
            )
        return elastic

    @field_validator("storage_bandwidth")
    @classmethod
    def _storage_at_least_a_byte_per_s(cls, value: str | float) -> str | float:
        if units.parse_rate(value) < 1:  # below that a checkpoint's write time overflows
            raise ValueError("storage_bandwidth must be at least 1 B/s")
        return value

    @property
    def storage_bytes_per_s(self) -> float:
        return units.parse_rate(self.storage_bandwidth)

    @property
    def restart_s(self) -> float:
        return _duration(self.restart_time)

    @property
    def repair_s(self) -> float | None:
        return None if self.repair_time is None else _duration(self.repair_time)
