"""Plain-text tables for people (columns aligned, numbers right-aligned)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.4e}"
    return str(value)


def table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    *,
    headers: Sequence[str] | None = None,
) -> str:
    """Rows of dicts as an aligned text table with the given column order."""
    heads = list(headers or columns)
    cells = [[_cell(row.get(c, "")) for c in columns] for row in rows]
    numeric = [
        all(isinstance(row.get(c), int | float) for row in rows) if rows else False for c in columns
    ]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(heads)]

    def fmt(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    lines = [fmt(heads), fmt(["-" * w for w in widths])]
    lines += [fmt(r) for r in cells]
    return "\n".join(lines)


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 node``, ``2 nodes`` (``nouns``: an irregular plural, e.g. ``anomalies``)."""
    return f"{n} {noun if n == 1 else (nouns or noun + 's')}"
