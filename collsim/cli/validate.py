"""``collsim validate``: predicted vs measured nccl-tests results, and the error (MAPE)."""

from __future__ import annotations

import json
from typing import Any

import click

from collsim.cli.base import (
    COLLECTIVE,
    FILE,
    OUT_FILE,
    cli,
    nccl_env,
    nccl_env_option,
    progress_bar,
    refuse_overwriting_inputs,
)
from collsim.tables import plural


@cli.command()
@click.argument("logs", nargs=-1, required=True, type=FILE)
@click.option("--topology", "-t", required=True, metavar="NAME|PATH", help="Catalog name or file.")
@click.option("--nodes", type=int, default=None, help="Override the nodes the logs report.")
@click.option("--gpus-per-node", type=int, default=None, help="Override the GPUs per node.")
@click.option("--profile", type=FILE, default=None, help="Fitted profile.")
@click.option(
    "--model",
    type=click.Choice(["collsim", "nccl"]),
    default="collsim",
    show_default=True,
    help="collsim's analytic model, or NCCL's own tuning model (baseline).",
)
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
@nccl_env_option
@click.option(
    "--nccl-version",
    default=None,
    metavar="X.Y.Z",
    help="NCCL release the runs used, where a log does not say (e.g. 2.9.9); its choices are "
    "predicted (no LL128 before 2.5; 2.4's tree threshold). Default: the newest behaviour.",
)
@click.option(
    "--allow-anomalies",
    is_flag=True,
    help="Compare logs with anomalies (#wrong > 0, times that disagree with the bandwidths).",
)
@click.option(
    "--cross-scale",
    is_flag=True,
    help="Fit a profile on one scale of the logs (--fit-on) and predict the others: per log, "
    "uncalibrated vs calibrated MAPE.",
)
@click.option(
    "--fit-on",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="With --cross-scale: fit on the logs at N nodes (or N ranks, where none ran on N "
    "nodes); default: the fewest ranks.",
)
@click.option("--summary", is_flag=True, help="Only the MAPE lines, no per-size table.")
@click.option("--json", "json_file", type=OUT_FILE, help="Write JSON here.")
@click.option("--plot", "plot_file", type=OUT_FILE, help="busbw plot (PNG/SVG).")
def validate(
    logs: tuple[str, ...],
    topology: str,
    nodes: int | None,
    gpus_per_node: int | None,
    profile: str | None,
    model: str,
    collective: str | None,
    ranks: int | None,
    gpus_per_thread: int | None,
    nccl_env_items: tuple[str, ...],
    nccl_version: str | None,
    allow_anomalies: bool,
    cross_scale: bool,
    fit_on: int | None,
    summary: bool,
    json_file: str | None,
    plot_file: str | None,
) -> None:
    """Predict each nccl-tests LOG on TOPOLOGY and compare: per size and MAPE on time.

    Without --profile the model is uncalibrated (datasheet links at NCCL's achievable fraction,
    NCCL's latencies and its tree all-reduce's medium-size correction); with it, the fitted
    parameters (on another scale than the fit's, those the fit could not see there stay
    uncalibrated). --model nccl uses NCCL's own tuning model instead. --cross-scale fits a
    profile on one scale of LOGS and compares the others uncalibrated and calibrated.
    """
    from collsim.calibration.fit import check_log
    from collsim.calibration.log_context import gpu_mismatch
    from collsim.calibration.predict import uncalibrated_params
    from collsim.calibration.session import load_samples
    from collsim.calibration.validate import plot_validation, validate_samples
    from collsim.errors import CollsimError
    from collsim.io import atomic_write_text, figure_format

    refuse_overwriting_inputs([*logs, topology, profile], json=json_file, plot=plot_file)
    from collsim.model.nccl_release import parse_nccl_version

    parse_nccl_version(nccl_version, field="--nccl-version")  # a bad value: one line, now
    if plot_file:
        figure_format(plot_file)
    samples = load_samples(
        logs, topology, nodes=nodes, gpus_per_node=gpus_per_node, collective=collective,
        ranks=ranks, gpus_per_thread=gpus_per_thread, env=nccl_env(nccl_env_items),
        nccl_version=nccl_version,  # so --cross-scale's fit and predictions follow it too
    )  # fmt: skip
    for s in samples:  # a wrong row would count in the error as if it were a measurement
        check_log(s.log, allow_anomalies=allow_anomalies, action="validate")
    if fit_on is not None and not cross_scale:
        raise CollsimError("takes effect with --cross-scale only", field="--fit-on", value=fit_on)
    if cross_scale:
        for flag, given in (("--profile", profile), ("--plot", plot_file)):
            if given:
                raise CollsimError("--cross-scale fits its own profile and draws no plot",
                                   field=flag, value=given)  # fmt: skip
        if model != "collsim":
            raise CollsimError("--cross-scale fits collsim's model", field="--model", value=model)
        from collsim.calibration.fit import fit_samples
        from collsim.calibration.validate import cross_scale as run_cross_scale

        found = run_cross_scale(samples, fit_on, fit=fit_samples)
        click.echo(found.text())
        if json_file:
            atomic_write_text(json_file, json.dumps(found.as_json(), indent=1) + "\n")
            click.echo(f"# wrote {json_file}")
        return
    notes: list[str] = []
    params: Any = uncalibrated_params()
    if profile:
        if model == "nccl":
            raise CollsimError("NCCL's model takes no profile", field="--profile", value=profile)
        from collsim.model.profile import load_profile

        prof = load_profile(profile)
        for s in samples:
            notes += [n for n in prof.check_topology(s.topology) if n not in notes]
        params = prof
    with progress_bar("log", "validate") as bar:
        result = validate_samples(
            samples, params, model=model, progress=bar, nccl_version=nccl_version
        )
    notes += [f"{s.name}: {n}" for s in samples for n in s.log.incomplete_notes]
    notes += [n for s in samples if (n := gpu_mismatch(s.log, s.topology))]
    notes += [
        f"{s.name}: the log ran on {plural(s.log.nodes, 'node')}; modelled on "
        f"{plural(s.topology.nodes, 'node')} of {plural(s.topology.gpus_per_node, 'GPU')} as the "
        "flags say"
        for s in samples
        if s.log.nodes and s.log.nodes != s.topology.nodes
    ]
    hints = (("--ranks", ranks, "ranks"), ("--gpus-per-thread", gpus_per_thread, "gpus_per_thread"))
    for flag, given, attr in hints:
        notes += [
            f"{s.name}: the log records {attr.replace('_', ' ')} = {getattr(s.log, attr)}, "
            f"which wins over {flag} {given}"
            for s in samples
            if given is not None and getattr(s.log, attr) != given
        ]
    result.notes = notes
    for s in samples:
        result.notes += [f"{s.name}: {a}" for a in s.log.anomalies]
    click.echo(result.text(points=not summary))
    if json_file:
        atomic_write_text(json_file, json.dumps(result.as_json(), indent=1) + "\n")
        click.echo(f"# wrote {json_file}")
    if plot_file:
        plot_validation(result, plot_file, title=f"{samples[0].topology.name}: {model} model")
        click.echo(f"# wrote {plot_file}")
