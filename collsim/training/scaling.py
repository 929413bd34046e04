"""Scaling curves of a workload: the step model at several cluster sizes, then the Amdahl fit.

Strong scaling keeps the workload's global batch (data parallelism grows, micro-batches per
pipeline shrink); weak scaling keeps the batch per data-parallel replica, so the global batch
grows with the GPU count from the workload's own at the smallest size that runs. Sizes where
the layout is invalid (the batch does not divide, too few GPUs for TP x PP) are skipped and
reported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from collsim.errors import CollsimError
from collsim.training.amdahl import ScalingCurve, scaling_curve
from collsim.training.step import StepModel, StepResult
from collsim.training.workload import WorkloadError, WorkloadIn, with_changes


def scale_workload(
    model: StepModel,
    w: WorkloadIn,
    node_counts: Sequence[int],
    mode: str = "strong",
    model_at: Callable[[int], StepModel] | None = None,
) -> tuple[ScalingCurve, list[StepResult], list[str]]:
    """Step results at each node count (on the first nodes of ``model``'s topology, or on
    ``model_at(nodes)``'s: a system of that size, e.g. with only the faults it holds), the
    scaling curve fitted to them, and why any count was skipped."""
    per_node = model.topology.gpus_per_node
    base_gpus: int | None = None  # weak scaling: the workload's batch is that of the first size
    results: list[StepResult] = []
    skipped: list[str] = []
    for nodes in sorted(node_counts):
        n = nodes * per_node
        wl = with_changes(w, parallel={"dp": "auto"})
        if mode == "weak" and base_gpus is not None:
            wl = with_changes(wl, global_batch=max(1, w.global_batch * n // base_gpus))  # type: ignore[arg-type]
        try:
            results.append((model_at(nodes) if model_at else model).evaluate(wl, n))
        except WorkloadError as exc:
            skipped.append(f"{nodes} node(s): {exc.message}")
            continue
        base_gpus = base_gpus or n
    if len(results) < 2:
        why = "; ".join(skipped) or f"only {len(results)} node count given"
        raise CollsimError(
            f"a scaling curve needs two node counts with a valid layout ({why})",
            field="--nodes",
        )
    curve = scaling_curve([r.n_gpus for r in results], [r.step_time_s for r in results], mode)
    return curve, results, skipped
