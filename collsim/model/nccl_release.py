"""What a prediction changes with the NCCL release a log ran.

NCCL's choices are not the same in every release. collsim's tuner ranks NCCL's algorithms and
protocols by collsim's own cost model; where a release offers fewer choices or picks by another
rule, the prediction has to follow that release. Each rule here is read off NVIDIA/nccl's source
at the tag named (the mirror's ``git show <tag>:<path>``):

* **LL128 exists from 2.5.** ``v2.4.6-1`` has LL and Simple only (``git grep LL128 v2.4.6-1 --
  src`` finds nothing); the protocol and the ``tuning.cc`` tables arrive with ``v2.5.6-1``
  (commit 299c554d, ``src/graph/tuning.cc``). A 2.4 log is predicted without LL128.
* **2.4 picks tree or ring by a size threshold, not by its cost model.** ``src/init.cc`` at
  ``v2.4.6-1`` (``ncclTreeThreshold``, lines 353-376) sets ``comm->treeThreshold`` once per
  communicator, and ``src/enqueue.cc`` (line 236) runs an all-reduce as a tree when ``nBytes <=
  treeThreshold``, else as a ring. With NVLink and two nodes the tree's modelled bandwidth is
  ``2 x 3/4`` of the ring's, so the tree runs at every size; ``NCCL_TREE_THRESHOLD`` overrides
  it (0: never a tree). From 2.5 the variable is gone (no ``TREE_THRESHOLD`` in ``v2.5.6-1`` or
  ``v2.9.9-1`` ``src/``): the cost model (``ncclTopoGetAlgoTime``) picks per call, which is
  what collsim's tuner does with its own model.

Not a version rule: at two nodes every release from 2.4 on prefers the tree for large all-reduces
(2.4 by the threshold above; 2.5+ because the topology search raises the tree graph's ``bwIntra``
to up to twice its ``bwInter`` -- ``search.cc`` pass 2, "increase speedIntra for trees (2 nodes
or collnet)", present in ``v2.9.9-1`` and ``v2.22.3-1`` alike -- and ``tuning.cc`` prices a 2-node
tree on ``bwIntra``). So the p4d logs (NCCL 2.8.3 / 2.9.9), whose busbw stays below the ring's
NIC bound, ran a tree that reached 0.35-0.47 of its bound, not a ring; a version-keyed switch to
the ring would contradict NCCL's source.

A log that does not say its release is predicted with the newest behaviour, except that a setting
only NCCL < 2.5 reads (``NCCL_TREE_THRESHOLD``) is taken as that release's: whoever set it ran a
release that reads it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from collsim.errors import CalibrationError

_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)\.(\d+)")
_CODE = re.compile(r"^\s*(\d{4,6})\s*$")


@dataclass(frozen=True, order=True)
class NcclVersion:
    """An NCCL release (major, minor, patch)."""

    major: int
    minor: int
    patch: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"

    @property
    def has_ll128(self) -> bool:
        """LL128 exists (from 2.5: ``v2.5.6-1`` ``src/graph/tuning.cc``; none in ``v2.4.6-1``)."""
        return self >= NcclVersion(2, 5, 0)

    @property
    def tree_by_threshold(self) -> bool:
        """The all-reduce's tree/ring choice is a size threshold (``NCCL_TREE_THRESHOLD`` or
        ``ncclTreeThreshold``), as before 2.5 (``v2.4.6-1`` ``src/init.cc``, ``enqueue.cc``)."""
        return self < NcclVersion(2, 5, 0)


NEWEST = NcclVersion(2, 30, 7)
"""The newest release whose behaviour collsim follows where a log does not say (the mirror's
newest tag, ``v2.30.7-1``)."""

OLD_ONLY_ENV = ("NCCL_TREE_THRESHOLD",)
"""NCCL settings only releases before 2.5 read."""


def parse_nccl_version(text: str | None, *, field: str = "nccl_version",
                       file: str | None = None) -> NcclVersion | None:  # fmt: skip
    """``2.9.9+cuda11.2``, ``2.26.2 (nccl-headers=22602 ...)``, ``v2.21.5-1`` or a version code
    (``22602``, ``2906`` as ``NCCL_VERSION_CODE`` writes them) -> :class:`NcclVersion`; None or
    empty -> None. Anything else is a :class:`CalibrationError` naming ``field`` and the text."""
    if text is None or not str(text).strip():
        return None
    s = str(text)
    found = _VERSION.match(s)
    if found:
        return NcclVersion(*(int(g) for g in found.groups()))
    code = _CODE.match(s)
    if code:
        n = int(code.group(1))
        # NCCL_VERSION_CODE: major*10000 + minor*100 + patch from 2.9, major*1000 + ... before
        if n >= 20900:
            return NcclVersion(n // 10000, (n // 100) % 100, n % 100)
        if 2000 <= n < 3000:
            return NcclVersion(n // 1000, (n // 100) % 10, n % 100)
    raise CalibrationError(
        "not an NCCL version (give major.minor.patch, e.g. 2.9.9, or a version code such as 22602)",
        file=file,
        field=field,
        value=text,
    )


def effective_version(version: NcclVersion | None, env: dict[str, str]) -> NcclVersion:
    """The release whose behaviour a prediction follows: ``version`` where known; else 2.4 when
    ``env`` sets something only NCCL < 2.5 reads; else :data:`NEWEST`."""
    if version is not None:
        return version
    if any(k in env for k in OLD_ONLY_ENV):
        return NcclVersion(2, 4, 8)
    return NEWEST


def tree_threshold_bytes(
    n_nodes: int, n_ranks: int, n_channels: int, nvlink: bool, env: dict[str, str]
) -> float:
    """NCCL 2.4's all-reduce tree threshold in bytes (tree up to and including it, ring above):
    ``NCCL_TREE_THRESHOLD`` where set, else ``ncclTreeThreshold`` (``v2.4.6-1`` ``src/init.cc``
    lines 353-376: its bandwidths in MB/s and latencies in us, a line-for-line transcription);
    ``inf`` for "every size", 0 for "never"."""
    raw = env.get("NCCL_TREE_THRESHOLD", "").strip()
    if raw:
        try:
            return float(int(raw))
        except ValueError:
            raise CalibrationError(
                "NCCL_TREE_THRESHOLD takes a size in bytes", field="--nccl-env",
                value=f"NCCL_TREE_THRESHOLD={raw}",
            ) from None  # fmt: skip
    ringbw = 5000.0 * n_channels if nvlink else 5000.0
    treebw = ringbw * 3 / 4 * (2 if n_nodes == 2 else 1) if nvlink else ringbw * 2 / 3
    ringlat = 6.0 * (n_ranks - 1)
    treelat = 15.0 * int(math.log2(max(n_nodes, 1))) + 4.0 * (n_ranks // max(n_nodes, 1) - 1)
    if n_nodes < 2 or ringlat <= treelat:
        return 0.0
    if treebw > ringbw:
        return math.inf
    return float(int(ringbw * treebw / (ringbw - treebw) * (ringlat - treelat)))


__all__ = [
    "NEWEST",
    "OLD_ONLY_ENV",
    "NcclVersion",
    "effective_version",
    "parse_nccl_version",
    "tree_threshold_bytes",
]
