"""ModelParams: serialisable, validated, and actually used by the model."""

import json

import numpy as np
import pytest

from collsim.errors import CalibrationError, ScheduleError
from collsim.model import DEFAULT_PARAMS, AnalyticModel, ModelParams
from collsim.topology.loader import load_topology


def test_params_round_trip_through_json():
    params = ModelParams(base_latency_s=5e-6, bandwidth_efficiency=(0.9, 0.8, 0.7),
                         size_factors=((1024, 0.5), (1 << 20, 1.0)))  # fmt: skip
    back = ModelParams.from_dict(json.loads(json.dumps(params.to_dict())))
    assert back == params and hash(back) == hash(params)
    assert ModelParams.from_dict(DEFAULT_PARAMS.to_dict()) == DEFAULT_PARAMS


@pytest.mark.parametrize(
    "data",
    [
        {"bandwidth_efficiency": [1, 1]},
        {"bandwidth_efficiency": [0, 1, 1]},
        {"base_latency_s": -1},
        {"size_factors": [[2048, 1], [1024, 1]]},
        {"nonsense": 1},
        {"protocols": {"LL": {"bandwidth_fraction": 0.5}}},
    ],
)
def test_bad_params_are_calibration_errors(data):
    with pytest.raises(CalibrationError):
        ModelParams.from_dict(data)


def test_params_change_predictions():
    topo = load_topology("dgx-h100", nodes=1)
    base = AnalyticModel(topo)
    slow = AnalyticModel(topo, ModelParams(base_latency_s=10e-6, bandwidth_efficiency=(0.5,) * 3))
    floored = AnalyticModel(topo, ModelParams(launch_floor_s=1e-3))
    sizes = np.array([8, 1 << 20, 1 << 30])
    t0 = base.predict("all_reduce", "ring", sizes)
    t1 = slow.predict("all_reduce", "ring", sizes)
    t2 = floored.predict("all_reduce", "ring", sizes)
    assert t1[0] == pytest.approx(t0[0] + 10e-6, rel=1e-6)  # the base adds to every call
    assert t1[2] == pytest.approx(2 * t0[2], rel=0.01)
    # The launch floor is a floor: small calls cost it, large ones only their own time.
    assert t0[1] < 0.5e-3 and t2[0] == t2[1] == 1e-3 and t2[2] == t0[2] > 1e-3
    with pytest.raises(ScheduleError):
        base.predict("all_reduce", "ring", sizes, protocol="Fast")


def test_the_tuner_ranks_choices_above_the_launch_floor():
    """Below a calibration's launch floor every choice costs the floor; the tuner still picks
    what is fastest above it (the same choice as without the floor) and reports the floor."""
    from collsim.model.tuner import Tuner

    topo = load_topology("dgx-h100", nodes=4)
    sizes = np.array([8, 1 << 16, 1 << 30])
    plain = Tuner(AnalyticModel(topo)).tune("all_reduce", sizes)
    floored = Tuner(AnalyticModel(topo, ModelParams(launch_floor_s=50e-6))).tune(
        "all_reduce", sizes
    )
    labels = [[t.choice_at(i).label() for i in range(3)] for t in (plain, floored)]
    assert labels[0] == labels[1]
    np.testing.assert_allclose(floored.best_s, np.maximum(50e-6, plain.best_s))
