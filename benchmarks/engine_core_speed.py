"""Engine core speed: a 1 GiB ring all-reduce on 1024 ranks (~2 million transfers).

Builds the schedule (the algorithm registry's ring if present, else the engine's own vectorised
ScheduleBuilder ring), replays it on a ring SimpleFabric with disjoint links, and reports wall
times and simulated transfers per second. Target: >= 400k transfers/s for the replay on a
2-core machine (the two-million-transfer ring in <= 5 s).

Usage: python benchmarks/engine_core_speed.py [--nranks 1024] [--size 1G] [--source auto]
"""

from __future__ import annotations

import argparse
import json
import time

from collsim.collectives.schedule import Schedule
from collsim.engine import ring_fabric, simulate
from collsim.engine.testing import ring_all_reduce
from collsim.units import parse_size


def build(source: str, nranks: int, count: int) -> tuple[Schedule, str]:
    """The ring all-reduce schedule and where it came from."""
    if source in ("auto", "registry"):
        try:
            from collsim.collectives.registry import build_schedule
        except ImportError:
            if source == "registry":
                raise
        else:
            return build_schedule("all_reduce", "ring", nranks=nranks, count=count), "registry"
    return ring_all_reduce(nranks, count), "engine.testing"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nranks", type=int, default=1024)
    parser.add_argument("--size", default="1G", help="per-rank buffer (nccl-tests sizes)")
    parser.add_argument("--source", choices=("auto", "registry", "builder"), default="auto")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()

    count = parse_size(args.size) // 4
    t0 = time.perf_counter()
    schedule, source = build(args.source, args.nranks, count)
    t1 = time.perf_counter()
    fabric = ring_fabric(args.nranks, 50e9, 1e-6)
    t2 = time.perf_counter()
    result = simulate(schedule, fabric, protocol="Simple")
    t3 = time.perf_counter()

    transfers = schedule.n_transfers()
    report = {
        "nranks": args.nranks,
        "size_bytes": schedule.size_bytes,
        "schedule_source": source,
        "transfers": transfers,
        "build_s": round(t1 - t0, 3),
        "fabric_s": round(t2 - t1, 3),
        "simulate_s": round(t3 - t2, 3),
        "transfers_per_s": round(transfers / (t3 - t2)),
        "end_to_end_transfers_per_s": round(transfers / (t3 - t0)),
        "simulated_time_s": result.time_s,
        "busbw_gbps": result.busbw_gbps,
    }
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>28}: {value}")


if __name__ == "__main__":
    main()
