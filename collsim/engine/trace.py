"""Chrome trace-event export of a simulation (open the file in Perfetto or chrome://tracing).

Layout: process 1 "GPU ranks" has one thread (track) per rank, showing each transfer on its
sender, and reductions and in-network reductions on the ranks that wait for them; process 2
"links" has one track per link that carried bytes, showing the flows crossing it. Every
operation is a complete ("X") event; times are microseconds, as the format requires.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from collsim.collectives.schedule import NETWORK_REDUCE, REDUCTION, Schedule
from collsim.engine.results import SimResult
from collsim.io import atomic_write_text

RANK_PID, LINK_PID = 1, 2
_US_PER_S = 1e6


def _meta(pid: int, tid: int | None, name: str) -> dict[str, Any]:
    if tid is None:
        return {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}
    return {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


def _x(name: str, pid: int, tid: int, start_s: float, end_s: float, **args: Any) -> dict:
    return {
        "name": name,
        "cat": "collsim",
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "ts": start_s * _US_PER_S,
        "dur": max(end_s - start_s, 0.0) * _US_PER_S,
        "args": args,
    }


def trace_events(result: SimResult, schedule: Schedule) -> list[dict[str, Any]]:
    """The trace's events as plain dicts (metadata first, then one "X" event per record)."""
    events: list[dict[str, Any]] = [
        _meta(RANK_PID, None, "GPU ranks"),
        _meta(LINK_PID, None, "links"),
    ]
    events += [_meta(RANK_PID, r, f"rank {r}") for r in range(result.nranks)]
    links = result.links
    busy = np.flatnonzero(links.bytes > 0)
    events += [_meta(LINK_PID, int(i), links.name[i]) for i in busy]

    tr = result.transfers
    reduce_flag = schedule.arrays["reduce"]
    for i in range(len(tr)):
        op, src, dst = int(tr.op_id[i]), int(tr.src[i]), int(tr.dst[i])
        nbytes = int(tr.bytes[i])
        kind = "copy" if src == dst else ("recv-reduce" if reduce_flag[op] else "send")
        start, flow, end = float(tr.start_s[i]), float(tr.flow_start_s[i]), float(tr.end_s[i])
        events.append(
            _x(f"{kind} {src}->{dst}", RANK_PID, src, start, end, op=op, dst=dst, bytes=nbytes)
        )
        for link in tr.path(i):
            events.append(_x(f"{src}->{dst}", LINK_PID, int(link), flow, end, op=op, bytes=nbytes))

    a = schedule.arrays
    for op in np.flatnonzero(a["kind"] == REDUCTION):
        rank, nbytes = int(a["src"][op]), int(a["count"][op]) * schedule.elem_bytes
        start, end = float(result.op_start_s[op]), float(result.op_end_s[op])
        events.append(_x("reduce", RANK_PID, rank, start, end, op=int(op), bytes=nbytes))
    for op in np.flatnonzero(a["kind"] == NETWORK_REDUCE):
        nbytes = int(a["count"][op]) * schedule.elem_bytes
        start, end = float(result.op_start_s[op]), float(result.op_end_s[op])
        for rank in schedule.groups[a["dst"][op]]:
            events.append(
                _x("network_reduce", RANK_PID, int(rank), start, end, op=int(op), bytes=nbytes)
            )
    return events


def write_chrome_trace(result: SimResult, schedule: Schedule, path: str | os.PathLike) -> Path:
    """Write ``result`` as Chrome trace JSON to ``path`` atomically (temp file + rename)."""
    target = Path(path)
    document = {
        "traceEvents": trace_events(result, schedule),
        "displayTimeUnit": "ns",
        "otherData": {key: str(value) for key, value in result.summary().items()},
    }
    atomic_write_text(target, json.dumps(document))
    return target
