"""Small workloads and topologies for the step-model tests (dicts, so a test can change a field)."""

from __future__ import annotations

import copy
from typing import Any

from collsim.topology.loader import topology_from_dict

GPU = {
    "model": "TestGPU",
    "peak_tflops": {"bf16": 100},
    "matmul_tflops": {"bf16": 100},  # hand-computed cases: the GEMM efficiency applies to 100
    "memory": "80GB",
    "memory_bandwidth": "2TB/s",
}


def ring_topology(n: int = 4, bandwidth: str = "25GB/s", latency: str = "2us") -> Any:
    """``n`` GPUs joined in a ring by direct links (no switches): ring all-reduce meets no one."""
    devices = [{"name": f"g{i}", "kind": "gpu", "node": i, "forwards": True} for i in range(n)]
    links = [
        {"a": f"g{i}", "b": f"g{(i + 1) % n}", "kind": "nvlink", "bandwidth": bandwidth,
         "latency": latency}
        for i in range(n)
    ]  # fmt: skip
    return topology_from_dict(
        {"name": "ring", "gpu": copy.deepcopy(GPU), "devices": devices, "links": links}
    )


def generic(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "job",
        "model": {"kind": "generic", "flops_per_sample": 1e12, "params": 100e6, "layers": 4},
        "global_batch": 64,
        "micro_batch": 16,
        "dtype": "bf16",
        "training": {"optimizer": "none", "dp_overlap": False, "algorithm": "ring"},
        "compute": {"efficiency": 0.5, "memory_reserve": 0},
    }
    return _with(data, changes)


def gpt(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "gpt",
        "model": {"layers": 8, "hidden": 1024, "heads": 16, "vocab": 32000, "seq_len": 1024},
        "global_batch": 32,
        "micro_batch": 2,
        "parallel": {"tp": 1, "pp": 1},
    }
    return _with(data, changes)


MOE = {"layers": 4, "hidden": 1024, "heads": 16, "vocab": 32000, "seq_len": 1024,
       "experts": {"count": 8, "top_k": 2}}  # fmt: skip
"""A small mixture-of-experts GPT: 8 experts, top-2 routing."""


def evaluate(topo: Any, data: dict[str, Any], n: int | None = None) -> Any:
    """The step model (analytic timer) on ``topo`` for the workload ``data``."""
    from collsim.training.comm import make_timer
    from collsim.training.step import StepModel
    from collsim.training.workload import workload_from_dict

    return StepModel(topo, make_timer("analytic", topo)).evaluate(workload_from_dict(data), n)


def _with(data: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``data`` with ``changes``: a mapping merges one level into the section it names."""
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return data
