"""A picture of a topology a person can read: layers from GPUs up to the core, servers boxed,
link kinds coloured, link widths growing with bandwidth.

Small systems (up to two nodes, at most 150 links) are drawn device by device. Larger ones are
drawn compactly: node 0 in full, the other nodes as boxes and each fabric tier as a box (or its
few switches), each bundle of links between two of them one line labelled with its count and
rate (:mod:`collsim.report.topology_groups`), so the fabric's shape shows instead of hundreds of
crossing lines; labels slide along their lines until clear of each other. Multi-node NVLink
domains (GB200 NVL72) are bands under the node boxes they span, each with its switch and what it
joins. Chip-level tori are drawn chip by chip, one panel per z-plane."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import FancyBboxPatch

from collsim.io import save_figure
from collsim.report.axes import slide_texts
from collsim.report.topology_groups import (
    Bundle,
    Domain,
    Unit,
    box_text,
    domain_texts,
    group,
    node_runs,
    nvlink_domains,
)
from collsim.topology.spec import Device, Link, Topology
from collsim.units import format_rate

LINK_COLOURS = {
    "nvlink": "#76b900",
    "nvlink_c2c": "#4f7a00",
    "pcie": "#8c8c8c",
    "infiniband": "#1f77b4",
    "roce": "#9467bd",
    "ethernet": "#e377c2",
    "efa": "#ff7f0e",
    "slingshot": "#17becf",
    "xgmi": "#d62728",
    "infinity_fabric": "#d62728",
    "ici": "#bcbd22",
    "upi": "#7f7f7f",
}
_LAYER = {"gpu": 0, "nvswitch": 1, "pcie_switch": 1, "cpu": 1.5, "nic": 2}
_MARKERS = {
    "gpu": ("s", "#76b900"),
    "nvswitch": ("D", "#2ca02c"),
    "pcie_switch": ("D", "#8c8c8c"),
    "cpu": ("h", "#555555"),
    "nic": ("o", "#1f77b4"),
    "switch": ("^", "#333333"),
}


def _layer(dev: Device) -> float:
    if dev.kind == "switch":
        return 2.5 + max(1, dev.tier)
    return _LAYER[dev.kind]


def grid_layout(topology: Topology) -> dict[str, tuple[float, float]]:
    """Chip-level tori: chip (x, y, z) at (x + z * (X + 1), y), one panel per z-plane."""
    dims = [*topology.grid_dims, 1, 1]
    pos = {}
    for v, gpu in enumerate(topology.gpus):
        x, y, z = v % dims[0], (v // dims[0]) % dims[1], v // (dims[0] * dims[1])
        pos[gpu.name] = (x + z * (dims[0] + 1.0), float(y))
    return pos


def layout(topology: Topology) -> dict[str, tuple[float, float]]:
    """x along servers (node-major), y by layer: GPUs at the bottom, core switches on top."""
    if topology.grid_dims:
        return grid_layout(topology)
    gpn = max(1, topology.gpus_per_node)
    width_per_node = gpn + 1.0
    pos: dict[str, tuple[float, float]] = {}
    in_node: dict[tuple[int, float], list[Device]] = {}
    fabric: dict[float, list[Device]] = {}
    for dev in topology.devices:
        if dev.node is not None:
            in_node.setdefault((dev.node, _layer(dev)), []).append(dev)
        else:
            fabric.setdefault(_layer(dev), []).append(dev)
    for (node, layer), devs in in_node.items():
        devs.sort(key=lambda d: (d.index, d.name))
        step = gpn / max(1, len(devs))
        for i, dev in enumerate(devs):
            pos[dev.name] = (node * width_per_node + (i + 0.5) * step, layer)
    total = max(1, topology.nodes) * width_per_node - 1
    for layer, devs in fabric.items():
        step = total / max(1, len(devs))
        for i, dev in enumerate(devs):
            pos[dev.name] = ((i + 0.5) * step, layer)
    return pos


def _panel(x: float, topology: Topology) -> int:
    """The z-plane of a chip drawn at ``x`` (:func:`grid_layout`)."""
    return int(x // (topology.grid_dims[0] + 1))


def _panel_centre(z: int, topology: Topology) -> float:
    return z * (topology.grid_dims[0] + 1.0) + (topology.grid_dims[0] - 1) / 2


def _draw_full(ax: Any, topology: Topology) -> list[str]:
    """Every device and link (small systems); returns the link kinds drawn."""
    pos = layout(topology)
    n_devices = len(topology.devices)
    max_bw = max((lk.bandwidth_bytes_per_s for lk in topology.links), default=1.0)
    seen_kinds: list[str] = []
    thin = n_devices > 600
    between: dict[tuple[int, ...], list[Link]] = {}
    for lk in topology.links:
        (x0, y0), (x1, y1) = pos[lk.a], pos[lk.b]
        colour = LINK_COLOURS.get(lk.kind, "black")
        lw = 0.4 + 2.6 * (lk.bandwidth_bytes_per_s / max_bw) ** 0.5
        if thin:
            lw *= 0.4
        same_layer = y0 == y1
        far = abs(x1 - x0) + abs(y1 - y0) > 1.01
        if topology.grid_dims and not far:
            ax.plot([x0, x1], [y0, y1], color=colour, lw=lw, alpha=0.7, zorder=1)
        elif topology.grid_dims and _panel(x0, topology) != _panel(x1, topology):
            pair = tuple(sorted((_panel(x0, topology), _panel(x1, topology))))
            between.setdefault(pair, []).append(lk)  # z-links: one bundle per pair of planes
        elif topology.grid_dims:  # a wrap-around link: a dashed stub out of each end
            for (xa, ya), (xb, yb) in (((x0, y0), (x1, y1)), ((x1, y1), (x0, y0))):
                dx, dy = (xa > xb) - (xa < xb), (ya > yb) - (ya < yb)
                ax.plot([xa, xa + 0.3 * dx], [ya, ya + 0.3 * dy], color=colour, lw=lw * 0.6,
                        alpha=0.6, ls="--", zorder=1)  # fmt: skip
        elif same_layer:
            # Links within a layer (meshes, tori): arcs so they do not hide each other.
            mid_x, mid_y = (x0 + x1) / 2, y0 - 0.25 - 0.05 * abs(x1 - x0) ** 0.5
            ax.plot([x0, mid_x, x1], [y0, mid_y, y1], color=colour, lw=lw, alpha=0.6, zorder=1)
        else:
            ax.plot([x0, x1], [y0, y1], color=colour, lw=lw, alpha=0.55, zorder=1)
        if lk.kind not in seen_kinds:
            seen_kinds.append(lk.kind)
    if between:  # planes side by side: a labelled arrow between neighbours, wraps said below
        top = max(p[1] for p in pos.values()) + 0.6
        planes = 1 + max(z for pair in between for z in pair)
        for z in range(planes):
            ax.text(_panel_centre(z, topology), -0.7, f"z = {z}", ha="center", fontsize=8)
        wraps = []
        for (za, zb), links in between.items():
            rate = format_rate(links[0].bandwidth_bytes_per_s)
            if zb - za > 1:
                wraps.append(f"z {zb} to z {za} (wrap-around): {len(links)} x {rate}")
                continue
            xa, xb = (_panel_centre(z, topology) for z in (za, zb))
            ax.annotate("", (xb, top), (xa, top), arrowprops={"arrowstyle": "<->", "lw": 1.2,
                        "color": LINK_COLOURS.get(links[0].kind, "black")})  # fmt: skip
            ax.text((xa + xb) / 2, top + 0.12, f"{len(links)} x {rate}", **_LABEL)
        if wraps:
            ax.text(_panel_centre(0, topology), -1.0, "; ".join(wraps), fontsize=8, va="top")
        ax.plot([0, 0], [-1.3, top + 0.3], alpha=0)  # room for the labels
    size = 60 if n_devices < 200 else 15
    for kind, (marker, colour) in _MARKERS.items():
        pts = [pos[d.name] for d in topology.devices if d.kind == kind]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.scatter(xs, ys, marker=marker, s=size, c=colour, zorder=3, label=kind)
    gpn = max(1, topology.gpus_per_node)
    for node in range(0 if topology.grid_dims else topology.nodes):
        ax.add_patch(
            FancyBboxPatch(
                (node * (gpn + 1) - 0.1, -0.4),
                gpn + 0.2,
                2.8,
                boxstyle="round,pad=0.05",
                fill=False,
                ec="#999999",
                lw=0.8,
                zorder=0,
            )
        )
        if topology.nodes <= 32:
            ax.text(node * (gpn + 1) + gpn / 2, -0.75, f"node {node}", ha="center", fontsize=8)
    return seen_kinds


def _node0_positions(topology: Topology, units: dict[str, Unit]) -> dict[str, tuple[float, float]]:
    """Node 0's devices placed as the full picture places them (x in [0, GPUs per node])."""
    gpn = max(1, topology.gpus_per_node)
    by_layer: dict[float, list[Unit]] = {}
    for u in units.values():
        if not u.is_box and u.devices[0].node is not None:
            by_layer.setdefault(u.layer, []).append(u)
    pos = {}
    for layer, members in by_layer.items():
        members.sort(key=lambda u: (u.devices[0].index, u.devices[0].name))
        step = gpn / len(members)
        for i, u in enumerate(members):
            pos[u.key] = ((i + 0.5) * step, layer)
    return pos


@dataclass
class _Fit:
    """Texts of a compact picture to fit once the figure is laid out: bundle labels slid along
    their lines (most important first), domain bands' texts shortened to their band's width, and
    the texts they must keep clear of."""

    labels: list[tuple[Any, list[tuple[float, float]]]] = field(default_factory=list)
    bands: list[tuple[Any, list[str], float]] = field(default_factory=list)
    fixed: list[Any] = field(default_factory=list)


_BAND_TOP, _BAND_HEIGHT = -0.95, 0.5
"""Where the multi-node NVLink domains' bands lie: below the node boxes and node 0's label."""


def _draw_compact(ax: Any, topology: Topology) -> tuple[list[str], _Fit]:
    """Node 0 in full, the other nodes and the fabric's tiers as boxes, link bundles labelled
    with their count and rate (:mod:`collsim.report.topology_groups`), multi-node NVLink domains
    as bands under their nodes; returns the link kinds and the texts to fit."""
    units, bundles = group(topology)
    gpn = max(1, topology.gpus_per_node)
    pos = _node0_positions(topology, units)
    boxes: dict[str, tuple[float, float, float, float]] = {}  # key -> x0, y0, width, height
    x = gpn + 1.0
    for u in units.values():
        if u.kind == "nodes":
            boxes[u.key] = (x, -0.4, 1.8, 2.8)
            pos[u.key] = (x + 0.9, 2.4)  # links leave a node box at its top
            x += 2.4
    width = max(x - 0.6, gpn)
    fabric: dict[float, list[Unit]] = {}
    for u in units.values():
        if u.key not in pos and u.kind != "domain":
            fabric.setdefault(u.layer, []).append(u)
    for layer, members in fabric.items():
        members.sort(
            key=lambda u: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", u.key)]
        )
        step = width / len(members)
        for i, u in enumerate(members):
            pos[u.key] = ((i + 0.5) * step, layer)
            if u.is_box:
                w = min(0.8 * step, 4.0)
                boxes[u.key] = (pos[u.key][0] - w / 2, layer - 0.22, w, 0.44)
    fit = _Fit()
    kinds: list[str] = []
    drawn = [b for b in bundles if units[b.a].kind != "domain" and units[b.b].kind != "domain"]
    # Bundles within a fabric layer (between dragonfly groups); node 0's own mesh is unlabelled.
    same_layer = [b for b in drawn if pos[b.a][1] == pos[b.b][1] and units[b.a].is_box]
    for b in drawn:
        (x0, y0), (x1, y1) = pos[b.a], pos[b.b]
        colour = LINK_COLOURS.get(b.kind, "black")
        lw = 0.8 + 0.9 * math.log2(b.count)
        if b.kind not in kinds:
            kinds.append(b.kind)
        if y0 == y1:  # within a tier (dragonfly groups): an arc below it
            mid = ((x0 + x1) / 2, y0 - 0.3 - 0.08 * abs(x1 - x0) ** 0.5)
            ax.plot([x0, mid[0], x1], [y0, mid[1], y1], color=colour, lw=lw, alpha=0.5, zorder=1)
            if b in same_layer and len(same_layer) <= 6:
                fit.labels.append((ax.text(*mid, b.label(), **_LABEL), [mid]))
            continue
        ax.plot([x0, x1], [y0, y1], color=colour, lw=lw, alpha=0.6, zorder=1)
        if b.count > 1:  # single links: the legend gives their rate
            (lx, ly), (hx, hy) = sorted(((x0, y0), (x1, y1)), key=lambda p: p[1])
            to_nodes = units[b.a].kind == "nodes" or units[b.b].kind == "nodes"
            fractions = _TO_NODES if to_nodes else _IN_FABRIC
            at = [(lx + f * (hx - lx), ly + f * (hy - ly)) for f in fractions]
            fit.labels.append((ax.text(*at[0], b.label(), **_LABEL), at))
    fit.labels.sort(key=lambda t: -t[1][0][1])  # the fabric's own bundles first, then top down
    if len(same_layer) > 6:
        labels = sorted({b.label() for b in same_layer})
        layer = pos[same_layer[0].a][1]
        what = labels[0] if len(labels) == 1 else "varying"
        note = ax.text(width / 2, layer - 0.75,
                       f"{len(same_layer)} pairs of groups joined, {what} each",
                       ha="center", va="top", fontsize=7, color="#444444")  # fmt: skip
        fit.fixed.append(note)
    for key, (bx, by, bw, bh) in boxes.items():
        u = units[key]
        ax.add_patch(FancyBboxPatch((bx, by), bw, bh, boxstyle="round,pad=0.05", zorder=2,
                                    fc="#f4f4f4" if u.kind == "nodes" else "white",
                                    ec="#777777", lw=0.9))  # fmt: skip
        fit.fixed.append(ax.text(bx + bw / 2, by + bh / 2, box_text(u), ha="center",
                                 va="center", fontsize=7, zorder=4))  # fmt: skip
    switches = _draw_domains(ax, topology, units, bundles, pos, boxes, fit)
    if switches and "nvlink" not in kinds:
        kinds.append("nvlink")
    size = 60
    for kind, (marker, colour) in _MARKERS.items():
        pts = [pos[u.key] for u in units.values() if u.kind == kind]
        pts += switches if kind == "nvswitch" else []
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.scatter(xs, ys, marker=marker, s=size, c=colour, zorder=3, label=kind)
    ax.add_patch(FancyBboxPatch((-0.1, -0.4), gpn + 0.2, 2.8, boxstyle="round,pad=0.05",
                                fill=False, ec="#999999", lw=0.8, zorder=0))  # fmt: skip
    fit.fixed.append(ax.text(gpn / 2, -0.75, "node 0", ha="center", fontsize=8, zorder=5,
                             bbox=_LABEL["bbox"]))  # fmt: skip
    ax.set_xlim(-0.6, width + 0.6)
    return kinds, fit


_TO_NODES = (0.3, 0.4, 0.2, 0.5, 0.6)
_IN_FABRIC = (0.5, 0.35, 0.65)
"""Where along its line a bundle's label may sit (fractions from the lower end), in order of
preference: near the node boxes, where labels of parallel lines line up, else slid along."""


def _draw_domains(
    ax: Any,
    topology: Topology,
    units: dict[str, Unit],
    bundles: list[Bundle],
    pos: dict[str, tuple[float, float]],
    boxes: dict[str, tuple[float, float, float, float]],
    fit: _Fit,
) -> list[tuple[float, float]]:
    """Each multi-node NVLink domain as a band under the node boxes it spans (domains that share
    a box, one band), with its switch and what it joins; node 0's GPUs and each box reach down
    into it. Returns where the switches are drawn."""
    domains = nvlink_domains(topology)
    if not domains:
        return []
    gpn = max(1, topology.gpus_per_node)
    box_of = {d.node: u.key for u in units.values() if u.kind == "nodes" for d in u.devices}
    bands: dict[tuple[str, ...], list[Domain]] = {}
    for dom in domains:
        spanned = tuple(sorted({box_of.get(n, "node0") for n in dom.nodes}))
        bands.setdefault(spanned, []).append(dom)
    colour = LINK_COLOURS["nvlink"]
    reach = {(b.a, b.b): b for b in bundles} | {(b.b, b.a): b for b in bundles}
    switches = []
    for spanned, members in bands.items():
        edges = [(-0.1, gpn + 0.1) if k == "node0" else (boxes[k][0], boxes[k][0] + 1.8)
                 for k in spanned]  # fmt: skip
        x0, x1 = min(e[0] for e in edges), max(e[1] for e in edges)
        y0 = _BAND_TOP - _BAND_HEIGHT
        ax.add_patch(FancyBboxPatch((x0, y0), x1 - x0, _BAND_HEIGHT, boxstyle="round,pad=0.05",
                                    fc="#eef6dd", ec=colour, lw=1.0, zorder=2))  # fmt: skip
        mid = y0 + _BAND_HEIGHT / 2
        switches.append((x0 + 0.25, mid))
        texts = domain_texts(members)
        text = ax.text(x0 + 0.5, mid, texts[0], ha="left", va="center", fontsize=7, zorder=4)
        fit.bands.append((text, texts, x1 - 0.1))
        keys = {d.key for d in members}
        for key in spanned:
            if key == "node0":  # node 0's GPUs, each straight down into the band
                ends = [pos[k] for (k, sw) in reach if sw in keys and units[k].kind == "gpu"]
                for gx, gy in ends:
                    ax.plot([gx, gx], [gy, _BAND_TOP], color=colour, lw=0.8, alpha=0.6, zorder=1)
                continue
            count = sum(reach[(key, k)].count for k in keys if (key, k) in reach)
            cx = boxes[key][0] + 0.9
            ax.plot([cx, cx], [-0.45, _BAND_TOP], color=colour, alpha=0.6, zorder=1,
                    lw=0.8 + 0.9 * math.log2(max(1, count)))  # fmt: skip
    return switches


def _fit_texts(fig: Any, ax: Any, fit: _Fit) -> None:
    """Once laid out: each band's text, the longest that fits its band; then the bundle
    labels slid along their lines clear of every other text (:func:`slide_texts`)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for text, variants, right_x in fit.bands:
        limit = ax.transData.transform((right_x, 0.0))[0]
        for variant in variants:
            text.set_text(variant)
            if text.get_window_extent(renderer).x1 <= limit:
                break
    slide_texts(ax, [t for t, _ in fit.labels], [spots for _, spots in fit.labels],
                keep_clear=fit.fixed + [t for t, _, _ in fit.bands])  # fmt: skip


_LABEL: dict[str, Any] = {
    "fontsize": 7, "ha": "center", "va": "center", "zorder": 5,
    "bbox": {"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85},
}  # fmt: skip


def compact_by_default(topology: Topology) -> bool:
    """More than two nodes, or more links than a reader can follow: the compact picture."""
    return not topology.grid_dims and (topology.nodes > 2 or len(topology.links) > 150)


def topology_figure(topology: Topology, *, title: str = "", full: bool | None = None) -> Any:
    """The picture of ``topology`` as a matplotlib figure: every device and link (``full``), or
    node 0 in full with the rest grouped (``full=False``); ``None`` picks by size."""
    full = not compact_by_default(topology) if full is None else full
    gpn = max(1, topology.gpus_per_node)
    if full:
        n = len(topology.devices)
        width = min(40.0, max(8.0, 0.35 * n**0.8))
    else:
        n_boxes = len(node_runs(topology.nodes, topology.nvlink_domain_nodes))
        width = min(24.0, max(9.0, 0.5 * (gpn + 2.4 * n_boxes) + 4))
    fig, ax = plt.subplots(figsize=(width, 6.5), layout="constrained")
    kinds, fit = (_draw_full(ax, topology), None) if full else _draw_compact(ax, topology)
    rates: dict[str, set[float]] = {}
    for lk in topology.links:
        rates.setdefault(lk.kind, set()).add(lk.bandwidth_bytes_per_s)
    names = [f"{k} ({', '.join(format_rate(r) for r in sorted(rates[k])[:3])})" for k in kinds]
    handles = [Line2D([0], [0], color=LINK_COLOURS.get(k, "black"), lw=2.5) for k in kinds]
    # Figure legends "outside": the constrained layout makes room for them (a second axes
    # legend added as an artist was left out of the saved picture's bounding box).
    fig.legend(handles, names, title="links (per direction)", loc="outside right upper",
               fontsize=8)  # fmt: skip
    fig.legend(*ax.get_legend_handles_labels(), title="devices", loc="outside right lower",
               fontsize=8)  # fmt: skip
    shown = "" if full or topology.nodes < 2 else "; node 0 in full, the rest grouped"
    ax.set_title(
        title
        or f"{topology.name}: {topology.nodes} x {gpn} {topology.gpu.model} "
        f"({topology.intra_fabric}; {topology.inter_fabric}{shown})",
        fontsize=10,
        wrap=True,
    )
    ax.set_yticks([])
    ax.set_xticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.margins(0.03, 0.12)
    if fit is not None:
        _fit_texts(fig, ax, fit)
    return fig


def draw_topology(
    topology: Topology, path: str | os.PathLike[str], *, title: str = "", full: bool | None = None
) -> Path:
    """Write a PNG/SVG/PDF picture of ``topology`` to ``path`` (atomically) and return the path
    (:func:`topology_figure`)."""
    return save_figure(topology_figure(topology, title=title, full=full), path)
