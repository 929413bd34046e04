"""Broadcast and reduce chains pipeline at the protocol's forwarding grain (NCCL's primitives):
a whole 512 KiB step for Simple, a thread block's trip of flagged lines for LL and LL128."""

import numpy as np
import pytest

from collsim.collectives.common import DEFAULT_CHUNK_BYTES
from collsim.model.analytic import AnalyticModel
from collsim.model.trees import CHAIN_GRAIN_BYTES
from collsim.topology.loader import load_topology

SIZES = np.array([1 << 20, 4 << 20, 16 << 20])


@pytest.fixture(scope="module")
def model() -> AnalyticModel:
    return AnalyticModel(load_topology("dgx-a100"))


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
@pytest.mark.parametrize("protocol", ["LL", "LL128"])
def test_flagged_lines_forward_at_their_grain(model, collective, protocol):
    t = model.predict(collective, "chain", SIZES, protocol=protocol, channels=24)
    fine = model.predict(collective, "chain", SIZES, protocol=protocol, channels=24,
                         chunk_bytes=CHAIN_GRAIN_BYTES[protocol])  # fmt: skip
    whole = model.predict(collective, "chain", SIZES, protocol=protocol, channels=24,
                          chunk_bytes=DEFAULT_CHUNK_BYTES)  # fmt: skip
    np.testing.assert_allclose(t, fine, rtol=1e-12)
    # 4 MiB over 24 channels is one step per channel: a 7-hop chain that forwarded whole steps
    # would pay the step's bytes at every hop
    assert np.all(t < whole)
    assert t[1] < 0.6 * whole[1]


def test_simple_forwards_whole_steps(model):
    t = model.predict("broadcast", "chain", SIZES, protocol="Simple", channels=24)
    whole = model.predict("broadcast", "chain", SIZES, protocol="Simple", channels=24,
                          chunk_bytes=DEFAULT_CHUNK_BYTES)  # fmt: skip
    np.testing.assert_allclose(t, whole, rtol=1e-12)


def test_grains_are_nccls():
    # LL: 512 threads x one 16-byte line (8 data bytes); LL128: 20 warps x 1920 data bytes
    assert CHAIN_GRAIN_BYTES == {"LL": 4096, "LL128": 38400}
