"""Workflow speed: the waits a user meets outside the engine's replay (issue 30's other targets).

Each case runs in a fresh process, as a user runs it, and is timed end to end (wall clock,
interpreter start and imports included) with its peak resident memory:

1. ``simulate all_reduce -t dgx-h100 --nodes 4096 --engine analytic -b 1G -e 1G``: one size on
   32,768 GPUs, the analytic model choosing among every algorithm it prices.
   Target: <= 5 s.
2. 32,768-GPU topology and routes: ``dgx-h100 --nodes 4096`` loaded, its network and fabric
   built, and the routes of every flat-ring edge (rank ``r -> r + 1``) and every rail edge (GPU
   ``g`` of node ``n`` to GPU ``g`` of node ``n + 1``) found. Target: <= 10 s.
3. ``simulate all_reduce -t dgx-h100 --nodes 16 -b 8 -e 8G -f 2 --tuned`` on the
   discrete-event engine (NCCL's choice per size, each timed by the engine). Target: <= 20 s.
4. ``collsim report`` of a sweep of >= 1,000 analytic points (the sweep run first, untimed).
   Target: <= 10 s.

Writes ``reports/workflow_speed.md``. Run: ``.venv/bin/python benchmarks/workflow_speed.py``
(about 3 minutes on 2 cores); ``--cases analytic_4096 topology_32k`` runs some.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collsim.io import atomic_write_text  # noqa: E402

CLI = [sys.executable, "-m", "collsim"]

ROUTES = """
import json, time
import numpy as np
t0 = time.perf_counter()
from collsim.topology.loader import load_topology
from collsim.whatif import WhatIf
t1 = time.perf_counter()
topo = load_topology("dgx-h100", nodes=4096)
t2 = time.perf_counter()
fabric = WhatIf(topo).fabric
t3 = time.perf_counter()
n, g = topo.n_gpus, topo.gpus_per_node
ranks = np.arange(n)
ptr, links, lat = fabric.routes(ranks, (ranks + 1) % n)
t4 = time.perf_counter()
ptr2, links2, lat2 = fabric.routes(ranks, (ranks + g) % n)
t5 = time.perf_counter()
assert ptr.size == n + 1 and ptr2.size == n + 1 and (lat > 0).all() and (lat2 > 0).all()
print(json.dumps({"import": t1 - t0, "topology": t2 - t1, "network + fabric": t3 - t2,
                  "ring routes": t4 - t3, "rail routes": t5 - t4, "routes found": 2 * n,
                  "links on them": int(ptr[-1] + ptr2[-1])}))
"""

SWEEP = """name: report-speed
topologies: [dgx-h100, hgx-b200]
nodes: [2, 16]
collectives: [all_reduce, all_gather]
algorithms: [all]
sizes: {min: 8, max: 16G, factor: 2}
engines: [analytic]
"""

TARGETS_S = {"analytic_4096": 5.0, "topology_32k": 10.0, "tuned_16": 20.0, "report": 10.0}


def timed(cmd: list[str], cwd: Path | None = None) -> tuple[float, str]:
    """Wall seconds and stdout of ``cmd`` in a fresh process."""
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return wall, done.stdout


def peak_of(cmd: list[str], cwd: Path | None = None) -> tuple[float, float, str]:
    """:func:`timed` with the process's peak resident memory in MB (from ``/usr/bin/time``
    where it exists, else the largest of this script's children so far)."""
    gnu_time = Path("/usr/bin/time")
    if not gnu_time.exists():
        wall, out = timed(cmd, cwd)
        return wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, out
    with tempfile.NamedTemporaryFile("r", suffix=".txt") as note:
        wall, out = timed([str(gnu_time), "-f", "%M", "-o", note.name, *cmd], cwd)
        text = Path(note.name).read_text().split()
    return wall, (int(text[-1]) / 1024 if text else float("nan")), out


def case_analytic_4096() -> dict:
    cmd = [*CLI, "simulate", "all_reduce", "-t", "dgx-h100", "--nodes", "4096", "--engine",
           "analytic", "-b", "1G", "-e", "1G"]  # fmt: skip
    wall, peak, out = peak_of(cmd)
    row = next(ln for ln in out.splitlines() if ln.strip() and not ln.startswith("#")).split()
    return {"wall_s": wall, "peak_mb": peak, "detail": f"{row[-1]}, {row[5]} us, busbw {row[7]}"}


def case_topology_32k() -> dict:
    wall, peak, out = peak_of([sys.executable, "-c", ROUTES])
    parts = json.loads(out)
    detail = ", ".join(f"{k} {v:.2f} s" for k, v in parts.items() if isinstance(v, float))
    detail += f"; {parts['routes found']:,} routes, {parts['links on them']:,} link entries"
    return {"wall_s": wall, "peak_mb": peak, "detail": detail}


def case_tuned_16() -> dict:
    cmd = [*CLI, "simulate", "all_reduce", "-t", "dgx-h100", "--nodes", "16", "-b", "8", "-e",
           "8G", "-f", "2", "--tuned"]  # fmt: skip
    wall, peak, out = peak_of(cmd)
    rows = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith("#")]
    return {"wall_s": wall, "peak_mb": peak, "detail": f"{len(rows)} sizes, DES"}


def case_report() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.yaml"
        spec.write_text(SWEEP)
        timed([*CLI, "sweep", str(spec), "-o", str(Path(tmp) / "results")])
        with open(Path(tmp) / "results" / "points.csv") as f:
            points = sum(1 for _ in f) - 1
        assert points >= 1000, points
        wall, peak, _ = peak_of([*CLI, "report", str(Path(tmp) / "results"), "-o",
                                 str(Path(tmp) / "report")])  # fmt: skip
        figures = len(list((Path(tmp) / "report").rglob("*.png")))
    return {"wall_s": wall, "peak_mb": peak, "detail": f"{points:,} points, {figures} figures"}


CASES = {
    "analytic_4096": ("one analytic size, 4,096 DGX H100 nodes (32,768 GPUs)", case_analytic_4096),
    "topology_32k": ("32,768-GPU topology + ring and rail routes", case_topology_32k),
    "tuned_16": ("16-node `--tuned` DES sweep, 8 B - 8 GiB", case_tuned_16),
    "report": ("`collsim report` of a >= 1,000-point sweep", case_report),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    args = parser.parse_args()
    rows = []
    for name in args.cases:
        label, fn = CASES[name]
        found = fn()
        target = TARGETS_S[name]
        verdict = "met" if found["wall_s"] <= target else "**missed**"
        rows.append(f"| {label} | {found['wall_s']:.2f} | {found['peak_mb']:.0f} | "
                    f"{found['detail']} | <= {target:g} s: {verdict} |")  # fmt: skip
        print(rows[-1], flush=True)
    load = os.getloadavg()[0]
    text = "\n".join([
        "# Workflow speed",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, load average {load:.1f} at the end. Command: "
        f"`python benchmarks/workflow_speed.py` (cases: {', '.join(args.cases)}). Each case in a "
        "fresh process, wall clock from interpreter start (imports included), peak RSS of "
        "the process.",
        "",
        "| case | wall s | peak MB | what | target (issue 30) |",
        "|---|---:|---:|---|---|",
        *rows,
        "",
        "The analytic case builds every candidate algorithm's structure (routes, max-min shares, "
        "critical paths) over 32,768 ranks before it prices the size; the ring's longest path "
        "is found in one pass per phase (`collsim/model/grid.py`), NVLS+tree's thousands of "
        "node reductions as arrays (`TopologyFabric.in_network_many`).",
        "",
    ])  # fmt: skip
    atomic_write_text(ROOT / "reports" / "workflow_speed.md", text)
    print(text)


if __name__ == "__main__":
    main()
