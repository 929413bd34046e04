"""Reading logs for a fit or a validation: parse, check, size the system, attach the profile.

Shared by ``collsim calibrate fit``, ``collsim validate`` and the validation report, so bad input
gives the same one-line errors everywhere: empty, truncated or table-less logs (the reader),
``#wrong > 0`` rows (refused for fitting unless allowed), a rank count the topology cannot hold,
and a profile fitted for another topology.
"""

from __future__ import annotations

from collections.abc import Sequence

from collsim.calibration.fit import Sample, check_log
from collsim.calibration.log_context import topology_for_log
from collsim.calibration.nccltests import read_logs
from collsim.topology.spec import Topology


def load_samples(
    paths: Sequence[str],
    topology: str | Topology,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    collective: str | None = None,
    ranks: int | None = None,
    gpus_per_thread: int | None = None,
    allow_anomalies: bool = False,
    for_fit: bool = False,
    env: dict[str, str] | None = None,
) -> list[Sample]:
    """Every log of ``paths`` on ``topology`` sized to it (one :class:`Sample` per table);
    ``env``: NCCL settings the runs used beyond those their logs record (which win)."""
    samples = []
    cache: dict[tuple[int, int], Topology] = {}
    for path in paths:
        for log in read_logs(
            path, collective=collective, ranks=ranks, gpus_per_thread=gpus_per_thread
        ):
            if for_fit:
                check_log(log, allow_anomalies=allow_anomalies)
            key = (log.ranks, log.nodes or 0)
            if key not in cache:
                cache[key] = topology_for_log(
                    topology, log, nodes=nodes, gpus_per_node=gpus_per_node
                )
            samples.append(Sample(log, cache[key], env=dict(env or {})))
    _unique_names(samples)
    return samples


def _unique_names(samples: list[Sample]) -> None:
    """Logs are reported by file name; where two share one (``run1/logs/all_reduce.txt`` and
    ``run2/logs/all_reduce.txt``, or two tables of one file) use the path, then a table number,
    so no log's result hides another's."""
    from collections import Counter

    if len({s.name for s in samples}) == len(samples):
        return
    seen = Counter(s.log.file for s in samples)
    count: Counter[str] = Counter()
    for s in samples:
        s.name = s.log.file
        if seen[s.log.file] > 1:
            count[s.log.file] += 1
            s.name = f"{s.log.file}#{count[s.log.file]}"
