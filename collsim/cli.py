"""The ``collsim`` command line: parse, call the library, print. No modelling happens here.

Every :class:`~collsim.errors.CollsimError` becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from collsim.errors import CollsimError


class _Group(click.Group):
    """A click group that turns collsim's input errors into one clean line and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CollsimError as exc:
            click.echo(f"collsim: error: {exc}", err=True)
            ctx.exit(2)
        except OSError as exc:  # a file we were asked to write or read: say which, and why
            where = exc.filename or ""
            click.echo(f"collsim: error: {where}: {exc.strerror or exc}", err=True)
            ctx.exit(2)


def topology_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """TOPOLOGY argument plus the --nodes / --gpus-per-node overrides."""

    @click.argument("topology", metavar="NAME|PATH")
    @click.option("--nodes", type=int, default=None, help="Override the number of nodes.")
    @click.option("--gpus-per-node", type=int, default=None, help="Override the GPUs in each node.")
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    return wrapper


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="collsim")
def cli() -> None:
    """collsim: what-if simulations of collective communication on GPU clusters."""


@cli.group(cls=_Group)
def topo() -> None:
    """List, describe, draw and export topologies."""


@topo.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def topo_list(as_json: bool) -> None:
    """The bundled catalog of real systems."""
    from collsim.report.tables import table
    from collsim.topology.describe import catalog_rows

    rows = catalog_rows()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    cols = ["name", "gpu", "gpus_per_node", "default_nodes", "intra", "inter"]
    click.echo(table(rows, cols, headers=["name", "GPU", "GPUs/node", "nodes", "intra", "inter"]))


@topo.command("show")
@topology_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def topo_show(topology: str, nodes: int | None, gpus_per_node: int | None, as_json: bool) -> None:
    """Counts by device and link kind, bandwidths, diameter of a topology."""
    from collsim.topology.describe import describe, describe_text
    from collsim.topology.loader import load_topology

    topo_ = load_topology(topology, nodes=nodes, gpus_per_node=gpus_per_node)
    info = describe(topo_)
    click.echo(json.dumps(info, indent=2) if as_json else describe_text(info))


@topo.command("draw")
@topology_options
@click.option(
    "-o", "--output", required=True, type=click.Path(dir_okay=False), help="PNG/SVG/PDF file."
)
def topo_draw(topology: str, nodes: int | None, gpus_per_node: int | None, output: str) -> None:
    """Draw a topology: servers boxed, layers from GPUs to core, link kinds coloured."""
    from collsim.report.topology_plot import draw_topology
    from collsim.topology.loader import load_topology

    topo_ = load_topology(topology, nodes=nodes, gpus_per_node=gpus_per_node)
    click.echo(f"wrote {draw_topology(topo_, output)}")


@topo.command("export")
@topology_options
def topo_export(topology: str, nodes: int | None, gpus_per_node: int | None) -> None:
    """Print the topology as an explicit graph (devices and links) in YAML."""
    from collsim.topology.describe import to_explicit_yaml
    from collsim.topology.loader import load_topology

    topo_ = load_topology(topology, nodes=nodes, gpus_per_node=gpus_per_node)
    click.echo(to_explicit_yaml(topo_), nl=False)


_COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall",
                "sendrecv"]  # fmt: skip


def _size(flag: str, text: str) -> int:
    from collsim import units

    try:
        return units.parse_size(text)
    except CollsimError as exc:
        raise exc.located(field=flag) from None


@cli.command()
@click.argument("collective", type=click.Choice(_COLLECTIVES))
@click.option("--topology", "-t", required=True, metavar="NAME|PATH", help="Catalog name or file.")
@click.option("--nodes", type=int, default=None, help="Override the number of nodes.")
@click.option("--gpus-per-node", type=int, default=None, help="Override the GPUs in each node.")
@click.option("--algorithm", "-a", default="auto", show_default=True, help="Algorithm or 'auto'.")
@click.option(
    "-b", "--minbytes", default="8", show_default=True, help="Smallest size (nccl-tests)."
)
@click.option("-e", "--maxbytes", default="128M", show_default=True, help="Largest size.")
@click.option("-f", "--stepfactor", type=float, default=2.0, show_default=True, help="Size step.")
@click.option("-d", "--datatype", default="float", show_default=True, help="nccl-tests type.")
@click.option("--channels", type=int, default=1, show_default=True, help="Parallel channels.")
@click.option(
    "--protocol",
    type=click.Choice(["LL", "LL128", "Simple"], case_sensitive=False),
    default="Simple",
    show_default=True,
)
@click.option("--chunk-bytes", default=None, help="Pipelining chunk for tree/chain algorithms.")
@click.option("--json", "json_file", type=click.Path(dir_okay=False), help="Write JSON here.")
@click.option("--trace", type=click.Path(dir_okay=False), help="Chrome/Perfetto trace (max size).")
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
    json_file: str | None,
    trace: str | None,
) -> None:
    """Simulate COLLECTIVE over message sizes, printed like nccl-tests.

    Sizes go from -b to -e multiplying by -f, as nccl-tests' flags do. With --algorithm auto each
    size is run with every algorithm the system supports and the fastest is kept.
    """
    from collsim import units
    from collsim.engine import write_chrome_trace
    from collsim.io import atomic_write_text
    from collsim.report.nccl_table import bottleneck_table, sweep_table
    from collsim.topology.loader import load_topology
    from collsim.whatif import WhatIf

    try:
        sizes = units.size_range(_size("-b", minbytes), _size("-e", maxbytes), stepfactor)
    except CollsimError as exc:
        raise exc.located(field=exc.field or "-b/-e/-f") from None
    chunk = _size("--chunk-bytes", chunk_bytes) if chunk_bytes else None
    whatif = WhatIf(load_topology(topology, nodes=nodes, gpus_per_node=gpus_per_node))
    sweep = whatif.sweep(
        collective,
        algorithm,
        sizes,
        dtype=datatype,
        channels=channels,
        protocol=protocol,
        chunk_bytes=chunk,
    )
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
@click.option("--nodes", type=int, default=4, show_default=True, help="Number of nodes.")
def demo(topology: str, nodes: int) -> None:
    """The README's main command: ring vs tree all-reduce across sizes on a bundled system."""
    from collsim.report.nccl_table import bottleneck_table
    from collsim.topology.describe import describe, describe_text
    from collsim.topology.loader import load_topology
    from collsim.whatif import WhatIf

    topo_ = load_topology(topology, nodes=nodes)
    click.echo(describe_text(describe(topo_)))
    whatif = WhatIf(topo_)
    sizes = [8 * 8**i for i in range(10)]  # 8 B .. 1 GiB
    sweeps = {a: whatif.sweep("all_reduce", a, sizes) for a in ("ring", "tree")}
    click.echo(f"\nall_reduce on {topo_.n_gpus} GPUs (float, Simple protocol, 1 channel):")
    click.echo(
        f"{'size':>10}  {'ring us':>10}  {'ring busbw':>10}  {'tree us':>10}  "
        f"{'tree busbw':>10}  winner"
    )
    for ring, tree in zip(sweeps["ring"].points, sweeps["tree"].points, strict=True):
        winner = "ring" if ring.time_s <= tree.time_s else "tree"
        ratio = max(ring.time_s, tree.time_s) / max(min(ring.time_s, tree.time_s), 1e-30)
        click.echo(
            f"{ring.size_bytes:>10}  {ring.time_s * 1e6:>10.2f}  {ring.busbw_gbps:>10.2f}  "
            f"{tree.time_s * 1e6:>10.2f}  {tree.busbw_gbps:>10.2f}  {winner} ({ratio:.2f}x)"
        )
    last = sweeps["ring"].last
    if last is not None:
        click.echo(bottleneck_table(last))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv, prog_name="collsim")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
