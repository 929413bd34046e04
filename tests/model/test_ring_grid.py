"""The ring model's longest path (:func:`collsim.model.rings._grid`) keeps exact intercepts."""

import numpy as np

from collsim.model.envelope import S_MAX_BYTES, Aff
from collsim.model.rings import _grid


def test_the_intercept_is_the_same_at_64_tib_as_at_one_byte():
    """A uniform 16-rank ring all-reduce takes the same path at every size, so its latency must
    not depend on the size it is evaluated at. It was recovered as ``value - slope x size``,
    which at the envelope's 64 TiB query (the value ~ 5e3 s) is off by ulps of the value:
    2.7e-12 s more latency than the engine on two DGX A100 nodes."""
    m = 16
    step = Aff(np.full((1, m), 4.8133e-6), np.full((1, m), 7.8125e-11 / 30))
    small, large = _grid([step] * (2 * (m - 1)), 1.0), _grid([step] * (2 * (m - 1)), S_MAX_BYTES)
    assert np.array_equal(small.a, large.a) and np.array_equal(small.b, large.b)
    assert float(small.a.max()) == sum([4.8133e-6] * (2 * (m - 1)))
