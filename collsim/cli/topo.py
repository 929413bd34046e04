"""``collsim topo``: list, describe, draw and export topologies."""

from __future__ import annotations

import json

import click

from collsim.cli.base import (
    OUT_FILE,
    CollsimGroup,
    cli,
    refuse_overwriting_inputs,
    size_option,
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


@topo.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=OUT_FILE, help="The topology file to write.")
@click.option("--name", default=None, help="The topology's name (default: the output's stem).")
@click.option(
    "--nodes",
    type=int,
    default=None,
    help="Servers like this one (default: the hosts of an ibnetdiscover scan, else 1).",
)
@click.option(
    "--gpu",
    default=None,
    metavar="NAME|PATH",
    help="Take the gpu: section from this catalog entry or file (for a GPU the PCI id table "
    "does not know, or an nvidia-smi matrix alone).",
)
@click.option(
    "--p2p/--no-p2p", default=None, help="GPU peer-to-peer over PCIe (default: as the driver)."
)
@click.option(
    "--nic-speed", default=None, help="NIC rate for an nvidia-smi matrix alone (400Gbps)."
)
@click.option(
    "--nic-kind",
    type=click.Choice(["infiniband", "roce", "ethernet", "efa"]),
    default="infiniband",
    show_default=True,
    help="NIC kind for an nvidia-smi matrix alone.",
)
def topo_import(
    files: tuple[str, ...],
    output: str,
    name: str | None,
    nodes: int | None,
    gpu: str | None,
    p2p: bool | None,
    nic_speed: str | None,
    nic_kind: str,
) -> None:
    """Build a topology file from what the cluster reports: an NCCL topology dump
    (NCCL_TOPO_DUMP_FILE), `nvidia-smi topo -m` output and an `ibnetdiscover` scan, in any
    order. The result is an ordinary topology file: `topo show`, `simulate` and the rest read it."""
    from pathlib import Path

    from collsim import units
    from collsim.io import atomic_write_text
    from collsim.topology.imports.files import ImportRequest, import_files, to_yaml

    refuse_overwriting_inputs(files, output=output)
    speed = units.parse_rate(nic_speed) * 8 / 1e9 if nic_speed else None
    request = ImportRequest(Path(output).stem if name is None else name, nodes, gpu, p2p, speed,
                            nic_kind)  # fmt: skip
    doc = import_files(list(files), request)
    atomic_write_text(output, to_yaml(doc))
    shape = "explicit graph" if "devices" in doc else "template"
    click.echo(f"# wrote {output} ({shape}): {doc['description']}")


@topo.command("diff")
@click.argument("first", metavar="A")
@click.argument("second", metavar="B")
@click.option("--nodes", type=int, default=None, help="Nodes of both (templates only).")
@click.option(
    "--gpus-per-node", type=int, default=None, help="GPUs per node of both (templates only)."
)
@click.option(
    "--size", default="1G", show_default=True, help="Size at which to compare predicted busbw."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def topo_diff(
    first: str, second: str, nodes: int | None, gpus_per_node: int | None, size: str, as_json: bool
) -> None:
    """What differs between two topologies (links, rates, NIC affinity), and the busbw each
    predicts for all_reduce, all_gather and alltoall at --size (tuned, analytic model)."""
    from collsim import units
    from collsim.topology.diff import topology_diff
    from collsim.topology.loader import load_topology
    from collsim.whatif import WhatIf

    size_bytes = size_option("--size", size)
    a = load_topology(first, nodes=nodes, gpus_per_node=gpus_per_node)
    b = load_topology(second, nodes=nodes, gpus_per_node=gpus_per_node)
    rows = topology_diff(a, b)
    busbw = []
    for collective in ("all_reduce", "all_gather", "alltoall"):
        got = []
        for topo_ in (a, b):
            point = WhatIf(topo_).sweep(collective, "auto", [size_bytes], tuned=True).points[0]
            got.append(point.busbw_gbps)
        busbw.append((collective, *got, got[1] / got[0] - 1 if got[0] else float("nan")))
    if as_json:
        doc = {
            "a": first, "b": second,
            "differences": [{"figure": k, "a": va, "b": vb} for k, va, vb in rows],
            "busbw_gbps": [{"collective": c, "size_bytes": size_bytes, "a": x, "b": y,
                            "relative": r} for c, x, y, r in busbw],
        }  # fmt: skip
        click.echo(json.dumps(doc, indent=2, default=str))
        return
    click.echo(f"# A = {first}, B = {second}")
    if not rows:
        click.echo("no differences in links, rates, counts or NIC affinity")
    for key, va, vb in rows:
        click.echo(f"{key}: {va} | {vb}")
    click.echo(f"# predicted busbw at {units.format_size(size_bytes)} (tuned, analytic model)")
    for collective, x, y, rel in busbw:
        click.echo(f"{collective}: {x:.2f} | {y:.2f} GB/s ({rel:+.1%})")
