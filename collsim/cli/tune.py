"""``collsim tune``: which (algorithm, protocol, channels) wins at which sizes: among what NCCL
would run (``--candidates nccl``, as ``simulate --tuned`` picks) or every schedule collsim knows."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, NamedTuple

import click

from collsim.cli.base import (
    COLLECTIVE,
    DTYPE,
    DTYPE_HELP,
    FILE,
    OUT_FILE,
    cli,
    refuse_overwriting_inputs,
    size_option,
    whatif_for,
)
from collsim.errors import CollsimError
from collsim.model.tuner import CANDIDATES, Choice

if TYPE_CHECKING:
    from collsim.model.bounds import BusbwBound
from collsim.tables import plural


class _Winner(NamedTuple):
    """One size's winner as printed: its time, busbw, bound and whether it passes the bound."""

    size_bytes: int
    choice: Choice
    time_s: float
    busbw_gbps: float
    bound: BusbwBound | None
    exceeds_bound: bool


@cli.command()
@click.argument("collective", type=COLLECTIVE)
@click.option("--topology", "-t", required=True, metavar="NAME|PATH", help="Catalog name or file.")
@click.option("--nodes", type=int, default=None, help="Override the number of nodes.")
@click.option("--gpus-per-node", type=int, default=None, help="Override the GPUs in each node.")
@click.option("-b", "--minbytes", default="8", show_default=True, help="Smallest size.")
@click.option("-e", "--maxbytes", default="16G", show_default=True, help="Largest size.")
@click.option("-f", "--stepfactor", type=float, default=2.0, show_default=True, help="Size step.")
@click.option("-d", "--datatype", type=DTYPE, default="float", show_default=True, help=DTYPE_HELP)
@click.option("--model", default="collsim", show_default=True, help="collsim or nccl.")
@click.option(
    "--candidates",
    type=click.Choice(CANDIDATES),
    default="nccl",
    show_default=True,
    help="nccl: what NCCL would run (its algorithms, the protocols it enables by default, 1, 8 or "
    "NCCL's channel count here; what simulate --tuned runs); all: the fastest schedule collsim "
    "knows (every algorithm, 1, 2, 4, 8 or NCCL's count of channels), which NCCL may not have.",
)
@click.option(
    "--profile",
    type=FILE,
    default=None,
    help="Calibration profile (collsim calibrate fit) for this topology: the collsim model "
    "prices every candidate under it.",
)
@click.option("--json", "json_file", type=OUT_FILE, help="Write JSON here.")
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
    candidates: str,
    profile: str | None,
    json_file: str | None,
) -> None:
    """Print the size ranges where each (algorithm, protocol, channels) is fastest.

    Every candidate is costed with the analytic model (--model collsim) or NCCL's own tuning
    model (--model nccl) at every size and the fastest kept, as NCCL's tuner ranks its own.
    --candidates says which question that answers: nccl (default), what NCCL would run -- its
    algorithms, the protocols it enables by default, 1, 8 or NCCL's channel count on the system
    (24 in one DGX H100, 16 across nodes), the choices simulate --tuned makes at every size;
    all, the fastest schedule collsim knows (rhd, hierarchical, ... on 1, 2, 4, 8 or NCCL's
    count of channels), which NCCL does not run. LL128 is a candidate only where NCCL
    enables it by default (NVLink-class links: NVLink, xGMI, ICI; compute capability
    7.0/8.0/9.0). The speed-up is over the default algorithm (ring for
    all_reduce/all_gather/reduce_scatter) with Simple on one channel. A busbw above what its
    (algorithm, protocol, channels) can reach on the topology's links is marked '!'.
    """
    from collsim import units
    from collsim.dtypes import dtype_bytes
    from collsim.io import atomic_write_text
    from collsim.metrics import busbw_gbps
    from collsim.model.analytic import effective_bytes
    from collsim.model.tuner import model_description, ranges, tuning
    from collsim.report.nccl_table import BOUND_MARK, bound_notes
    from collsim.topology.loader import load_topology

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
    elem = dtype_bytes(datatype)
    result = tuning(cost, collective, sizes, elem_bytes=elem, candidates=candidates)
    spans = ranges(result)
    topo = whatif.topology
    base = result.baseline
    priced_by = model_description(cost)
    # Per size: the busbw of the winner (of the bytes nccl-tests moves, as simulate prints it)
    # and the most that (algorithm, protocol, channels) can reach on these links.
    moved = effective_bytes(collective, result.sizes_bytes, elem, topo.n_gpus)
    bounds = whatif.bounds()
    points = []
    for i, size in enumerate(result.sizes_bytes.tolist()):
        c, t_s = result.choice_at(i), float(result.best_s[i])
        busbw = busbw_gbps(collective, topo.n_gpus, float(moved[i]), t_s) if t_s > 0 else 0.0
        bound = bounds.bound(collective, c.algorithm, c.protocol, c.channels) if moved[i] else None
        over = bound is not None and bound.exceeded_by(busbw)
        points.append(_Winner(size, c, t_s, busbw, bound, over))
    click.echo(
        f"# {collective} on {topo.name}: {topo.n_gpus} GPUs, {plural(topo.nodes, 'node')}; "
        f"speed-up vs {base.algorithm}/{base.protocol}/{base.channels}ch"
    )
    click.echo(f"# candidates {candidates}: {result.question()}")
    click.echo(f"# priced by {priced_by} (--model {model})")
    click.echo(
        f"{'from':>10} {'to':>10}  {'algorithm':<13}{'protocol':<9}{'channels':>8}  "
        f"{'time (us)':>21}  {'busbw at to':>11}  speed-up"
    )
    by_size = {p.size_bytes: p for p in points}
    flagged = []
    for span in spans:
        c = span.choice
        speed = (
            f"{span.speedup_min:.2f}x"
            if abs(span.speedup_max - span.speedup_min) < 5e-3
            else f"{span.speedup_min:.2f}-{span.speedup_max:.2f}x"
        )
        lo, hi = by_size[span.lo_bytes], by_size[span.hi_bytes]
        lo_s, hi_s, busbw = lo.time_s, hi.time_s, hi.busbw_gbps
        over = [p for p in points if span.lo_bytes <= p.size_bytes <= span.hi_bytes]
        over = [p for p in over if p.exceeds_bound]
        flagged += [(c.label(), p.busbw_gbps, p.bound.busbw_gbps) for p in over]
        mark = BOUND_MARK if over else " "
        click.echo(
            f"{units.format_size(span.lo_bytes):>10} {units.format_size(span.hi_bytes):>10}  "
            f"{c.algorithm:<13}{c.protocol:<9}{c.channels:>8}  "
            f"{f'{lo_s * 1e6:.4g}..{hi_s * 1e6:.4g}':>21}  {busbw:>6.2f} GB/s{mark} {speed}"
        )
    for line in bound_notes(flagged, priced_by, topo.name):
        click.echo(line)
    if json_file:
        doc = {
            "collective": collective,
            "topology": topo.name,
            "ranks": topo.n_gpus,
            "nodes": topo.nodes,
            "model": model,
            "priced_by": priced_by,
            "candidates": candidates,
            "question": result.question(),
            "baseline": {
                "algorithm": base.algorithm,
                "protocol": base.protocol,
                "channels": base.channels,
            },
            "ranges": [
                {
                    **s.as_json(),
                    "exceeds_bound": any(
                        p.exceeds_bound for p in points if s.lo_bytes <= p.size_bytes <= s.hi_bytes
                    ),
                }
                for s in spans
            ],
            "points": [
                {
                    "bytes": int(p.size_bytes),
                    "algorithm": p.choice.algorithm,
                    "protocol": p.choice.protocol,
                    "channels": p.choice.channels,
                    "time_us": p.time_s * 1e6,
                    "baseline_us": float(result.baseline_s[i] * 1e6),
                    "busbw_gbps": p.busbw_gbps,
                    "busbw_bound_gbps": p.bound.busbw_gbps if p.bound is not None else None,
                    "exceeds_bound": p.exceeds_bound,
                }
                for i, p in enumerate(points)
            ],
        }
        atomic_write_text(json_file, json.dumps(doc, indent=2) + "\n")
        click.echo(f"# wrote {json_file}")
