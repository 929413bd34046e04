"""``collsim topo diff``: what differs between two topologies, as a list of figures.

Compares what sizes a system (``topo show``'s figures: GPU, counts of devices and links by kind,
link rates, per-GPU NVLink and NIC bandwidth, bisection, diameter, in-network reduction,
transports) and, per GPU of node 0, the NICs it is nearest (GPU-NIC affinity), so that an imported
topology can be checked against its catalog twin and every difference that could change a
prediction is named.
"""

from __future__ import annotations

from typing import Any

from collsim.topology.describe import describe
from collsim.topology.spec import Topology

_SKIP = ("name", "description", "file")


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, sub in value.items():
            if not prefix and key in _SKIP:
                continue
            out.update(_flatten(sub, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return _flatten({str(i): v for i, v in enumerate(value)}, prefix)
    return {prefix: value}


def _close(a: Any, b: Any, rel: float) -> bool:
    if isinstance(a, float | int) and isinstance(b, float | int) and not isinstance(a, bool):
        return abs(a - b) <= rel * max(abs(a), abs(b))
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return all(_close(x, y, rel) for x, y in zip(a, b, strict=True))
    return a == b


def topology_diff(a: Topology, b: Topology, rel: float = 1e-3) -> list[tuple[str, Any, Any]]:
    """``(figure, value in a, value in b)`` for every figure that differs (numbers by more than
    ``rel``); ``None`` where one side lacks the figure."""
    fa, fb = _flatten(describe(a)), _flatten(describe(b))
    rows = []
    for key in list(dict.fromkeys([*fa, *fb])):
        va, vb = fa.get(key), fb.get(key)
        if not _close(va, vb, rel):
            rows.append((key, va, vb))
    return rows
