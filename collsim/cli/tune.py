"""``collsim tune``: which (algorithm, protocol, channels) wins at which sizes, NCCL-style."""

from __future__ import annotations

import json

import click

from collsim.cli.base import FILE, cli, refuse_overwriting_inputs, size_option, whatif_for
from collsim.collectives.registry import COLLECTIVES
from collsim.errors import CollsimError
from collsim.tables import plural


@cli.command()
@click.argument("collective", type=click.Choice(COLLECTIVES))
@click.option("--topology", "-t", required=True, metavar="NAME|PATH", help="Catalog name or file.")
@click.option("--nodes", type=int, default=None, help="Override the number of nodes.")
@click.option("--gpus-per-node", type=int, default=None, help="Override the GPUs in each node.")
@click.option("-b", "--minbytes", default="8", show_default=True, help="Smallest size.")
@click.option("-e", "--maxbytes", default="16G", show_default=True, help="Largest size.")
@click.option("-f", "--stepfactor", type=float, default=2.0, show_default=True, help="Size step.")
@click.option("-d", "--datatype", default="float", show_default=True, help="nccl-tests type.")
@click.option("--model", default="collsim", show_default=True, help="collsim or nccl.")
@click.option(
    "--profile",
    type=FILE,
    default=None,
    help="Calibration profile (collsim calibrate fit) for this topology: the collsim model "
    "prices every candidate under it.",
)
@click.option("--json", "json_file", type=FILE, help="Write JSON here.")
def tune(
    collective: str,
    topology: str,
    nodes: int | None,
    gpus_per_node: int | None,
    minbytes: str,
    maxbytes: str,
    stepfactor: float,
    datatype: str,
    model: str,
    profile: str | None,
    json_file: str | None,
) -> None:
    """Print the size ranges where each (algorithm, protocol, channels) is fastest.

    Every candidate is costed with the analytic model (--model collsim) or NCCL's own tuning
    model (--model nccl) at every size, as NCCL's tuner does; the speed-up is over the default
    algorithm (ring for all_reduce/all_gather/reduce_scatter) with Simple on one channel.
    LL128 is a candidate only where NCCL enables it by default (NVLink-class links: NVLink,
    xGMI, ICI; compute capability 7.0/8.0/9.0).
    """
    from collsim import units
    from collsim.io import atomic_write_text
    from collsim.metrics import busbw_gbps
    from collsim.model.tuner import Tuner, ranges
    from collsim.topology.loader import load_topology
    from collsim.whatif import dtype_bytes

    refuse_overwriting_inputs([topology, profile], json=json_file)
    try:
        sizes = units.size_range(
            size_option("-b", minbytes), size_option("-e", maxbytes), stepfactor
        )
    except CollsimError as exc:
        raise (exc if exc.field else exc.located(field="-b/-e/-f")) from None
    topo = load_topology(topology, nodes=nodes, gpus_per_node=gpus_per_node)
    whatif, _ = whatif_for(topo, profile, "analytic", model)
    cost = whatif.cost_model(model)
    result = Tuner(cost).tune(collective, sizes, elem_bytes=dtype_bytes(datatype))
    spans = ranges(result)
    topo = whatif.topology
    base = result.baseline
    click.echo(
        f"# {collective} on {topo.name}: {topo.n_gpus} GPUs, {plural(topo.nodes, 'node')}; "
        f"model {model}; "
        f"speed-up vs {base.algorithm}/{base.protocol}/{base.channels}ch"
    )
    click.echo(
        f"{'from':>10} {'to':>10}  {'algorithm':<13}{'protocol':<9}{'channels':>8}  "
        f"{'time (us)':>21}  {'busbw at to':>11}  speed-up"
    )
    best_s = dict(zip(result.sizes_bytes.tolist(), result.best_s.tolist(), strict=True))
    for span in spans:
        c = span.choice
        speed = (
            f"{span.speedup_min:.2f}x"
            if abs(span.speedup_max - span.speedup_min) < 5e-3
            else f"{span.speedup_min:.2f}-{span.speedup_max:.2f}x"
        )
        lo_s, hi_s = best_s[span.lo_bytes], best_s[span.hi_bytes]
        busbw = busbw_gbps(collective, topo.n_gpus, span.hi_bytes, hi_s) if hi_s > 0 else 0.0
        click.echo(
            f"{units.format_size(span.lo_bytes):>10} {units.format_size(span.hi_bytes):>10}  "
            f"{c.algorithm:<13}{c.protocol:<9}{c.channels:>8}  "
            f"{f'{lo_s * 1e6:.4g}..{hi_s * 1e6:.4g}':>21}  {busbw:>6.2f} GB/s  {speed}"
        )
    if json_file:
        doc = {
            "collective": collective,
            "topology": topo.name,
            "ranks": topo.n_gpus,
            "nodes": topo.nodes,
            "model": model,
            "baseline": {
                "algorithm": base.algorithm,
                "protocol": base.protocol,
                "channels": base.channels,
            },
            "ranges": [s.as_json() for s in spans],
            "points": [
                {
                    "bytes": int(size),
                    "algorithm": result.choice_at(i).algorithm,
                    "protocol": result.choice_at(i).protocol,
                    "channels": result.choice_at(i).channels,
                    "time_us": float(result.best_s[i] * 1e6),
                    "baseline_us": float(result.baseline_s[i] * 1e6),
                }
                for i, size in enumerate(result.sizes_bytes)
            ],
        }
        atomic_write_text(json_file, json.dumps(doc, indent=2) + "\n")
        click.echo(f"# wrote {json_file}")
