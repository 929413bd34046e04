"""Sweeps: grids of what-if points (topologies x nodes x collectives x algorithms x sizes x
engines, and workloads x layouts for step times), run on a process pool or a Dask cluster, with
results kept incrementally (:mod:`collsim.sweep.runner`)."""

from collsim.sweep.runner import EXECUTORS, SweepOutcome, read_points, run_sweep
from collsim.sweep.spec import SweepError, SweepSpec, Task, load_spec, spec_from_dict

__all__ = [
    "EXECUTORS",
    "SweepError",
    "SweepOutcome",
    "SweepSpec",
    "Task",
    "load_spec",
    "read_points",
    "run_sweep",
    "spec_from_dict",
]
