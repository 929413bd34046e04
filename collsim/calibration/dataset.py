"""The bundled nccl-tests dataset (``data/nccl-tests``): its index, and every log read with it.

``index.yaml`` lists, per log, the measured setup (collective, GPU, GPUs per node, nodes, ranks,
links, NCCL version, source, notes), the closest catalog topology and the ``--nodes`` /
``--gpus-per-node`` overrides (``topology_args``) that make it the measured system.
:func:`read_dataset` reads
every log with :func:`~collsim.calibration.nccltests.read_log`, giving the index's figures as hints
for what a log does not say itself (published excerpts often lack the device list), so fitting
and validation can run over the whole dataset with one call.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collsim.calibration.nccltests import NcclTestsLog, read_log
from collsim.errors import CalibrationError, CollsimError
from collsim.topology.loader import read_yaml

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "nccl-tests"
"""The dataset in a source checkout (it is not installed with the package)."""

_REQUIRED = ("file", "collective", "gpus_per_node", "nodes", "ranks", "source", "topology")


@dataclass(frozen=True)
class DatasetEntry:
    """One log of the dataset as its index describes it."""

    path: Path
    collective: str
    gpu: str | None
    gpus_per_node: int
    nodes: int
    ranks: int
    intra_node: str | None
    inter_node: str | None
    nccl_version: str | None
    source: str
    notes: str
    topology: str
    topology_match: str
    topology_args: dict[str, int]

    @property
    def name(self) -> str:
        return self.path.name

    def topology_overrides(self) -> dict[str, int]:
        """``load_topology`` keyword arguments (``nodes``, ``gpus_per_node``) that turn the catalog
        entry into the measured system; empty where the entry already is it."""
        return dict(self.topology_args)


def load_index(directory: str | Path | None = None) -> list[DatasetEntry]:
    """The entries of ``directory/index.yaml`` (default: the bundled dataset)."""
    folder = Path(directory) if directory is not None else DATA_DIR
    index = folder / "index.yaml"
    if not index.is_file():
        raise CalibrationError("no index.yaml here", file=str(index))
    try:
        doc: Any = read_yaml(index)
    except CollsimError as exc:
        raise CalibrationError(exc.message, file=str(index)) from None
    items = doc.get("logs") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise CalibrationError("expected a 'logs' list", file=str(index), field="logs")
    entries = []
    for i, item in enumerate(items):
        missing = [k for k in _REQUIRED if not isinstance(item, dict) or item.get(k) is None]
        if missing:
            raise CalibrationError(
                f"entry lacks {', '.join(missing)}", file=str(index), field=f"logs[{i}]"
            )
        entries.append(
            DatasetEntry(
                path=folder / item["file"],
                collective=item["collective"],
                gpu=item.get("gpu"),
                gpus_per_node=int(item["gpus_per_node"]),
                nodes=int(item["nodes"]),
                ranks=int(item["ranks"]),
                intra_node=item.get("intra_node"),
                inter_node=item.get("inter_node"),
                nccl_version=item.get("nccl_version"),
                source=item["source"],
                notes=item.get("notes") or "",
                topology=item["topology"],
                topology_match=item.get("topology_match", "exact"),
                topology_args={k: int(v) for k, v in (item.get("topology_args") or {}).items()},
            )
        )
    return entries


def read_entry(entry: DatasetEntry, *, strict: bool = False) -> NcclTestsLog:
    """One dataset log, with the index's figures as hints where the log is silent."""
    return read_log(
        entry.path,
        strict=strict,
        collective=entry.collective,
        ranks=entry.ranks,
        nodes=entry.nodes,
        gpu=entry.gpu,
    )


def read_dataset(
    directory: str | Path | None = None, *, strict: bool = False
) -> list[tuple[DatasetEntry, NcclTestsLog]]:
    """Every log of the dataset, read, with its index entry."""
    return [(e, read_entry(e, strict=strict)) for e in load_index(directory)]
