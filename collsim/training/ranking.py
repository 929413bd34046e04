"""Does the step model order layouts as the hardware does? Spearman rank correlation between
predicted and measured step times over the configurations of one model on one cluster.

A *group* is one source, model, system and GPU count; its members are the distinct
*configurations* run there (the layout -- TP, PP, CP, virtual stages, micro-batch, global batch,
sharding, sequence parallelism, recomputation -- and, in the loose grouping, the precision
recipe). Runs of one configuration repeated across software releases are one member, at their
mean measured time (their predictions are equal: collsim does not model the releases).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks from 1, ties given the mean of the ranks they span (the usual convention for
    Spearman's rho with ties)."""
    v = np.asarray(values, dtype=float)
    order = np.argsort(v, kind="stable")
    r = np.empty(len(v))
    i = 0
    while i < len(v):
        j = i
        while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
            j += 1
        r[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rho: the Pearson correlation of the ranks (NaN if either side is constant)."""
    ra, rb = ranks(a), ranks(b)
    if len(ra) < 2 or ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


@dataclass(frozen=True)
class Group:
    """One model on one cluster: its configurations' labels, measured and predicted seconds."""

    key: str
    labels: list[str]
    measured_s: list[float]
    predicted_s: list[float]

    @property
    def rho(self) -> float:
        return spearman(self.measured_s, self.predicted_s)


def layout_groups(
    rows: Sequence[dict[str, Any]],
    group_of: Callable[[dict[str, Any]], str],
    config_of: Callable[[dict[str, Any]], str],
    min_configs: int = 3,
) -> list[Group]:
    """Groups (``group_of(row)``) with at least ``min_configs`` distinct configurations
    (``config_of(row)``); each configuration's measured time is the mean over its rows, its
    predicted time the mean of its (equal) predictions. Rows carry ``measured_s`` and
    ``predicted_s``."""
    by: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for row in rows:
        by.setdefault(group_of(row), {}).setdefault(config_of(row), []).append(row)
    out = []
    for key in sorted(by):
        configs = by[key]
        if len(configs) < min_configs:
            continue
        labels = sorted(configs)
        out.append(
            Group(
                key,
                labels,
                [float(np.mean([r["measured_s"] for r in configs[c]])) for c in labels],
                [float(np.mean([r["predicted_s"] for r in configs[c]])) for c in labels],
            )
        )
    return out
