"""Max-min results shared between the cost models of one system (collsim/model/shares.py): the
same bits as a model on its own, and never a result computed over other link capacities."""

from dataclasses import replace

import numpy as np
import pytest

import collsim.model.flows as flows
from collsim.model import DEFAULT_PARAMS, AnalyticModel
from collsim.model.shares import WaveShares
from collsim.topology.loader import load_topology
from collsim.whatif import WhatIf

SIZES = np.array([1 << 10, 1 << 20, 1 << 28])


@pytest.fixture()
def max_min_calls(monkeypatch):
    """How many max-min problems the flows solve (each wave not found in a cache solves one)."""
    calls = []
    real = flows.max_min_rates

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(flows, "max_min_rates", counting)
    return calls


def _system():
    # two Polaris nodes: an all-to-all split over the dragonfly's paths, NIC-bound when large
    return WhatIf(load_topology("polaris", nodes=2))


def _alltoall(model):
    return model.predict("alltoall", "direct", SIZES, protocol="Simple", channels=4)


def test_models_with_the_same_capacities_share_every_wave(max_min_calls):
    system = _system()
    first = _alltoall(AnalyticModel(system, DEFAULT_PARAMS))
    solved = len(max_min_calls)
    assert solved > 0
    # the validation report's cross-scale profile on another scale: other latencies and floor
    other = replace(DEFAULT_PARAMS, base_latency_s=9e-6, launch_floor_s=40e-6)
    shared = _alltoall(AnalyticModel(system, other))
    assert len(max_min_calls) == solved  # no wave solved again
    alone = _alltoall(AnalyticModel(_system(), other))
    assert shared.tobytes() == alone.tobytes()
    assert not np.array_equal(first, shared)  # the latencies did change the times


def test_other_capacities_never_reuse_a_share(max_min_calls):
    system = _system()
    _alltoall(AnalyticModel(system, DEFAULT_PARAMS))
    solved = len(max_min_calls)
    slower = replace(DEFAULT_PARAMS, bandwidth_efficiency=(0.5, 0.5, 0.5))
    shared = _alltoall(AnalyticModel(system, slower))
    assert len(max_min_calls) > solved  # solved over its own capacities
    alone = _alltoall(AnalyticModel(_system(), slower))
    assert shared.tobytes() == alone.tobytes()
    assert shared[-1] > 1.5 * _alltoall(AnalyticModel(_system(), DEFAULT_PARAMS))[-1]


def test_a_model_keeps_its_own_shares_when_the_system_drops_them(max_min_calls):
    system = _system()
    system.wave_shares = WaveShares(keep=2)
    model = AnalyticModel(system, DEFAULT_PARAMS)
    model.load_lines("alltoall", "direct", protocol="Simple", channels=1)  # solves its waves
    for eff in (0.5, 0.6, 0.7):  # more capacity sets than the system keeps
        _alltoall(AnalyticModel(system, replace(DEFAULT_PARAMS, bandwidth_efficiency=(eff,) * 3)))
    solved = len(max_min_calls)
    one = model.predict("alltoall", "direct", SIZES, protocol="Simple", channels=1)
    assert len(max_min_calls) == solved  # the same waves, from the model's own set
    alone = AnalyticModel(_system(), DEFAULT_PARAMS)
    assert (
        one.tobytes()
        == alone.predict("alltoall", "direct", SIZES, protocol="Simple", channels=1).tobytes()
    )


def test_wave_shares_keep_the_last_capacity_sets():
    shares = WaveShares(keep=2)
    a, b, c = (np.full(4, x) for x in (1.0, 2.0, 3.0))
    first = shares.for_capacity(a)
    first[b"wave"] = (np.ones(1),)
    assert shares.for_capacity(a.copy()) is first  # the same capacities, by value
    shares.for_capacity(b)
    assert shares.for_capacity(a) is first  # used last: kept
    shares.for_capacity(c)  # b was the oldest
    assert shares.for_capacity(a) is first
    assert shares.for_capacity(b) == {}


def test_wave_shares_drop_old_sets_past_their_byte_budget():
    shares = WaveShares(budget_bytes=1000)
    a, b = np.ones(4), np.full(4, 2.0)
    shares.for_capacity(a)[b"wave"] = (np.zeros(100),)  # 800 bytes
    shares.for_capacity(b)[b"wave"] = (np.zeros(100),)  # the newest stays whatever its size
    assert shares.for_capacity(b)  # 1600 bytes held: a goes
    assert shares.for_capacity(a) == {}
