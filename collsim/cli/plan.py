"""``collsim plan``: rank cluster options for a workload by time to train and cost."""

from __future__ import annotations

import json

import click

from collsim.cli.base import (
    FILE,
    OUT_FILE,
    cli,
    progress_bar,
    refuse_overwriting_inputs,
)
from collsim.cli.batch import GLOBAL_BATCH, batch_changes, with_batch
from collsim.cli.step import (
    EFFICIENCY,
    ENGINE,
    JSON_OUT,
    PROFILE,
    WORKLOAD,
    insert_after,
    load_profile,
)
from collsim.errors import CollsimError
from collsim.io import figure_format


@cli.command()
@WORKLOAD
@click.option("--candidates", "-c", required=True, type=FILE, help="Candidates YAML.")
@ENGINE
@PROFILE
@EFFICIENCY
@click.option("--all-layouts", is_flag=True, help="List every fitting layout, not the best.")
@click.option(
    "--top", type=click.IntRange(min=1), default=20, show_default=True, help="Rows to print."
)
@click.option("--plot", type=OUT_FILE, help="Write the Pareto plot (PNG or SVG, by suffix).")
@GLOBAL_BATCH
@click.option(
    "--micro-batch",
    type=int,
    default=None,
    help="Samples per micro-batch (overrides the workload's micro_batch and the candidates' "
    "search of it).",
)
@JSON_OUT
def plan(
    workload: str,
    candidates: str,
    engine: str,
    profile: str | None,
    efficiency: float | None,
    all_layouts: bool,
    top: int,
    plot: str | None,
    global_batch: int | None,
    micro_batch: int | None,
    json_file: str | None,
) -> None:
    """Rank cluster options for a workload by time to train and cost (layouts searched)."""
    from collsim.io import atomic_write_text
    from collsim.report.step_plots import plot_pareto
    from collsim.tables import table
    from collsim.training import plan as planning
    from collsim.training.workload import load_workload

    refuse_overwriting_inputs([workload, candidates, profile], plot=plot, json=json_file)
    if plot:
        figure_format(plot)
    w = with_batch(load_workload(workload), batch_changes(global_batch, micro_batch))
    cand = planning.load_candidates(candidates)
    if micro_batch is not None and cand.search.micro_batch:
        click.echo(f"# note: --micro-batch {micro_batch} replaces the candidates' search of "
                   f"micro_batch {cand.search.micro_batch}")  # fmt: skip
        search = cand.search.model_copy(update={"micro_batch": None})
        cand = cand.model_copy(update={"search": search})
    params, eff = load_profile(profile)
    with progress_bar("size", "plan") as bar:
        options, rejected = planning.plan(
            w, cand, engine=engine, efficiency=eff, force_efficiency=efficiency, params=params,
            keep="all" if all_layouts else "best", profile=profile, progress=bar,
        )  # fmt: skip
    for note in rejected.notes:
        click.echo(f"# note: {note}")
    click.echo(f"# {w.name}: {cand.tokens:.3g} tokens, global batch {w.global_batch}; "
               f"{rejected.summary()}")  # fmt: skip
    if not options:
        why = "fits in memory" if not rejected.reasons else "can run and fits in memory"
        raise CollsimError(f"no candidate layout {why}", file=candidates, field="clusters")
    rows = [o.row() for o in options[:top]]
    split = [o for o in options[:top] if o.tp_split is not None]
    if split:  # marked in their own column, next to the layout
        rows = [insert_after(r, "layout", "tp_nodes", o.tp_nodes)
                for r, o in zip(rows, options[:top], strict=True)]  # fmt: skip
    cols = list(rows[0])
    click.echo(table(rows, cols))
    if split:
        first = split[0]
        click.echo(
            f"# warning: {len(split)} listed option(s) split a tensor-parallel group over nodes "
            f"(tp_nodes > 1), e.g. {first.cluster} {first.result.layout.label()}: "
            + first.tp_split.message()  # type: ignore[union-attr]
        )
    if plot:
        plot_pareto(options, plot, title=f"{w.name}: time vs cost")
        click.echo(f"# wrote {plot}")
    if json_file:
        data = [
            o.row()
            | {"tp_nodes": o.tp_nodes}
            | ({"tp_span": o.tp_split.as_json()} if o.tp_split else {})
            | {"step": o.result.as_json()}
            for o in options
        ]
        atomic_write_text(json_file, json.dumps(data, indent=2) + "\n")
        click.echo(f"# wrote {json_file}")
