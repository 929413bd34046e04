"""The validation report over the bundled dataset (``reports/validation.md`` and its plots).

Per log, the MAPE on time of:

* (a) the uncalibrated model (catalog topology, datasheet links at NCCL's achievable fraction,
  NCCL's latencies and tree correction);
* (b) calibrated in-sample: one profile per *system* (the setup a log's file name starts with,
  ``<setup>-<collective>-<n>.txt``) fitted on all its logs;
* (c) cross-collective: fitted on the system's all_reduce logs, predicting its other collectives;
* (d) cross-size: fitted on the system's rows <= 64 MiB, predicting its larger rows;
* (e) cross-scale: per scale series (:mod:`.scale_series`: one system and collective at several
  node counts), fitted on its logs at <= 8 nodes, predicting the larger ones;

beside two baselines: NCCL's own tuning model (``--model nccl``, uncalibrated) and a per-log
two-parameter latency-bandwidth fit ``t = alpha + beta * bytes`` (Hockney, "The communication
challenge for MPP", Parallel Computing 1994), fitted in-sample by linear least squares on the
relative error; and issue 28's targets (:mod:`.targets`). :func:`build` computes it all as cached
jobs (:mod:`.report_jobs`); :func:`write` renders the Markdown (:mod:`.report_text`) and plots.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from collsim.calibration.dataset import DatasetEntry, load_index, read_dataset
from collsim.calibration.fit import Sample
from collsim.calibration.log_context import env_from_notes, topology_for_log
from collsim.calibration.report_jobs import Job, RunStats, run_jobs
from collsim.calibration.report_text import (
    MODES,
    TITLES,
    busbw_lines,
    definition_lines,
    left_out_lines,
    miss_lines,
    pct,
    run_lines,
    series_lines,
    summary,
    target_lines,
)
from collsim.calibration.scale_series import ScalePlot, Series, scale_plot, series_of
from collsim.calibration.targets import busbw_error
from collsim.calibration.validate import LogResult, Validation, compare, plot_validation
from collsim.io import atomic_write_bytes, atomic_write_text, make_folders
from collsim.model.profile import Profile, profile_from_dict

SMALL_BYTES = 64 * 1024**2
FIT_MAX_RANKS = 64
"""Systems fitted in modes (b)-(d) have at most this many ranks per log. A fit rebuilds its
models at every step of the search (hundreds of times): at 1024 and 2160 ranks one build of a
Polaris alltoall takes minutes, and a fit of the 128-rank GB300 system had not finished after
ten minutes on a loaded two-core machine; larger systems are fitted only where cross-scale fits
them, at <= 8 nodes (``--fit-max-ranks`` raises it)."""


def system_of(name: str) -> str:
    """``<setup>`` of ``<setup>-<collective>-<n>.txt``."""
    return re.sub(r"-(all_reduce|all_gather|reduce_scatter|broadcast|reduce|alltoall|sendrecv)"
                  r"-\d+\.\w+$", "", name)  # fmt: skip


def subset(s: Sample, mask: np.ndarray) -> Sample:
    out = Sample(s.log, s.topology, s.env, s.name, s.nccl_version)
    out.sizes, out.measured_s = s.sizes[mask], s.measured_s[mask]
    return out


def alpha_beta(s: Sample) -> np.ndarray:
    """In-sample two-parameter fit: minimise sum(((alpha + beta S) / t - 1)^2), alpha, beta >= 0."""
    from scipy.optimize import lsq_linear

    a = np.column_stack([1.0 / s.measured_s, s.sizes / s.measured_s])
    scale = np.array([1e-6, 1e-10])
    res = lsq_linear(a * scale, np.ones(s.sizes.size), bounds=(0, np.inf))
    x = res.x * scale
    return x[0] + x[1] * s.sizes


def alpha_beta_with_empty_rows(samples: Sequence[Sample]) -> tuple[float, float]:
    """(mean, median) MAPE of the alpha-beta baseline when 0-byte rows are kept (for comparison
    with figures computed that way)."""
    mapes = []
    for s in samples:
        rows = [r for r in s.log.rows if r.time_us]
        full = subset(s, np.ones(s.sizes.size, dtype=bool))
        full.sizes = np.array([r.size_bytes for r in rows], dtype=np.int64)
        full.measured_s = np.array([r.time_us for r in rows]) * 1e-6
        pred = alpha_beta(full)
        mapes.append(float(np.mean(np.abs(pred - full.measured_s) / full.measured_s)))
    return float(np.mean(mapes)), float(np.median(mapes))


@dataclass
class Report:
    samples: list[Sample]
    mape: dict[str, dict[str, float]] = field(default_factory=dict)  # mode -> log -> mape
    profiles: dict[str, Profile] = field(default_factory=dict)  # system -> in-sample profile
    validations: dict[str, Validation] = field(default_factory=dict)
    exact: set[str] = field(default_factory=set)  # logs whose catalog topology is exact
    seconds: float = 0.0
    unfitted: dict[str, str] = field(default_factory=dict)  # what could not be fitted, and why
    series: list[Series] = field(default_factory=list)
    series_profiles: dict[str, Profile] = field(default_factory=dict)  # series name -> profile
    nodes: dict[str, int] = field(default_factory=dict)  # log -> nodes (index)
    not_fitted: dict[str, str] = field(default_factory=dict)  # system -> why modes b-d skip it
    stats: RunStats = field(default_factory=RunStats)
    workers: int = 1
    left_out: list[str] = field(default_factory=list)  # dataset logs this run left out

    def multi_node_busbw_errors(self) -> dict[str, float]:
        """Uncalibrated mean |busbw error| over rows >= 256 MiB, per log on two nodes or more
        (:func:`~.targets.busbw_error`)."""
        v = self.validations.get("uncalibrated")
        out = {}
        for r in v.logs if v else []:
            if self.nodes.get(r.file, 1) < 2:
                continue
            err = busbw_error([(p.bytes, p.measured_busbw_gbps, p.predicted_busbw_gbps)
                               for p in r.points])  # fmt: skip
            if err is not None:
                out[r.file] = err
        return out

    def put(self, mode: str, results: Sequence[LogResult]) -> None:
        self.mape.setdefault(mode, {}).update({r.file: r.mape for r in results})
        old = self.validations.get(mode)
        self.validations[mode] = Validation((old.logs if old else []) + list(results))


def dataset_samples(directory: str | Path | None = None) -> list[Sample]:
    """Every log of the dataset on its sized catalog topology, with NCCL_* settings of its notes."""
    out = []
    for entry, log in read_dataset(directory):
        topo = topology_for_log(entry.topology, log, **entry.topology_overrides())
        out.append(Sample(log, topo, env_from_notes(entry.notes), entry.name, entry.nccl_version))
    return out


def exact_logs(directory: str | Path | None = None) -> set[str]:
    """Names of the dataset logs whose catalog topology is the measured system (not nearest)."""
    return {e.name for e in load_index(directory) if e.topology_match == "exact"}


def _profile_text(outcome_result: dict[str, Any]) -> str | None:
    prof = outcome_result.get("profile")
    return None if prof is None else json.dumps(prof, sort_keys=True)


def _fit_jobs(
    samples: Sequence[Sample], series: Sequence[Series], fit_max_ranks: int, rep: Report
) -> tuple[list[Job], dict[str, list[str]]]:
    """The fits (modes b-e) and, per fit, the logs its profile predicts."""
    ranks = {s.name: s.log.ranks for s in samples}
    jobs: list[Job] = []
    targets: dict[str, list[str]] = {}

    def add(key: str, logs: list[str], predict: list[str], small: bool = False) -> None:
        jobs.append(Job(key, tuple(logs), small_rows=small,
                        cost=1e3 * sum(ranks[n] for n in logs)))  # fmt: skip
        targets[key] = predict

    systems: dict[str, list[Sample]] = {}
    for s in samples:
        systems.setdefault(system_of(s.name), []).append(s)
    for name, group in systems.items():
        most = max(s.log.ranks for s in group)
        if most > fit_max_ranks:
            rep.not_fitted[name] = f"{most} ranks > {fit_max_ranks}"
            continue
        add(f"fit/in_sample/{name}", [s.name for s in group], [s.name for s in group])
        ar = [s.name for s in group if s.log.collective == "all_reduce"]
        others = [s.name for s in group if s.log.collective != "all_reduce"]
        if ar and others:
            add(f"fit/cross_collective/{name}", ar, others)
        large = [s for s in group if (s.sizes > SMALL_BYTES).any()]
        small = [s for s in group if (s.sizes <= SMALL_BYTES).sum() >= 3]
        if large and all((s.sizes <= SMALL_BYTES).sum() >= 3 for s in large):
            add(f"fit/cross_size/{name}", [s.name for s in small], [s.name for s in large],
                small=True)  # fmt: skip
    for ser in series:
        if not all(n in ranks for n in ser.fit_on):  # a log it fits on is left out
            continue
        add(f"fit/cross_scale/{ser.slug}", list(ser.fit_on), list(ser.predict))
        targets[f"fit/cross_scale_fit/{ser.slug}"] = list(ser.fit_on)  # the plots' fit scales
    return jobs, targets


def _applies(
    rep: Report, targets: dict[str, list[str]], fitted: dict[str, Any], samples: Sequence[Sample]
) -> dict[str, list[tuple[str, str]]]:
    """Per log, the (mode, profile) pairs of the fits done so far that predict it; notes the
    in-sample and series profiles and the fits that failed in ``rep``."""
    applies: dict[str, list[tuple[str, str]]] = {s.name: [] for s in samples}
    for key, logs in targets.items():
        _, mode, group = key.split("/", 2)
        source = fitted.get(key.replace("cross_scale_fit", "cross_scale"))
        if source is None:
            continue
        text = _profile_text(source.result)
        if text is None:
            if mode != "cross_scale_fit":
                rep.unfitted[f"{group} ({mode})"] = source.result.get("error", "no profile")
            continue
        if mode == "in_sample":
            rep.profiles[group] = profile_from_dict(json.loads(text))
        if mode == "cross_scale":
            rep.series_profiles[group] = profile_from_dict(json.loads(text))
        for n in logs:
            if n in applies:  # not a log left out
                applies[n].append((mode, text))
    return applies


def _predict_jobs(
    samples: Sequence[Sample], applies: dict[str, list[tuple[str, str]]]
) -> list[Job]:
    """One prediction job per log, with the profiles that apply to it."""
    return [
        Job(f"predict/{s.name}", (s.name,), profiles=tuple(sorted(applies[s.name])),
            cost=float(s.log.ranks) ** (2 if s.log.collective == "alltoall" else 1))
        for s in samples
    ]  # fmt: skip


def build(
    samples: Sequence[Sample],
    exact: set[str] | None = None,
    *,
    data_dir: str | Path | None = None,
    workers: int = 1,
    cache: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
    fit_max_ranks: int = FIT_MAX_RANKS,
    left_out: Sequence[str] = (),
) -> Report:
    """Every mode, baseline and series over ``samples`` (dataset logs of ``data_dir``): fits and
    one prediction job per log, in ``workers`` processes, each cached under ``cache`` where given
    (:func:`~.report_jobs.run_jobs`); the results are assembled in ``samples``' order.
    ``left_out``: dataset logs deliberately not run (named in the report; the series still
    count them, so a target cannot pass without them)."""
    rep = Report(list(samples), exact=set(exact or ()), workers=workers,
                 left_out=sorted(left_out))  # fmt: skip
    names = {s.name for s in samples}
    entries: list[DatasetEntry] = [e for e in load_index(data_dir) if e.name in names]
    rep.nodes = {e.name: e.nodes for e in entries}
    # Series over the logs left out too: a target series missing one is a MISS, not a pass.
    rep.series = series_of([e for e in load_index(data_dir) if e.name in names | set(left_out)])
    fits, targets = _fit_jobs(samples, rep.series, fit_max_ranks, rep)
    say = progress or (lambda _: None)
    kw: dict[str, Any] = {"data_dir": data_dir, "cache": cache, "workers": workers,
                          "progress": progress, "stats": rep.stats}  # fmt: skip
    # Three rounds, so the longest job (a 2160-rank alltoall, whose routes take minutes) starts
    # early: the series' fits (small: <= 8 nodes); then the systems' fits beside the predictions
    # that need no system fit (the systems above fit_max_ranks: the largest logs); then the rest.
    series_fits = [j for j in fits if j.key.startswith("fit/cross_scale/")]
    say(f"round 1: {len(series_fits)} cross-scale fits")
    fitted = dict(run_jobs(series_fits, **kw))
    early = {s.name for s in samples if system_of(s.name) in rep.not_fitted}
    preds = _predict_jobs(samples, _applies(rep, targets, fitted, samples))
    system_fits = [j for j in fits if j not in series_fits]
    first = [j for j in preds if j.logs[0] in early]
    say(f"round 2: {len(system_fits)} system fits beside {len(first)} predictions")
    got = run_jobs(system_fits + first, **kw)
    fitted.update({k: v for k, v in got.items() if k.startswith("fit/")})
    preds = _predict_jobs(samples, _applies(rep, targets, fitted, samples))
    rest = [j for j in preds if j.logs[0] not in early]
    say(f"round 3: {len(rest)} predictions")
    predicted = {**{k: v for k, v in got.items() if k.startswith("predict/")},
                 **run_jobs(rest, **kw)}  # fmt: skip
    for s, job in zip(samples, preds, strict=True):
        result = predicted[job.key].result
        for mode, pred in result.items():
            if "error" in pred:
                continue
            t = np.asarray(pred["s"])
            if mode == "cross_size":  # predicted for the rows above the fit's
                keep = s.sizes > SMALL_BYTES
                r = compare(subset(s, keep), t[keep], list(np.asarray(pred["labels"])[keep]))
            else:
                r = compare(s, t, pred["labels"])
            rep.put(mode, [r])
        rep.put("alpha_beta", [compare(s, alpha_beta(s))])
    rep.seconds = rep.stats.wall_s
    return rep


def markdown(rep: Report, plots: dict[str, str], *, command: str = "") -> str:
    """The report's Markdown (every number computed from ``rep``; :mod:`.report_text`)."""
    regen = command or "python benchmarks/validation_report.py --jobs 2"
    lines = [
        "# Validation against published nccl-tests measurements",
        "",
        f"Regenerate with `{regen}` (writes this file and `reports/validation/*.png`; results "
        "are cached per job, keyed by the logs, topologies and collsim source they read, so a "
        "rerun recomputes only what changed). Every number below was computed by that command "
        f"from the {len(rep.samples)} logs in `data/nccl-tests/` "
        "(`collsim/calibration/report.py` says how).",
        "",
        *run_lines(rep),
        "",
        *left_out_lines(rep),
        "MAPE = mean over a log's out-of-place rows (0-byte rows excluded) of |predicted - "
        "measured| / measured, on time. Predictions take the tuner's choice among NCCL's "
        "algorithms, protocols and channels per size, honouring NCCL_ALGO/NCCL_PROTO/"
        "NCCL_TREE_THRESHOLD where a log (or its index notes) records them.",
        "",
        "## Issue 28's targets",
        "",
        *target_lines(rep),
        "",
        "## Cross-scale per series (MAPE %)",
        "",
        *series_lines(rep),
        "",
        "## Uncalibrated busbw at >= 256 MiB on multi-node logs",
        "",
        *busbw_lines(rep),
        "",
        "## Definitions",
        "",
        *definition_lines(rep),
        "",
        "## Summary (MAPE %, over logs)",
        "",
        "| mode | logs | mean | median |",
        "| --- | ---: | ---: | ---: |",
    ]
    for mode in MODES:
        mean, med, n = summary(rep, mode)
        lines.append(f"| {TITLES[mode]} | {n} | {pct(mean)} | {pct(med)} |")
    ab_mean, ab_median = alpha_beta_with_empty_rows(rep.samples)
    lines += [
        "",
        f"The alpha-beta baseline keeping the 0-byte rows (which time an empty call, not a "
        f"collective) scores {pct(ab_mean)}% mean / {pct(ab_median)}% median; every MAPE here "
        "leaves those rows out.",
        "",
        "## Per log (MAPE %)",
        "",
        "| log | coll. | nodes | ranks | " + " | ".join(TITLES[m] for m in MODES) + " |",
        "| --- | --- | ---: | ---: | " + " | ".join("---:" for _ in MODES) + " |",
    ]
    for s in rep.samples:
        cells = [pct(rep.mape.get(m, {}).get(s.name)) for m in MODES]
        lines.append(f"| {s.name} | {s.log.collective} | {rep.nodes.get(s.name, '?')} | "
                     f"{s.log.ranks} | " + " | ".join(cells) + " |")  # fmt: skip
    for label, idx in (("**mean**", 0), ("**median**", 1)):
        cells = [pct(summary(rep, m)[idx]) for m in MODES]
        lines.append(f"| {label} | | | | " + " | ".join(cells) + " |")
    lines += ["", "## Fitted profiles (mode b), one per system", "",
              "| system | topology | link classes (bandwidth eff. / latency scale) | "
              "base us / floor us per launch | size efficiency (64K, 1M, 16M) | in-sample mean % |",
              "| --- | --- | --- | ---: | --- | ---: |"]  # fmt: skip
    for name, prof in rep.profiles.items():
        doc = prof.doc
        cls = ", ".join(
            f"{k} {c.bandwidth_efficiency:.2f}/{c.latency_scale:.2f}"
            for k, c in doc.link_classes.items()
        )
        sizes = ", ".join(f"{f:.2f}" for _, f in doc.size_efficiency[:-1])
        err = pct(doc.fit_error.mape) if doc.fit_error else "--"
        base_us = f"{doc.base_latency_us:.1f} / {doc.launch_floor_us:.1f}"
        lines.append(f"| {name} | {doc.topology.name} | {cls} | {base_us} | {sizes} | {err} |")
    if rep.unfitted:
        lines += [
            "",
            "Not fitted (their rows cannot determine a profile; those modes show --): "
            + "; ".join(f"{k}: {v}" for k, v in rep.unfitted.items())
            + ".",
        ]
    lines += ["", "## Where the targets are missed", "", *miss_lines(rep)]
    lines += ["", "## Plots", ""]
    for title, path in plots.items():
        lines.append(f"![{title}]({path})")
        lines.append("")
    return "\n".join(lines) + "\n"


def scatter(rep: Report, path: Path) -> None:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    for mode, color in (("uncalibrated", "C3"), ("nccl", "C2"), ("in_sample", "C0")):
        v = rep.validations.get(mode)
        if v is None:
            continue
        m = [p.measured_us for r in v.logs for p in r.points]
        p = [p.predicted_us for r in v.logs for p in r.points]
        ax.loglog(m, p, ".", ms=2, color=color, label=TITLES[mode], alpha=0.6)
    lims = [1, 1e6]
    ax.plot(lims, lims, "k-", lw=0.5)
    ax.set_xlabel("measured time (us)")
    ax.set_ylabel("predicted time (us)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


ScalePlotter = Callable[[ScalePlot, Path], Any]


def write(
    rep: Report,
    out_md: str | Path,
    *,
    scale_plotter: ScalePlotter | None = None,
    command: str = "",
) -> Path:
    """Render ``rep`` to ``out_md`` and its plots to ``<dir>/validation/``: the scatter, the
    in-sample busbw of four systems, and per series its busbw against nodes drawn by
    ``scale_plotter(plot, path)`` where given (the report floor's
    :func:`collsim.report.scale_plots.plot_scale`, passed in: it sits above this module)."""
    out_md = Path(out_md)
    plot_dir = make_folders(out_md.parent / "validation", folder=True)
    plots: dict[str, str] = {}
    scatter(rep, plot_dir / "scatter.png")
    plots["predicted vs measured time, every row"] = "validation/scatter.png"
    if scale_plotter is not None:
        results = {m: {r.file: r for r in v.logs} for m, v in rep.validations.items()}
        for ser in rep.series:
            name = f"scale-{ser.slug}.png"
            scale_plotter(scale_plot(ser, results), plot_dir / name)
            plots[f"busbw vs nodes, {ser.name}"] = f"validation/{name}"
    v = rep.validations.get("in_sample")
    if v is not None:
        for system in ("a100-40g-8gpu-superbench", "a100-p4d-efa-2n", "h100-snellius-ib-2n",
                       "a100pcie-ib-2n1g-gdr"):  # fmt: skip
            logs = [r for r in v.logs if system_of(r.file) == system]
            if logs:
                name = f"busbw-{system}.png"
                title = f"{system}: measured (dots) vs in-sample fit (lines)"
                plot_validation(Validation(logs), plot_dir / name, title=title)
                plots[f"busbw, {system} (in-sample)"] = f"validation/{name}"
    atomic_write_text(out_md, markdown(rep, plots, command=command))
    return out_md
