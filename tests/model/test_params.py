"""ModelParams: serialisable, validated, and actually used by the model."""

import json

import numpy as np
import pytest

from collsim.engine.prepare import prepare
from collsim.engine.testing import ring_all_reduce
from collsim.errors import CalibrationError, ScheduleError
from collsim.model import DEFAULT_PARAMS, AnalyticModel, ModelParams
from collsim.model.flows import FlowCosts
from collsim.model.params import ProtocolParams
from collsim.protocols import get_protocol
from collsim.topology.loader import load_topology
from collsim.whatif import WhatIf


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
    # NCCL's 24 channels fill the port (one is held to its channel's rate, whatever the links)
    t0 = base.predict("all_reduce", "ring", sizes, channels=24)
    t1 = slow.predict("all_reduce", "ring", sizes, channels=24)
    t2 = floored.predict("all_reduce", "ring", sizes, channels=24)
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


def test_nccl_tree_correction_table_by_size():
    """NCCL's treeCorrectionFactor, indexed by log2(bytes / 64): 0.7 at 32 MiB for Simple, 0.6
    at 256 KiB for LL128, none (1) from 512 MiB on."""
    from collsim.model.nccl import tree_correction

    sizes = np.array([32 << 20, 256 << 20, 512 << 20, 1 << 30])
    assert list(tree_correction("Simple", sizes)) == [0.7, 0.9, 1.0, 1.0]
    assert tree_correction("ll128", np.array([256 << 10]))[0] == 0.6
    assert tree_correction("LL", np.array([64]))[0] == 1.0


def test_tree_correction_slows_only_tree_all_reduces():
    """With ``tree_correction`` a tree all-reduce's bytes take 1/factor as long: NCCL's tree
    efficiency (0.92 at every size) times its medium-size correction (32 MiB Simple: 0.7), so
    1 GiB moves at 0.92 and 32 MiB at 0.92 x 0.7 of the rate; rings and other collectives are
    unchanged; it round-trips through to_dict."""
    topo = load_topology("dgx-h100", nodes=4)
    on = ModelParams(tree_correction=True)
    off, corr = AnalyticModel(topo), AnalyticModel(topo, on)
    sizes = np.array([32 << 20, 1 << 30])
    t_off = off.predict("all_reduce", "tree", sizes, channels=8)
    t_on = corr.predict("all_reduce", "tree", sizes, channels=8)
    # Mostly the bandwidth term on 4 nodes: longer by nearly 1/factor, never more.
    assert 1.3 < t_on[0] / t_off[0] <= 1 / (0.92 * 0.7) + 1e-9
    assert 1.08 < t_on[1] / t_off[1] <= 1 / 0.92 + 1e-9
    for coll, algo in (("all_reduce", "ring"), ("all_gather", "ring"), ("broadcast", "tree")):
        a = off.predict(coll, algo, sizes, channels=8)
        b = corr.predict(coll, algo, sizes, channels=8)
        assert np.array_equal(a, b), (coll, algo)
    assert ModelParams.from_dict(json.loads(json.dumps(on.to_dict()))) == on
    with pytest.raises(CalibrationError, match="tree_correction"):
        ModelParams(tree_correction=1)  # type: ignore[arg-type]


def test_tree_correction_takes_protocol_objects_and_leaves_unknown_protocols_alone():
    from collsim.model.nccl import tree_correction
    from collsim.protocols import SIMPLE

    sizes = np.array([32 << 20])
    assert tree_correction(SIMPLE, sizes)[0] == 0.7
    assert tree_correction("Fast", sizes)[0] == 1.0
    topo = load_topology("dgx-h100", nodes=4)
    on = AnalyticModel(topo, ModelParams(tree_correction=True))
    by_name = on.predict("all_reduce", "tree", sizes, protocol="Simple")
    assert on.predict("all_reduce", "tree", sizes, protocol=SIMPLE)[0] == by_name[0]


def test_step_latency_is_the_larger_of_route_and_hwlat_in_model_and_engine():
    """One node of a DGX H100: the GPU -> NVSwitch -> GPU route's datasheet latency (two 0.7 us
    NVLink cables and the switch) exceeds NCCL's NVLink LL hwLat of 0.6 us, so an LL step costs
    the route's latency alone, not 0.6 us more; a Simple step NCCL's 3.4 us, which covers the
    route. The analytic model's flows and the engine's prepared routes charge the same."""
    whatif = WhatIf(load_topology("dgx-h100"))
    fabric = whatif.fabric
    _, _, route_s = fabric.routes(np.array([0]), np.array([1]))
    route = float(route_s[0])
    assert 0.6e-6 < route < 3.4e-6  # datasheet: between the two protocols' hwLat
    for name, expected in (("LL", route), ("Simple", 3.4e-6)):
        proto = get_protocol(name)
        costs = FlowCosts(fabric, DEFAULT_PARAMS, ProtocolParams.of(proto))
        _, _, lat = costs.routes(np.array([0]), np.array([1]))
        assert float(lat[0]) == pytest.approx(expected, rel=1e-12)
        prep = prepare(ring_all_reduce(8, 8 * 16), fabric, proto)
        assert prep.route_latency_s.max() == pytest.approx(expected, rel=1e-12)
