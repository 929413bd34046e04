"""Shared helpers: synthetic nccl-tests logs for the quirks the published dataset lacks."""

# ruff: noqa: E501  (log lines are kept at nccl-tests' own width)

from __future__ import annotations

from pathlib import Path

import pytest

HEADER = """\
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
"""  # noqa: W291

DEVICES = """\
# nThread 1 nGpus 1 minBytes 1024 maxBytes 4096 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid   1001 on      node1 device  0 [0000:04:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid   1002 on      node1 device  1 [0000:05:00] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid   2001 on      node2 device  0 [0000:04:00] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid   2002 on      node2 device  1 [0000:05:00] NVIDIA H100 80GB HBM3
"""

# all_reduce on 4 ranks: busbw = algbw x 1.5
ROWS = [
    "        1024           256     float     sum      -1    20.48    0.05    0.08      0    20.48    0.05    0.08      0",
    "        2048           512     float     sum      -1    20.48    0.10    0.15      0    20.48    0.10    0.15      0",
    "        4096          1024     float     sum      -1    40.96    0.10    0.15      0    40.96    0.10    0.15      0",
]

FOOTER = """\
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.126667
#
"""


def alpha_beta_rows(n: int = 12, alpha_us: float = 20.0, gbps: float = 40.0) -> list[str]:
    """``n`` all_reduce rows on 4 ranks from 1 KiB doubling, timed ``alpha + bytes / rate``."""
    rows = []
    for k in range(n):
        size = 1024 << k
        t = alpha_us + size / (gbps * 1e3)
        alg = size / t / 1e3
        cols = f"{t:8.2f} {alg:7.2f} {alg * 1.5:7.2f}      0"
        rows.append(f"{size:12d}  {size // 4:12d}     float     sum      -1 {cols} {cols}")
    return rows


def standard_log(rows: list[str] | None = None, *, start: str = "all_reduce_perf") -> str:
    """A well-formed current-layout log (4 ranks on 2 hosts)."""
    body = "\n".join(ROWS if rows is None else rows)
    return f"# Collective test starting: {start}\n{DEVICES}NCCL version 2.21.5+cuda12.4\n#\n{HEADER}{body}\n{FOOTER}"


@pytest.fixture
def write(tmp_path: Path):
    """write(text, name="log.txt") -> path of a file holding ``text``."""

    def _write(text: str, name: str = "log.txt") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return _write
