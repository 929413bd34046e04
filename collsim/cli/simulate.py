"""``collsim simulate`` and ``collsim demo``: what-if simulations printed like nccl-tests."""

from __future__ import annotations

import json
import textwrap
import time

import click

from collsim.cli.base import (
    COLLECTIVE,
    FILE,
    OUT_FILE,
    chunk_option,
    cli,
    fault_option,
    progress_bar,
    refuse_overwriting_inputs,
    run_options,
    size_option,
    whatif_for,
)
from collsim.collectives.common import MAX_CHUNKS, PIPELINE_FILL
from collsim.errors import CollsimError

SLOW_RUN_S = 30.0
"""A discrete-event run longer than this ends with a hint at the analytic engine."""


@cli.command()
@click.argument("collective", type=COLLECTIVE)
@click.option("--topology", "-t", required=True, metavar="NAME|PATH", help="Catalog name or file.")
@click.option("--nodes", type=int, default=None, help="Override the number of nodes.")
@click.option("--gpus-per-node", type=int, default=None, help="Override the GPUs in each node.")
@click.option("--algorithm", "-a", default="auto", show_default=True, help="Algorithm or 'auto'.")
@click.option(
    "-b", "--minbytes", default="8", show_default=True, help="Smallest size (nccl-tests)."
)
@click.option("-e", "--maxbytes", default="128M", show_default=True, help="Largest size.")
@run_options
@click.option(
    "--engine",
    default="des",
    show_default=True,
    help="des (discrete-event, with contention) or analytic (closed forms, instant).",
)
@click.option(
    "--model",
    default="collsim",
    show_default=True,
    help="Cost model for --engine analytic and for auto's choices: collsim or nccl.",
)
@click.option(
    "--profile",
    type=FILE,
    default=None,
    help="Calibration profile (collsim calibrate fit) for this topology. The des engine takes its "
    "link rates and latencies; its memory efficiency (the per-channel ceiling), base latency, "
    "launch floor, size factors and NCCL's tree correction apply with --engine analytic (the "
    "collsim model) only.",
)
@click.option("--json", "json_file", type=OUT_FILE, help="Write JSON here.")
@click.option("--trace", type=OUT_FILE, help="Chrome/Perfetto trace (max size).")
@click.option(
    "--tuned",
    is_flag=True,
    help="Run what NCCL would: per size, the tuner picks among NCCL's algorithms, the protocols "
    "it enables by default and 1, 8 or NCCL's channel count here (the cost model's choice); "
    "overrides --protocol and --channels.",
)
@fault_option
def simulate(
    collective: str,
    topology: str,
    nodes: int | None,
    gpus_per_node: int | None,
    algorithm: str,
    minbytes: str,
    maxbytes: str,
    stepfactor: float,
    datatype: str,
    channels: int,
    protocol: str,
    chunk_bytes: str | None,
    engine: str,
    model: str,
    profile: str | None,
    json_file: str | None,
    trace: str | None,
    tuned: bool,
    faults: tuple[str, ...],
) -> None:
    """Simulate COLLECTIVE over message sizes, printed like nccl-tests.

    Sizes go from -b to -e multiplying by -f, as nccl-tests' flags do. With --algorithm auto the
    tuner picks each size's algorithm from the cost model (--model), with the given protocol and
    channels; with --tuned it also picks the protocol and channels, as NCCL does. --engine des
    (the default) then times it on the discrete-event engine, --engine analytic with the cost
    model itself.
    """
    from collsim import units
    from collsim.engine import write_chrome_trace
    from collsim.io import atomic_write_text
    from collsim.report.nccl_table import bottleneck_table, sweep_table
    from collsim.topology.loader import load_topology

    refuse_overwriting_inputs([topology, profile], json=json_file, trace=trace)
    try:
        sizes = units.size_range(
            size_option("-b", minbytes), size_option("-e", maxbytes), stepfactor
        )
    except CollsimError as exc:
        raise (exc if exc.field else exc.located(field="-b/-e/-f")) from None
    chunk = chunk_option(chunk_bytes)
    if trace and engine != "des":
        raise CollsimError("a trace needs the discrete-event engine", field="--trace", value=engine)
    topo = load_topology(topology, nodes=nodes, gpus_per_node=gpus_per_node, faults=faults)
    if topo.faults:
        click.echo(f"# faults: {'; '.join(topo.faults)}")
    whatif, prof = whatif_for(topo, profile, engine, model)
    if prof is not None:
        if not tuned:
            click.echo(
                f"# note: times are for {protocol} on {channels} channel(s), as asked; NCCL "
                "picks the protocol and channels per size (--tuned; `collsim validate` compares "
                "its choices with measured logs; `collsim tune --profile` shows which of "
                "collsim's algorithms the model finds fastest)"
            )
        doc = prof.doc
        if engine == "des" and (
            doc.base_latency_us or doc.launch_floor_us or doc.size_efficiency
            or doc.tree_correction
        ):  # fmt: skip
            click.echo(
                f"# note: the discrete-event engine takes the profile's links only (rates, "
                f"latencies, duplex, switch forwarding latencies); its base latency "
                f"({doc.base_latency_us:g} us), launch floor "
                f"({doc.launch_floor_us:g} us per launch, {doc.p2p_op_us:g} us per "
                "point-to-point operation), latency scales of NCCL's per-hop protocol latencies, "
                "size factors and NCCL's tree correction apply with --engine analytic, so the "
                "two engines differ most at small sizes"
            )
    pipelined = algorithm in ("tree", "chain", "in_network") or (
        algorithm == "auto" and collective in ("all_reduce", "broadcast", "reduce")
    )
    if chunk is not None and pipelined and not tuned and max(sizes) > MAX_CHUNKS * chunk * channels:
        from collsim.units import format_size

        click.echo(
            f"# note: --chunk-bytes {format_size(chunk)}: a pipeline cuts each channel's share "
            f"into at most {MAX_CHUNKS} chunks, or {PIPELINE_FILL} per stage of its depth if "
            "more (a bound on the schedule's size), so from "
            f"{format_size(MAX_CHUNKS * chunk * channels)} on its chunks may be larger"
        )
    started = time.perf_counter()
    with progress_bar("size", "simulate", worth_it=engine == "des") as bar:
        sweep = whatif.sweep(
            collective,
            algorithm,
            sizes,
            dtype=datatype,
            channels=channels,
            protocol=protocol,
            chunk_bytes=chunk,
            engine=engine,
            model=model,
            progress=bar,
            tuned=tuned,
        )
    took = time.perf_counter() - started
    if engine == "des" and took > SLOW_RUN_S:
        click.echo(f"# note: the discrete-event engine took {took:.0f} s (every transfer and "
                   "link share simulated); --engine analytic estimates in milliseconds",
                   err=True)  # fmt: skip
    if engine == "analytic":
        click.echo(f"# analytic estimate (model {model}); no per-link detail")
    click.echo(sweep_table(sweep))
    if sweep.last is not None:
        click.echo(bottleneck_table(sweep.last))
    if json_file:
        atomic_write_text(json_file, json.dumps(sweep.as_json(), indent=2) + "\n")
        click.echo(f"# wrote {json_file}")
    if trace and sweep.last is not None and sweep.last_schedule is not None:
        write_chrome_trace(sweep.last, sweep.last_schedule, trace)
        click.echo(f"# wrote {trace} (open in https://ui.perfetto.dev)")


@cli.command()
@click.option("--topology", default="dgx-h100", show_default=True, help="Catalog name or file.")
@click.option(
    "--nodes",
    type=int,
    default=None,
    help="Number of nodes [default: 4 on dgx-h100, else the topology's own].",
)
def demo(topology: str, nodes: int | None) -> None:
    """The README's main command: ring vs tree all-reduce across sizes on a bundled system."""
    from collsim.report.nccl_table import bottleneck_table
    from collsim.topology.describe import describe, describe_text
    from collsim.topology.loader import load_topology
    from collsim.whatif import WhatIf

    if nodes is None and topology == "dgx-h100":
        nodes = 4
    topo_ = load_topology(topology, nodes=nodes)
    click.echo(describe_text(describe(topo_)))
    whatif = WhatIf(topo_)
    sizes = [8 * 8**i for i in range(10)]  # 8 B .. 1 GiB
    sweeps = {a: whatif.sweep("all_reduce", a, sizes) for a in ("ring", "tree")}
    tuned = whatif.sweep("all_reduce", "auto", sizes, tuned=True)
    intro = (
        f"all_reduce on {topo_.n_gpus} GPUs (float): ring and tree with the Simple protocol on "
        "1 channel, and 'tuned': the algorithm, protocol and channels NCCL's tuner would pick "
        "(collsim simulate --tuned)"
    )
    click.echo("\n" + textwrap.fill(intro, width=100))
    click.echo(
        f"{'size':>10}  {'ring us':>10}  {'ring busbw':>10}  {'tree us':>10}  "
        f"{'tree busbw':>10}  {'winner':<13}  {'tuned us':>10}  {'tuned busbw':>11}  tuned choice"
    )
    rows = zip(sweeps["ring"].points, sweeps["tree"].points, tuned.points, strict=True)
    for ring, tree, best in rows:
        winner = "ring" if ring.time_s <= tree.time_s else "tree"
        ratio = max(ring.time_s, tree.time_s) / max(min(ring.time_s, tree.time_s), 1e-30)
        click.echo(
            f"{ring.size_bytes:>10}  {ring.time_s * 1e6:>10.2f}  {ring.busbw_gbps:>10.2f}  "
            f"{tree.time_s * 1e6:>10.2f}  {tree.busbw_gbps:>10.2f}  "
            f"{f'{winner} ({ratio:.2f}x)':<13}  {best.time_s * 1e6:>10.2f}  "
            f"{best.busbw_gbps:>11.2f}  {best.algorithm}/{best.protocol}/{best.channels}ch"
        )
    if tuned.last is not None:  # the busiest links of NCCL's choice at the largest size
        click.echo(bottleneck_table(tuned.last))
