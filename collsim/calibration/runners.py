"""Measuring a real cluster: nccl-tests binaries or the torch benchmark, under a launcher.

:func:`plan_commands` turns a :class:`RunConfig` into command lines (what ``--dry-run`` prints);
:func:`check_tools` says, in one line, what is missing (binary, launcher, torch);
:func:`run` executes the commands, streams their output into the result store (one nccl-tests log
per collective, recorded only when complete: every size asked for and nccl-tests' summary line;
the torch benchmark records every point itself),
reports each finished row to a progress callback, and stops a command that prints nothing for
longer than the timeout (a hung collective) with a message saying what it was running.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from collsim import units
from collsim.calibration._process import (
    execute,
    failure_reason,
    free_loopback_port,
    keep_interrupted,
)
from collsim.calibration.cluster import CLUSTER, capture_cluster, dump_path, note_captures
from collsim.calibration.environment import capture_environment, note_versions
from collsim.calibration.nccltests import NcclTestsLog, read_log
from collsim.calibration.store import MANIFEST, ResultStore
from collsim.calibration.torchbench import TORCH_DTYPES
from collsim.dtypes import NCCL_TYPES, canonical_dtype
from collsim.errors import CalibrationError, CollsimError
from collsim.io import directory_lock
from collsim.tables import plural

RUNNERS = ("nccl-tests", "torch")
LAUNCHERS = ("local", "torchrun", "mpirun", "srun")


LOCAL = ("local", "torchrun")
TORCH_MISSING = (
    "torch is not installed: on GPUs pip install 'collsim[calib]' (the CUDA build); on CPUs "
    "(gloo) pip install torch --index-url https://download.pytorch.org/whl/cpu"
)
"""Launchers that start every process on this machine."""

_TORCH_STARTUP_S = 60.0
"""Time allowed for torch's start-up on top of ``--timeout`` (the benchmark guards each point)."""

MAX_TIMEOUT = threading.TIMEOUT_MAX - _TORCH_STARTUP_S
"""The longest ``--timeout``: the silence timer waits on a queue, which takes no longer wait than
``threading.TIMEOUT_MAX`` (``inf`` or ``1e300`` overflowed there, a traceback)."""


@dataclass
class RunConfig:
    """Everything ``collsim calibrate run`` was asked to do."""

    runner: str
    launcher: str
    nprocs: int
    nodes: int
    collectives: list[str]
    minbytes: str = "8"
    maxbytes: str = "128M"
    stepfactor: float = 2.0
    dtype: str = "float"
    warmup: int = 5
    iters: int = 20
    out: Path = Path("calibration")
    binary_dir: Path | None = None
    timeout: float = 300.0
    """Seconds of silence after which a command counts as hung: finite and at most
    :data:`MAX_TIMEOUT` (there is no "never": a hung collective would hold the run forever)."""
    backend: str = "auto"
    launcher_args: list[str] = field(default_factory=list)
    master_port: int | None = None

    def sizes(self) -> list[int]:
        return units.size_range(
            units.parse_size(self.minbytes), units.parse_size(self.maxbytes), self.stepfactor
        )

    def validate(self) -> None:
        if self.runner not in RUNNERS:
            raise CalibrationError(
                f"unknown runner (choose from {', '.join(RUNNERS)})",
                field="--runner",
                value=self.runner,
            )
        if self.nodes < 1:
            raise CalibrationError("must be at least 1", field="--nodes", value=self.nodes)
        if self.nprocs < 1 or self.nprocs % self.nodes:
            raise CalibrationError(
                "--nprocs must be a positive multiple of --nodes",
                field="--nprocs",
                value=self.nprocs,
            )
        if self.launcher in LOCAL and self.nodes > 1:
            raise CalibrationError(
                f"--launcher {self.launcher} runs on this machine only; use "
                "srun or mpirun for several nodes",
                field="--nodes",
                value=self.nodes,
            )
        if self.launcher_args and self.runner == "nccl-tests" and self.launcher == "local":
            raise CalibrationError(
                "--launcher local starts the nccl-tests binaries directly: no launcher is there "
                "to take these (use --launcher mpirun or srun)",
                field="--launcher-args",
                value=" ".join(self.launcher_args),
            )
        if self.runner == "nccl-tests" and self.launcher == "torchrun":
            raise CalibrationError(
                "nccl-tests is started by local, mpirun or srun",
                field="--launcher",
                value=self.launcher,
            )
        # any alias (bf16, fp16, float32, ...) becomes the name nccl-tests' -d takes: nccl-tests
        # runs float, saying so only in its output, for a name it does not know
        types = tuple(TORCH_DTYPES) if self.runner == "torch" else NCCL_TYPES
        try:
            self.dtype = canonical_dtype(self.dtype, types, field="--datatype")
        except CollsimError as exc:
            raise CalibrationError(
                f"the {self.runner} runner: {exc.message}", field="--datatype", value=self.dtype
            ) from None
        for flag, value, least in (("--iters", self.iters, 1), ("--warmup", self.warmup, 0)):
            if value < least:
                raise CalibrationError(f"must be >= {least}", field=flag, value=value)
        if not self.timeout > 0:
            raise CalibrationError("must be > 0 seconds", field="--timeout", value=self.timeout)
        if not self.timeout <= MAX_TIMEOUT:  # inf, or more than a wait can take: say so
            raise CalibrationError(
                f"must be a finite number of seconds, at most {MAX_TIMEOUT:.0f} (about "
                f"{MAX_TIMEOUT / 3.15576e7:.0f} years)",
                field="--timeout",
                value=self.timeout,
            )
        try:  # the size range first: -f must be a finite number > 1
            self.sizes()
        except CollsimError as exc:
            raise (exc if exc.field else exc.located(field="-b/-e/-f")) from None
        if self.runner == "torch" and self.backend == "nccl" and self.launcher in LOCAL:
            try:
                import torch
            except ImportError:
                raise CalibrationError(
                    TORCH_MISSING,
                    field="--runner",
                    value=self.runner,
                ) from None
            if not torch.cuda.is_available():
                raise CalibrationError(
                    "the nccl backend needs CUDA GPUs, and this machine has none (gloo runs on "
                    "CPUs)",
                    field="--backend",
                    value=self.backend,
                )
        if self.runner == "nccl-tests" and self.stepfactor != int(self.stepfactor):
            raise CalibrationError(
                "nccl-tests reads -f as a whole number (1.5 would step by its default instead)",
                field="-f",
                value=self.stepfactor,
            )
        self.sizes()


@dataclass
class Step:
    """One command to run; ``collective`` is None when it covers all (the torch benchmark)."""

    argv: list[str]
    collective: str | None
    env: dict[str, str] = field(default_factory=dict)
    points: int = 0

    def shell(self) -> str:
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (prefix + " " if prefix else "") + shlex.join(self.argv)


def _binary(cfg: RunConfig, collective: str) -> str:
    name = f"{collective}_perf"
    return str(cfg.binary_dir / name) if cfg.binary_dir else name


def _launcher_prefix(cfg: RunConfig) -> list[str]:
    per_node = str(cfg.nprocs // cfg.nodes)
    if cfg.launcher == "mpirun":
        return ["mpirun", "-np", str(cfg.nprocs), "-npernode", per_node, *cfg.launcher_args]
    if cfg.launcher == "srun":
        return [
            "srun",
            "-N",
            str(cfg.nodes),
            "-n",
            str(cfg.nprocs),
            "--ntasks-per-node",
            per_node,
            *cfg.launcher_args,
        ]
    return []


def _slurm_first_node() -> str | None:
    """The first host of the Slurm allocation this runs in (``scontrol show hostnames``), if any."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist or shutil.which("scontrol") is None:
        return None
    try:
        done = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                              text=True, timeout=30, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    hosts = done.stdout.split()
    return hosts[0] if done.returncode == 0 and hosts else None


def plan_commands(cfg: RunConfig) -> list[Step]:
    """The command lines that perform ``cfg``, in order. Sizes are passed as whole byte
    counts: nccl-tests reads ``1MB`` as 2**20 and refuses ``512B``, collsim reads 1e6 and 512.
    The first asks NCCL to write the system it detects into the results (:mod:`.cluster`)."""
    steps = _plan(cfg)
    nccl = cfg.runner == "nccl-tests" or cfg.backend == "nccl"  # gloo never loads NCCL
    if steps and nccl and "NCCL_TOPO_DUMP_FILE" not in os.environ:
        first = steps[0]
        first.env["NCCL_TOPO_DUMP_FILE"] = str(dump_path(cfg.out))
        if first.argv[:1] == ["mpirun"]:  # Open MPI passes only the variables it is told to
            first.argv[1:1] = ["-x", "NCCL_TOPO_DUMP_FILE"]
    return steps


def _plan(cfg: RunConfig) -> list[Step]:
    cfg.validate()
    sizes = cfg.sizes()
    common = [
        "-b",
        str(units.parse_size(cfg.minbytes)),
        "-e",
        str(units.parse_size(cfg.maxbytes)),
        "-f",
        f"{cfg.stepfactor:g}",
        "-w",
        str(cfg.warmup),
        "-n",
        str(cfg.iters),
        "-d",
        cfg.dtype,
    ]
    if cfg.runner == "nccl-tests":
        gpus = str(cfg.nprocs) if cfg.launcher == "local" else "1"
        return [
            Step(
                [*_launcher_prefix(cfg), _binary(cfg, c), *common, "-g", gpus, "-c", "1"],
                c,
                points=len(sizes),
            )
            for c in cfg.collectives
        ]
    bench = [
        "-m",
        "collsim.calibration.torchbench",
        "-c",
        ",".join(cfg.collectives),
        *common,
        "--backend",
        cfg.backend,
        "--out",
        str(cfg.out),
        "--timeout",
        f"{cfg.timeout:g}",
    ]
    points = len(sizes) * len(cfg.collectives)
    env: dict[str, str] = {}
    if cfg.launcher in ("local", "torchrun"):
        port = str(cfg.master_port or free_loopback_port())
        start = [sys.executable, "-m", "torch.distributed.run"]
        if cfg.launcher == "torchrun":
            start = ["torchrun"]
        argv = [
            *start,
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(cfg.nprocs),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            port,
            *cfg.launcher_args,
            *bench,
        ]
        return [Step(argv, None, points=points)]
    if cfg.nodes == 1:
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(cfg.master_port or 29500)}
    elif "MASTER_ADDR" not in os.environ:
        # Every rank must reach rank 0's rendezvous: under Slurm, its first node.
        first = _slurm_first_node() if cfg.launcher == "srun" else None
        if first is None:
            raise CalibrationError(
                f"set MASTER_ADDR (and MASTER_PORT) to the first node's address for a "
                f"multi-node {cfg.launcher} run"
                + (" (or run inside a Slurm allocation)" if cfg.launcher == "srun" else ""),
                field="MASTER_ADDR",
            )
        env = {"MASTER_ADDR": first, "MASTER_PORT": str(cfg.master_port or 29500)}
    prefix = _launcher_prefix(cfg)
    if cfg.launcher == "mpirun":
        prefix[1:1] = ["-x", "MASTER_ADDR", "-x", "MASTER_PORT"]
    return [Step([*prefix, sys.executable, *bench], None, env=env, points=points)]


def check_tools(cfg: RunConfig, steps: list[Step]) -> None:
    """Raise one clear error for the first thing missing: launcher, binary or torch."""
    if cfg.launcher in ("mpirun", "srun", "torchrun") and shutil.which(cfg.launcher) is None:
        raise CalibrationError(
            f"launcher '{cfg.launcher}' not found on PATH", field="--launcher", value=cfg.launcher
        )
    if cfg.runner == "nccl-tests":
        for c in cfg.collectives:
            binary = _binary(cfg, c)
            found = Path(binary) if cfg.binary_dir else shutil.which(binary)
            if not found or not Path(found).is_file() or not os.access(found, os.X_OK):
                where = f"in {cfg.binary_dir}" if cfg.binary_dir else "on PATH (use --binary-dir)"
                raise CalibrationError(
                    f"nccl-tests binary {c}_perf not found {where}",
                    field="--binary-dir",
                    value=binary,
                )
    else:
        try:
            metadata.version("torch")
        except metadata.PackageNotFoundError:
            raise CalibrationError(
                TORCH_MISSING,
                field="--runner",
                value="torch",
            ) from None


def run(
    cfg: RunConfig,
    steps: list[Step],
    on_line: Callable[[str], None],
    on_skip: Callable[[int], None],
    notify: Callable[[str], None],
) -> list[Path]:
    """Execute ``steps``; return the logs (``logs/<collective>.txt``) now complete in ``cfg.out``.

    A SIGTERM (a batch system's time limit) ends the run like Ctrl-C: the launched commands are
    stopped and everything recorded so far stays.
    """
    with directory_lock(cfg.out, "calibrate run", "--out", CalibrationError):
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, _terminated)
            try:
                return _run(cfg, steps, on_line, on_skip, notify)
            finally:
                signal.signal(signal.SIGTERM, previous)
                _settle(cfg)
        try:
            return _run(cfg, steps, on_line, on_skip, notify)
        finally:
            _settle(cfg)


def _settle(cfg: RunConfig) -> None:
    """Bring every per-point log up to date with its recorded points (a stopped run may lag)."""
    if cfg.runner == "torch" and (cfg.out / MANIFEST).exists():
        # an unreadable manifest is reported by the run itself
        with contextlib.suppress(CalibrationError):
            ResultStore(cfg.out, {}).settle()


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _run(
    cfg: RunConfig,
    steps: list[Step],
    on_line: Callable[[str], None],
    on_skip: Callable[[int], None],
    notify: Callable[[str], None],
) -> list[Path]:
    run_dir = cfg.out / "run"
    run_dir.mkdir(exist_ok=True)
    # settings that change what a number means: a resumed run must measure as the first did
    identity: dict[str, object] = {
        "runner": cfg.runner, "ranks": cfg.nprocs, "nodes": cfg.nodes, "dtype": cfg.dtype,
        "warmup": cfg.warmup, "iters": cfg.iters,
    }  # fmt: skip
    if cfg.runner == "nccl-tests":  # one log per collective covers the whole size range
        identity["sizes"] = [units.parse_size(cfg.minbytes), units.parse_size(cfg.maxbytes),
                             cfg.stepfactor]  # fmt: skip
    store = ResultStore(cfg.out, identity)
    for problem in store.problems():
        notify(f"warning: {problem}")
    store.clean()
    capture_environment(cfg.out, cfg.runner, cfg.launcher, [s.shell() for s in steps])
    (cfg.out / CLUSTER).mkdir(exist_ok=True)  # NCCL writes its dump there, not making folders
    captured = capture_cluster(cfg.out, cfg.launcher, cfg.nodes, cfg.launcher_args)
    for step in steps:
        label = step.collective or "torchbench"
        if step.collective and store.done(step.collective):
            notify(f"{step.collective}: done in an earlier run, skipped")
            on_skip(step.points)
            continue
        # the torch benchmark guards each point itself; allow for torch's start-up around it
        silence = cfg.timeout + (_TORCH_STARTUP_S if cfg.runner == "torch" else 0.0)
        status, stdout, err = execute(step, run_dir, label, silence, on_line, notify)
        if status != 0:
            detail = failure_reason(err, status, stdout)
            raise CalibrationError(
                f"{label} failed: {detail} (output kept in {run_dir})",
                field="exit status",
                value=status,
            )
        if step.collective:
            staged = run_dir / f"{label}.stdout"
            log = read_log(staged, collective=step.collective)  # refuse what does not parse
            if log.ranks != cfg.nprocs:
                raise CalibrationError(
                    f"{label} ran on {plural(log.ranks, 'rank')}, not the {cfg.nprocs} asked "
                    f"for (output kept in {run_dir}; not recorded)",
                    field="--nprocs",
                    value=cfg.nprocs,
                )
            short = _cut_short(cfg, log, staged.read_text(encoding="utf-8", errors="replace"))
            if short:  # exited 0 all the same: not done, or a rerun would skip it
                kept = keep_interrupted(staged) or staged
                raise CalibrationError(
                    f"{label} exited 0 but {short}: cut short, not recorded (a rerun measures "
                    f"{label} again)",
                    file=str(kept),
                    field="rows",
                )
            store.record(
                step.collective,
                f"logs/{step.collective}.txt",
                stdout.encode(),
                collective=step.collective,
                kind="nccl-tests log",
            )
            for anomaly in log.anomalies:  # kept (it is what was measured), but said
                notify(f"warning: {step.collective}: {anomaly}")
    logs = sorted((cfg.out / "logs").glob("*.txt"))
    note_versions(cfg.out, logs)
    note_captures(cfg.out, captured)
    return logs


_REDUCED = re.compile(r"Reducing maxBytes to (\d+)")


def _cut_short(cfg: RunConfig, log: NcclTestsLog, text: str) -> str | None:
    """Why a table from a command that exited 0 is still not a whole measurement, or None: its
    rows stop short of the largest size asked for (more than nccl-tests' rounding of a size down
    to whole elements of every rank; nccl-tests' own ``Reducing maxBytes to N due to memory
    limitation`` lowers that to the last size up to ``N``), or it lacks the ``Avg bus
    bandwidth`` line nccl-tests prints after the last size, or a row of it never completed."""
    sizes = cfg.sizes()
    asked = sizes[-1]
    if reduced := _REDUCED.search(text):
        asked = max((s for s in sizes if s <= int(reduced.group(1))), default=sizes[0])
    last = max((r.size_bytes for r in log.rows), default=0)
    why = []
    if last + 16 * log.ranks < asked:
        why.append(f"its rows stop at {last} B of the {asked} B asked for")
    if log.avg_busbw is None:
        why.append("it has no 'Avg bus bandwidth' line")
    if log.incomplete_rows:  # the reader leaves such rows out: a measurement would lack them
        lines = ", ".join(map(str, log.incomplete_rows))
        why.append(f"its result row(s) at line(s) {lines} never completed")
    return " and ".join(why) or None
