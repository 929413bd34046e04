"""Stragglers: per-rank start times and slowdowns in the engine (both paths), the seeded
straggler study (collsim.training.stragglers) and ``collsim stragglers``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from collsim.cli import cli
from collsim.collectives.schedule import ScheduleBuilder
from collsim.engine import SimResult, ring_fabric, simulate, star_fabric
from collsim.engine.testing import ring_all_reduce
from collsim.errors import CollsimError, ScheduleError
from collsim.topology.loader import load_topology
from collsim.training.stragglers import draw, parse_spec, run_stragglers
from tests.engine.conftest import IDEAL
from tests.engine.test_uncontended import assert_same

B = 25e9
LAT = 1.5e-6


def both(schedule, fabric, protocol=IDEAL, **kw) -> tuple[SimResult, SimResult]:
    """(default result, forced replay) with stragglers, after checking that they agree."""
    quick = simulate(schedule, fabric, protocol=protocol, **kw)
    replay = simulate(schedule, fabric, protocol=protocol, fast_path=False, **kw)
    assert replay.meta["engine_path"] == "replay"
    assert_same(quick, replay)
    return quick, replay


def _issued_by(schedule) -> np.ndarray:
    return schedule.arrays["src"]


# -- the engine ------------------------------------------------------------------------------------
@pytest.mark.parametrize("late", [0, 3, 7])
@pytest.mark.parametrize("delay", [2e-6, 40e-6])
def test_late_rank_delays_a_homogeneous_ring_by_its_delay(late: int, delay: float) -> None:
    # On a ring of identical links every send waits for the block from its left and for its own
    # previous send, and every step takes the same time: no rank has slack, so the critical path
    # runs through every rank's first send and a rank entering D late ends the ring D late
    # (up to rounding of the summed step times, far below 1e-9 of the total).
    n = 8
    schedule, fabric = ring_all_reduce(n, n * 5000), ring_fabric(n, B, LAT)
    healthy = simulate(schedule, fabric, protocol=IDEAL)
    start = np.zeros(n)
    start[late] = delay
    quick, _ = both(schedule, fabric, rank_start_s=start)
    assert quick.meta["engine_path"] == "contention_free"
    assert quick.time_s - healthy.time_s == pytest.approx(delay, abs=1e-9 * healthy.time_s)
    # no op the late rank issues starts before it enters; the others' first sends do not wait
    issued = _issued_by(schedule) == late
    assert quick.op_start_s[issued].min() == delay
    assert quick.op_start_s[~issued].min() == 0.0


def test_late_rank_on_a_real_system_delays_by_at_most_its_delay() -> None:
    # Two DGX H100: NVLink ring edges inside a node have slack behind the InfiniBand edges, so a
    # late NVLink sender is (partly) absorbed, a late InfiniBand sender is not. Never more than D.
    from collsim.training.stragglers import _schedule
    from collsim.whatif import WhatIf

    whatif = WhatIf(load_topology("dgx-h100", nodes=2))
    schedule = _schedule(whatif, "all_reduce", "ring", 1 << 22, 4, 1, None)
    healthy = simulate(schedule, whatif.fabric).time_s
    delay = 20e-6
    deltas = []
    for rank in range(16):
        start = np.zeros(16)
        start[rank] = delay
        deltas.append(simulate(schedule, whatif.fabric, rank_start_s=start).time_s - healthy)
    deltas = np.array(deltas)
    assert (deltas >= -1e-12).all() and (deltas <= delay + 1e-9 * healthy).all()
    assert deltas.max() == pytest.approx(delay, abs=1e-9 * healthy)  # some rank has no slack
    assert deltas.min() < 0.5 * delay  # and some have slack


def test_zero_skew_and_unit_slowdown_are_bit_identical_to_healthy() -> None:
    n = 6
    schedule = ring_all_reduce(n, n * 1001 + 5)
    fabric = ring_fabric(n, B, LAT, memory_bytes_per_s=np.linspace(0.5, 3.0, n) * B)
    for fast_path in (True, False):
        healthy = simulate(schedule, fabric, fast_path=fast_path)
        same = simulate(
            schedule, fabric, fast_path=fast_path, rank_start_s=np.zeros(n),
            rank_slowdown=np.ones(n),
        )  # fmt: skip
        assert same.time_s == healthy.time_s
        np.testing.assert_array_equal(same.op_start_s, healthy.op_start_s)
        np.testing.assert_array_equal(same.op_end_s, healthy.op_end_s)
        np.testing.assert_array_equal(same.links.busy_s, healthy.links.busy_s)


def test_fast_path_and_replay_agree_under_random_skew_and_slowdown() -> None:
    rng = np.random.default_rng(3)
    n = 7
    schedule = ring_all_reduce(n, n * 4000 + 3)
    fabric = ring_fabric(n, B, LAT, memory_bytes_per_s=2.0 * B)
    for _ in range(5):
        start = rng.exponential(20e-6, n)
        slow = 1.0 + rng.exponential(1.0, n)
        quick, _ = both(schedule, fabric, rank_start_s=start, rank_slowdown=slow)
        assert quick.meta["engine_path"] == "contention_free"


def test_skew_on_a_contended_schedule_holds_every_rank_until_it_enters() -> None:
    # All-to-all-ish bursts on a star: flows share uplinks, so the replay runs (both paths);
    # local reductions and an in-network reduction are held too.
    n = 5
    fabric = star_fabric(n, B, LAT, 0.2e-6, reducing=True, memory_bytes_per_s=3 * B)
    b = ScheduleBuilder()
    sends = [b.transfer(s, d, 1 << 16, "input", 0, "scratch", s * (1 << 16))
             for s in range(n) for d in range(n) if s != d]  # fmt: skip
    reds = [b.reduction(r, 1 << 16, "scratch", 0, "output", 0, deps=sends) for r in range(n)]
    b.network_reduce([0, 1, 2], [3, 4], 1 << 14, "output", 0, "output", 0, deps=reds)
    schedule = b.build("custom", "burst", n, 0, 4)
    start = np.array([0.0, 5e-6, 0.0, 12e-6, 1e-6])
    quick, _ = both(schedule, fabric, rank_start_s=start)
    a = schedule.arrays
    p2p = a["kind"] != 2
    assert (quick.op_start_s[p2p] >= start[a["src"][p2p]]).all()
    innet = np.flatnonzero(~p2p)[0]
    assert quick.op_start_s[innet] >= start[[0, 1, 2]].max()
    assert quick.time_s > simulate(schedule, fabric, protocol=IDEAL).time_s


def test_slowdown_of_one_rank_slows_its_reductions() -> None:
    n = 6
    schedule = ring_all_reduce(n, n * 8000)
    fabric = ring_fabric(n, B, LAT, memory_bytes_per_s=3.0 * B)  # reduce at B: GPU-bound
    healthy = simulate(schedule, fabric, protocol=IDEAL)
    slow = np.ones(n)
    slow[2] = 4.0
    quick, _ = both(schedule, fabric, rank_slowdown=slow)
    assert quick.time_s > healthy.time_s * 1.5
    # the fused receive-reduces rank 2 receives (from rank 1) take 4x the GPU time
    a = schedule.arrays
    into2 = np.flatnonzero(a["reduce"] & (a["dst"] == 2))
    into3 = np.flatnonzero(a["reduce"] & (a["dst"] == 3))
    d2 = quick.op_end_s[into2] - quick.op_start_s[into2]
    d3 = quick.op_end_s[into3] - quick.op_start_s[into3]
    assert d2.min() > 3.0 * d3.max() - 4 * LAT


@pytest.mark.parametrize(
    "kw",
    [
        {"rank_start_s": np.zeros(3)},
        {"rank_start_s": np.full(4, -1e-6)},
        {"rank_start_s": np.array([0, 0, np.nan, 0])},
        {"rank_slowdown": np.zeros(4)},
        {"rank_slowdown": np.ones(5)},
    ],
)
def test_bad_per_rank_arrays_are_schedule_errors(kw) -> None:
    with pytest.raises(ScheduleError):
        simulate(ring_all_reduce(4, 400), ring_fabric(4, B, LAT), **kw)


# -- the straggler study ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "what,spec,kind,params",
    [
        ("skew", "none", "none", ()),
        ("skew", "uniform:50us", "uniform", (50e-6,)),
        ("skew", "exp:10", "exp", (10e-6,)),
        ("skew", "exponential:1ms", "exp", (1e-3,)),
        ("skew", "lognormal:5us", "lognormal", (5e-6, 0.5)),
        ("skew", "lognormal:5us,1.5", "lognormal", (5e-6, 1.5)),
        ("skew", "one:20us@3", "one", (20e-6,)),
        ("slowdown", "uniform:2", "uniform", (2.0,)),
        ("slowdown", "exp:1.5", "exp", (1.5,)),
        ("slowdown", "lognormal:0.3", "lognormal", (0.3,)),
        ("slowdown", "one:3", "one", (3.0,)),
    ],
)
def test_specs_parse(what, spec, kind, params) -> None:
    d = parse_spec(what, spec)
    assert d.kind == kind
    assert d.params == pytest.approx(params)


@pytest.mark.parametrize(
    "what,spec",
    [
        ("skew", "exp:-5us"),
        ("skew", "uniform"),
        ("skew", "gamma:3"),
        ("skew", "uniform:5parsecs"),
        ("skew", "one:5us@x"),
        ("skew", "uniform:5us@2"),
        ("skew", "lognormal:5us,-1"),
        ("skew", "uniform:1,2"),
        ("slowdown", "one:0.5"),
        ("slowdown", "uniform:nan"),
        ("slowdown", "lognormal:-0.1"),
        ("skew", "one:1e300"),  # these printed 200-digit times
        ("slowdown", "one:1e300"),
        ("skew", "lognormal:5us,1e300"),
    ],
)
def test_bad_specs_are_one_line_errors(what, spec) -> None:
    with pytest.raises(CollsimError) as info:
        parse_spec(what, spec)
    assert f"--{what}" in str(info.value) and "\n" not in str(info.value)


def test_draws_are_seeded_per_sample() -> None:
    skew, slow = parse_spec("skew", "exp:10us"), parse_spec("slowdown", "uniform:2")
    s1, f1 = draw(skew, slow, 8, 42, range(10))
    s2, f2 = draw(skew, slow, 8, 42, range(10))
    np.testing.assert_array_equal(s1, s2)
    np.testing.assert_array_equal(f1, f2)
    s3, _ = draw(skew, slow, 8, 43, range(10))
    assert not np.array_equal(s1, s3)
    s4, f4 = draw(skew, slow, 8, 42, [7, 8, 9])  # a sample depends only on (seed, index)
    np.testing.assert_array_equal(s4, s1[7:])
    np.testing.assert_array_equal(f4, f1[7:])
    assert (s1.min(axis=1) == 0).all() and (f1 >= 1).all() and (f1 <= 2).all()
    one, _ = draw(parse_spec("skew", "one:5us@3"), slow, 8, 0, range(4))
    assert one[:, 3] == pytest.approx([5e-6] * 4) and (np.delete(one, 3, axis=1) == 0).all()


@pytest.fixture(scope="module")
def one_node():
    return load_topology("dgx-h100", nodes=1)


def test_study_is_deterministic_and_its_tail_bounds_hold(one_node) -> None:
    kw = {"skew": "exp:5us", "slowdown": "uniform:1.5", "samples": 40}
    a = run_stragglers(one_node, "all_reduce", "ring", [1 << 20], seed=1, **kw)
    b = run_stragglers(one_node, "all_reduce", "ring", [1 << 20], seed=1, **kw)
    c = run_stragglers(one_node, "all_reduce", "ring", [1 << 20], seed=2, **kw)
    assert a.as_json() == b.as_json()
    pa, pc = a.points[0], c.points[0]
    assert not np.array_equal(pa.completion_s, pc.completion_s)
    stats = pa.as_json()["completion_us"]
    healthy_us = pa.healthy_s * 1e6
    assert stats["max"] >= stats["p99"] >= stats["mean"] > healthy_us
    assert (pa.completion_s >= pa.healthy_s).all()  # a ring never gains from a straggler
    assert (pa.after_last_start_s == pa.completion_s - pa.max_skew_s).all()


def test_study_without_stragglers_is_the_healthy_time(one_node) -> None:
    s = run_stragglers(one_node, "all_gather", "ring", [1 << 16, 1 << 18], samples=3)
    for p in s.points:
        assert (p.completion_s == p.healthy_s).all()


def test_study_one_late_rank_on_one_node(one_node) -> None:
    # NVSwitch: every ring edge alike, no slack: one rank late by D costs D in every sample.
    s = run_stragglers(one_node, "all_reduce", "ring", [1 << 20], skew="one:30us", samples=6)
    p = s.points[0]
    np.testing.assert_allclose(p.completion_s - p.healthy_s, 30e-6, atol=1e-9 * p.healthy_s)


def test_study_does_not_depend_on_jobs(one_node) -> None:
    kw = {"skew": "uniform:20us", "slowdown": "one:2", "samples": 6, "seed": 5}
    serial = run_stragglers(one_node, "all_reduce", "ring", [1 << 18], **kw)
    pooled = run_stragglers(one_node, "all_reduce", "ring", [1 << 18], jobs=2, **kw)
    assert serial.as_json() == pooled.as_json()


# -- the CLI ---------------------------------------------------------------------------------------
def test_cli_writes_json(tmp_path) -> None:
    out = tmp_path / "s.json"
    args = ["stragglers", "all_reduce", "-t", "dgx-h100", "--nodes", "1", "-a", "ring",
            "-b", "1M", "-e", "2M", "--skew", "one:10us", "--slowdown", "uniform:1.2",
            "--samples", "5", "--seed", "3", "--json", str(out)]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "p99" in result.output
    data = json.loads(out.read_text())
    assert {"collective", "topology", "ranks", "skew", "slowdown", "samples", "seed", "points"} <= (
        data.keys()
    )
    assert [p["bytes"] for p in data["points"]] == [1 << 20, 2 << 20]
    point = data["points"][0]
    assert {"healthy_us", "completion_us", "after_last_start_us", "mean_over_healthy",
            "p99_over_healthy", "samples_completion_us"} <= point.keys()  # fmt: skip
    assert {"mean", "p50", "p99", "max"} <= point["completion_us"].keys()
    assert len(point["samples_completion_us"]) == 5
    again = tmp_path / "again.json"
    assert CliRunner().invoke(cli, [*args[:-1], str(again)]).exit_code == 0
    assert again.read_bytes() == out.read_bytes()


@pytest.mark.parametrize(
    "extra",
    [
        ["--skew", "exp:-5us"],
        ["--slowdown", "one:0.5"],
        ["--skew", "one:5us@99"],
        ["--samples", "0"],
    ],
)
def test_cli_bad_input_exits_2(extra) -> None:
    args = ["stragglers", "all_reduce", "-t", "dgx-h100", "--nodes", "1", "-b", "1K", *extra]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


def test_an_empty_call_ends_when_its_last_rank_enters() -> None:
    """8 bytes of all_gather on 8 ranks round to nothing: each rank's call returns as it starts,
    so the last one ends at the skew (it said 0, and -5 us after the last start)."""
    study = run_stragglers(
        load_topology("dgx-h100", nodes=1), "all_gather", "ring", [8], skew="one:5us", samples=3
    )
    (point,) = study.points
    assert np.allclose(point.completion_s, 5e-6)
    assert np.allclose(point.after_last_start_s, 0.0)


def test_a_negative_time_is_named_as_such() -> None:
    """`exp:-5us` said "not a time" (times are parsed unsigned); it is a time, below zero."""
    with pytest.raises(CollsimError, match=">= 0") as info:
        parse_spec("skew", "exp:-5us")
    assert info.value.field == "--skew" and "not a time" not in info.value.message
