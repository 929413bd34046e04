"""Plain-text reports of step results and scaling curves (what ``collsim step``/``scale`` print)."""

from __future__ import annotations

from collsim.tables import plural, table
from collsim.training.amdahl import ScalingCurve
from collsim.training.step import BREAKDOWN_KEYS, StepResult

_LABELS = {
    "compute": "compute (GEMMs, elementwise, recompute)",
    "tp_comm": "tensor-parallel communication",
    "cp_comm": "context-parallel K/V collectives",
    "ep_comm": "expert-parallel all-to-all",
    "pp_comm": "pipeline sends (exposed)",
    "bubble": "pipeline bubble",
    "dp_comm": "data-parallel communication (exposed)",
    "optimizer": "optimizer step",
    "compression": "gradient compression codec",
    "straggler_wait": "straggler wait",
}


def step_report(r: StepResult, measured_s: float | None = None) -> str:
    """The breakdown table, throughput and memory of one step."""
    lay = r.layout
    lines = [
        f"# {r.workload} on {r.topology}: {r.n_gpus} GPUs, {lay.label()}, "
        f"global batch {lay.global_batch} ({lay.m} micro-batches of {lay.micro} per replica), "
        f"efficiency {r.details['efficiency']:.3f}",
    ]
    rows = [
        {
            "part": _LABELS[k],
            "seconds": r.breakdown[k],
            "share_%": 100 * r.breakdown[k] / r.step_time_s,
        }
        for k in BREAKDOWN_KEYS
        if r.breakdown[k] > 0 or k in ("compute",)
    ]
    rows.append({"part": "step", "seconds": r.step_time_s, "share_%": 100.0})
    lines.append(table(rows, ["part", "seconds", "share_%"]))
    lines.append(
        f"throughput: {r.tflops_per_gpu:.1f} TFLOP/s per GPU (model FLOPs), "
        f"MFU {100 * r.mfu:.1f}%, HFU {100 * r.hfu:.1f}%, "
        f"{r.tokens_per_step / r.step_time_s:.4g} {r.unit}/s"
    )
    mem = r.memory
    verdict = "fits" if mem.fits else "DOES NOT FIT"
    lines.append(
        f"memory per GPU: {mem.total / 1e9:.1f} GB of {mem.capacity / 1e9:.0f} GB ({verdict}): "
        f"weights {mem.weights / 1e9:.1f}, gradients {mem.gradients / 1e9:.1f}, optimizer "
        f"{mem.optimizer / 1e9:.1f}, activations {mem.activations / 1e9:.1f}, reserve "
        f"{mem.reserve / 1e9:.1f}"
    )
    if r.details.get("straggler_max_multiplier", 1.0) > 1.0:
        waits_for = {"async": "each replica's slowest GPU",  # whom the step waits for, per mode
                     "local_sgd": "the slowest replica, averaged over the period"}  # fmt: skip
        whom = waits_for.get(r.details.get("sync", ""), "the slowest GPU")
        lines.append(
            f"stragglers: the step waits for {whom}, "
            f"{r.details['straggler_max_multiplier']:.3f}x the mean "
            f"(expected wait {r.breakdown['straggler_wait']:.4g} s per step)"
        )
    if measured_s is not None:
        err = (r.step_time_s - measured_s) / measured_s
        lines.append(
            f"measured: {measured_s:.4g} s per step; predicted {r.step_time_s:.4g} s "
            f"(error {100 * err:+.1f}%)"
        )
    return "\n".join(lines)


def scaling_report(curve: ScalingCurve, results: list[StepResult], skipped: list[str]) -> str:
    """GPU count, layout, step time, speedup, efficiency and Karp-Flatt per point; the fit."""
    rows = []
    for i, r in enumerate(results):
        kf = curve.karp_flatt[i]
        rows.append(
            {
                "gpus": r.n_gpus,
                "layout": r.layout.label(),
                "step_s": r.step_time_s,
                "speedup": float(curve.speedup[i]),
                "efficiency_%": 100 * float(curve.efficiency[i]),
                "karp_flatt": "-" if kf != kf else f"{kf:.3g}",
                "comm+bubble_%": 100
                * (r.step_time_s - r.breakdown["compute"] - r.breakdown["optimizer"])
                / r.step_time_s,
                "mem_GB": r.memory.total / 1e9,
                "fits": "yes" if r.fits else "NO",
            }
        )
    law = "Amdahl" if curve.mode == "strong" else "Gustafson"
    lines = [table(rows, list(rows[0])), f"{law} fit: serial/communication fraction f = "
             f"{curve.serial_fraction:.4g}"]  # fmt: skip
    over = [r for r in results if not r.fits]
    if over:
        lines.append(
            f"# WARNING: {plural(len(over), 'point')} (fits: NO) exceed the GPU's "
            f"{over[0].memory.capacity / 1e9:.1f} GB of memory; their step times assume it "
            "would hold them"
        )
    lines += [f"# skipped {s}" for s in skipped]
    return "\n".join(lines)
