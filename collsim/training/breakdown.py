"""``collsim step --breakdown``: a step's time per phase and one layer's per part.

Built from :class:`~collsim.training.step_result.StepResult` alone (its ``breakdown`` and the
``compute_parts_s`` / ``comm_total_s`` details the step model keeps), so parts a newer step
model adds show up without a change here: a compute part this module does not name is listed
under its own key, and compute the parts do not account for is an ``other`` row. Each
communication phase is shown as total, hidden (overlapped behind compute) and exposed; only
the exposed part counts in the step, so the exposed column sums to the step time.
"""

from __future__ import annotations

from typing import Any

from collsim.training.step_result import BREAKDOWN_KEYS, StepResult

COMPUTE_LABELS = {
    "gemm": "compute: GEMM",
    "attention": "compute: attention",
    "memory_bound": "compute: memory-bound",
    "launch": "compute: kernel launches (CPU-bound)",
    "quantisation": "compute: quantisation (FP8/FP4 casts)",
    "recompute": "compute: recompute",
    "logits_loss": "compute: output layer + loss",
    "optimizer": "compute: optimizer",
}
"""Names of the compute parts the step model is known to keep; others print as their key."""

COMM_KEYS = ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm")
OTHER_LABELS = {
    "bubble": "pipeline bubble",
    "optimizer": "optimizer",
    "compression": "gradient compression",
    "straggler_wait": "straggler wait",
}
_TOL = 1e-9  # relative: a residual below it is rounding, not an unaccounted part


def phase_rows(r: StepResult) -> list[dict[str, Any]]:
    """One row per phase: ``phase``, ``total_s``, ``hidden_s``, ``exposed_s`` (what the step
    pays), ``share`` (exposed / step). The exposed column sums to ``r.step_time_s``."""
    rows: list[dict[str, Any]] = []

    def add(phase: str, exposed: float, total: float | None = None) -> None:
        total = exposed if total is None else max(total, exposed)
        rows.append(
            {
                "phase": phase,
                "total_s": total,
                "hidden_s": total - exposed,
                "exposed_s": exposed,
                "share": exposed / r.step_time_s if r.step_time_s > 0 else 0.0,
            }
        )

    compute = r.breakdown["compute"]
    parts = dict(r.details.get("compute_parts_s", {}))
    for key, seconds in parts.items():
        if seconds != 0:
            add(COMPUTE_LABELS.get(key, f"compute: {key}"), float(seconds))
    rest = compute - sum(parts.values())
    if not parts or abs(rest) > _TOL * max(compute, 1e-30):
        add("compute: other" if parts else "compute", rest)
    totals = r.details.get("comm_total_s", {})
    for key in COMM_KEYS:
        exposed = r.breakdown[key]
        total = float(totals.get(key, exposed))
        if total > 0 or exposed > 0:
            add(f"{key[:2].upper()} comm", exposed, total)
    for key in BREAKDOWN_KEYS:
        if key == "compute" or key in COMM_KEYS:
            continue
        if r.breakdown[key] != 0:
            add(OTHER_LABELS.get(key, key), r.breakdown[key])
    for key, seconds in r.breakdown.items():  # a part a newer step model adds
        if key not in BREAKDOWN_KEYS and seconds != 0:
            add(key, seconds)
    return rows


def layer_parts(model: Any, w: Any, n_gpus: int | None = None) -> dict[str, float]:
    """Seconds of ONE layer of the slowest stage for one micro-batch, per ``pass:part``
    (forward / backward; GEMM, attention, memory-bound, quantisation, recompute, exposed TP /
    CP / EP comm), from ``model`` (a :class:`collsim.training.step.StepModel`)."""
    one = model.one_layer(w, n_gpus, slowest=True)
    fwd_share = 2 / (4 + (2 if w.recomputes == "full" else 0))  # of the TP / EP calls
    parts = {
        "forward:GEMM": one["gemm_fwd"],
        "forward:launch-bound": one["launch_fwd"],
        "forward:attention": one["attention_fwd"],
        "forward:memory-bound": one["memory_bound"] / 3,
        "forward:quantisation": one["quantisation_fwd"],
        "forward:TP comm": one["tp"] * fwd_share,
        "forward:CP comm": one["cp_fwd"],
        "forward:EP comm": one["ep"] * fwd_share,
        "backward:GEMM": one["gemm"] - one["gemm_fwd"],
        "backward:launch-bound": one["launch"] - one["launch_fwd"],
        "backward:attention": one["attention"] - one["attention_fwd"],
        "backward:memory-bound": 2 * one["memory_bound"] / 3,
        "backward:quantisation": one["quantisation"] - one["quantisation_fwd"],
        "backward:recompute": one["recompute"],
        "backward:TP comm": one["tp"] * (1 - fwd_share),
        "backward:CP comm": one["cp"] - one["cp_fwd"],
        "backward:EP comm": one["ep"] * (1 - fwd_share),
    }
    return {k: v for k, v in parts.items() if v > 0}


def layer_rows(parts: dict[str, float]) -> list[dict[str, Any]]:
    """One transformer layer's forward and backward (:func:`layer_parts`) as rows
    ``pass``, ``part``, ``seconds``, ``share`` (of the layer's forward + backward)."""
    whole = sum(parts.values())
    rows = []
    for key, seconds in parts.items():
        which, _, part = key.partition(":")
        rows.append(
            {
                "pass": which,
                "part": part,
                "seconds": seconds,
                "share": seconds / whole if whole > 0 else 0.0,
            }
        )
    return rows


def breakdown_json(r: StepResult, layer: dict[str, float] | None) -> dict[str, Any]:
    """The breakdown as ``--json`` writes it: phases and (transformers) one layer."""
    out: dict[str, Any] = {"phases": phase_rows(r), "step_time_s": r.step_time_s}
    if layer is not None:
        out["layer"] = layer_rows(layer)
    return out
