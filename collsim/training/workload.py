"""Training workloads: the YAML format (pydantic, unknown keys rejected) and its loader.

A workload is a model (a GPT-style ``transformer`` or a ``generic`` job given by FLOPs and bytes),
a batch, a data type, a parallel layout (DP x TP x PP, sequence parallel, ZeRO/FSDP, expert
parallel), activation recomputation and training options (overlap, stragglers, local SGD,
compression) and, optionally, failures over a long run (``resilience``).
``docs/workload-format.md`` documents every field. Bad files raise :class:`WorkloadError`, one
line naming the file, the field and the value, through the same machinery as topology files
(:mod:`collsim.topology.loader`). The sections and their field types are in
:mod:`collsim.training.workload_sections`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from collsim.errors import CollsimError
from collsim.topology import loader as _topo_loader
from collsim.topology.input_errors import one_line
from collsim.topology.schema import Strict
from collsim.training.precision import LOW_PRECISION, Recipe, default_recipe
from collsim.training.workload_sections import (
    MAX_STRAGGLER_SAMPLES as MAX_STRAGGLER_SAMPLES,  # re-exported: the CLI's --samples bound
)
from collsim.training.workload_sections import (
    ComputeIn,
    GenericIn,
    ParallelIn,
    Pos,
    ResilienceIn,
    TrainingIn,
    TransformerIn,
    _divides,
    training_dtype,
)
from collsim.training.workload_sections import parse_count as parse_count  # re-exported

CATALOG_DIR = Path(
    os.environ.get("COLLSIM_WORKLOADS", Path(__file__).resolve().parents[2] / "workloads")
)

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "tf32": 4, "fp4": 1}
"""Bytes per element of the training data types (FP4 values are packed two to a byte, but only
inside the GEMMs: weights and activations stay 16-bit, :attr:`WorkloadIn.value_dtype`)."""
PEAK_KEY = {
    "bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "fp8": "fp8", "tf32": "tf32", "fp4": "fp4",
}  # fmt: skip
"""Which ``peak_tflops`` entry of the GPU a data type runs at."""


class WorkloadError(CollsimError):
    """A workload file or option that does not describe a trainable job."""


class WorkloadIn(Strict):
    name: str
    description: str = ""
    source: str | None = None
    model: TransformerIn | GenericIn
    global_batch: Annotated[int, Field(ge=1, le=1 << 40)]
    micro_batch: Pos = 1
    dtype: Annotated[
        Literal["bf16", "fp16", "fp32", "fp8", "tf32", "fp4"], training_dtype(tuple(DTYPE_BYTES))
    ] = "bf16"
    precision: Recipe | None = None
    """The low-precision recipe (:mod:`collsim.training.precision`): ``fp8`` (delayed scaling),
    ``fp8-cs`` (current scaling), ``mxfp8`` with ``dtype: fp8``; ``nvfp4`` with ``dtype: fp4``.
    Default: :func:`collsim.training.precision.default_recipe` of ``dtype``."""
    parallel: ParallelIn = ParallelIn()
    recompute: Literal["none", "selective", "full"] = "none"
    training: TrainingIn = TrainingIn()
    compute: ComputeIn = ComputeIn()
    resilience: ResilienceIn | None = None

    @field_validator("parallel")
    @classmethod
    def _generic_layout(cls, par: ParallelIn, info: ValidationInfo) -> ParallelIn:
        m = info.data.get("model")
        if isinstance(m, TransformerIn) and par.cp > 1 and m.seq_len % (2 * par.cp):
            raise ValueError(  # Megatron-LM and Llama 3 cut 2 cp chunks to balance causal attention
                f"cp {par.cp} needs seq_len ({m.seq_len}) divisible by 2 x cp = {2 * par.cp}: "
                "each rank holds two of 2 x cp chunks, one early and one late, to balance the "
                "causal mask"
            )
        if not isinstance(m, GenericIn):
            return par
        if par.tp > 1 and not m.tp_bytes_per_layer:
            raise ValueError("tp > 1 needs model.tp_bytes_per_layer (what TP moves per layer)")
        if par.pp > 1 and not m.activation_bytes:
            raise ValueError("pp > 1 needs model.activation_bytes (what a stage sends)")
        if par.sequence_parallel:
            raise ValueError("sequence_parallel needs a transformer model")
        if par.cp > 1:
            raise ValueError("cp > 1 needs a transformer model (it splits sequences)")
        return par

    @field_validator("recompute")
    @classmethod
    def _generic_recompute(cls, rec: str, info: ValidationInfo) -> str:
        if rec != "none" and isinstance(info.data.get("model"), GenericIn):
            raise ValueError("recomputation needs a transformer model (a generic job's layers "
                             "are not described)")  # fmt: skip
        return rec

    @field_validator("training")
    @classmethod
    def _replicas_hold_their_state(cls, tr: TrainingIn, info: ValidationInfo) -> TrainingIn:
        par = info.data.get("parallel")
        zero = 0 if par is None else (3 if par.fsdp else par.zero)
        deferred = (tr.sync.mode == "local_sgd" and tr.sync.period > 1) or (
            tr.sync.mode == "async" and tr.sync.staleness > 0
        )
        if par is not None and par.cp > 1 and deferred:
            raise ValueError(
                f"sync mode {tr.sync.mode} lets each data-parallel replica step on its own, but "
                f"the {par.cp} context-parallel GPUs of a replica computed parts of the same "
                "sequences and must reduce their gradients every step: use cp: 1 with it"
            )
        if zero and deferred:
            raise ValueError(
                f"sync mode {tr.sync.mode} lets each data-parallel replica step on its own, but "
                f"ZeRO stage {zero} shards the optimizer (and more) over those replicas, which "
                "must then meet every step: use zero: 0 with it"
            )
        return tr

    @field_validator("micro_batch")
    @classmethod
    def _batch(cls, micro: int, info: ValidationInfo) -> int:
        return _divides(micro, "micro_batch", info, "global_batch")

    @field_validator("precision")
    @classmethod
    def _recipe_fits_dtype(cls, precision: str | None, info: ValidationInfo) -> str | None:
        dtype = info.data.get("dtype")
        if precision is None or dtype is None:
            return precision
        needs = {"fp8": "fp8", "fp8-cs": "fp8", "mxfp8": "fp8", "nvfp4": "fp4"}.get(precision)
        if needs is None and precision != dtype:
            raise ValueError(f"precision {precision} is a data type: it must equal dtype ({dtype})")
        if needs is not None and needs != dtype:
            raise ValueError(
                f"the {precision} recipe runs its GEMMs in {needs}: set dtype: {needs}"
            )
        return precision

    @property
    def grad_dtype(self) -> str:
        """The gradients' type: ``training.grad_reduce_dtype``, else the training type, except
        that FP8 recipes keep gradients in bf16 (FP8 is for the GEMMs; Micikevicius et al. 2022,
        "FP8 Formats for Deep Learning", arXiv:2209.05433, section 4)."""
        if self.training.grad_reduce_dtype:
            return self.training.grad_reduce_dtype
        return "bf16" if self.dtype in LOW_PRECISION else self.dtype

    @property
    def recipe(self) -> str:
        """The precision recipe in effect (``precision``, else the data type's default)."""
        return self.precision or default_recipe(self.dtype)

    @property
    def value_dtype(self) -> str:
        """The type weights and activations are held and exchanged in (memory, TP / EP / PP
        messages, weight all-gathers): the training type, except that FP8 recipes cast to FP8
        only inside the GEMMs and keep 16-bit weights and activations (Micikevicius et al. 2022,
        section 4; NVIDIA Transformer Engine)."""
        return "bf16" if self.dtype in LOW_PRECISION else self.dtype

    @property
    def recomputes(self) -> str:
        """What is recomputed in effect: selective recomputation re-runs the attention scores,
        which FlashAttention never stores (its backward recomputes them anyway), so with it
        selective is ``none`` (no extra FLOPs, no extra memory)."""
        m = self.model
        if self.recompute == "selective" and m.kind == "transformer" and m.flash_attention:
            return "none"
        return self.recompute


def _model_section(data: dict[str, Any]) -> dict[str, Any]:
    """Validate ``model:`` by its ``kind`` first, so errors read ``model.layers``, not a union."""
    model = data.get("model")
    if not isinstance(model, dict):
        return data
    kind = model.get("kind", "transformer")
    classes: dict[str, type[BaseModel]] = {"transformer": TransformerIn, "generic": GenericIn}
    if not isinstance(kind, str) or kind not in classes:
        raise WorkloadError(
            "unknown model kind (use transformer or generic)", field="model.kind", value=kind
        )
    cls = classes[kind]
    try:
        checked = cls.model_validate({**model, "kind": kind})
    except ValidationError as exc:
        raise _as_workload_error(one_line(exc, cls)).located(field="model") from None
    return {**data, "model": checked}


def catalog_names() -> list[str]:
    """Names of the bundled workloads (``workloads/*.yaml``), sorted."""
    return sorted(p.stem for p in CATALOG_DIR.glob("*.yaml"))


def resolve(name_or_path: str | os.PathLike[str]) -> Path:
    """A catalog name or a path -> the file to read."""
    return _topo_loader.resolve_in_catalog(
        name_or_path, CATALOG_DIR, what="workload", error=WorkloadError,
        none_hint=f" (bundled: {', '.join(catalog_names())})",
    )  # fmt: skip


def _as_workload_error(exc: CollsimError) -> WorkloadError:
    return WorkloadError(
        exc.message, file=exc.file, field=exc.field, value=exc.value, has_value=exc.has_value
    )


def workload_from_dict(data: Any, *, file: str | None = None) -> WorkloadIn:
    """Validate a parsed YAML document (errors: one line naming the field and value)."""
    if not isinstance(data, dict):
        raise WorkloadError(
            "a workload file must be a mapping with 'name', 'model' and 'global_batch'",
            file=file,
            value=type(data).__name__,
        )
    try:
        data = _model_section(data)
        return WorkloadIn.model_validate(data)
    except ValidationError as exc:
        err = _as_workload_error(one_line(exc, WorkloadIn))
        raise err.located(file=file) from None
    except WorkloadError as exc:
        raise exc.located(file=file) from None


def load_workload(name_or_path: str | os.PathLike[str]) -> WorkloadIn:
    """Load and validate a workload file or bundled workload name."""
    path = resolve(name_or_path)
    try:
        data = _topo_loader.read_yaml(path)
    except CollsimError as exc:
        raise _as_workload_error(exc) from None
    return workload_from_dict(data, file=str(path))


def with_changes(workload: WorkloadIn, **sections: dict[str, Any]) -> WorkloadIn:
    """A copy with some sections' fields replaced and re-validated (``parallel={"tp": 4}``)."""
    data = workload.model_dump()
    for section, changes in sections.items():
        if isinstance(data.get(section), dict):
            data[section] = {**data[section], **changes}
        else:
            data[section] = changes
    return workload_from_dict(data)
