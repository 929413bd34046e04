"""What a worker runs: one :class:`~collsim.sweep.spec.Task` -> its rows, as CSV text.

:func:`run_task` is a pure function of the task (it builds its own topology, ``WhatIf`` and
models, and shares no state with other tasks), so a process pool and a Dask cluster produce
byte-identical rows. Floats are written with ``repr`` (the shortest exact round trip).
"""

from __future__ import annotations

import csv
import io
from typing import Any

import numpy as np

from collsim.dtypes import dtype_bytes
from collsim.engine.results import bottleneck_links
from collsim.errors import CollsimError
from collsim.metrics import algbw_gbps, busbw_gbps
from collsim.model.analytic import effective_bytes
from collsim.model.tuner import tuned_algorithms
from collsim.sweep.spec import Task, layout_text
from collsim.topology.loader import load_topology
from collsim.training.comm import make_timer
from collsim.training.step import StepModel
from collsim.training.workload import load_workload, with_changes
from collsim.whatif import WhatIf, printed_count

COLUMNS = (
    "kind", "topology", "faults", "nodes", "gpus", "engine", "model",
    "collective", "algorithm", "algorithm_used", "dtype", "protocol", "channels",
    "size_bytes", "bytes", "count", "time_us", "algbw_gbps", "busbw_gbps",
    "link_util", "busiest_link",
    "workload", "layout", "layout_used", "step_time_s", "mfu", "tflops_per_gpu", "fits_in_memory",
    "compute_s", "comm_s", "bubble_s",
    "error",
)  # fmt: skip
"""Every row has every column (empty where it does not apply), in this order."""

_COMM_KEYS = ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float | np.floating):
        return repr(float(value))
    if isinstance(value, np.integer):
        return str(int(value))
    return str(value)


def to_csv(rows: list[dict[str, Any]], header: bool = False) -> str:
    """Rows -> CSV text in :data:`COLUMNS` order (``\\n`` line ends)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if header:
        writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow([_cell(row.get(c)) for c in COLUMNS])
    return out.getvalue()


def run_task(task: Task) -> tuple[str, str, int]:
    """Compute one task: ``(task key, CSV rows without header, number of rows)``."""
    rows = _collective_rows(task) if task.kind == "collective" else _step_rows(task)
    return task.key, to_csv(rows), len(rows)


def _base(task: Task, gpus: int) -> dict[str, Any]:
    return {
        "kind": task.kind,
        "topology": task.topology,
        "faults": "; ".join(task.faults),
        "nodes": task.nodes,
        "gpus": gpus,
        "engine": task.engine,
        "model": task.model,
    }


def _collective_rows(task: Task) -> list[dict[str, Any]]:
    topo = load_topology(task.topology_path, nodes=task.nodes, faults=task.faults)
    whatif = WhatIf(topo)
    n = topo.n_gpus
    elem = dtype_bytes(task.dtype)
    coll = task.collective
    base = _base(task, n) | {
        "collective": coll,
        "dtype": task.dtype,
        "protocol": task.protocol,
        "channels": task.channels,
    }
    sizes = np.asarray(task.sizes, dtype=np.int64)
    rows: list[dict[str, Any]] = []
    for algo in task.algorithms:
        head = base | {"algorithm": algo}
        try:
            cost = whatif.cost_model(task.model)
            if algo == "auto":
                picks = tuned_algorithms(
                    cost, coll, sizes.tolist(), elem_bytes=elem, protocol=task.protocol,
                    channels=task.channels,
                )  # fmt: skip
            else:
                picks = [algo] * len(sizes)
            eff = effective_bytes(coll, sizes, elem, n).astype(np.int64)
            times = np.zeros(len(sizes))
            util = np.full(len(sizes), np.nan)
            busiest: list[str | None] = [None] * len(sizes)
            if task.engine == "analytic":
                for name in sorted(set(picks)):
                    idx = np.array([i for i, p in enumerate(picks) if p == name])
                    times[idx] = cost.predict(
                        coll, name, sizes[idx], elem_bytes=elem, protocol=task.protocol,
                        channels=task.channels,
                    )  # fmt: skip
                    if task.model == "collsim":  # busiest link's wire time over the time
                        st = cost.structure(
                            coll, name, protocol=task.protocol, channels=task.channels
                        )
                        load = st.load_lines.b_s_per_byte.max() * eff[idx].astype(np.float64)
                        with np.errstate(divide="ignore", invalid="ignore"):
                            util[idx] = np.where(times[idx] > 0, load / times[idx], np.nan)
            else:
                for i, (size, name) in enumerate(zip(sizes.tolist(), picks, strict=True)):
                    sim, _ = whatif.run(
                        coll, name, size, elem_bytes=elem, channels=task.channels,
                        protocol=task.protocol,
                    )  # fmt: skip
                    times[i] = sim.time_s
                    top = bottleneck_links(sim, top=1)
                    if top:
                        util[i], busiest[i] = top[0].utilization, top[0].name
        except CollsimError as exc:
            rows += [head | {"size_bytes": int(s), "error": str(exc)} for s in sizes.tolist()]
            continue
        for i, size in enumerate(sizes.tolist()):
            t = float(times[i])
            nbytes = int(eff[i])
            rows.append(
                head
                | {
                    "algorithm_used": picks[i],
                    "size_bytes": size,
                    "bytes": nbytes,
                    "count": printed_count(coll, nbytes // elem, n),
                    "time_us": t * 1e6,
                    "algbw_gbps": algbw_gbps(nbytes, t) if t > 0 else 0.0,
                    "busbw_gbps": _busbw(busbw_gbps, coll, n, nbytes, t),
                    "link_util": None if np.isnan(util[i]) else float(util[i]),
                    "busiest_link": busiest[i],
                }
            )
    return rows


def _busbw(fn: Any, coll: str, n: int, nbytes: int, t: float) -> float | None:
    if t <= 0:
        return 0.0
    try:
        return float(fn(coll, n, nbytes, t))
    except CollsimError:  # a collective nccl-tests defines no bus factor for
        return None


def _step_rows(task: Task) -> list[dict[str, Any]]:
    topo = load_topology(task.topology_path, nodes=task.nodes, faults=task.faults)
    w = load_workload(task.workload_path)
    model = StepModel(topo, make_timer(task.engine, topo), task.efficiency)
    rows = []
    for changes in task.layouts:
        row = _base(task, topo.n_gpus) | {"workload": task.workload, "layout": layout_text(changes)}
        try:
            wl = with_changes(w, parallel=dict(changes)) if changes else w
            res = model.evaluate(wl)
        except CollsimError as exc:
            rows.append(row | {"error": str(exc)})
            continue
        rows.append(
            row
            | {
                "layout_used": res.layout.label(),
                "step_time_s": res.step_time_s,
                "mfu": res.mfu,
                "tflops_per_gpu": res.tflops_per_gpu,
                "fits_in_memory": res.fits,
                "compute_s": res.breakdown["compute"],
                "comm_s": sum(res.breakdown[k] for k in _COMM_KEYS),
                "bubble_s": res.breakdown["bubble"],
            }
        )
    return rows
