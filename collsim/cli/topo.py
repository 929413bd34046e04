"""``collsim topo``: list, describe, draw and export topologies."""

from __future__ import annotations

import json

import click

from collsim.cli.base import (
    OUT_FILE,
    CollsimGroup,
    cli,
    refuse_overwriting_inputs,
    topology_options,
)


@cli.group(cls=CollsimGroup)
def topo() -> None:
    """List, describe, draw and export topologies."""


@topo.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def topo_list(as_json: bool) -> None:
    """The bundled catalog of real systems."""
    from collsim.tables import table
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
@click.option("-o", "--output", required=True, type=OUT_FILE, help="PNG/SVG/PDF file.")
@click.option(
    "--full/--compact",
    default=None,
    help="Every device and link, or node 0 in full with the other nodes and the fabric's tiers "
    "grouped and their links bundled (default: compact beyond 2 nodes or 150 links).",
)
def topo_draw(
    topology: str, nodes: int | None, gpus_per_node: int | None, output: str, full: bool | None
) -> None:
    """Draw a topology: servers boxed, layers from GPUs to core, link kinds coloured."""
    from collsim.io import figure_format
    from collsim.report.topology_plot import draw_topology
    from collsim.topology.loader import load_topology

    refuse_overwriting_inputs([topology], output=output)
    figure_format(output, "--output")
    topo_ = load_topology(topology, nodes=nodes, gpus_per_node=gpus_per_node)
    click.echo(f"# wrote {draw_topology(topo_, output, full=full)}")


@topo.command("export")
@topology_options
def topo_export(topology: str, nodes: int | None, gpus_per_node: int | None) -> None:
    """Print the topology as an explicit graph (devices and links) in YAML."""
    from collsim.topology.describe import to_explicit_yaml
    from collsim.topology.loader import load_topology

    topo_ = load_topology(topology, nodes=nodes, gpus_per_node=gpus_per_node)
    click.echo(to_explicit_yaml(topo_), nl=False)
