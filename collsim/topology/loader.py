"""Topology files -> validated :class:`Topology`. The boundary where bad input is caught.

``load_topology("dgx-h100")`` reads ``topologies/dgx-h100.yaml`` from the catalog;
``load_topology("my.yaml", nodes=16)`` reads a file and overrides its node count. Every problem
becomes a :class:`TopologyError` naming the file, the field and the value.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from collsim.errors import CollsimError, TopologyError
from collsim.io import yaml_load
from collsim.topology.builders import Parts, build_fabric, build_node, fabric_shape
from collsim.topology.domains import build_nvlink_domains, check_nvlink_domain
from collsim.topology.faults import apply_faults, faults_from_file, parse_cli_faults
from collsim.topology.input_errors import one_line
from collsim.topology.reach import check_connected
from collsim.topology.schema import ExplicitIn, FabricIn, GpuIn, TemplateIn
from collsim.topology.spec import Device, GpuModel, Link, SharedCapacity, Topology

CATALOG_DIR = Path(
    os.environ.get("COLLSIM_TOPOLOGIES", Path(__file__).resolve().parents[2] / "topologies")
)


def catalog_names() -> list[str]:
    """Names of the bundled systems (``topologies/*.yaml``), sorted."""
    return sorted(p.stem for p in CATALOG_DIR.glob("*.yaml"))


def resolve(name_or_path: str | os.PathLike[str]) -> Path:
    """A catalog name or a path -> the file to read."""
    return resolve_in_catalog(
        name_or_path, CATALOG_DIR, what="topology", error=TopologyError,
        none_hint=" (see `collsim topo list`)",
    )  # fmt: skip


def resolve_in_catalog(
    name_or_path: str | os.PathLike[str],
    catalog: Path,
    *,
    what: str,
    error: type[CollsimError],
    none_hint: str,
) -> Path:
    """A bundled ``catalog/NAME.yaml`` or a file path -> the file to read.

    Anything that looks like a path (a YAML suffix, a separator, an existing file) is taken as
    one; otherwise the name is looked up in ``catalog``, with a "did you mean" hint on a miss.
    """
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists() or os.sep in str(name_or_path):
        if path.is_dir():
            raise error(f"a folder, not a {what} file (name one of its .yaml files)",
                        file=str(path))  # fmt: skip
        if not path.is_file():
            raise error(f"no such {what} file", file=str(path))
        return path
    candidate = catalog / f"{name_or_path}.yaml"
    if candidate.is_file():
        return candidate
    names = sorted(p.stem for p in catalog.glob("*.yaml"))
    hint = difflib.get_close_matches(str(name_or_path), names, n=1)
    extra = f"; did you mean {hint[0]!r}?" if hint else none_hint
    raise error(
        f"no {what} named {str(name_or_path)!r} in the catalog{extra}",
        field=what,
        value=str(name_or_path),
    )


def read_yaml(path: Path) -> Any:
    """Parse a YAML file; syntax errors become one line with the position."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TopologyError(f"cannot read file: {exc.strerror}", file=str(path)) from None
    except UnicodeDecodeError as exc:
        raise TopologyError(
            f"not a UTF-8 text file (byte {exc.start}: {exc.object[exc.start : exc.start + 1]!r})",
            file=str(path),
        ) from None
    try:
        return yaml_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise TopologyError(f"malformed YAML{where}: {problem}", file=str(path)) from None


def load_topology(
    name_or_path: str | os.PathLike[str],
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    faults: Sequence[str] = (),
) -> Topology:
    """Load, validate and expand a topology; ``nodes``/``gpus_per_node`` override a template.

    ``faults`` are ``--fault`` texts (:mod:`collsim.topology.faults`), applied after the file's
    own ``faults:``.
    """
    path = resolve(name_or_path)
    data = read_yaml(path)
    extra = parse_cli_faults(faults)
    try:
        topo = topology_from_dict(data, nodes=nodes, gpus_per_node=gpus_per_node, file=str(path))
    except CollsimError as exc:
        raise exc.located(file=str(path)) from None
    return apply_faults(topo, extra)


def topology_from_dict(
    data: Any,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    file: str | None = None,
) -> Topology:
    """Validate a parsed YAML document and build the :class:`Topology` it describes."""
    if not isinstance(data, dict):
        raise TopologyError(
            "a topology file must be a mapping with 'name', 'gpu' and either 'node' or 'devices'",
            value=type(data).__name__,
        )
    explicit = "devices" in data or "links" in data
    model: type[BaseModel] = ExplicitIn if explicit else TemplateIn
    try:
        spec = model.model_validate(data)
    except ValidationError as exc:
        raise one_line(exc, model) from None
    for flag, value in (("--nodes", nodes), ("--gpus-per-node", gpus_per_node)):
        if value is not None and value < 1:
            raise TopologyError("must be at least 1", field=flag, value=value)
    if isinstance(spec, ExplicitIn):
        topo = _from_explicit(spec, file)
        # Its own size may be restated (a sweep or a log names it); another one cannot apply.
        sizes = (("--nodes", nodes, topo.nodes), ("--gpus-per-node", gpus_per_node,
                                                   topo.gpus_per_node))  # fmt: skip
        for flag, value, own in sizes:
            if value is not None and value != own:
                raise TopologyError(
                    f"an explicit graph has a fixed size ({topo.nodes} x {topo.gpus_per_node} "
                    "GPUs): --nodes/--gpus-per-node cannot change it",
                    field=flag,
                    value=value,
                )
    else:
        topo = _from_template(spec, nodes, gpus_per_node, file)
    check_connected(topo)
    if spec.faults:
        topo = apply_faults(topo, faults_from_file(spec.faults))
    return topo


def _gpu_model(gpu: GpuIn) -> GpuModel:
    return GpuModel(
        model=gpu.model,
        peak_flops={k: v * 1e12 for k, v in gpu.peak_tflops.items()},
        memory_bytes=gpu.memory,
        memory_bandwidth_bytes_per_s=gpu.memory_bandwidth,
        source=gpu.source,
        matmul_flops={k: v * 1e12 for k, v in (gpu.matmul_tflops or {}).items()},
        sms=gpu.sms,
    )


def _sources(spec: BaseModel, prefix: str = "") -> dict[str, str]:
    """Every ``source:`` note in the file, keyed by the section it annotates."""
    found: dict[str, str] = {}
    for name, value in spec:
        key = f"{prefix}{name}"
        if name == "source" and isinstance(value, str):
            found[prefix.rstrip(".") or "."] = value
        elif isinstance(value, BaseModel):
            found.update(_sources(value, key + "."))
    return found


MAX_GPUS = 1 << 20
"""The largest system a template expands to (over 10x today's largest clusters)."""

MAX_GPUS_PER_NODE = 1024
"""The most GPUs one node (one NVLink / PCIe domain) holds: GB200 NVL72 has 72 and NVIDIA's
announced NVL576 576; collsim routes every pair inside a node, which grows with its square
(1024 GPUs: about 5 s)."""


def _from_template(
    spec: TemplateIn, nodes: int | None, gpus_per_node: int | None, file: str | None
) -> Topology:
    n_nodes = nodes if nodes is not None else spec.nodes
    gpus = gpus_per_node if gpus_per_node is not None else spec.node.gpus
    fabric = spec.fabric
    if gpus > MAX_GPUS_PER_NODE:
        raise TopologyError(
            f"a node holds at most {MAX_GPUS_PER_NODE} GPUs in collsim (the largest NVLink "
            "domains announced hold 576)",
            field="--gpus-per-node" if gpus_per_node is not None else "node.gpus",
            value=gpus,
        )
    if n_nodes * gpus > MAX_GPUS:  # refused before building (a million nodes took minutes)
        flag, value = ("--nodes", n_nodes) if nodes is not None else ("nodes", n_nodes)
        if gpus_per_node is not None and (nodes is None or gpus >= n_nodes):
            flag, value = "--gpus-per-node", gpus  # the override that pushed it over
        raise TopologyError(
            f"{n_nodes} nodes x {gpus} GPUs is more than the {MAX_GPUS:,} GPUs collsim models",
            field=flag,
            value=value,
        )

    gpus_field = "--gpus-per-node" if gpus_per_node is not None else "node.gpus"
    nics = spec.node.nics
    if nics is not None and nics.count_for(gpus) is None:
        raise TopologyError(
            f"{nics.per_gpu:g} NICs per GPU (node.nics.per_gpu) x {gpus} GPUs is not a whole "
            "number of NICs",
            field=gpus_field if gpus_per_node is not None else "node.nics.per_gpu",
            value=gpus if gpus_per_node is not None else nics.per_gpu,
        )
    domain = spec.nvlink_domain
    if domain is not None:
        check_nvlink_domain(domain, spec.node.intra.kind, gpus, gpus_field)
    _check_sharp(spec.fabric, nics.link.kind if nics is not None else None)

    def build(fabric: FabricIn) -> Parts:
        parts = Parts()
        gpu_forwards = fabric.kind in ("torus", "ring") and fabric.attach == "gpu"
        nics_by_node = [build_node(parts, n, spec.node, gpus, gpu_forwards) for n in range(n_nodes)]
        gpus_by_node = [[f"n{n}.gpu{i}" for i in range(gpus)] for n in range(n_nodes)]
        nic_link = spec.node.nics and spec.node.nics.link
        domains = build_nvlink_domains(parts, domain, gpus_by_node) if domain else n_nodes
        if domains > 1 or fabric.kind != "none":  # one NVLink domain needs no fabric
            build_fabric(parts, fabric, nics_by_node, gpus_by_node, nic_link)
        return parts

    try:
        parts = build(fabric)
    except TopologyError as exc:
        # Scaled past what its 2-tier fabric holds (--nodes), a cluster gets the third tier such
        # clusters are built with (e.g. the DGX SuperPOD's core layer), said in the fabric words.
        if not (exc.field == "fabric.tiers" and nodes is not None):
            raise
        fabric = fabric.model_copy(update={"tiers": 3})
        try:
            parts = build(fabric)
        except TopologyError as again:
            raise TopologyError(
                f"{nodes} nodes need more than the file's 2-tier fabric, and even 3 tiers of "
                f"radix {fabric.radix} cannot hold them ({again.message}); use fewer nodes or "
                "a file with a larger radix",
                field="--nodes",
                value=nodes,
            ) from None
    fabric_words = fabric.kind
    if fabric.kind in ("fat_tree", "rail_optimized"):
        fabric_words += f"/{fabric.tiers}-tier"
        if fabric.tiers != spec.fabric.tiers:
            fabric_words += f" (the file's {spec.fabric.tiers} tiers hold fewer nodes)"
        if fabric.kind == "fat_tree" and fabric.oversubscription != 1:
            fabric_words += f" {fabric.oversubscription:g}:1"
    nic = spec.node.nics
    if nic is not None and spec.fabric.kind != "none":
        fabric_words += f" ({nic.count_for(gpus)}x{nic.link.kind})"
    intra_words = spec.node.intra.kind
    if spec.node.intra.kind == "pcie" and not spec.node.intra.p2p:
        intra_words += " (no P2P: SHM through host memory)"
    if domain is not None:
        intra_words = (
            f"nvlink_domain ({domain.nodes} nodes, {domain.switch_trays} switch trays x "
            f"{domain.switches_per_tray})"
        )
    return Topology(
        name=spec.name,
        gpu=_gpu_model(spec.gpu),
        devices=tuple(parts.devices),
        links=tuple(parts.links),
        shared=tuple(parts.shared),
        transport=(nic.transport or "") if nic is not None else "",
        nic_gpu_path=nic.gpu_path if nic is not None else "pix",
        gpu_p2p=not (spec.node.intra.kind == "pcie" and not spec.node.intra.p2p),
        nodes=n_nodes,
        gpus_per_node=gpus,
        description=spec.description,
        intra_fabric=intra_words,
        inter_fabric=fabric_words,
        source_file=file,
        is_template=True,
        default_nodes=spec.nodes,
        grid_dims=tuple(fabric_shape(spec.fabric, n_nodes * gpus))
        if spec.fabric.kind in ("torus", "ring") and spec.fabric.attach == "gpu"
        else (),
        sources=_sources(spec),
        nvlink_domain_nodes=domain.nodes if domain is not None else 1,
        routing=spec.fabric.routing,
    )


def _first_use(seen: dict[str, int], name: str, i: int, section: str, what: str) -> None:
    """Record ``name`` as entry ``i`` of ``section``; a name used before is an error naming both
    entries."""
    if name in seen:
        raise TopologyError(
            f"{what} (first at {section}.{seen[name]})", field=f"{section}.{i}.name", value=name
        )
    seen[name] = i


def _from_explicit(spec: ExplicitIn, file: str | None) -> Topology:
    seen: dict[str, int] = {}
    devices = []
    local_index: dict[int | None, int] = {}
    places: dict[str, int] = {}
    for i, dev in enumerate(spec.devices):
        _first_use(seen, dev.name, i, "devices", "duplicate device name")
        # A GPU without a node is on node 0 (a single machine needs no node numbers).
        node = 0 if dev.node is None and dev.kind == "gpu" else dev.node
        index = dev.index
        if index is None:
            index = local_index.get(node, 0) if dev.kind == "gpu" else 0
        if dev.kind == "gpu":
            local_index[node] = max(local_index.get(node, 0), index + 1)
            place = f"node {node} index {index}"
            if place in places:
                raise TopologyError(f"a second GPU at {place} (first at devices.{places[place]})",
                                    field=f"devices.{i}.index", value=index)  # fmt: skip
            places[place] = i
        devices.append(
            Device(
                name=dev.name,
                kind=dev.kind,
                node=node,
                index=index,
                latency_s=dev.latency,
                in_network_reduction=dev.in_network_reduction,
                in_network_efficiency=dev.in_network_efficiency,
                tier=dev.tier,
                forwards=dev.forwards if dev.forwards is not None else dev.kind != "gpu",
            )
        )
    links = []
    pairs: dict[frozenset[str], int] = {}
    for i, lk in enumerate(spec.links):
        for end in ("a", "b"):
            _listed(getattr(lk, end), seen, "link end is not a listed device", f"links.{i}.{end}")
        if lk.a == lk.b:
            raise TopologyError("a link must join two devices", field=f"links.{i}.b", value=lk.b)
        pair = frozenset((lk.a, lk.b))
        if pair in pairs:
            raise TopologyError(
                f"a second link between {lk.a} and {lk.b} (first at links.{pairs[pair]}); give one "
                "link with their total bandwidth",
                field=f"links.{i}",
            )
        pairs[pair] = i
        links.append(
            Link(
                lk.a,
                lk.b,
                lk.kind,
                lk.bandwidth,
                lk.latency,
                duplex_bandwidth_bytes_per_s=lk.duplex_bandwidth,
            )
        )
    shared = _explicit_shared(spec, seen, pairs)
    gpus = [d for d in devices if d.kind == "gpu"]
    if not gpus:
        raise TopologyError(
            "an explicit graph needs at least one device of kind gpu", field="devices"
        )
    node_ids = {d.node for d in gpus}
    per_node = max(sum(1 for d in gpus if d.node == n) for n in node_ids)
    return Topology(
        name=spec.name,
        gpu=_gpu_model(spec.gpu),
        devices=tuple(devices),
        links=tuple(links),
        shared=shared,
        nodes=len(node_ids),
        gpus_per_node=per_node,
        description=spec.description,
        intra_fabric="explicit",
        inter_fabric="explicit",
        source_file=file,
        is_template=False,
        default_nodes=len(node_ids),
        sources=_sources(spec),
        routing=spec.routing,
        gpu_p2p=spec.gpu_p2p,
    )


def _listed(name: str, devices: dict[str, int], what: str, field: str) -> None:
    """Raise, with a "did you mean", unless ``name`` is a listed device."""
    if name not in devices:
        hint = difflib.get_close_matches(name, list(devices), n=1)
        extra = f"; did you mean {hint[0]!r}?" if hint else ""
        raise TopologyError(f"{what}{extra}", field=field, value=name)


def _explicit_shared(
    spec: ExplicitIn, devices: dict[str, int], pairs: dict[frozenset[str], int]
) -> tuple[SharedCapacity, ...]:
    """The ``shared:`` capacities of an explicit graph: unique names, each direction along a
    listed link, once."""
    shared = []
    names: dict[str, int] = {}
    for i, sh in enumerate(spec.shared):
        _first_use(names, sh.name, i, "shared", "a second shared capacity of this name")
        seen_dirs: set[tuple[str, str]] = set()
        for j, (a, b) in enumerate(sh.directions):
            for end in (a, b):
                _listed(end, devices, "not a listed device", f"shared.{i}.directions.{j}")
            if frozenset((a, b)) not in pairs or a == b or (a, b) in seen_dirs:
                raise TopologyError(
                    "a shared capacity's direction must follow a listed link (from, to), once",
                    field=f"shared.{i}.directions.{j}",
                    value=[a, b],
                )
            seen_dirs.add((a, b))
        shared.append(
            SharedCapacity(sh.name, sh.kind, sh.bandwidth, tuple((a, b) for a, b in sh.directions))
        )
    return tuple(shared)


SHARP_LINK_KINDS = ("infiniband", "nvlink")
"""Scale-out links whose switches reduce in flight: InfiniBand (SHARP on Quantum switches, what
NCCL's CollNet uses) and NVLink switches (NVLS). Ethernet, RoCE, EFA and Slingshot switches do
not reduce."""


def _check_sharp(fabric: FabricIn, nic_kind: str | None) -> None:
    """``fabric.in_network_reduction`` only where the fabric's switches can reduce."""
    if not fabric.in_network_reduction:
        return
    kind = fabric.link.kind if fabric.link is not None else nic_kind
    if fabric.kind in ("none", "torus", "ring"):
        raise TopologyError(
            f"a {fabric.kind!r} fabric has no switches to reduce in flight",
            field="fabric.in_network_reduction",
            value=True,
        )
    if kind not in SHARP_LINK_KINDS:
        raise TopologyError(
            f"in-network reduction (SHARP) runs on InfiniBand or NVLink switches, not on a "
            f"{kind} fabric",
            field="fabric.in_network_reduction",
            value=kind,
        )
