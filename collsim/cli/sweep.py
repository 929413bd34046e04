"""``collsim sweep`` (a grid of what-if points, locally or on Dask) and ``collsim report``."""

from __future__ import annotations

import sys

import click

from collsim.cli.base import FILE, OUT_FOLDER, cli, progress_bar
from collsim.tables import plural


@cli.command()
@click.argument("spec_file", metavar="SPEC.yaml", type=FILE)
@click.option(
    "-o",
    "--output",
    required=True,
    type=OUT_FOLDER,
    metavar="RESULTS",
    help="Results directory (resumed).",
)
@click.option(
    "--executor",
    type=click.Choice(["local", "dask"]),
    default="local",
    show_default=True,
    help="local: a process pool on this machine; dask: a dask.distributed scheduler.",
)
@click.option("--scheduler", metavar="tcp://HOST:PORT", help="Dask scheduler address.")
@click.option(
    "-j", "--jobs", type=int, default=None, help="Local worker processes (default: all cores)."
)
@click.option("--dry-run", is_flag=True, help="Validate the spec and count the points only.")
def sweep(
    spec_file: str,
    output: str,
    executor: str,
    scheduler: str | None,
    jobs: int | None,
    dry_run: bool,
) -> None:
    """Run a grid of what-if points; results are kept as they finish and a rerun resumes.

    Writes RESULTS/points.csv (one row per point: every input and output). Ctrl-C keeps what
    finished."""
    from collsim.errors import CollsimError
    from collsim.sweep import load_spec, run_sweep
    from collsim.units import MAX_JOBS

    if jobs is not None and not 1 <= jobs <= MAX_JOBS:
        raise CollsimError(f"must be from 1 to {MAX_JOBS}", field="--jobs", value=jobs)
    if executor == "dask" and not scheduler and not dry_run:  # before loading the spec
        raise CollsimError("--executor dask needs --scheduler tcp://HOST:PORT", field="--scheduler")
    spec = load_spec(spec_file)
    click.echo(f"# {spec.name}: {spec.n_points} points in {plural(len(spec.tasks), 'task')}")
    if dry_run:
        return
    with progress_bar("pt", "sweep") as bar:
        out = run_sweep(
            spec, output, executor=executor, jobs=jobs, scheduler=scheduler, progress=bar
        )
    for problem in out.problems:
        click.echo(f"# warning: {problem}", err=True)
    click.echo(
        f"# {out.points} rows in {out.path / 'points.csv'} "
        f"({plural(out.computed_tasks, 'task')} computed, "
        f"{out.reused_tasks} reused)"
    )
    if out.errors:
        click.echo(
            f"# warning: {plural(len(out.errors), 'row')} could not be computed (their 'error' "
            f"column says why), e.g.: {out.errors[0]}",
            err=True,
        )
    if out.interrupted:
        click.echo("# interrupted: finished tasks are kept; rerun the same command to resume",
                   err=True)  # fmt: skip
        sys.exit(130)


@cli.command()
@click.argument("results", metavar="RESULTS", type=click.Path(exists=True))
@click.option(
    "-o", "--output", required=True, type=OUT_FOLDER, metavar="DIR", help="Report folder."
)
@click.option(
    "--measured",
    type=FILE,
    help="CSV of measured times (collective, size_bytes, time_us; optional topology, nodes, "
    "algorithm) for the predicted-vs-measured plot.",
)
def report(results: str, output: str, measured: str | None) -> None:
    """Markdown + HTML report with plots of a sweep's results."""
    from collsim.report.sweep_report import write_report

    with progress_bar("section", "report") as bar:
        paths = write_report(results, output, measured=measured, progress=bar)
    for path in paths:
        click.echo(f"# wrote {path}")
