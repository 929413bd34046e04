"""Every published log in data/nccl-tests parses and agrees with its index and nccl-tests' maths."""

from __future__ import annotations

import pytest

from collsim.calibration.dataset import DATA_DIR, load_index, read_dataset, read_entry
from collsim.metrics import bus_factor
from collsim.topology.loader import load_topology

ENTRIES = load_index()


def print_unit(value: float) -> float:
    """Half the last digit nccl-tests prints for a bandwidth of this size (2, 1 or 0 decimals)."""
    return 0.005 if value < 1000 else 0.05 if value < 10000 else 0.5


def test_index_covers_every_log():
    files = sorted(p.name for p in (DATA_DIR / "logs").glob("*.txt"))
    assert len(files) == 50
    assert sorted(e.name for e in ENTRIES) == files
    assert (DATA_DIR / "README.md").exists()


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_log_parses_and_matches_index(entry):
    log = read_entry(entry, strict=True)  # strict: no anomaly anywhere in the published data
    assert log.rows
    assert (log.collective, log.ranks, log.nodes) == (entry.collective, entry.ranks, entry.nodes)
    assert log.gpus_per_node == entry.gpus_per_node
    if log.nccl_version and entry.nccl_version:
        assert entry.nccl_version.startswith(log.nccl_version.split("+")[0])
    factor = bus_factor(log.collective, log.ranks)
    for row in log.rows:
        for alg, bus in (
            (row.oop_algbw_gbps, row.oop_busbw_gbps),
            (row.ip_algbw_gbps, row.ip_busbw_gbps),
        ):
            if alg is None:
                continue
            assert bus is not None
            tolerance = print_unit(bus) + factor * print_unit(alg) + 1e-9
            assert abs(bus - alg * factor) <= tolerance, (row.line, alg, bus, factor)


def test_dataset_summary():
    logs = read_dataset()
    assert len(logs) == 50
    assert sum(len(log.rows) for _, log in logs) == 3138
    assert sum(len(log.anomalies) for _, log in logs) == 0
    layouts = {log.layout for _, log in logs}
    assert layouts == {"current", "legacy"}


@pytest.mark.parametrize("topology", sorted({e.topology for e in ENTRIES}))
def test_catalog_topologies_give_the_measured_systems(topology):
    for entry in (e for e in ENTRIES if e.topology == topology):
        topo = load_topology(entry.topology, **entry.topology_overrides())
        assert (topo.n_gpus, topo.nodes) == (entry.ranks, entry.nodes), entry.name
