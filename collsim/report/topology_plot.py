"""A picture of a topology a person can read: layers from GPUs up to the core, servers boxed,
link kinds coloured, link widths growing with bandwidth."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import FancyBboxPatch

from collsim.io import save_figure
from collsim.topology.spec import Device, Topology

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


def draw_topology(topology: Topology, path: str | os.PathLike[str], *, title: str = "") -> Path:
    """Write a PNG/SVG/PDF picture of ``topology`` to ``path`` (atomically) and return the path."""
    pos = layout(topology)
    n_devices = len(topology.devices)
    width = min(40.0, max(8.0, 0.35 * len(pos) ** 0.8))
    fig, ax = plt.subplots(figsize=(width, 6.5))
    max_bw = max((lk.bandwidth_bytes_per_s for lk in topology.links), default=1.0)
    seen_kinds: list[str] = []
    thin = n_devices > 600
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
        elif topology.grid_dims:  # a wrap-around link: a dashed arc
            mid_x = (x0 + x1) / 2 + (0.35 if x0 == x1 else 0)
            mid_y = (y0 + y1) / 2 + (0.35 if y0 == y1 else 0)
            ax.plot([x0, mid_x, x1], [y0, mid_y, y1], color=colour, lw=lw * 0.6, alpha=0.5,
                    ls="--", zorder=1)  # fmt: skip
        elif same_layer:
            # Links within a layer (meshes, tori): arcs so they do not hide each other.
            mid_x, mid_y = (x0 + x1) / 2, y0 - 0.25 - 0.05 * abs(x1 - x0) ** 0.5
            ax.plot([x0, mid_x, x1], [y0, mid_y, y1], color=colour, lw=lw, alpha=0.6, zorder=1)
        else:
            ax.plot([x0, x1], [y0, y1], color=colour, lw=lw, alpha=0.55, zorder=1)
        if lk.kind not in seen_kinds:
            seen_kinds.append(lk.kind)
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
    handles = [Line2D([0], [0], color=LINK_COLOURS.get(k, "black"), lw=2.5) for k in seen_kinds]
    legend1 = ax.legend(
        handles, seen_kinds, title="links", loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8
    )
    ax.add_artist(legend1)
    ax.legend(title="devices", loc="lower left", bbox_to_anchor=(1.0, 0.0), fontsize=8)
    ax.set_title(
        title
        or f"{topology.name}: {topology.nodes} x {gpn} {topology.gpu.model} "
        f"({topology.intra_fabric}; {topology.inter_fabric})",
        fontsize=10,
        wrap=True,
    )
    ax.set_yticks([])
    ax.set_xticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.margins(0.03, 0.12)
    fig.tight_layout()
    return save_figure(fig, path)
