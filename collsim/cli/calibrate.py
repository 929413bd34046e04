"""``collsim calibrate``: measure a real cluster (``run``) and read measurement logs (``read``)."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict
from pathlib import Path

import click

from collsim.cli.base import (
    COLLECTIVE,
    DTYPE,
    DTYPE_HELP,
    FILE,
    FOLDER,
    OUT_FILE,
    OUT_FOLDER,
    cli,
    nccl_env,
    nccl_env_option,
    refuse_overwriting_inputs,
)
from collsim.collectives.registry import COLLECTIVES
from collsim.tables import plural


@cli.group()
def calibrate() -> None:
    """Measure collectives on a real system and read nccl-tests results."""


def _split_args(text: str) -> list[str]:
    """``--launcher-args`` as a shell splits it; an unbalanced quote is an error naming it."""
    from collsim.errors import CalibrationError

    try:
        return shlex.split(text)
    except ValueError as exc:
        raise CalibrationError(
            f"cannot split it as a shell would: {exc}", field="--launcher-args", value=text
        ) from None


def _collectives(text: str) -> list[str]:
    from collsim.errors import CalibrationError, CollsimError
    from collsim.metrics import canonical_collective

    names = []
    for item in text.split(","):
        if item.strip() == "all":
            names += COLLECTIVES
            continue
        try:
            names.append(canonical_collective(item.strip()))
        except CollsimError as exc:
            raise CalibrationError(exc.message, field="--collectives", value=item) from None
    return list(dict.fromkeys(names))


@calibrate.command("run")
@click.option(
    "--runner",
    type=click.Choice(["nccl-tests", "torch"]),
    default="nccl-tests",
    show_default=True,
    help="nccl-tests binaries, or the torch.distributed benchmark.",
)
@click.option(
    "--launcher",
    type=click.Choice(["local", "torchrun", "mpirun", "srun"]),
    default="local",
    show_default=True,
    help="How processes are started.",
)
@click.option("--nprocs", type=int, default=2, show_default=True, help="Total ranks.")
@click.option("--nodes", type=int, default=1, show_default=True, help="Nodes the ranks span.")
@click.option(
    "-c",
    "--collectives",
    default="all_reduce",
    show_default=True,
    help="Comma-separated collectives, or 'all'.",
)
@click.option("-b", "--minbytes", default="8", show_default=True, help="Smallest size.")
@click.option("-e", "--maxbytes", default="128M", show_default=True, help="Largest size.")
@click.option("-f", "--stepfactor", type=float, default=2.0, show_default=True, help="Size step.")
@click.option("-d", "--datatype", type=DTYPE, default="float", show_default=True, help=DTYPE_HELP)
@click.option("-w", "--warmup", type=int, default=5, show_default=True, help="Warm-up calls.")
@click.option("-n", "--iters", type=int, default=20, show_default=True, help="Timed calls.")
@click.option("--out", type=OUT_FOLDER, required=True, help="Results directory.")
@click.option(
    "--binary-dir",
    type=FOLDER,
    default=None,
    help="Where the nccl-tests *_perf binaries are (default: PATH).",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "gloo", "nccl"]),
    default="auto",
    show_default=True,
    help="torch runner: nccl on GPUs, gloo on CPUs.",
)
@click.option(
    "--timeout",
    type=float,
    default=300.0,
    show_default=True,
    help="Seconds one collective may take before it counts as hung.",
)
@click.option("--launcher-args", default="", help="Extra arguments for the launcher (quoted).")
@click.option("--dry-run", is_flag=True, help="Print the commands and stop.")
def run_cmd(
    runner: str,
    launcher: str,
    nprocs: int,
    nodes: int,
    collectives: str,
    minbytes: str,
    maxbytes: str,
    stepfactor: float,
    datatype: str,
    warmup: int,
    iters: int,
    out: str,
    binary_dir: str | None,
    backend: str,
    timeout: float,
    launcher_args: str,
    dry_run: bool,
) -> None:
    """Measure collectives with nccl-tests or torch.distributed; results go to --out.

    Each completed measurement is kept at once (rerunning skips it; killing a run loses nothing
    completed). The logs in OUT/logs/ are nccl-tests tables that 'collsim calibrate read' reads.
    """
    from collsim.calibration.runners import RunConfig, check_tools, plan_commands
    from collsim.calibration.runners import run as execute

    cfg = RunConfig(
        runner=runner,
        launcher=launcher,
        nprocs=nprocs,
        nodes=nodes,
        collectives=_collectives(collectives),
        minbytes=minbytes,
        maxbytes=maxbytes,
        stepfactor=stepfactor,
        dtype=datatype,
        warmup=warmup,
        iters=iters,
        out=Path(out),
        binary_dir=Path(binary_dir) if binary_dir else None,
        timeout=timeout,
        backend=backend,
        launcher_args=_split_args(launcher_args),
    )
    steps = plan_commands(cfg)
    if dry_run:
        for step in steps:
            click.echo(step.shell())
        return
    check_tools(cfg, steps)
    total = sum(s.points for s in steps)
    try:
        with click.progressbar(
            length=total, label=f"{runner} via {launcher}", file=None, show_pos=True
        ) as bar:
            logs = execute(
                cfg,
                steps,
                on_line=lambda _line: bar.update(1),
                on_skip=bar.update,
                notify=lambda msg: click.echo(f"\n# {msg}", err=True),
            )
    except (KeyboardInterrupt, SystemExit) as stop:  # Ctrl-C, or a batch system's SIGTERM
        how = "interrupted" if isinstance(stop, KeyboardInterrupt) else f"stopped ({stop.code})"
        click.echo(f"\n# {how}: completed points are kept in {out}; run the same command "
                   "again to resume", err=True)  # fmt: skip
        raise
    for log in logs:
        click.echo(f"# wrote {log}")


@calibrate.command("read")
@click.argument("logs", nargs=-1, required=True, type=FILE)
@click.option(
    "--collective",
    type=COLLECTIVE,
    default=None,
    help="Collective, where the log does not name it.",
)
@click.option(
    "--ranks", type=click.IntRange(min=1), default=None, help="Ranks, where the log does not say."
)
@click.option(
    "--gpus-per-thread",
    type=click.IntRange(min=1),
    default=None,
    help="GPUs one host thread drove (nccl-tests -g), where a log does not say; default 1.",
)
@click.option("--strict", is_flag=True, help="Fail on any anomaly (e.g. #wrong > 0).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def read_cmd(
    logs: tuple[str, ...],
    collective: str | None,
    ranks: int | None,
    gpus_per_thread: int | None,
    strict: bool,
    as_json: bool,
) -> None:
    """Print what each nccl-tests LOG says: system, ranks, nodes, rows, anomalies."""
    from collsim.calibration import read_logs
    from collsim.calibration.writer import format_row

    parsed = [
        log
        for path in logs
        for log in read_logs(
            path,
            strict=strict,
            collective=collective,
            ranks=ranks,
            gpus_per_thread=gpus_per_thread,
        )
    ]
    if as_json:
        click.echo(json.dumps([asdict(p) for p in parsed], indent=1))
        return
    for log in parsed:
        click.echo(
            f"# {log.file}: {log.collective} on {plural(log.ranks, 'rank')} "
            f"({plural(log.nodes, 'node') if log.nodes is not None else '? nodes'}), "
            f"GPU {log.gpu or '?'}, NCCL {log.nccl_version or '?'}, {log.layout} layout, "
            f"{log.gpus_per_thread} GPU(s) per host thread"
        )
        if log.nccl_env:
            click.echo("# NCCL settings: " + " ".join(f"{k}={v}" for k, v in log.nccl_env.items()))
        for row in log.rows:
            click.echo(format_row(row))
        if log.avg_busbw is not None:
            click.echo(f"# Avg bus bandwidth    : {log.avg_busbw:g}")
        for note in log.notes:
            click.echo(f"# note: {note}")
        for anomaly in log.anomalies:
            click.echo(f"# ANOMALY: {anomaly}")
        found = plural(len(log.anomalies), "anomaly", "anomalies")
        click.echo(f"# {plural(len(log.rows), 'row')}, {found}")


@calibrate.command("fit")
@click.argument("logs", nargs=-1, required=True, type=FILE)
@click.option(
    "--topology",
    "-t",
    required=True,
    metavar="NAME|PATH|DIR",
    help="Catalog name or file, or a calibrate run results directory: the cluster it captured "
    "(NCCL's topology dump, nvidia-smi, ibnetdiscover), imported.",
)
@click.option("--nodes", type=int, default=None, help="Override the nodes the logs report.")
@click.option("--gpus-per-node", type=int, default=None, help="Override the GPUs per node.")
@click.option(
    "--collective", type=COLLECTIVE, default=None, help="Collective, where a log does not name it."
)
@click.option(
    "--ranks", type=click.IntRange(min=1), default=None, help="Ranks, where a log does not say."
)
@click.option(
    "--gpus-per-thread",
    type=click.IntRange(min=1),
    default=None,
    help="GPUs one host thread drove (nccl-tests -g), where a log does not say; default 1.",
)
@click.option("--allow-anomalies", is_flag=True, help="Fit logs with anomalies (#wrong > 0).")
@nccl_env_option
@click.option(
    "--nccl-version",
    default=None,
    metavar="X.Y.Z",
    help="NCCL release the runs used, where a log does not say (e.g. 2.9.9+cuda11.2); the fit "
    "predicts those logs with its choices, as validate does. Default: the newest behaviour.",
)
@click.option(
    "-o",
    "--output",
    required=True,
    type=OUT_FILE,
    help="Profile to write (YAML; JSON where the name ends in .json).",
)
def fit_cmd(
    logs: tuple[str, ...],
    topology: str,
    nodes: int | None,
    gpus_per_node: int | None,
    collective: str | None,
    ranks: int | None,
    gpus_per_thread: int | None,
    allow_anomalies: bool,
    nccl_env_items: tuple[str, ...],
    nccl_version: str | None,
    output: str,
) -> None:
    """Fit a calibration profile of TOPOLOGY to nccl-tests LOGS (least squares on time error).

    Ranks and nodes come from each log (--nodes/--gpus-per-node override). The profile holds a
    few physical parameters (per link class: bandwidth efficiency and latency scale, and for PCIe
    and network links a duplex efficiency where the logs hold one-way and two-way collectives; a
    per-call base latency and the host's launch floor under back-to-back calls, per GPU one host
    thread drives, as nccl-tests -g gives it; size-dependent efficiency) that 'simulate',
    'validate' and 'step' accept as --profile. Each log is predicted as its NCCL release runs
    it: the release its header names, else --nccl-version, else the newest behaviour.
    """
    from collsim.calibration.session import load_samples
    from collsim.model.nccl_release import parse_nccl_version

    refuse_overwriting_inputs([*logs, topology], output=output)
    parse_nccl_version(nccl_version, field="--nccl-version")  # a bad value: one line, now
    if Path(topology).is_dir():  # a results directory: the topology its run captured
        from collsim.calibration.cluster import captured_topology

        topology = str(captured_topology(Path(topology), nodes))
        click.echo(f"# imported the captured cluster into {topology}")
    samples = load_samples(
        logs, topology, nodes=nodes, gpus_per_node=gpus_per_node, collective=collective,
        ranks=ranks, gpus_per_thread=gpus_per_thread, allow_anomalies=allow_anomalies,
        for_fit=True, env=nccl_env(nccl_env_items), nccl_version=nccl_version,
    )  # fmt: skip
    from collsim.calibration.fit import fit_samples
    from collsim.calibration.identify import identified_text
    from collsim.calibration.log_context import gpu_mismatch
    from collsim.calibration.session import release_lines

    for s in samples:
        for note in s.log.incomplete_notes:  # the fit uses the rows that completed
            click.echo(f"# note: {s.name}: {note}")
        if note := gpu_mismatch(s.log, s.topology):
            click.echo(f"# note: {note}")
    for line in release_lines(samples, nccl_version):
        click.echo(f"# {line}")
    profile = fit_samples(samples)
    profile.save(output)
    doc = profile.doc
    click.echo(
        f"# fitted {doc.topology.name} on {plural(len(samples), 'log')} ({doc.provenance.method})"
    )
    for name, c in doc.link_classes.items():
        click.echo(
            f"#   {name}: bandwidth efficiency {c.bandwidth_efficiency:.3f}, "
            f"latency scale {c.latency_scale:.3f}"
            + (f", duplex efficiency {c.duplex_efficiency:.3f}" if c.duplex_efficiency else "")
        )
    click.echo(
        f"#   base latency {doc.base_latency_us:.2f} us, launch floor {doc.launch_floor_us:.2f} us"
        f" per GPU a host thread drives (+ {doc.p2p_op_us:g} us per point-to-point operation,"
        " a priori)"
    )
    click.echo(
        "#   size efficiency " + ", ".join(f"{int(s)}B: {f:.3f}" for s, f in doc.size_efficiency)
    )
    if doc.identifiability:
        click.echo("# what the logs constrain (a parameter no row moves is kept at its prior, "
                   "the uncalibrated model; at another scale only constrained link parameters "
                   "carry over):")  # fmt: skip
    for name, seen in doc.identifiability.items():
        click.echo(f"#   {identified_text(name, seen)}")
    for name in doc.prior.bandwidth_efficiency if doc.prior else ():
        if name not in doc.link_classes:
            click.echo(f"#   {name}.*: no log crosses it; not constrained, kept at its prior")
    for bound in doc.provenance.at_bounds:
        click.echo(f"# note: {bound}: the data push it past what is physical; the model misses "
                   "something these logs show")  # fmt: skip
    if doc.fit_error is not None:
        for name, err in doc.fit_error.per_log.items():
            click.echo(f"#   {name}: in-sample MAPE {100 * err:.1f}%")
        click.echo(
            f"# in-sample MAPE {100 * doc.fit_error.mape:.1f}% mean, "
            f"{100 * doc.fit_error.median_mape:.1f}% median"
        )
    click.echo(f"# wrote {output}")
