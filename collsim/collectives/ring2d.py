"""2D-ring all-reduce over a ``rows x cols`` grid (Ying et al., "Image classification at
supercomputer scale", 2018, on TPU pods; Mikami et al. 2018 "2D-Torus all-reduce").

Rows are consecutive ranks (usually a node or a slice of one). Ring reduce-scatter along each row,
ring all-reduce of each rank's reduced block along its column, ring all-gather along the row:
each phase's rings are ``cols`` or ``rows`` long, so latency grows with ``rows + cols`` rather than
``n``, while the bandwidth term stays that of a ring. The grid is ``layout.grid`` or the most square
factorisation of ``nranks`` (a prime count degenerates to one ring).
"""

from __future__ import annotations

from collsim.collectives.common import BuildSpec
from collsim.collectives.hierarchical import two_level_all_reduce
from collsim.collectives.schedule import Schedule


def build_all_reduce(spec: BuildSpec) -> Schedule:
    """Row reduce-scatter, column ring all-reduce, row all-gather."""
    rows, cols = spec.layout.grid2d()
    schedule = two_level_all_reduce(spec, cols, "ring")
    schedule.meta["grid"] = (rows, cols)
    return schedule
