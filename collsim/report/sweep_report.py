"""``collsim report RESULTS -o DIR``: a sweep's results as Markdown + HTML with PNG plots.

Sections (each only when the results hold what it needs):

* bus bandwidth vs size per algorithm (nccl-tests-style curves), per topology x nodes x collective;
* algorithm crossovers: the fastest algorithm per size range, and each algorithm's time over the
  best one's (crossovers are where a curve touches 1);
* link utilization of the busiest link vs size (the engine's records, or the analytic model's
  link-load bound over the predicted time);
* scaling: bus bandwidth at the largest size vs GPUs, and step time vs GPUs;
* predicted vs measured scatter, given ``--measured``.
"""

from __future__ import annotations

import csv
import html
import math
import os
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from collsim.errors import CollsimError
from collsim.io import atomic_write_text, make_folders
from collsim.metrics import canonical_collective
from collsim.report.axes import count_axis, legend_beside, plain_log_axis, size_axis
from collsim.report.figures import FigureWriter
from collsim.sweep.runner import read_points
from collsim.tables import plural
from collsim.units import format_size

MAX_GROUPS = 24
"""Plots per section at most (the first groups: per collective, cluster sizes in turn, the systems
of one size side by side)."""

Block = tuple[Any, ...]


def _omitted(groups: dict, what: str) -> list[Block]:
    """A line saying how many cases a section leaves out (it plots the first MAX_GROUPS)."""
    extra = len(groups) - MAX_GROUPS
    if extra <= 0:
        return []
    return [("p", f"{extra} more {what} not plotted (the first {MAX_GROUPS} are; "
                  "points.csv holds every case).")]  # fmt: skip


def _f(row: dict[str, str], key: str) -> float | None:
    text = row.get(key, "")
    try:
        return float(text) if text not in ("", None) else None
    except ValueError:
        return None


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _groups(rows: Iterable[dict[str, str]], keys: tuple[str, ...]) -> dict[tuple[str, ...], list]:
    out: dict[tuple[str, ...], list[dict[str, str]]] = defaultdict(list)
    for row in rows:
        out[tuple(row[k] for k in keys)].append(row)
    return out


def _title(key: tuple[str, ...]) -> str:
    topo, nodes, gpus, coll, engine = key
    return f"{coll} on {topo} ({plural(int(nodes), 'node')}, {gpus} GPUs), {engine}"


def _slug(key: tuple[str, ...]) -> str:
    # file names: a faulty scenario's label holds ':', '>', ';' and brackets
    return "-".join(re.sub(r"[^A-Za-z0-9._-]", "_", k) for k in key)


def _size_axis(ax: Any) -> None:
    """Message sizes over the plotted range (:func:`collsim.report.axes.size_axis`; the ticks
    used to come from the default locator, before the data, and ran from 1 B to 64 G)."""
    xs = [x for line in ax.get_lines() for x in line.get_xdata() if x > 0]
    size_axis(ax, min(xs, default=1.0), max(xs, default=1.0))
    ax.set_xlabel("message size")
    ax.grid(True, which="both", alpha=0.3)


def _curves(rows: list[dict[str, str]], field: str) -> dict[str, tuple[list[float], list[float]]]:
    """Per algorithm: sizes and ``field`` values (rows with an error or no value are left out)."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    for algo, items in _groups(rows, ("algorithm",)).items():
        pts = [(_f(r, "bytes"), _f(r, field)) for r in items if not r.get("error")]
        pts = sorted((x, y) for x, y in pts if x and y is not None)
        if pts:
            out[algo[0]] = ([p[0] for p in pts], [p[1] for p in pts])
    return out


def _bandwidth_section(coll_groups: dict, plots: FigureWriter) -> list[Block]:
    blocks: list[Block] = [("h2", "Bus bandwidth vs size")]
    plt = _plt()
    for key, rows in list(coll_groups.items())[:MAX_GROUPS]:
        curves = _curves(rows, "busbw_gbps")
        if not curves:
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        for algo, (x, y) in curves.items():
            ax.plot(x, y, marker=".", label=algo, linestyle="--" if algo == "auto" else "-")
        _size_axis(ax)
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(_title(key), fontsize=10)
        legend_beside(ax)
        blocks.append(("img", plots.save(fig, f"busbw-{_slug(key)}.png"), _title(key)))
    return blocks + _omitted(coll_groups, "cases")


def _crossover_section(coll_groups: dict, plots: FigureWriter) -> list[Block]:
    blocks: list[Block] = [("h2", "Algorithm crossovers")]
    plt = _plt()
    table = []
    for n, (key, rows) in enumerate(coll_groups.items()):  # the table: every case
        curves = {a: c for a, c in _curves(rows, "time_us").items() if a != "auto"}
        if len(curves) < 2:
            continue
        best: dict[float, tuple[float, str]] = {}
        for algo, (x, y) in curves.items():
            for s, t in zip(x, y, strict=True):
                if t > 0 and (s not in best or t < best[s][0]):
                    best[s] = (t, algo)
        sizes = sorted(best)
        start = 0
        for i in range(1, len(sizes) + 1):
            if i == len(sizes) or best[sizes[i]][1] != best[sizes[start]][1]:
                table.append(
                    {
                        "case": _title(key),
                        "from": format_size(int(sizes[start])),
                        "to": format_size(int(sizes[i - 1])),
                        "fastest": best[sizes[start]][1],
                    }
                )
                start = i
        if n >= MAX_GROUPS:  # plots: the first cases only (said below)
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        for algo, (x, y) in curves.items():
            ratio = [t / best[s][0] for s, t in zip(x, y, strict=True) if s in best]
            ax.plot(x[: len(ratio)], ratio, marker=".", label=algo)
        _size_axis(ax)
        ax.set_yscale("log")
        plain_log_axis(ax, which="y")
        ax.set_ylabel("time / fastest algorithm's")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_title(_title(key), fontsize=10)
        legend_beside(ax)
        blocks.append(("img", plots.save(fig, f"crossover-{_slug(key)}.png"), _title(key)))
    if table:
        blocks.insert(1, ("table", table, ["case", "from", "to", "fastest"]))
    return (
        blocks + _omitted(coll_groups, "cases (the table lists them all)")
        if len(blocks) > 1
        else []
    )


def _link_section(coll_groups: dict, plots: FigureWriter) -> list[Block]:
    blocks: list[Block] = [
        ("h2", "Link utilization"),
        ("p", "Utilization of the busiest link over the collective's time (engine des: its "
              "link records; analytic: the link-load bound over the predicted time)."),
    ]  # fmt: skip
    plt = _plt()
    for key, rows in list(coll_groups.items())[:MAX_GROUPS]:
        curves = {a: c for a, c in _curves(rows, "link_util").items() if a != "auto"}
        if not curves:
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        for algo, (x, y) in curves.items():
            ax.plot(x, y, marker=".", label=algo)
        _size_axis(ax)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("busiest link utilization")
        ax.set_title(_title(key), fontsize=10)
        legend_beside(ax)
        blocks.append(("img", plots.save(fig, f"links-{_slug(key)}.png"), _title(key)))
    return blocks + _omitted(coll_groups, "cases") if len(blocks) > 2 else []


def _scaling_section(coll: list[dict[str, str]], steps: list[dict[str, str]], plots: FigureWriter):  # type: ignore[no-untyped-def]
    blocks: list[Block] = [("h2", "Scaling")]
    plt = _plt()
    by_case = _groups(coll, ("topology", "collective", "engine"))
    for key, rows in list(by_case.items())[:MAX_GROUPS]:
        ok = [r for r in rows if not r.get("error") and _f(r, "busbw_gbps") is not None]
        if len({r["gpus"] for r in ok}) < 2:
            continue
        largest = max(_f(r, "size_bytes") or 0 for r in ok)
        fig, ax = plt.subplots(figsize=(7, 4))
        for algo, items in _groups(ok, ("algorithm",)).items():
            pts = sorted(
                (int(r["gpus"]), _f(r, "busbw_gbps"))
                for r in items
                if _f(r, "size_bytes") == largest
            )
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=algo[0])
        count_axis(ax, [int(r["gpus"]) for r in ok])
        ax.set_xlabel("GPUs")
        ax.set_ylabel(f"busbw at {format_size(int(largest))} (GB/s)")
        title = f"{key[1]} on {key[0]}, {key[2]}"
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        legend_beside(ax)
        blocks.append(("img", plots.save(fig, f"scaling-{_slug(key)}.png"), title))
    ok_steps = [r for r in steps if not r.get("error") and _f(r, "step_time_s")]
    for key, rows in list(_groups(ok_steps, ("workload", "engine")).items())[:MAX_GROUPS]:
        fig, ax = plt.subplots(figsize=(7, 4))
        for (topo, layout), items in _groups(rows, ("topology", "layout")).items():
            pts = sorted((int(r["gpus"]), _f(r, "step_time_s")) for r in items)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                    label=f"{topo} {layout}")  # fmt: skip
        count_axis(ax, [int(r["gpus"]) for r in rows])
        ax.set_yscale("log")
        plain_log_axis(ax, which="y")
        ax.set_xlabel("GPUs")
        ax.set_ylabel("step time (s)")
        ax.set_title(f"{key[0]} step time ({key[1]})", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        legend_beside(ax, fontsize=7)
        blocks.append(("img", plots.save(fig, f"steps-{_slug(key)}.png"), key[0]))
        fitting = [r for r in rows if r.get("fits_in_memory", "true").lower() != "false"]
        if not fitting:
            blocks.append(("p", f"{key[0]}: no layout fits in the GPUs' memory."))
            continue
        best = min(fitting, key=lambda r: _f(r, "step_time_s") or float("inf"))
        blocks.append(
            ("p", f"{key[0]}: fastest {best['topology']} x {plural(int(best['nodes']), 'node')}, "
                  f"layout {best['layout_used']}: {float(best['step_time_s']):.4g} s per step, "
                  f"MFU {float(best['mfu']):.1%} (layouts that do not fit in memory left out).")
        )  # fmt: skip
    return blocks if len(blocks) > 1 else []


def read_measured(path: str) -> list[dict[str, str]]:
    """Measured times: a CSV with ``collective``, ``size_bytes`` and ``time_us`` columns (and
    optionally ``topology``, ``nodes``, ``algorithm``); a spreadsheet's byte-order mark and
    spaces around values are fine."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle, skipinitialspace=True)
            header = [(c or "").strip() for c in reader.fieldnames or []]
            rows = [{(k or "").strip(): (v or "").strip() for k, v in row.items()}
                    for row in reader]  # fmt: skip
    except OSError as exc:
        raise CollsimError(f"cannot read file: {exc.strerror}", file=path) from None
    except UnicodeDecodeError:
        raise CollsimError("not a UTF-8 text file", file=path, field="--measured") from None
    need = ("collective", "size_bytes", "time_us")
    for col in need:
        if col not in header:
            raise CollsimError(f"needs a {col!r} column", file=path, field="--measured")
    if not rows:
        raise CollsimError("no measured rows (only a header)", file=path, field="--measured")
    for line, row in enumerate(rows, start=2):  # a measurement that cannot be read is an error
        for col, positive in (("size_bytes", False), ("time_us", True)):
            text = (row.get(col) or "").strip()
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            if not math.isfinite(value) or value < 0 or (positive and value == 0):
                what = "a positive number" if positive else "a number of bytes"
                raise CollsimError(f"line {line}: not {what}", file=path, field=col, value=text)
        nodes = row.get("nodes") or ""
        if nodes and not _whole_at_least_one(nodes):  # optional, but not nonsense ("1.0" is 1)
            raise CollsimError(f"line {line}: not a whole number of nodes >= 1", file=path,
                               field="nodes", value=nodes)  # fmt: skip
    return rows


def _whole_at_least_one(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return math.isfinite(value) and value >= 1 and value == int(value)


def _same(a: str | None, b: str | None) -> bool:
    """Two cells equal as numbers where both are (``1048576.0`` is ``1048576``), else as text."""
    try:
        return float(a or "") == float(b or "")
    except ValueError:
        return (a or "").strip() == (b or "").strip()


def _collective(name: str) -> str:
    """A measured row's collective by its canonical name (``allreduce``, ``all_reduce_perf``),
    or as written where it is none (the row then matches no predicted case, and is counted)."""
    try:
        return canonical_collective(name)
    except CollsimError:
        return name


def _measured_section(
    coll: list[dict[str, str]], measured: list[dict[str, str]], plots: FigureWriter
):  # type: ignore[no-untyped-def]
    """Each measured row against the predictions of its case: its collective and size, and its
    topology, nodes and algorithm where given. A row that names no algorithm is compared with
    the tuner's pick (``auto``) where the sweep ran several algorithms (an error over all of
    them would not measure the model), and is left out if it has none."""
    optional = ("topology", "nodes", "algorithm")
    pairs = []
    unpicked = 0  # rows that match several algorithms' points but no ``auto`` one
    unmatched: list[str] = []  # rows that match no point at all
    for m in measured:
        t = _f(m, "time_us")
        if t is None:
            continue
        found = [
            r for r in coll
            if not r.get("error") and r["collective"] == _collective(m["collective"])
            and (_same(r["size_bytes"], m["size_bytes"]) or _same(r["bytes"], m["size_bytes"]))
            and all(_same(m[k], r[k]) for k in optional if m.get(k))
        ]  # fmt: skip
        if not m.get("algorithm") and len({r["algorithm"] for r in found}) > 1:
            found = [r for r in found if r["algorithm"] == "auto"]
            unpicked += not found
        elif not found:
            unmatched.append(f"{m['collective']} {m['size_bytes']} B")
        pairs += [(t, _f(r, "time_us"), r["algorithm"]) for r in found]
    missed = ""
    if unmatched:
        missed = (f" {len(unmatched)} measured row(s) match no predicted case (e.g. "
                  f"{unmatched[0]}): check their collective, size, topology, nodes and algorithm "
                  "against the sweep's.")  # fmt: skip
    blocks: list[Block] = [("h2", "Predicted vs measured")]
    if not pairs:
        why = ""
        if unpicked:
            why = (f" ({unpicked} measured row(s) name no algorithm and the sweep ran several "
                   "without `auto`: give the algorithm, or add `auto` to the sweep)")  # fmt: skip
        return [*blocks, ("p", f"No measured point matches a predicted one{why}.{missed}")]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for algo, items in _groups([{"a": p[2], "i": str(i)} for i, p in enumerate(pairs)],
                               ("a",)).items():  # fmt: skip
        idx = [int(x["i"]) for x in items]
        ax.scatter([pairs[i][0] for i in idx], [pairs[i][1] for i in idx], s=12, label=algo[0])
    lo = min(min(p[0], p[1]) for p in pairs)
    hi = max(max(p[0], p[1]) for p in pairs)
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured time (us)")
    ax.set_ylabel("predicted time (us)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    errs = sorted(abs(p[1] - p[0]) / p[0] for p in pairs if p[0] > 0)
    median = statistics.median(errs) if errs else 0.0
    blocks.append(("img", plots.save(fig, "predicted-vs-measured.png"), "predicted vs measured"))
    if errs:
        blocks.append(("p", f"{len(pairs)} matched points; median |error| "
                            f"{median:.1%}, max {errs[-1]:.1%}.{missed}"))  # fmt: skip
    return blocks


def _markdown(blocks: list[Block]) -> str:
    out = []
    for block in blocks:
        kind = block[0]
        if kind == "h1":
            out.append(f"# {block[1]}\n")
        elif kind == "h2":
            out.append(f"## {block[1]}\n")
        elif kind == "p":
            out.append(f"{block[1]}\n")
        elif kind == "img":
            out.append(f"![{block[2]}]({block[1]})\n")
        elif kind == "table":
            rows, cols = block[1], block[2]
            out.append("| " + " | ".join(cols) + " |")
            out.append("| " + " | ".join("---" for _ in cols) + " |")
            out += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
            out.append("")
    return "\n".join(out)


def _html(blocks: list[Block], title: str) -> str:
    e = html.escape
    out = [
        "<!DOCTYPE html>",
        f"<html><head><meta charset='utf-8'><title>{e(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:900px;margin:auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}</style>",
        "</head><body>",
    ]
    for block in blocks:
        kind = block[0]
        if kind in ("h1", "h2"):
            out.append(f"<{kind}>{e(block[1])}</{kind}>")
        elif kind == "p":
            out.append(f"<p>{e(block[1])}</p>")
        elif kind == "img":
            out.append(f"<figure><img src='{e(block[1])}' alt='{e(block[2])}' width='700'>"
                       f"<figcaption>{e(block[2])}</figcaption></figure>")  # fmt: skip
        elif kind == "table":
            rows, cols = block[1], block[2]
            out.append("<table><tr>" + "".join(f"<th>{e(c)}</th>" for c in cols) + "</tr>")
            out += [
                "<tr>" + "".join(f"<td>{e(str(r[c]))}</td>" for c in cols) + "</tr>" for r in rows
            ]
            out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write_report(
    results: str | os.PathLike[str],
    output: str | os.PathLike[str],
    measured: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    jobs: int | None = None,
) -> list[Path]:
    """Write ``report.md``, ``report.html`` and the PNGs into ``output``; returns the two pages.
    ``progress(done, total)`` counts the report's sections (each a set of plots) as they are
    built; ``jobs``: processes drawing the figures (default: every core;
    :mod:`collsim.report.figures`)."""
    import json

    rows = read_points(results)
    if not rows:
        raise CollsimError("no points in these results yet; run the sweep", file=str(results))
    name = "sweep"
    where = Path(results)
    spec = (where if where.is_dir() else where.parent) / "spec.json"  # points.csv given: beside it
    if spec.is_file():
        try:
            name = str(json.loads(spec.read_text(encoding="utf-8")).get("name", name))
        except (OSError, ValueError, AttributeError, RecursionError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise CollsimError(
                f"unreadable sweep spec ({reason}); rerun the sweep or remove it to report "
                "without its name",
                file=str(spec),
            ) from None
    folder = make_folders(output, folder=True)
    coll = [r for r in rows if r["kind"] == "collective"]
    steps = [r for r in rows if r["kind"] == "step"]
    errors = [r for r in rows if r.get("error")]
    coll_groups = _groups(coll, ("topology", "nodes", "gpus", "collective", "engine"))

    # Systems of one size next to each other, so a capped section still compares them.
    def by_size(key: tuple[str, ...]) -> tuple[Any, ...]:
        topology, nodes, gpus, collective, engine = key
        return collective, engine, _f({"gpus": gpus}, "gpus") or 0.0, topology, nodes

    coll_groups = dict(sorted(coll_groups.items(), key=lambda kv: by_size(kv[0])))
    blocks: list[Block] = [
        ("h1", f"Sweep report: {name}"),
        ("p", f"{len(rows)} points from {results}: {len(coll)} collective, {len(steps)} step "
              f"time; {len(errors)} could not be computed (their 'error' column says why)."),
    ]  # fmt: skip
    measured_rows = read_measured(measured) if measured else None  # a bad file: before any plot
    sections: list[Callable[[], list[Block]]] = [
        lambda: _bandwidth_section(coll_groups, plots),
        lambda: _crossover_section(coll_groups, plots),
        lambda: _link_section(coll_groups, plots),
        lambda: _scaling_section(coll, steps, plots),
    ]
    if measured_rows is not None:
        sections.append(lambda: _measured_section(coll, measured_rows, plots))
    with FigureWriter(folder, jobs) as plots:  # figures drawn on every core as they are built
        for done, section in enumerate(sections):
            if progress is not None:
                progress(done, len(sections))
            blocks += section()
    if progress is not None:
        progress(len(sections), len(sections))
    md = atomic_write_text(folder / "report.md", _markdown(blocks))
    page = atomic_write_text(folder / "report.html", _html(blocks, f"Sweep report: {name}"))
    return [md, page]
