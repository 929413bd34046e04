"""Compile the engine's numba kernels into their cache (``make`` runs this once at install).

The first contended replay would otherwise spend ~40 s compiling; afterwards numba loads the
cache in about a second. A tiny contended replay (two flows into one port) compiles every kernel
the replay uses.
"""

from __future__ import annotations

import time

import numpy as np

from collsim.collectives.schedule import ScheduleBuilder
from collsim.engine import simulate, star_fabric


def main() -> None:
    start = time.perf_counter()
    fabric = star_fabric(3, 25e9, 1e-6, switch_latency=0.5e-6)
    b = ScheduleBuilder()
    b.transfers(np.array([1, 2]), np.array([0, 0]), np.array([1 << 20, 1 << 21]), "input", 0,
                "output", 0)  # fmt: skip
    result = simulate(b.build("custom", "incast", 3, 0, 4), fabric, fast_path=False)
    kernel = result.meta.get("replay_kernel")
    print(f"collsim: replay kernel {kernel} ready in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
