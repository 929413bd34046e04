"""The validation report's Markdown: every figure in it is computed from the report's results.

Sections: issue 28's targets (:mod:`.targets`), cross-scale per series, the uncalibrated busbw at
large sizes on multi-node logs, the definitions of every mode with the logs each uses, the
summary and per-log tables, the fitted profiles, the logs behind each missed target, the plots.
``rep`` is a :class:`~.report.Report` (passed in: this module sits below it).
"""

from __future__ import annotations

import os
import platform
from typing import Any

import numpy as np

from collsim.calibration.scale_series import FIT_MAX_NODES, PREDICT_NODES
from collsim.calibration.targets import (
    BUSBW_WITHIN,
    CROSS_SCALE_SERIES_MAX,
    TargetRow,
    issue_targets,
    series_rows,
)

MODES = ("uncalibrated", "in_sample", "cross_collective", "cross_size", "cross_scale", "nccl",
         "alpha_beta")  # fmt: skip
TITLES = {
    "uncalibrated": "(a) uncalibrated",
    "in_sample": "(b) in-sample",
    "cross_collective": "(c) cross-collective",
    "cross_size": "(d) cross-size",
    "cross_scale": "(e) cross-scale",
    "nccl": "NCCL model",
    "alpha_beta": "alpha-beta fit",
}


def summary(rep: Any, mode: str) -> tuple[float, float, int]:
    """(mean, median, logs) of ``mode``'s MAPE."""
    vals = list(rep.mape.get(mode, {}).values())
    if not vals:
        return float("nan"), float("nan"), 0
    return float(np.mean(vals)), float(np.median(vals)), len(vals)


def pct(x: float | None) -> str:
    return "--" if x is None or not np.isfinite(x) else f"{100 * x:.1f}"


def targets_of(rep: Any) -> list[TargetRow]:
    return issue_targets(rep.mape, rep.series, rep.multi_node_busbw_errors())


def _bare(name: str) -> str:
    return name.removesuffix(".txt")


def _nodes(nodes: list[int]) -> str:
    return ", ".join(str(n) for n in nodes)


def run_lines(rep: Any) -> list[str]:
    """Where and how long the run took, and which jobs dominated it."""
    st = rep.stats
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    slow = sorted(st.outcomes.items(), key=lambda kv: -kv[1].seconds)[:4]
    total = sum(o.seconds for o in st.outcomes.values())
    out = [
        f"Machine: {platform.machine()}, {platform.system()} {platform.release()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}; {rep.workers} worker "
        f"process(es); load average at the end {load} (1/5/15 min; the machine is shared). "
        f"This run's jobs: {rep.seconds:.0f} s wall, {st.computed} of {len(st.outcomes)} "
        f"computed, the rest reused from the cache; the jobs' own times (each as computed) sum "
        f"to {total:.0f} s.",
    ]
    if slow:
        out += ["", "Slowest jobs (seconds when computed): " + ", ".join(
            f"`{k}` {o.seconds:.0f} s" for k, o in slow) + "."]  # fmt: skip
    return out


def left_out_lines(rep: Any) -> list[str]:
    """The dataset logs this run left out (``--exclude``): every table and target below is
    without them, and a target series missing one of its logs is a MISS."""
    if not rep.left_out:
        return []
    return [f"**Left out of this run** (`--exclude`): {', '.join(map(_bare, rep.left_out))}. "
            "Every table and target below is computed without them; a series in the target "
            "that misses one of its logs counts as a MISS.", ""]  # fmt: skip


def target_lines(rep: Any) -> list[str]:
    lines = ["| target | over | value | limit | verdict |", "| --- | ---: | ---: | ---: | --- |"]
    for t in targets_of(rep):
        op = ">=" if t.higher_is_better else "<="
        value = "--" if t.value is None else f"{100 * t.value:.1f}%"
        lines.append(f"| {t.name} | {t.over} | {value} | {op} {100 * t.limit:.0f}% | "
                     f"**{t.verdict}** |")  # fmt: skip
    return lines


def series_lines(rep: Any) -> list[str]:
    unc, cal = rep.mape.get("uncalibrated", {}), rep.mape.get("cross_scale", {})
    fit = rep.mape.get("cross_scale_fit", {})
    lines = [
        "| series | topology | fit on (nodes) | predicted (nodes) | uncalibrated % | "
        "cross-scale % | limit | verdict |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | --- |",
    ]
    notes = []
    for r in series_rows(rep.series, unc, cal):
        s = r.series
        verdict = "--" if r.passed is None else f"**{'PASS' if r.passed else 'MISS'}**"
        limit = f"{100 * CROSS_SCALE_SERIES_MAX:.0f}" if s.in_target else "--"
        lines.append(f"| {s.name} | {s.topology} | {_nodes(s.nodes_of(s.fit_on))} | "
                     f"{_nodes(s.nodes_of(s.predict))} | {pct(r.uncalibrated)} | "
                     f"{pct(r.calibrated)} | {limit} | {verdict} |")  # fmt: skip
        if s.note:
            notes.append(f"- {s.name}: outside the target ({s.note}).")
        if r.missing:
            missing = ", ".join(map(_bare, r.missing))
            gone = [n for n in r.missing if n in rep.left_out]
            why = "left out of this run" if gone else "the fit failed"
            why = rep.unfitted.get(f"{s.slug} (cross_scale)", why)
            notes.append(f"- {s.name}: no cross-scale result for {missing} ({why}).")
    same = [
        r.series.name
        for r in series_rows(rep.series, unc, cal)
        if r.series.predict
        and all(n in cal and abs(cal[n] - unc.get(n, -1.0)) < 5e-4 for n in r.series.predict)
    ]
    if same:
        notes.append(
            f"- {', '.join(same)}: the cross-scale profile changes no predicted log by "
            "0.05 point or more: at those scales it keeps the prior (the uncalibrated "
            "model) for what the fit could not see there (`Profile.params`)."
        )
    lines += ["", *notes, "", "Per log:", "",
              "| series | log | nodes | ranks | role | uncalibrated % | "
              "calibrated % (fit logs: the profile on its own logs) |",
              "| --- | --- | ---: | ---: | --- | ---: | ---: |"]  # fmt: skip
    for s in rep.series:
        for g in s.logs:
            role = "fit" if g.name in s.fit_on else "predicted"
            got = fit.get(g.name) if role == "fit" else cal.get(g.name)
            lines.append(f"| {s.name} | {_bare(g.name)} | {g.nodes} | {g.ranks} | {role} | "
                         f"{pct(unc.get(g.name))} | {pct(got)} |")  # fmt: skip
    return lines


def busbw_lines(rep: Any) -> list[str]:
    errs = rep.multi_node_busbw_errors()
    lines = [f"| log | nodes | topology | mean busbw error % | within {100 * BUSBW_WITHIN:.0f}% |",
             "| --- | ---: | --- | ---: | --- |"]  # fmt: skip
    for name, e in sorted(errs.items(), key=lambda kv: kv[1]):
        match = "exact" if name in rep.exact else "approximate"
        ok = "yes" if e <= BUSBW_WITHIN else "no"
        lines.append(f"| {_bare(name)} | {rep.nodes[name]} | {match} | {100 * e:.1f} | {ok} |")
    multi = sorted(n for n, k in rep.nodes.items() if k >= 2 and n not in errs)
    if multi:
        lines += ["", "Multi-node logs without a row >= 256 MiB (not counted): "
                  + ", ".join(map(_bare, multi)) + "."]  # fmt: skip
    return lines


def definition_lines(rep: Any) -> list[str]:
    def logs(mode: str) -> str:
        return str(len(rep.mape.get(mode, {})))

    fitted = sorted(rep.profiles)
    lo, hi = PREDICT_NODES
    lines = [
        f"- **uncalibrated** (a), {logs('uncalibrated')} logs: no fit. The catalog topology "
        "sized to the log, datasheet link latencies and rates at the fraction NCCL's own "
        "topology model expects of them (src/graph/topo.h), NCCL's per-hop and launch "
        "latencies, its medium-size tree correction (treeCorrectionFactor), and a host launch "
        "floor per GPU the measuring thread drives plus a cost per point-to-point operation.",
        f"- **in-sample** (b), {logs('in_sample')} logs: one profile per system (the setup a "
        "log's file name starts with, `<setup>-<collective>-<n>.txt`), fitted on all of that "
        "system's logs and scored on the same logs. Systems fitted: "
        + (", ".join(f"`{n}`" for n in fitted) or "none")
        + ".",
        f"- **cross-collective** (c), {logs('cross_collective')} logs: fitted on a system's "
        "all_reduce logs, scored on its other collectives (systems with both).",
        f"- **cross-size** (d), {logs('cross_size')} logs: fitted on a system's rows <= 64 MiB, "
        "scored on its larger rows.",
        f"- **cross-scale** (e), {logs('cross_scale')} logs: per *series* -- one system and "
        "collective at several node counts (index entries with the same catalog topology, "
        "collective and source repository) -- fitted on the series' logs at "
        f"<= {FIT_MAX_NODES} nodes and scored on its larger logs, the profile applied as "
        "`collsim validate --cross-scale` applies it (what the fit could not see at the other "
        f"scale stays at the prior). Issue 28's target counts the series whose predicted logs "
        f"all lie in {lo}-{hi} nodes; the others are fitted at their fewest ranks and shown "
        "beside it.",
        "- **multi-node** (the busbw target): a log on two nodes or more as the index gives them "
        "(for the NVL72 systems a node is a 4-GPU tray, so a 2-tray log is all NVLink). Its "
        "busbw error is the mean over its rows >= 256 MiB of |predicted - measured| / measured "
        "busbw, uncalibrated.",
        "- Baselines: NCCL's own tuning model (v2.19-2.21 transcription) on the same topology; a "
        "per-log in-sample fit of t = alpha + beta x bytes.",
        "- Medians and means are over logs (each log once); a series' figure is the mean over "
        "its predicted logs. Which logs each mode scores: the per-log table below ('--' where a "
        "mode does not score a log).",
    ]
    if rep.not_fitted:
        skipped = ", ".join(f"`{k}` ({v})" for k, v in sorted(rep.not_fitted.items()))
        lines.append("- Not fitted in modes (b)-(d) (too many ranks for a fit's hundreds of "
                     f"model builds here, FIT_MAX_RANKS): {skipped}.")  # fmt: skip
    return lines


def miss_lines(rep: Any) -> list[str]:
    """Per missed target, the logs (or series) furthest from it."""
    out = []
    rows = {t.name: t for t in targets_of(rep)}
    for t in rows.values():
        if t.passed:
            continue
        if t.name.startswith("cross-scale worst"):
            rows_ = series_rows(rep.series, rep.mape.get("uncalibrated", {}),
                                rep.mape.get("cross_scale", {}))  # fmt: skip
            worst = sorted(((r.series.name, r.calibrated) for r in rows_
                            if r.series.in_target and r.calibrated is not None),
                           key=lambda kv: -kv[1])[:6]  # fmt: skip
        elif t.name.startswith("cross-scale"):
            worst = sorted(((n, v) for s in rep.series if s.in_target for n in s.predict
                            if (v := rep.mape.get("cross_scale", {}).get(n)) is not None),
                           key=lambda kv: -kv[1])[:6]  # fmt: skip
        elif t.name.startswith("uncalibrated busbw"):
            worst = sorted(rep.multi_node_busbw_errors().items(), key=lambda kv: -kv[1])[:6]
        else:
            mode = "in_sample" if t.name.startswith("in-sample") else "cross_collective"
            worst = sorted(rep.mape.get(mode, {}).items(), key=lambda kv: -kv[1])[:6]
        out.append(f"- {t.name} ({t.verdict}): furthest off "
                   + ", ".join(f"{_bare(n)} {100 * v:.1f}%" for n, v in worst) + ".")  # fmt: skip
    return out or ["- Every target is met."]
