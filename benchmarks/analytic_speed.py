"""Analytic model speed: predictions per second, and a full nccl-tests sweep on 1024 GPUs.

Measures, on ``dgx-h100 --nodes 128`` (1024 GPUs):

1. *Structure* (once per topology x collective x algorithm x protocol x channels): routes, waves,
   max-min shares, the envelope of the critical path -- timed separately, it is cached.
2. *Vectorised evaluation*: one cached structure over 1,000,000 sizes (size points per second).
3. *Full sweep*: every collective and algorithm at every size of ``-b 8 -e 16G -f 2`` (32 sizes),
   structures cached: the what-if a user runs, end to end through ``AnalyticModel.predict``.

Writes ``reports/analytic_speed.md``. Run: ``.venv/bin/python benchmarks/analytic_speed.py``.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collsim import units  # noqa: E402
from collsim.io import atomic_write_text  # noqa: E402
from collsim.topology.loader import load_topology  # noqa: E402
from collsim.whatif import WhatIf  # noqa: E402

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall",
               "sendrecv")  # fmt: skip


def _best(fn, repeat: int = 5) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    topo = load_topology("dgx-h100", nodes=128)
    t0 = time.perf_counter()
    whatif = WhatIf(topo)
    model = whatif.cost_model("collsim")
    setup_s = time.perf_counter() - t0
    pairs = [(c, a) for c in COLLECTIVES for a in whatif.candidates(c)]
    built, skipped, per_struct = [], [], {}
    for coll, algo in pairs:
        t1 = time.perf_counter()
        try:
            model.structure(coll, algo)
        except Exception as exc:  # in-network needs a switch every rank reaches
            skipped.append(f"{coll}/{algo} ({type(exc).__name__})")
            continue
        per_struct[f"{coll}/{algo}"] = time.perf_counter() - t1
        built.append((coll, algo))
    structure_s = sum(per_struct.values())

    sizes = np.asarray(units.size_range(8, 16 << 30, 2))
    million = np.geomspace(8, 16 << 30, 1_000_000).astype(np.int64)
    rate_s = _best(lambda: model.predict("all_reduce", "ring", million), repeat=5)
    points_per_s = million.size / rate_s

    def sweep() -> None:
        for coll, algo in built:
            model.predict(coll, algo, sizes)

    sweep_s = _best(sweep, repeat=20)
    n_points = len(built) * sizes.size
    cpu = platform.processor() or platform.machine()
    lines = [
        "# Analytic model speed",
        "",
        f"Measured by `benchmarks/analytic_speed.py` on {platform.node() or 'this machine'}: {cpu},"
        f" {os.cpu_count()} logical CPUs, Python {platform.python_version()}, numpy"
        f" {np.__version__}; one process, best of several runs.",
        "",
        f"Topology: `dgx-h100 --nodes 128` ({topo.n_gpus} GPUs, {topo.nodes} nodes).",
        "",
        "| what | measured | target |",
        "| --- | ---: | ---: |",
        f"| vectorised evaluation, all_reduce ring, 1,000,000 sizes | {rate_s * 1e3:.1f} ms"
        f" = {points_per_s / 1e6:.1f} M size points/s | >= 1 M points/s |",
        f"| full sweep -b 8 -e 16G -f 2 ({sizes.size} sizes) x {len(built)} collective/algorithm"
        f" pairs = {n_points} points, structures cached | {sweep_s * 1e3:.2f} ms | <= 50 ms |",
        f"| structure precomputation, all {len(built)} pairs, once per topology | "
        f"{structure_s:.2f} s | (not in the 50 ms) |",
        f"| topology load + routing setup (WhatIf) | {setup_s:.2f} s | |",
        "",
        "Structure time per collective/algorithm (routes, waves, max-min shares, envelope):",
        "",
        "| collective/algorithm | structure (s) |",
        "| --- | ---: |",
        *[f"| {k} | {v:.3f} |" for k, v in per_struct.items()],
        "",
    ]
    if skipped:
        lines += ["Not run here: " + ", ".join(skipped) + ".", ""]
    atomic_write_text(ROOT / "reports" / "analytic_speed.md", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
