"""What a calibration run learns about the cluster's structure, and the topology made from it.

``collsim calibrate run`` keeps, in ``OUT/cluster/`` beside the measurements: the system NCCL
detected (its first job runs with ``NCCL_TOPO_DUMP_FILE`` pointing there, which rank 0 writes:
``nccl-topo.xml``), ``nvidia-smi topo -m`` of every node (``nvsmi-<host>.txt``, one process per
node through the run's launcher) and, where the tool exists and may read the fabric,
``ibnetdiscover`` (``ibnetdiscover.txt``). Each capture is best effort: one that fails is a note
in ``env.json``, never a failed run.

``collsim calibrate fit -t OUT`` (a results directory for ``--topology``) imports those captures
(:mod:`collsim.topology.imports`) into ``OUT/cluster/topology.yaml`` and fits that: the cluster
as it reported itself, not a catalog entry that may differ.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

from collsim.errors import CalibrationError
from collsim.io import atomic_write_text
from collsim.topology.imports.files import ImportRequest, import_files, to_yaml

CLUSTER = "cluster"
DUMP = "nccl-topo.xml"
TOPOLOGY = "topology.yaml"


def dump_path(out: Path) -> Path:
    """Where the run's first job asks NCCL to write its topology (absolute: ranks on other
    nodes write it through the shared file system)."""
    return (out / CLUSTER / DUMP).resolve()


def per_node_command(
    launcher: str, nodes: int, launcher_args: list[str], folder: Path
) -> list[str]:
    """One process per node writing its ``nvidia-smi topo -m`` into ``folder``."""
    write = f"nvidia-smi topo -m > {shlex.quote(str(folder))}/nvsmi-$(hostname).txt 2>&1"
    shell = ["sh", "-c", write]
    if launcher == "srun":
        return ["srun", "-N", str(nodes), "--ntasks-per-node", "1", *launcher_args, *shell]
    if launcher == "mpirun":
        return ["mpirun", "-np", str(nodes), "-npernode", "1", *launcher_args, *shell]
    return shell


def capture_cluster(
    out: Path, launcher: str, nodes: int, launcher_args: list[str]
) -> dict[str, str]:
    """Run the per-node and fabric captures into ``out/cluster``; what failed, by capture."""
    folder = (out / CLUSTER).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    problems: dict[str, str] = {}
    if shutil.which("nvidia-smi") is None:  # the nodes are taken to be like this one
        problems["nvidia-smi"] = "not found here (no per-node matrices)"
    else:
        argv = per_node_command(launcher, nodes, launcher_args, folder)
        problems.update(_best_effort("nvidia-smi topo -m", argv, None))
    if shutil.which("ibnetdiscover") is None:
        problems["ibnetdiscover"] = "not found (no fabric scan)"
    else:
        problems.update(
            _best_effort("ibnetdiscover", ["ibnetdiscover"], folder / "ibnetdiscover.txt")
        )
    return problems


def _best_effort(name: str, argv: list[str], into: Path | None) -> dict[str, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return {name: f"failed: {exc}"}
    if done.returncode != 0:
        return {name: f"exit status {done.returncode}: {done.stderr.strip()[:200]}"}
    if into is not None:
        atomic_write_text(into, done.stdout)
    return {}


def note_captures(out: Path, problems: dict[str, str]) -> None:
    """Add what the captures found and what failed to ``env.json``."""
    env_file = out / "env.json"
    info = json.loads(env_file.read_text(encoding="utf-8")) if env_file.exists() else {}
    folder = out / CLUSTER
    info["cluster_captures"] = sorted(p.name for p in folder.glob("*") if p.is_file())
    if problems:
        info["cluster_capture_problems"] = problems
    atomic_write_text(env_file, json.dumps(info, indent=1) + "\n")


def captured_topology(results: Path, nodes: int | None = None) -> Path:
    """Import a results directory's captures into ``cluster/topology.yaml``; its path."""
    folder = results / CLUSTER
    dump = folder / DUMP
    matrices = sorted(folder.glob("nvsmi-*.txt"))
    if not dump.is_file() and not matrices:
        raise CalibrationError(
            "no captured topology here (cluster/nccl-topo.xml or cluster/nvsmi-*.txt): a "
            "results directory of collsim calibrate run on GPUs, or give a topology file",
            file=str(results), field="--topology",
        )  # fmt: skip
    files = [str(dump)] if dump.is_file() else []
    if matrices and files:
        files.append(str(matrices[0]))  # every node is alike; the first node's affinity
    scan = folder / "ibnetdiscover.txt"
    if scan.is_file():
        files.append(str(scan))
    if not files:
        raise CalibrationError(
            "only nvidia-smi matrices were captured (NCCL wrote no topology dump): import them "
            "with collsim topo import --gpu ... and give that file",
            file=str(matrices[0]), field="--topology",
        )  # fmt: skip
    doc = import_files(files, ImportRequest(f"{results.name}-cluster", nodes=nodes))
    return atomic_write_text(folder / TOPOLOGY, to_yaml(doc))
