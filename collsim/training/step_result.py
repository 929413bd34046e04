"""What the step model returns and the fixed arithmetic it builds on: :class:`StepResult` (a step
time, its breakdown, FLOPs and memory), the GPU's peak and best matmul rates, layers per pipeline
stage and the pipeline bubble. :mod:`collsim.training.step` computes the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from collsim.topology.spec import Topology
from collsim.training.layout import Layout, Memory
from collsim.training.workload import PEAK_KEY, WorkloadError

DEFAULT_EFFICIENCY = 0.7585
"""GEMM efficiency (achieved FLOP/s / the GPU's best matmul rate, :func:`matmul_flops`, for a
well-shaped GEMM: :mod:`collsim.training.kernels` prices each shape) when neither the workload
nor a profile gives one: the value fitted on all 120 published runs of ``data/steptime``
(median signed error zero; reports/steptime_validation.md, with its leave-one-source-out)."""
OPTIMIZER_BYTES = {"adam": 34.0, "sgd": 14.0, "none": 0.0}
"""Bytes read + written per local parameter by the optimizer step: Adam reads fp32 gradient,
master weight, momentum, variance (16), writes the last three (12) and the 16-bit copy (2), plus
the gradient-norm pass (4); SGD with momentum: 14."""
BREAKDOWN_KEYS = (
    "compute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "bubble", "dp_comm", "optimizer",
    "compression", "straggler_wait",
)  # fmt: skip


@dataclass
class StepResult:
    """One workload on one cluster: the step time and where it goes (seconds per step)."""

    workload: str
    topology: str
    layout: Layout
    step_time_s: float
    breakdown: dict[str, float]
    model_flops: float
    hardware_flops: float
    peak_flops: float
    memory: Memory
    tokens_per_step: float
    """Tokens per step for a transformer; samples for a generic job (``unit``)."""
    details: dict[str, Any] = field(default_factory=dict)
    unit: str = "tokens"
    """What ``tokens_per_step`` counts: ``tokens`` (transformers) or ``samples`` (generic jobs)."""

    @property
    def n_gpus(self) -> int:
        return self.layout.n_gpus

    @property
    def tflops_per_gpu(self) -> float:
        """Model FLOP/s per GPU (no recomputation counted), in TFLOP/s."""
        return self.model_flops / self.step_time_s / self.n_gpus / 1e12

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation (Chowdhery et al. 2022; Korthikanti et al. 2022 App. A)."""
        return self.model_flops / (self.step_time_s * self.n_gpus * self.peak_flops)

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation (recomputation counted)."""
        return self.hardware_flops / (self.step_time_s * self.n_gpus * self.peak_flops)

    @property
    def fits(self) -> bool:
        return self.memory.fits

    def as_json(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "topology": self.topology,
            "gpus": self.n_gpus,
            "layout": self.layout.label(),
            "step_time_s": self.step_time_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "tokens_per_s": self.tokens_per_step / self.step_time_s,
            "throughput_unit": self.unit,
            "breakdown": {k: self.breakdown[k] for k in BREAKDOWN_KEYS},
            "memory_gb_per_gpu": self.memory.total / 1e9,
            "memory": self.memory.as_json(),
            "fits_in_memory": self.fits,
            "global_batch": self.layout.global_batch,
            "micro_batch": self.layout.micro,
            "details": self.details,
        }


def peak_flops(topology: Topology, dtype: str) -> float:
    """The GPU's dense tensor FLOP/s for ``dtype`` (from the topology's ``peak_tflops``)."""
    key = PEAK_KEY[dtype]
    if key not in topology.gpu.peak_flops:
        raise WorkloadError(
            f"{topology.gpu.model} has no {key} peak in {topology.name} "
            f"(has: {', '.join(topology.gpu.peak_flops)})",
            field="dtype",
            value=dtype,
        )
    return topology.gpu.peak_flops[key]


def matmul_flops(topology: Topology, dtype: str) -> float:
    """FLOP/s of the GPU's best matrix multiply in ``dtype``: the rate the GEMM efficiency is a
    fraction of (measured where the topology gives ``matmul_tflops``, else an assumed fraction
    of the peak, :data:`collsim.topology.spec.DEFAULT_MATMUL_FRACTION`). Separating the GPU's
    own shortfall (clocks held down at its power limit) from the software's keeps one calibrated
    efficiency valid across GPU generations."""
    peak_flops(topology, dtype)  # the error for a dtype the GPU lacks
    return topology.gpu.matmul_rate(PEAK_KEY[dtype])


def stage_layer_counts(layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage: even, the remainder on the middle stages first (the first
    holds the embedding and the most activations in flight, the last the logits: Llama 3 405B
    keeps one layer fewer on those two, Dubey et al. 2024, section 3.3.2)."""
    base, extra = divmod(layers, pp)
    order = [*range(1, pp - 1), 0, pp - 1] if pp > 2 else list(range(pp))
    counts = [base] * pp
    for i in order[:extra]:
        counts[i] += 1
    return counts


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Pipeline bubble as a fraction of the step: ``((p-1)/v) / (m + (p-1)/v)`` (Narayanan 2021)."""
    return ((p - 1) / v) / (m + (p - 1) / v)
