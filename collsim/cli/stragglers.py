"""``collsim stragglers``: expected and tail (p99) collective times under seeded stragglers."""

from __future__ import annotations

import json
import os
import sys

import click

from collsim.cli.base import COLLECTIVE, OUT_FILE, chunk_option, cli, run_options, size_option
from collsim.collectives.registry import default_algorithm
from collsim.errors import CollsimError
from collsim.tables import plural

_BAR_MIN = 50
"""Fewest simulations for which a progress bar is worth showing."""


@cli.command()
@click.argument("collective", type=COLLECTIVE)
@click.option("--topology", "-t", required=True, metavar="NAME|PATH", help="Catalog name or file.")
@click.option("--nodes", type=int, default=None, help="Override the number of nodes.")
@click.option("--gpus-per-node", type=int, default=None, help="Override the GPUs in each node.")
@click.option("--algorithm", "-a", default=None, help="Algorithm or 'auto' [default: registry's].")
@click.option("-b", "--minbytes", default="64M", show_default=True, help="Smallest size.")
@click.option("-e", "--maxbytes", default=None, help="Largest size [default: -b].")
@run_options
@click.option(
    "--skew",
    default="none",
    show_default=True,
    help="Start delay per rank: none, uniform:MAX, exp:MEAN, lognormal:MEDIAN[,SIGMA], "
    "one:DELAY[@RANK] (times: 50us, 1.2ms; bare numbers are us). Each draw is shifted so its "
    "earliest rank starts at 0 (only the spread matters): with exp:MEAN the latest rank starts "
    "MEAN x (1/1 + ... + 1/(N-1)) after the first on average.",
)
@click.option(
    "--slowdown",
    default="none",
    show_default=True,
    help="Local-work factor per rank (>= 1): none, uniform:MAX, exp:MEAN, lognormal:SIGMA, "
    "one:FACTOR[@RANK].",
)
@click.option("--samples", "-n", type=int, default=100, show_default=True, help="Draws.")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed.")
@click.option("-j", "--jobs", type=int, default=1, show_default=True, help="Worker processes.")
@click.option("--json", "json_file", type=OUT_FILE, help="Write JSON here.")
def stragglers(
    collective: str,
    topology: str,
    nodes: int | None,
    gpus_per_node: int | None,
    algorithm: str | None,
    minbytes: str,
    maxbytes: str | None,
    stepfactor: float,
    datatype: str,
    channels: int,
    protocol: str,
    chunk_bytes: str | None,
    skew: str,
    slowdown: str,
    samples: int,
    seed: int,
    jobs: int,
    json_file: str | None,
) -> None:
    """Expected and p99 time of COLLECTIVE when ranks start late or run slow.

    Each of --samples draws gives every rank a start delay (--skew) and a slowdown of its local
    reductions and copies (--slowdown), seeded by --seed (sample i depends only on the seed and
    i, not on --samples or --jobs), and is timed on the discrete-event engine. Prints per size
    the healthy time, the mean, p50, p99 and max completion time (first rank entering to last
    rank finishing) and their ratio to healthy, and the mean time after the last rank entered.
    """
    from collsim import units
    from collsim.io import atomic_write_text
    from collsim.topology.loader import load_topology
    from collsim.training.stragglers import parse_spec, run_stragglers
    from collsim.training.workload import MAX_STRAGGLER_SAMPLES

    skew_d = parse_spec("skew", skew)
    slow_d = parse_spec("slowdown", slowdown)
    if not 1 <= samples <= MAX_STRAGGLER_SAMPLES:  # each draw is one discrete-event run
        raise CollsimError(
            f"must be from 1 to {MAX_STRAGGLER_SAMPLES}", field="--samples", value=samples
        )
    if seed < 0:
        raise CollsimError("must be >= 0", field="--seed", value=seed)
    lo = size_option("-b", minbytes)
    hi = size_option("-e", maxbytes) if maxbytes is not None else lo
    try:
        sizes = units.size_range(lo, hi, stepfactor)
    except CollsimError as exc:
        raise (exc if exc.field else exc.located(field="-b/-e/-f")) from None
    chunk = chunk_option(chunk_bytes)
    topo = load_topology(topology, nodes=nodes, gpus_per_node=gpus_per_node)
    algo = algorithm or default_algorithm(collective)
    bar = None
    if sys.stderr.isatty() and not os.environ.get("CI") and samples * len(sizes) >= _BAR_MIN:
        from tqdm import tqdm

        bar = tqdm(total=samples * len(sizes), unit="run", desc="stragglers", file=sys.stderr,
                   dynamic_ncols=True)  # fmt: skip
    try:
        study = run_stragglers(
            topo, collective, algo, sizes, skew=skew_d, slowdown=slow_d, samples=samples,
            seed=seed, dtype=datatype, protocol=protocol, channels=channels, chunk_bytes=chunk,
            jobs=jobs, progress=bar.update if bar is not None else None,
        )  # fmt: skip
    finally:
        if bar is not None:
            bar.close()
    click.echo(
        f"# {collective} on {study.topology} ({study.ranks} ranks, {plural(study.nodes, 'node')}), "
        f"{study.protocol}, {study.channels} channel(s); skew {study.skew}, slowdown "
        f"{study.slowdown}; {samples} samples, seed {seed}; discrete-event engine"
    )
    click.echo(
        f"{'size':>12}  {'algorithm':>10}  {'healthy us':>11}  {'mean us':>10}  {'p50 us':>10}  "
        f"{'p99 us':>10}  {'max us':>10}  {'mean/h':>7}  {'p99/h':>7}  {'after-last us':>13}"
    )
    for point in study.points:
        row = point.as_json()
        comp = row["completion_us"]
        ratio_mean = row["mean_over_healthy"] or 0.0
        ratio_p99 = row["p99_over_healthy"] or 0.0
        click.echo(
            f"{point.size_bytes:>12}  {point.algorithm:>10}  {row['healthy_us']:>11.2f}  "
            f"{comp['mean']:>10.2f}  {comp['p50']:>10.2f}  {comp['p99']:>10.2f}  "
            f"{comp['max']:>10.2f}  {ratio_mean:>7.3f}  {ratio_p99:>7.3f}  "
            f"{row['after_last_start_us']['mean']:>13.2f}"
        )
    if json_file:
        atomic_write_text(json_file, json.dumps(study.as_json(), indent=2) + "\n")
        click.echo(f"# wrote {json_file}")
