"""What a calibration run records about the machine it ran on, beside its measurements.

``env.json`` holds the host, Python, collsim and torch versions, the runner and launcher, the
exact commands, and the NCCL/CUDA/UCX/libfabric/Slurm/Open MPI variables in force (they change
what NCCL does: a profile fitted without them cannot be explained later); ``topo.txt`` and
``gpus.txt`` hold ``nvidia-smi topo -m`` and ``nvidia-smi -L`` where nvidia-smi exists. After the
run, each log's NCCL version is added (nccl-tests binaries link their own NCCL).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from collsim.calibration.nccltests import read_log
from collsim.errors import CalibrationError
from collsim.io import atomic_write_text

ENV_PREFIXES = ("NCCL_", "CUDA_", "UCX_", "FI_", "TORCH_NCCL_", "SLURM_JOB", "OMPI_MCA_")
"""Environment variables recorded: those that change what NCCL and the launchers do."""


def capture_environment(out: Path, runner: str, launcher: str, commands: list[str]) -> Path:
    """Write ``out/env.json`` (versions, relevant variables, commands) and ``topo.txt`` if
    possible."""
    info: dict[str, object] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "collsim": metadata.version("collsim"),
        "runner": runner,
        "launcher": launcher,
        "commands": commands,
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }
    try:
        info["torch"] = metadata.version("torch")
    except metadata.PackageNotFoundError:
        info["torch"] = None
    smi = shutil.which("nvidia-smi")
    if smi:
        for args, name in ((["topo", "-m"], "topo.txt"), (["-L"], "gpus.txt")):
            try:
                done = subprocess.run([smi, *args], capture_output=True, text=True, timeout=30)
                atomic_write_text(out / name, done.stdout + done.stderr)
            except (OSError, subprocess.TimeoutExpired) as exc:
                info[f"nvidia-smi {' '.join(args)}"] = f"failed: {exc}"
    else:
        info["nvidia-smi"] = "not found (no topology captured)"
    return atomic_write_text(out / "env.json", json.dumps(info, indent=1) + "\n")


def note_versions(out: Path, logs: list[Path]) -> None:
    """Add the NCCL version each log reports to ``env.json`` (the binaries link their own)."""
    env_file = out / "env.json"
    info = json.loads(env_file.read_text(encoding="utf-8"))
    versions: dict[str, str | None] = {}
    for path in logs:
        try:
            versions[path.stem] = read_log(path).nccl_version
        except CalibrationError:
            versions[path.stem] = None
    info["nccl_version"] = versions
    atomic_write_text(env_file, json.dumps(info, indent=1) + "\n")
