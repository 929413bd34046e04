"""Max-min results of waves shared between the cost models of one system.

:class:`~collsim.model.flows.FlowCosts` caches each wave's max-min result under a digest of the
wave (its flows, weights, sizes and channel ceilings); this module keeps those caches per fabric
and link capacities, so that models that differ only in what does not touch the sharing
(latencies, launch floors) compute each wave once. Its own module so that
:class:`~collsim.model.system.System`, which ``flows``' imports reach, can hold one.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

Shares = dict[bytes, tuple[np.ndarray, ...]]
"""A wave's digest -> its flows' seconds per wire byte in the normalised problem
(:meth:`FlowCosts.wave`); valid for one fabric and one set of link capacities."""


class _Set(dict):  # type: ignore[type-arg]
    """One capacity set's shares, counting the bytes of the arrays put in it."""

    nbytes = 0

    def __setitem__(self, key: bytes, unit: tuple[np.ndarray, ...]) -> None:
        old = self.get(key)
        self.nbytes += sum(a.nbytes for a in unit) - (
            0 if old is None else sum(a.nbytes for a in old)
        )
        super().__setitem__(key, unit)


class WaveShares:
    """The max-min results of waves on one fabric, shared by every cost model of one system
    (:class:`~collsim.model.system.System`), grouped by the link capacities they were shared
    over: a wave's flows, routes and paths are the fabric's, and its max-min result depends on
    nothing else but those capacities (the bandwidth efficiencies of a model's parameters
    scale them) and what the wave's key holds (weights, sizes, channel ceilings). Two models
    with the same efficiencies (the validation report's uncalibrated and cross-scale
    predictions of one log differ only in latencies) then share every wave's max-min, which
    on a 1024-GPU all-to-all is about half of a model's cost (the 256-node Polaris all-to-all
    job of the report: 125 s -> 92-99 s of CPU for its two models).

    The capacity sets used last are held, up to ``keep`` of them and ``budget_bytes`` of
    arrays (the newest always): a fit varies one parameter at a time around its point, so the
    point's set comes round again after a few others, while a set of a 2,160-GPU all-to-all
    holds an estimated ~150 MB (~5,400 waves of 2-9k flows, 8 bytes each). A model keeps a
    reference to its own set (:class:`FlowCosts`' ``cache``), so what it computed stays its
    own, as before, when the system drops it."""

    def __init__(self, keep: int = 16, budget_bytes: int = 512 * 1024**2) -> None:
        self.keep = keep
        self.budget_bytes = budget_bytes
        self._sets: OrderedDict[bytes, _Set] = OrderedDict()

    def for_capacity(self, capacity_bytes_per_s: np.ndarray) -> Shares:
        """The shares computed over exactly these capacities (a new, empty set if none)."""
        key = hashlib.blake2b(
            np.ascontiguousarray(capacity_bytes_per_s, dtype=np.float64).tobytes(), digest_size=20
        ).digest()
        found = self._sets.get(key)
        if found is None:
            found = self._sets[key] = _Set()
        self._sets.move_to_end(key)
        held = 0
        for kept, k in enumerate(reversed(list(self._sets)), start=1):  # newest first
            held += self._sets[k].nbytes
            if kept > 1 and (kept > self.keep or held > self.budget_bytes):
                del self._sets[k]
        return found
