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
from collsim.model.nccl_release import NEWEST, effective_version, parse_nccl_version
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
    nccl_version: str | None = None,
) -> list[Sample]:
    """Every log of ``paths`` on ``topology`` sized to it (one :class:`Sample` per table);
    ``env``: NCCL settings the runs used beyond those their logs record (which win);
    ``nccl_version``: the NCCL release the runs used where a log names none (a log's own wins;
    None: the newest behaviour), which fits and validations predict the log with."""
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
            samples.append(Sample(log, cache[key], env=dict(env or {}), nccl_version=nccl_version))
    _unique_names(samples)
    return samples


def release_lines(samples: Sequence[Sample], given: str | None = None) -> list[str]:
    """Which NCCL release each log is predicted with, and where that came from (the log, the
    ``given`` ``--nccl-version``, a setting only old releases read, or none: the newest), one
    line per release and source, so a fit says which release's choices it assumed."""
    groups: dict[str, list[str]] = {}
    for s in samples:
        if s.log.nccl_version:
            key = f"{parse_nccl_version(s.log.nccl_version, file=s.log.file)} (the log's own)"
        elif s.nccl_version:
            source = "--nccl-version" if s.nccl_version == given else "given"
            key = f"{parse_nccl_version(s.nccl_version, field=source)} ({source})"
        elif (release := effective_version(None, s.env)) != NEWEST:
            key = f"{release} (NCCL_TREE_THRESHOLD is set: only releases before 2.5 read it)"
        else:
            key = (f"not known: the newest behaviour ({NEWEST}); give --nccl-version if the runs "
                   "used an older one")  # fmt: skip
        groups.setdefault(key, []).append(s.name)
    return [f"NCCL release {key}: {', '.join(names)}" for key, names in groups.items()]


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
