"""Failures over a long run: Young/Daly checkpoint intervals, goodput, elastic vs wait, the
``resilience`` workload section and its report in ``collsim step`` and ``plan``."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from collsim.cli import cli
from collsim.errors import CollsimError
from collsim.training import resilience as rs
from collsim.training.workload import WorkloadError, load_workload, workload_from_dict

H = 3600.0
SECTION = {
    "node_mtbf_hours": 6300,
    "storage_bandwidth": "50GB/s",
    "restart_time": "10min",
    "repair_time": "24h",
    "elastic": True,
}
SMALL = {
    "name": "small",
    "model": {"layers": 4, "hidden": 256, "heads": 4, "seq_len": 128},
    "global_batch": 64,
}


def test_young_on_a_hand_computed_case():
    # delta = 100 GB / 10 GB/s = 10 s; M = 1000 h / 100 nodes = 10 h = 36000 s
    write = rs.checkpoint_write_s(100e9, 10e9)
    mtbf = rs.system_mtbf_s(1000 * H, 100)
    assert write == pytest.approx(10.0)
    assert mtbf == pytest.approx(36000.0)
    assert rs.young_interval_s(write, mtbf) == pytest.approx(math.sqrt(2 * 10 * 36000))  # 848.5 s
    assert rs.young_interval_s(write, mtbf) == pytest.approx(848.528, abs=1e-3)


def test_daly_approaches_young_when_the_write_is_short():
    mtbf = 24 * H
    for write, tol in ((1000.0, 0.2), (10.0, 0.02), (0.01, 1e-3)):
        young, daly = rs.young_interval_s(write, mtbf), rs.daly_interval_s(write, mtbf)
        assert abs(daly - young) / young < tol
    # and Daly's terms by hand: x = d/2M
    d, m = 600.0, 10 * H
    x = d / (2 * m)
    want = math.sqrt(2 * d * m) * (1 + math.sqrt(x) / 3 + x / 9) - d
    assert rs.daly_interval_s(d, m) == pytest.approx(want)
    assert rs.daly_interval_s(3 * m, m) == m  # delta >= 2M: tau = M


@pytest.mark.parametrize("write,mtbf", [(10.0, 36000.0), (300.0, 4 * H), (1800.0, H)])
def test_the_optimal_interval_minimises_the_expected_time(write, mtbf):
    cost = lambda tau: rs.wall_per_useful(tau, write, 120.0, mtbf)  # noqa: E731
    best = rs.optimal_interval_s(write, mtbf)
    scan = np.linspace(0.2 * best, 5 * best, 2001)
    assert cost(best) <= min(cost(t) for t in scan) * (1 + 1e-12)
    assert cost(best) < cost(0.9 * best) and cost(best) < cost(1.1 * best)
    # Daly's estimate is close to the exact optimum in interval and (much closer) in time
    daly = rs.daly_interval_s(write, mtbf)
    assert abs(daly - best) / best < 0.05
    assert cost(daly) == pytest.approx(cost(best), rel=1e-3)
    assert cost(daly) <= cost(rs.young_interval_s(write, mtbf)) * (1 + 1e-9)


def test_wall_time_matches_daly_by_hand():
    tau, d, r, m = 3600.0, 60.0, 300.0, 20 * H
    want = m * math.exp(r / m) * (math.exp((tau + d) / m) - 1) / tau
    assert rs.wall_per_useful(tau, d, r, m) == pytest.approx(want)
    # first order: 1 + d/tau + (tau + d)/(2M) + R/M
    assert want == pytest.approx(1 + d / tau + (tau + d) / (2 * m) + r / m, rel=2e-3)


def _run(nodes: int = 8, **kw):  # type: ignore[no-untyped-def]
    args = dict(node_mtbf_s=6300 * H, nodes=nodes, checkpoint_bytes=2.4e12,
                storage_bytes_per_s=50e9, restart_s=600.0)  # fmt: skip
    return rs.analyze(**(args | kw))


def test_goodput_falls_with_cluster_size_and_stays_in_0_1():
    goodputs = [_run(n).goodput for n in (1, 8, 64, 512, 4096, 32768)]
    assert all(0 < g <= 1 for g in goodputs)
    assert all(a > b for a, b in itertools.pairwise(goodputs))
    big = _run(4096)
    assert big.inflation == pytest.approx(1 / big.goodput)
    assert big.policy == "spares" and big.goodput_wait is None


def test_elastic_beats_waiting_when_the_repair_is_long():
    res = _run(256, repair_s=48 * H, elastic=True)
    assert res.goodput_elastic > res.goodput_wait
    assert res.policy == "elastic" and res.expected_goodput == res.goodput_elastic
    assert res.goodput_wait < res.goodput_elastic < res.goodput  # spares are best
    assert res.elastic_nodes == 255 and res.elastic_throughput == pytest.approx(255 / 256)
    # a short repair and a poor shrunken throughput: waiting wins (f D < R)
    slow = lambda n: 1.0 if n == 256 else 20.0  # noqa: E731
    short = _run(256, repair_s=120.0, elastic=True, step_time_s=slow)
    assert short.goodput_wait > short.goodput_elastic
    # one node: nothing to shrink to
    assert _run(1, repair_s=H, elastic=True).goodput_elastic is None


def test_dp_step_time_counts_whole_replicas():
    at = rs.dp_step_time(10.0, gpus=512, gpus_per_node=8, replica_gpus=64)  # 8 replicas
    assert at(64) == pytest.approx(10.0)
    assert at(63) == pytest.approx(10.0 * 8 / 7)
    assert at(7) is None


@pytest.mark.parametrize(
    "kw,field,value",
    [
        ({"node_mtbf_s": -5.0}, "node_mtbf_s", -5.0),
        ({"storage_bytes_per_s": 0.0}, "storage_bytes_per_s", 0.0),
        ({"restart_s": -1.0}, "restart_s", -1.0),
        ({"nodes": 0}, "nodes", 0),
        ({"checkpoint_bytes": float("nan")}, "checkpoint_bytes", None),
        ({"repair_s": 0.0}, "repair_s", 0.0),
    ],
)
def test_bad_values_name_the_field(kw, field, value):
    with pytest.raises(CollsimError) as err:
        _run(**kw)
    assert err.value.field == field
    assert field in str(err.value)
    if value is not None:
        assert err.value.value == value


def test_durations():
    assert rs.parse_duration_s("10min") == 600
    assert rs.parse_duration_s("1.5h") == 5400
    assert rs.parse_duration_s("2d") == 172800
    assert rs.parse_duration_s("90s") == 90
    for bad in ("600", 600, "10 fortnights", True):
        with pytest.raises(CollsimError, match="duration"):
            rs.parse_duration_s(bad)


def test_workload_section_validates_and_defaults_the_checkpoint():
    w = workload_from_dict(SMALL | {"resilience": SECTION})
    assert w.resilience.restart_s == 600 and w.resilience.repair_s == 24 * H
    assert w.resilience.storage_bytes_per_s == 50e9
    gpt3 = load_workload("gpt3-175b")
    assert rs.default_checkpoint_bytes(gpt3) == pytest.approx(174.6e9 * 14, rel=0.01)
    with pytest.raises(WorkloadError, match=r"resilience\.node_mtbf_hours"):
        workload_from_dict(SMALL | {"resilience": SECTION | {"node_mtbf_hours": -1}})
    with pytest.raises(WorkloadError, match=r"resilience\.restart_time"):
        workload_from_dict(SMALL | {"resilience": SECTION | {"restart_time": 600}})
    with pytest.raises(WorkloadError, match=r"resilience\.mtbf"):
        workload_from_dict(SMALL | {"resilience": SECTION | {"mtbf": 3}})


VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 10**6), st.floats(allow_nan=True),
    st.sampled_from(["10min", "0s", "1e308d", "50GB/s", "0GB/s", "1e300TB/s", "3h", "x", ""]),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers()),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(changes=st.dictionaries(st.sampled_from([*SECTION, "bogus"]), VALUES, max_size=3))
def test_fuzzed_sections_validate_or_fail_cleanly(changes):
    try:
        w = workload_from_dict(SMALL | {"resilience": SECTION | changes})
    except WorkloadError as exc:
        assert exc.field and exc.field.startswith("resilience"), str(exc)
        return
    res = rs.for_job(w, 64, 8)
    assert 0 <= res.expected_goodput <= 1


runner = CliRunner()


@pytest.mark.parametrize("with_section", [True, False])
def test_step_json_has_resilience_only_with_the_section(tmp_path, with_section):
    wl = tmp_path / "w.yaml"
    wl.write_text(yaml.safe_dump(SMALL | ({"resilience": SECTION} if with_section else {})))
    out = tmp_path / "s.json"
    res = runner.invoke(
        cli, ["step", "-w", str(wl), "-t", "dgx-h100", "--nodes", "4", "--json", str(out)]
    )
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert ("resilience" in data) is with_section
    assert ("goodput" in res.output) is with_section
    if with_section:
        r = data["resilience"]
        assert r["nodes"] == 4 and r["system_mtbf_s"] == pytest.approx(6300 * H / 4)
        assert 0 < r["goodput"] <= 1 and r["time_to_train_inflation"] >= 1
        assert r["interval_young_s"] == pytest.approx(
            math.sqrt(2 * r["checkpoint_write_s"] * r["system_mtbf_s"])
        )


def test_bundled_gpt3_reports_elastic_and_wait():
    res = runner.invoke(cli, ["step", "-w", "gpt3-175b", "-t", "dgx-h100", "--nodes", "64"])
    assert res.exit_code == 0, res.output
    assert "checkpoint interval: Young" in res.output
    assert "wait for repair" in res.output
    assert "elastic with 63 nodes left (the best layout they hold" in res.output


def test_plan_adds_goodput_columns(tmp_path):
    wl = tmp_path / "w.yaml"
    wl.write_text(yaml.safe_dump(SMALL | {"resilience": SECTION}))
    cand = tmp_path / "c.yaml"
    cand.write_text(yaml.safe_dump({
        "tokens": "1B", "clusters": [{"topology": "dgx-h100", "nodes": [1, 4], "gpu_hour_usd": 3}],
    }))  # fmt: skip
    out = tmp_path / "p.json"
    res = runner.invoke(cli, ["plan", "-w", str(wl), "-c", str(cand), "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "goodput_%" in res.output and "days_failures" in res.output
    rows = json.loads(out.read_text())
    for r in rows:
        assert 0 < r["goodput_%"] <= 100
        assert r["days_failures"] == pytest.approx(r["days"] * 100 / r["goodput_%"])
        assert r["cost_failures_usd"] >= r["cost_usd"]
    assert [r["days_failures"] for r in rows] == sorted(r["days_failures"] for r in rows)


def test_a_storage_bandwidth_under_a_byte_per_second_is_refused():
    """1e-300 B/s made the checkpoint write time infinite past validation (found by the fuzz)."""
    with pytest.raises(WorkloadError, match=r"resilience\.storage_bandwidth.*at least 1 B/s"):
        workload_from_dict(SMALL | {"resilience": SECTION | {"storage_bandwidth": "1e-300GB/s"}})
