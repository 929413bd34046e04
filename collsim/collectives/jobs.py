"""Several independent jobs in one schedule, so the engine times them sharing one fabric.

A cluster rarely runs one collective alone: two training jobs' all-reduces meet on the same
up-links. :func:`side_by_side` puts the schedules of independent jobs on consecutive rank ranges
of one schedule (job ``j``'s rank ``r`` becomes ``offset_j + r``); nothing in one waits for the
other, so the engine's max-min sharing of the links they both cross is the only coupling. Place
the ranks on GPUs with the fabric (rank ``i`` on the fabric's ``i``-th GPU).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from collsim.collectives.schedule import Schedule
from collsim.errors import ScheduleError


def side_by_side(schedules: Sequence[Schedule]) -> Schedule:
    """One schedule running ``schedules`` at once on consecutive rank ranges. They must be the
    same collective, element count and element size (a schedule's buffers are sized by them);
    ``meta["jobs"]`` lists each job's ``(first rank, ranks, first op, ops)``."""
    if not schedules:
        raise ScheduleError("no schedules to run side by side", field="schedules", value=0)
    first = schedules[0]
    for s in schedules[1:]:
        same = (s.collective, s.count, s.elem_bytes) == (first.collective, first.count,
                                                         first.elem_bytes)  # fmt: skip
        if not same:
            raise ScheduleError(
                "jobs side by side must be one collective of one size: "
                f"{first.collective} x {first.count} vs {s.collective} x {s.count}",
                field="schedules",
                value=s.collective,
            )
    names = [name for name in first.arrays if name != "after"]
    arrays: dict[str, list[np.ndarray]] = {name: [] for name in names}
    dep_ptr, dep_idx, after, groups, jobs = [np.zeros(1, np.int64)], [], [], [], []
    ranks = ops = edges = 0
    for s in schedules:
        for name in names:
            column = s.arrays[name]
            if name in ("src", "dst"):
                column = column.astype(np.int64) + ranks
            arrays[name].append(column)
        follows = s.after.astype(np.int64)
        after.append(np.where(follows >= 0, follows + ops, -1))
        dep_ptr.append(s.dep_ptr[1:].astype(np.int64) + edges)
        dep_idx.append(s.dep_idx.astype(np.int64) + ops)
        groups += [tuple(r + ranks for r in g) for g in s.groups]
        jobs.append((ranks, s.nranks, ops, len(s)))
        ranks, ops, edges = ranks + s.nranks, ops + len(s), edges + int(s.dep_ptr[-1])
    merged = {
        name: np.concatenate(parts).astype(
            np.int64 if name in ("src", "dst") else first.arrays[name].dtype, copy=False
        )
        for name, parts in arrays.items()
    }
    merged["after"] = np.concatenate(after)
    return Schedule(
        collective=first.collective,
        algorithm="+".join(sorted({s.algorithm for s in schedules})),
        nranks=ranks,
        count=first.count,
        elem_bytes=first.elem_bytes,
        arrays=merged,
        dep_ptr=np.concatenate(dep_ptr),
        dep_idx=np.concatenate(dep_idx) if dep_idx else np.zeros(0, np.int64),
        groups=tuple(groups),
        root=first.root,
        channels=max(s.channels for s in schedules),
        meta={"jobs": jobs},
    )
