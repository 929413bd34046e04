"""Every published log in data/nccl-tests parses and agrees with its index and nccl-tests' maths."""

from __future__ import annotations

import pytest

from collsim.calibration.dataset import DATA_DIR, load_index, read_dataset, read_entry
from collsim.calibration.nccltests import read_log
from collsim.metrics import bus_factor
from collsim.topology.loader import load_topology

ENTRIES = load_index()


def print_unit(value: float) -> float:
    """Half the last digit nccl-tests prints for a bandwidth of this size (2, 1 or 0 decimals)."""
    return 0.005 if value < 1000 else 0.05 if value < 10000 else 0.5


def test_index_covers_every_log():
    files = sorted(p.name for p in (DATA_DIR / "logs").glob("*.txt"))
    assert len(files) == 73
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
    assert len(logs) == 73
    assert sum(len(log.rows) for _, log in logs) == 3630
    assert sum(len(log.anomalies) for _, log in logs) == 0
    layouts = {log.layout for _, log in logs}
    assert layouts == {"current", "legacy"}


@pytest.mark.parametrize("topology", sorted({e.topology for e in ENTRIES}))
def test_catalog_topologies_give_the_measured_systems(topology):
    for entry in (e for e in ENTRIES if e.topology == topology):
        topo = load_topology(entry.topology, **entry.topology_overrides())
        assert (topo.n_gpus, topo.nodes) == (entry.ranks, entry.nodes), entry.name


def _entry(name: str):
    return next(e for e in ENTRIES if e.name == name)


def test_scale_series_ranks_come_from_the_rows_where_the_device_list_is_elided():
    """The published excerpts of the scale series shorten their device lists: OCI's GB300 keeps
    the first two and last two ranks, CoreWeave's GB200 only one line, which on its two-rack run
    says 'Rank 143' while every row's busbw/algbw says 128 ranks. Read without the index's help,
    the rows decide, and the notes say so."""
    gb200 = read_log(_entry("gb200-coreweave-nvl72-ib-32n-all_reduce-1.txt").path, strict=True)
    assert (gb200.ranks, gb200.ranks_source, gb200.nodes) == (128, "busbw/algbw ratio", None)
    assert "shows rank 143, but the rows' busbw/algbw ratio fits only 128 ranks" in gb200.notes[1]
    oci = read_log(_entry("gb300-oci-nvl72-roce8x400-32n-alltoall-1.txt").path)
    assert (oci.ranks, oci.nodes) == (128, None)
    assert oci.notes[0] == ("the device list is elided (4 rank(s) shown, the highest 127); the "
                            "rows' element counts confirm 128 ranks")  # fmt: skip
    h100 = read_log(_entry("h100-coreweave-ib-12n-all_reduce-1.txt").path)
    assert (h100.ranks, h100.ranks_source) == (96, "busbw/algbw ratio")
    # with the index's node count, the dataset reader gives the measured system
    log = read_entry(_entry("gb300-oci-nvl72-roce8x400-16n-all_reduce-1.txt"))
    assert (log.ranks, log.nodes, log.gpus_per_node) == (64, 16, 4)


def test_polaris_at_540_nodes_reads_every_rank():
    """2160 device lines on 540 hosts: the list is whole; at this size busbw/algbw only bounds
    the count (2(n-1)/n is flat), so the list is what counts."""
    log = read_entry(_entry("a100-polaris-slingshot-540n-all_gather-1.txt"), strict=True)
    assert (log.ranks, log.nodes, log.ranks_source, len(log.rows)) == (2160, 540, "devices", 29)
