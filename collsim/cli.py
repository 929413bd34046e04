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


@cli.command()
@click.option("--topology", default="dgx-h100", show_default=True, help="Catalog name or file.")
@click.option("--nodes", type=int, default=None, help="Override the number of nodes.")
def demo(topology: str, nodes: int | None) -> None:
    """The README's main command: describe a bundled system."""
    from collsim.topology.describe import describe, describe_text
    from collsim.topology.loader import load_topology

    click.echo(describe_text(describe(load_topology(topology, nodes=nodes))))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv, prog_name="collsim")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
