"""Sweeps printed the way nccl-tests prints its results, so the two can be read side by side."""

from __future__ import annotations

from collsim.engine import SimResult, bottleneck_links
from collsim.tables import plural
from collsim.whatif import Sweep

_REDUCING = {"all_reduce": "sum", "reduce_scatter": "sum", "reduce": "sum"}
_ROOTED = {"broadcast", "reduce"}


def sweep_table(sweep: Sweep) -> str:
    """Header, one row per size (size, count, type, redop, root, time, algbw, busbw), average.

    The header says what chose each size's algorithm (with ``auto`` or ``--tuned``) and what
    produced the times; a busbw above what its (algorithm, protocol, channels) can reach on the
    topology's links is marked ``!`` and explained under the table (:func:`bound_notes`)."""
    tuned = sweep.tuned
    how = (
        "algorithm, protocol and channels per size as NCCL's tuner picks them"
        if tuned
        else f"algorithm {sweep.algorithm}, protocol {sweep.protocol}, {sweep.channels} channel(s)"
    )
    lines = [
        f"# collsim: {sweep.collective} on {sweep.topology}: {plural(sweep.ranks, 'rank')} "
        f"({plural(sweep.nodes, 'node')}), {how}",
    ]
    if sweep.question is not None:
        lines.append(f"# choices: {sweep.question}; chosen by {sweep.chosen_by}")
    lines += [
        f"# times: {sweep.timed_by}",
        "#",
        f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>5}  "
        f"{'time':>10}  {'algbw':>7}  {'busbw':>7}  algorithm",
        f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>5}  "
        f"{'(us)':>10}  {'(GB/s)':>7}  {'(GB/s)':>7}",
    ]
    redop = _REDUCING.get(sweep.collective, "none")
    root = "0" if sweep.collective in _ROOTED else "-1"
    for p in sweep.points:
        mark = BOUND_MARK if p.exceeds_bound else " "
        lines.append(
            f"  {p.size_bytes:>10}  {p.count:>12}  {sweep.dtype:>8}  {redop:>6}  {root:>5}  "
            f"{p.time_s * 1e6:>10.2f}  {p.algbw_gbps:>7.2f}  {p.busbw_gbps:>7.2f}{mark} "
            f"{p.algorithm}" + (f"/{p.protocol}/{p.channels}ch" if tuned else "")
        )
    if sweep.points:
        avg = sum(p.busbw_gbps for p in sweep.points) / len(sweep.points)
        lines.append(f"# Avg bus bandwidth    : {avg:.4g}")
    flagged = [
        (f"{p.algorithm}/{p.protocol}/{p.channels}ch", p.busbw_gbps, p.busbw_bound_gbps or 0.0)
        for p in sweep.points
        if p.exceeds_bound
    ]
    lines += bound_notes(flagged, sweep.timed_by, sweep.topology)
    return "\n".join(lines)


BOUND_MARK = "!"
"""The mark after a busbw above its bound (:mod:`collsim.model.bounds`)."""


def bound_notes(flagged: list[tuple[str, float, float]], model: str, topology: str) -> list[str]:
    """One footnote per (algorithm, protocol, channels) whose busbw passed its bound: ``flagged``
    holds (label, busbw, bound) per marked row; ``model`` produced the numbers."""
    worst: dict[str, tuple[float, float, int]] = {}
    for label, busbw, bound in flagged:
        top, _, count = worst.get(label, (0.0, bound, 0))
        worst[label] = (max(top, busbw), bound, count + 1)
    return [
        f"# {BOUND_MARK} {model} puts {label} at up to {top:.2f} GB/s busbw "
        f"({plural(count, 'size')}), above the {bound:.2f} GB/s its busiest link or channel "
        f"allows on {topology}: no run of it can reach that"
        for label, (top, bound, count) in worst.items()
    ]


def bottleneck_table(result: SimResult, top: int = 5) -> str:
    """The busiest links of one simulated collective."""
    stats = bottleneck_links(result, top=top)
    if not stats:
        return "# no link carried data"
    size = result.size_bytes
    lines = [f"# bottleneck links at {size} B ({result.algorithm}, {result.time_s * 1e6:.2f} us):"]
    width = max(len(s.name) for s in stats)
    for s in stats:
        lines.append(
            f"#   {s.name:<{width}}  utilization {s.utilization * 100:5.1f}%  "
            f"busy {s.busy_fraction * 100:5.1f}%  {s.bytes / 1e6:10.3f} MB"
        )
    return "\n".join(lines)
