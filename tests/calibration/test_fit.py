"""Fitting profiles: physical, bounded, deterministic; a profile transfers across collectives;
bad input (wrong results, a rank count the topology cannot hold) is a clear error."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from collsim.calibration.dataset import DATA_DIR
from collsim.calibration.fit import FIT_BASE, Sample, _doc, _systems, classes_used, fit_samples
from collsim.calibration.log_context import (
    constraints,
    elem_bytes,
    env_from_notes,
    topology_for_log,
)
from collsim.calibration.predict import Predictor, Scale, ScaledModel, uncalibrated_params
from collsim.calibration.problem import Problem
from collsim.calibration.report import dataset_samples
from collsim.calibration.validate import validate_samples
from collsim.cli import cli
from collsim.errors import CalibrationError
from collsim.model.analytic import AnalyticModel
from collsim.model.params import DEFAULT_PARAMS, HOST_LAUNCH_S, HOST_P2P_OP_S, p2p_ops
from collsim.model.profile import Profile, load_profile
from collsim.topology.loader import CATALOG_DIR, topology_from_dict
from tests.calibration.conftest import ROWS, alpha_beta_rows, standard_log

LOGS = DATA_DIR / "logs"


@pytest.fixture(scope="module")
def h100():
    """The 8x H100 NVSwitch logs (all_gather, all_reduce, reduce_scatter; NCCL_ALGO=Ring)."""
    return [s for s in dataset_samples() if s.name.startswith("h100-8gpu-together-ring")]


def test_fit_is_physical_bounded_and_deterministic(h100, tmp_path):
    a, b = fit_samples(h100), fit_samples(h100)
    assert a.to_yaml() == b.to_yaml()
    doc = a.doc
    assert set(doc.link_classes) == {"nvlink"}
    nv = doc.link_classes["nvlink"]
    assert 0.02 <= nv.bandwidth_efficiency <= 1.2 and 0.05 <= nv.latency_scale <= 50
    n_params = 2 * len(doc.link_classes) + 1 + len(doc.size_efficiency) - 1
    assert n_params <= 10
    assert doc.fit_error is not None and doc.fit_error.median_mape < 0.10
    path = tmp_path / "p.yaml"
    a.save(path)
    assert load_profile(path).to_dict() == a.to_dict()


def test_scaled_model_equals_profile_params(h100):
    """The fit's fast path (scaling the model's lines) is the model under the profile's params,
    exactly (every latency, links and devices, scales with the latency scale; one link class: its
    efficiency scales every rate, the memory's keeping its prior's proportion to it)."""
    prof = fit_samples(h100[:1])
    s = h100[0]
    nvlink = prof.doc.link_classes["nvlink"]
    ratio = prof.doc.memory_efficiency / nvlink.bandwidth_efficiency
    fast = Predictor.wrap(
        ScaledModel(
            AnalyticModel(
                s.topology,
                dataclasses.replace(DEFAULT_PARAMS, reduce_efficiency=ratio, copy_efficiency=ratio),
            ),
            Scale(
                latency=nvlink.latency_scale,
                bandwidth=nvlink.bandwidth_efficiency,
                base_latency_s=prof.doc.base_latency_us * 1e-6,
                launch_floor_s=prof.doc.launch_floor_us * 1e-6,
                size_factors=tuple(prof.doc.size_efficiency),
            ),
        )
    )
    slow = Predictor(s.topology, prof.params())
    t_fast, _ = fast.predict(s.log.collective, s.sizes, env=s.env)
    t_slow, _ = slow.predict(s.log.collective, s.sizes, env=s.env)
    np.testing.assert_allclose(t_fast, t_slow, rtol=1e-6)


def test_launch_floor_counts_once_per_gpu_the_host_thread_drives(h100):
    """nccl-tests -g N: one thread issues each call to N GPUs in turn, so back-to-back calls
    take at least N launches; the GPU-side time does not change."""
    s = next(x for x in h100 if x.log.collective == "all_gather")
    assert s.log.gpus_per_thread == 8  # one process drove the eight GPUs
    params = dataclasses.replace(DEFAULT_PARAMS, launch_floor_s=5e-6)
    pred = Predictor(s.topology, params)
    tiny = np.array([1024])
    one, _ = pred.predict("all_gather", tiny)
    eight, _ = pred.predict("all_gather", tiny, gpus_per_thread=8)
    assert 5e-6 <= one[0] < 40e-6  # the GPUs' own time, above one launch
    assert eight[0] == pytest.approx(40e-6)  # eight launches
    big = np.array([1 << 30])  # far above the floor: the thread's GPUs do not matter
    np.testing.assert_allclose(
        pred.predict("all_gather", big)[0], pred.predict("all_gather", big, gpus_per_thread=8)[0]
    )
    # The dataset's own log is predicted with its thread's eight launches, and a fit reports
    # the floor per launch: an eighth of the ~35 us these small messages take.
    assert Predictor(s.topology, params).predict_log(s.log)[2][0] == pytest.approx(40e-6)
    prof = fit_samples([s])
    assert 3.0 < prof.doc.launch_floor_us < 6.0


def test_point_to_point_operations_add_host_cost_to_the_floor():
    """An all-to-all posts a send and a receive per rank (itself included): the host pays each on
    top of the launch, so its calls follow each other more slowly than a collective's. The
    superbench A100 log (one thread drove the 8 GPUs) shows it: 87 us at small sizes where its
    collectives take 35 us; the old floor (one launch per GPU, as for collectives) predicted
    40 us there."""
    assert [p2p_ops(c, 8) for c in ("alltoall", "sendrecv", "all_reduce")] == [16, 2, 0]
    params = dataclasses.replace(DEFAULT_PARAMS, launch_floor_s=5e-6, p2p_op_s=0.4e-6)
    assert params.floor_s("alltoall", 8) == pytest.approx(5e-6 + 16 * 0.4e-6)
    assert params.floor_s("all_gather", 8) == pytest.approx(5e-6)
    samples = [s for s in dataset_samples() if s.log.file.endswith("superbench-alltoall-1.txt")]
    (s,) = samples
    assert s.log.gpus_per_thread == 8
    sizes, measured, pred, _ = Predictor(s.topology, uncalibrated_params()).predict_log(s.log)
    small = sizes <= 65536
    assert pred[small] == pytest.approx(8 * (HOST_LAUNCH_S + 16 * HOST_P2P_OP_S))
    assert np.median(np.abs(pred[small] / measured[small] - 1)) < 0.1
    # A fitted profile records the value it used, and applies it.
    # A fit applies it: the floor per launch stays a launch's cost (about 5 us, as the
    # collectives of this system fit), not 16 operations' worth, and the plateau fits.
    prof = fit_samples([s])
    assert prof.doc.p2p_op_us == pytest.approx(HOST_P2P_OP_S * 1e6)
    assert prof.params().p2p_op_s == pytest.approx(HOST_P2P_OP_S)
    assert 3.5 < prof.doc.launch_floor_us < 6.0
    assert prof.doc.fit_error is not None and prof.doc.fit_error.mape < 0.08


def test_all_reduce_profile_improves_other_collectives(h100):
    ar = [s for s in h100 if s.log.collective == "all_reduce"]
    others = [s for s in h100 if s.log.collective != "all_reduce"]
    fitted = validate_samples(others, fit_samples(ar).params())
    raw = validate_samples(others, uncalibrated_params())
    assert fitted.mape < raw.mape
    assert fitted.mape < 0.10


def test_nccl_settings_are_honoured():
    assert constraints({"NCCL_ALGO": "Ring"}, "all_reduce").algorithms == ("ring",)
    assert constraints({"NCCL_ALGO": "^Ring"}, "all_reduce").algorithms == (
        "tree", "in_network", "nvls_tree", "collnet",
    )  # fmt: skip
    assert constraints({"NCCL_ALGO": "NVLSTree"}, "all_reduce").algorithms == ("nvls_tree",)
    assert constraints({"NCCL_ALGO": "PAT"}, "all_gather").algorithms == ("pat",)
    assert constraints({"NCCL_PROTO": "LL128"}, "all_gather").protocols == ("LL128",)
    assert constraints({"NCCL_TREE_THRESHOLD": "0"}, "all_reduce").algorithms == (
        "ring", "in_network", "nvls_tree", "collnet",
    )  # fmt: skip
    assert constraints({"NCCL_MAX_NCHANNELS": "4"}, "all_reduce").channels == (1,)
    # a count above the usual ones is the one NCCL ran with (it was clamped to 8)
    assert constraints({"NCCL_MIN_NCHANNELS": "32"}, "all_reduce").channels == (32,)
    assert constraints({"NCCL_MIN_NCHANNELS": "16"}, "all_reduce").channels == (16,)
    assert env_from_notes("labelled 'ring' (NCCL_ALGO=RING set)") == {"NCCL_ALGO": "RING"}


def test_a_logs_own_nccl_settings_bind_its_prediction(write):
    """A log that records NCCL_ALGO=Tree (NCCL INFO '... set by environment to') is predicted
    with the tree by `collsim validate` and fitted with it: the log's settings used to be read
    and printed but never applied."""
    from collsim.calibration import read_log
    from collsim.topology.loader import load_topology

    rows = alpha_beta_rows(n=16)
    info = "node1:1001:1001 [0] NCCL INFO NCCL_ALGO set by environment to Tree\n"
    text = standard_log(rows).replace("NCCL version", info + "NCCL version")
    path = write(text)
    log = read_log(path)
    assert log.nccl_env == {"NCCL_ALGO": "Tree"}
    sample = Sample(log, load_topology("h100-4gpu-ib", nodes=2, gpus_per_node=2))
    assert sample.env["NCCL_ALGO"] == "Tree"
    v = validate_samples([sample], uncalibrated_params())
    assert {p.choice.split("/")[0] for p in v.logs[0].points} == {"tree"}
    out = CliRunner().invoke(cli, ["validate", str(path), "-t", "h100-4gpu-ib",
                                   "--gpus-per-node", "2"])  # fmt: skip
    assert out.exit_code == 0, out.output
    assert " tree/" in out.output and " ring/" not in out.output


def test_ring_log_is_predicted_with_the_ring(h100):
    s = next(x for x in h100 if x.log.collective == "all_reduce")
    assert s.env.get("NCCL_ALGO", "").lower() == "ring"
    _, labels = Predictor(s.topology).predict("all_reduce", s.sizes, env=s.env)
    assert {lab.split("/")[0] for lab in labels} == {"ring"}


def test_wrong_results_are_refused_for_fitting(write, tmp_path):
    rows = alpha_beta_rows()
    bad = [*rows[:-1], rows[-1][:-1] + "3"]  # last in-place #wrong = 3
    path = write(standard_log(bad))
    out = tmp_path / "p.yaml"
    args = ["calibrate", "fit", str(path), "-t", "h100-4gpu-ib", "--gpus-per-node", "2",
            "-o", str(out)]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert "#wrong" in result.output and "--allow-anomalies" in result.output
    assert str(path) in result.output and not out.exists()
    result = CliRunner().invoke(cli, [*args, "--allow-anomalies"])
    assert result.exit_code == 0, result.output
    assert out.exists()


def test_wrong_results_are_refused_for_validation(write):
    """A wrong row would count in the error as a measurement: validate refuses the log as fit
    does, and compares it when told to."""
    rows = alpha_beta_rows()
    path = write(standard_log([*rows[:-1], rows[-1][:-1] + "3"]))
    args = ["validate", str(path), "-t", "h100-4gpu-ib", "--gpus-per-node", "2", "--summary"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert "refusing to validate" in result.output and "--allow-anomalies" in result.output
    result = CliRunner().invoke(cli, [*args, "--allow-anomalies"])
    assert result.exit_code == 0, result.output
    assert "MAPE" in result.output and "#wrong" in result.output


def test_rank_count_that_does_not_fit_is_an_error(write):
    from collsim.calibration import read_log

    text = standard_log().replace("# Using devices", "").split("\n")
    text = "\n".join(line for line in text if "Rank " not in line)
    log = read_log(write(text), ranks=64)
    assert log.ranks == 64 and not log.nodes
    with pytest.raises(CalibrationError) as err:
        topology_for_log("dgx-h100", log, nodes=1)
    msg = str(err.value)
    assert "64 ranks" in msg and "dgx-h100" in msg and "8 GPUs" in msg and "--nodes" in msg
    with pytest.raises(CalibrationError):
        topology_for_log("dgx-h100", log)  # dgx-h100 has 4 nodes x 8 = 32 GPUs
    assert topology_for_log("dgx-h100", log, nodes=8).n_gpus == 64
    # One of --nodes / --gpus-per-node given: the log's ranks give the other (4 ranks on one
    # node are 4 GPUs of it), never more GPUs per node than the template has (above: 64 on 1).
    four = read_log(write(standard_log(), "four.txt"))
    assert (four.ranks, four.nodes) == (4, 2)
    one = topology_for_log("dgx-h100", four, nodes=1)
    assert (one.nodes, one.gpus_per_node) == (1, 4)
    assert topology_for_log("dgx-h100", four, gpus_per_node=1).nodes == 4


def test_logs_sharing_a_file_name_keep_their_own_results(tmp_path):
    from collsim.calibration.session import load_samples

    src = LOGS / "h100-snellius-1n4g-all_reduce-1.txt"
    paths = []
    for run in ("run1", "run2"):
        (tmp_path / run).mkdir()
        paths.append(tmp_path / run / "all_reduce.txt")
        paths[-1].write_bytes(src.read_bytes())
    samples = load_samples([str(p) for p in paths], "h100-4gpu-ib")
    assert [s.name for s in samples] == [str(p) for p in paths]
    prof = fit_samples(samples)
    assert prof.doc.fit_error is not None and len(prof.doc.fit_error.per_log) == 2


def test_sample_rejects_log_without_data_rows(write):
    from collsim.calibration import read_log

    zero = "           0             0     float     sum      -1    20.48    0.00    0.00      0    20.48    0.00    0.00      0"  # noqa: E501
    log = read_log(write(standard_log([zero])))
    with pytest.raises(CalibrationError, match="no timed rows"):
        Sample(log, topology_for_log("h100-4gpu-ib", log))


def test_duplex_is_fitted_only_where_one_way_and_two_way_logs_tell_it(tmp_path):
    """GPUDirect RDMA over one HDR HCA: broadcast reaches 24 GB/s, sendrecv 14.6 GB/s each way.
    With both, on a topology that joins GPU and HCA directly, the fit finds the two directions
    sharing ~29 GB/s (duplex well below 1) and fits both; with sendrecv alone it cannot tell,
    and keeps full duplex. The catalog's topology routes the pair through the CPU's shared
    forwarding capacity (node.intra.host_p2p_bandwidth), which leaves no shortfall to fit."""
    from collsim.calibration.fit import duplex_identifiable

    catalog = [s for s in dataset_samples() if s.name.startswith("a100pcie-ib-2n1g-gdr-")
               and s.log.collective in ("broadcast", "sendrecv")]  # fmt: skip
    fitted = {c.duplex_efficiency for c in fit_samples(catalog).doc.link_classes.values()}
    assert all(d is None or d > 0.95 for d in fitted)
    doc = yaml.safe_load((CATALOG_DIR / "a100-pcie-ib-2node.yaml").read_text())
    doc["node"]["intra"].pop("host_p2p_bandwidth")
    doc["node"]["nics"].pop("gpu_path")
    direct = topology_from_dict(doc)
    gdr = [Sample(s.log, direct, env=s.env, name=s.name) for s in catalog]
    both = [s for s in gdr if s.log.collective in ("broadcast", "sendrecv")]
    two_way = [s for s in gdr if s.log.collective == "sendrecv"]
    assert duplex_identifiable(both) and not duplex_identifiable(two_way)
    prof = fit_samples(both)
    duplex = {c.duplex_efficiency for c in prof.doc.link_classes.values()}
    assert len(duplex) == 1 and 0.5 <= duplex.pop() < 0.8
    assert max(prof.doc.fit_error.per_log.values()) < 0.05
    assert all(c.duplex_efficiency is None for c in fit_samples(two_way).doc.link_classes.values())
    path = tmp_path / "gdr.yaml"
    prof.save(path)
    again = load_profile(path)
    assert again.doc == prof.doc
    assert again.params().duplex_efficiency == prof.params().duplex_efficiency
    # the engine sees the same shared capacity
    topo = again.apply_to_topology(both[0].topology)
    assert any(lk.duplex_bandwidth_bytes_per_s for lk in topo.links)


def test_simulate_says_which_parts_of_a_profile_each_engine_takes(h100, tmp_path):
    prof = tmp_path / "h100.yaml"
    fit_samples(h100[:1]).save(prof)
    args = ["simulate", "all_gather", "-t", "dgx-h100", "--nodes", "1", "-b", "1K", "-e", "1K"]
    des = CliRunner().invoke(cli, [*args, "--profile", str(prof)])
    assert des.exit_code == 0 and "apply with --engine analytic" in des.output
    nccl = CliRunner().invoke(
        cli, [*args, "--profile", str(prof), "--engine", "analytic", "--model", "nccl"]
    )
    assert nccl.exit_code == 2 and "NCCL's model takes no profile" in nccl.output


def test_a_profile_notices_a_topology_whose_links_changed(h100):
    import dataclasses as dc

    from collsim.topology.loader import load_topology

    prof = fit_samples(h100[:1])
    assert prof.doc.topology.links
    bigger = load_topology("dgx-h100", nodes=4)  # another scale of the same system
    assert not any("differ" in n for n in prof.check_topology(bigger))
    first = bigger.links[0]
    edited = dc.replace(
        bigger, links=(dc.replace(first, bandwidth_bytes_per_s=1e9), *bigger.links[1:])
    )
    assert any("differ from those the profile was fitted on" in n
               for n in prof.check_topology(edited))  # fmt: skip


def test_parameters_left_at_a_bound_are_reported(write):
    """A log 2000x slower than NVLink can carry (a broken link, or the wrong topology): the fit
    pushes the bandwidth efficiency to its lower bound, and says so; a clean fit says nothing."""
    from collsim.calibration.session import load_samples

    path = write(standard_log(alpha_beta_rows(gbps=0.05)))
    prof = fit_samples(load_samples([str(path)], "h100-4gpu-ib", gpus_per_node=2, for_fit=True))
    assert any("bandwidth_efficiency" in b and b.endswith("(lower bound)")
               for b in prof.doc.provenance.at_bounds), prof.doc.provenance.at_bounds  # fmt: skip
    clean = fit_samples([s for s in dataset_samples() if s.name.startswith("h100-8gpu")][:1])
    assert clean.doc.provenance.at_bounds == []


def test_a_base_with_its_own_host_floor_is_not_counted_twice():
    """The fit owns the host's floor; a base that has one (the uncalibrated parameters: 5 us a
    launch, 0.4 us a point-to-point operation) used to add it under the fitted one, so the
    superbench all-to-all's plateau came out at twice its 16 operations' cost."""
    (s,) = [s for s in dataset_samples() if s.log.file.endswith("superbench-alltoall-1.txt")]
    prof = fit_samples([s], base=uncalibrated_params())
    assert prof.params().p2p_op_s == pytest.approx(HOST_P2P_OP_S)
    sizes, measured, pred, _ = Predictor(s.topology, prof.params()).predict_log(s.log)
    floor = 8 * (prof.doc.launch_floor_us * 1e-6 + 16 * HOST_P2P_OP_S)
    assert pred[sizes <= 4096] == pytest.approx(floor)
    assert np.median(np.abs(pred[sizes <= 65536] / measured[sizes <= 65536] - 1)) < 0.1


def test_too_few_rows_to_determine_the_fit_are_refused(write, tmp_path):
    """Three rows and eight parameters: any values fit them exactly (an in-sample 0% that means
    nothing), so the fit says so instead of writing a profile."""
    out = tmp_path / "p.yaml"
    args = ["calibrate", "fit", "-t", "h100-4gpu-ib", "--gpus-per-node", "2", "-o", str(out)]
    few = CliRunner().invoke(cli, [*args, str(write(standard_log(ROWS)))])
    assert few.exit_code == 2 and "3 measured rows cannot determine" in few.output
    assert not out.exists()
    enough = CliRunner().invoke(cli, [*args, str(write(standard_log(alpha_beta_rows()), "b.txt"))])
    assert enough.exit_code == 0, enough.output


def test_the_launch_floor_never_exceeds_the_fastest_call_measured():
    """A floor is a lower bound on every call: the fastest call measured (per launch) bounds
    it, so no fitted profile predicts a measured row slower than it ran because of its floor
    (the GDR pair's broadcast ran 1 MiB in 70.19 us; an unbounded fit put the floor at 98.7)."""
    gdr = [s for s in dataset_samples() if s.name.startswith("a100pcie-ib-2n1g-gdr-")
           and s.log.collective in ("broadcast", "sendrecv")]  # fmt: skip
    prof = fit_samples(gdr)
    fastest_us = min(float(s.measured_s.min()) / s.log.gpus_per_thread for s in gdr) * 1e6
    assert prof.doc.launch_floor_us <= fastest_us + 1e-6
    assert prof.doc.fit_error is not None and max(prof.doc.fit_error.per_log.values()) < 0.02


def test_a_floor_the_logs_cannot_place_stays_at_the_fastest_call():
    """Superbench's all_reduce ring latencies exceed its launch floor at every size, so its
    all_reduce alone cannot place the floor; the prior keeps it at the fastest call per launch,
    where the system's other collectives (whose small messages take the same ~34 us) need it."""
    bench = [s for s in dataset_samples() if s.name.startswith("a100-40g-8gpu-superbench")]
    prof = fit_samples([s for s in bench if s.log.collective == "all_reduce"])
    fastest = min(float(s.measured_s.min()) for s in bench if s.log.collective == "all_reduce")
    assert prof.doc.launch_floor_us == pytest.approx(fastest * 1e6 / 8, rel=0.05)


def test_a_fixed_cost_above_a_launch_is_not_put_in_the_floor():
    """Two snellius nodes, one GPU per thread, all_reduce alone: its 17 us small messages are
    mostly the network's hops, which this log cannot tell from a launch floor. The prior caps
    the floor at a launch's a-priori cost, so the one-node log (one thread driving four GPUs,
    16.7 us measured) is not predicted at four such floors (68 us; 243% off)."""
    from collsim.model.params import HOST_LAUNCH_S

    samples = dataset_samples()
    two = [s for s in samples if s.name == "h100-snellius-ib-2n-all_reduce-1.txt"]
    prof = fit_samples(two)
    assert prof.doc.launch_floor_us <= HOST_LAUNCH_S * 1e6 * (1 + 1e-6)
    one = [s for s in samples if s.name == "h100-snellius-1n4g-all_reduce-1.txt"]
    small = one[0].sizes <= 4096
    result = validate_samples(one, prof.params())
    errors = [p.rel_err for p in result.logs[0].points if p.bytes <= 4096]
    assert small.any() and max(abs(e) for e in errors) < 1.0


@pytest.mark.parametrize("system", ["aws-eks-2n1g-efa", "a100-40g-8gpu-superbench-all_reduce"])
def test_the_profile_predicts_what_the_fit_minimised(system):
    """A profile applied (``Profile.params``) is the fit's own model at the fitted values, every
    row: the fit's fast path scales every latency by the reference class's latency scale and
    every rate, each channel's ceiling too, by the memory's efficiency, so the profile moves a
    network transport's per-step overhead with the network's latency scale (EFA) and NCCL's
    per-channel ceiling with the memory's efficiency (eight A100 channels on one node bind at
    it). Before, the in-sample error of a100-80g-p4de-efa-2n was 4.4% in the fit and 18% in the
    profile it wrote."""
    samples = [s for s in dataset_samples() if s.name.startswith(system)]
    systems = _systems(samples)
    classes = sorted({k for w in systems.values() for k in classes_used(w)})
    prob = Problem(samples, classes, FIT_BASE, systems=[systems[id(s.topology)] for s in samples])
    # off the prior everywhere: rates at 1.15 (a ceiling 15% above NCCL's), latencies x 2.5
    x = np.array([1.15, 2.5, 3.0, 4.0, 0.5, 0.8, 0.9, *[0.7] * (len(prob.kinds) - 7)])
    params = Profile(_doc(prob, x)).params(FIT_BASE)
    # the channel ceiling the fit's fast path sees (its lines' rates divided by x[0]) is the
    # profile's, wherever a ceiling binds: the memory's efficiency times NCCL's
    fitted = prob.models(x)[0].params.channel_efficiency * x[0]
    assert fitted == pytest.approx(params.channel_efficiency, rel=1e-12)
    for s, fast in zip(samples, prob.predict(x), strict=True):
        slow, _ = Predictor(systems[id(s.topology)], params).predict(
            s.log.collective, s.sizes, env=s.env, elem=elem_bytes(s.log),
            gpus_per_thread=s.log.gpus_per_thread,
        )  # fmt: skip
        np.testing.assert_allclose(fast, slow, rtol=1e-9)


@pytest.mark.parametrize("system", ["a100-p4d-efa-2n", "v100-32g-aws-2n"])
def test_the_fit_predicts_each_log_with_its_nccl_release(system):
    """The fit minimises the model validation applies: each log predicted as the NCCL release
    it ran would choose (2.9.9 / 2.8.3: the tree's correction table of its release, and its
    reduce-then-broadcast tree on NICs at a share of their rate; 2.4.6: no LL128, the tree up to
    its threshold). Before, the fit predicted every log with the newest release's tables and no
    up-then-down tree: on p4d's 256 MiB row half the time validation predicts."""
    samples = [s for s in dataset_samples() if s.name.startswith(system)]
    assert samples and all(s.nccl_version for s in samples)
    systems = _systems(samples)
    classes = sorted({k for w in systems.values() for k in classes_used(w)})
    prob = Problem(samples, classes, FIT_BASE, systems=[systems[id(s.topology)] for s in samples])
    x = np.array([1.15, 2.5, 3.0, 4.0, 0.5, 0.8, 0.9, *[0.7] * (len(prob.kinds) - 7)])
    params = Profile(_doc(prob, x)).params(FIT_BASE)
    validated = validate_samples(samples, params)
    newest = False  # the release matters on these logs (else this test could not fail)
    for s, fast, r in zip(samples, prob.predict(x), validated.logs, strict=True):
        slow = np.array([p.predicted_us for p in r.points]) * 1e-6
        np.testing.assert_allclose(fast, slow, rtol=1e-9)
        latest, _ = Predictor(systems[id(s.topology)], params).predict(
            s.log.collective, s.sizes, env=s.env, elem=elem_bytes(s.log),
            gpus_per_thread=s.log.gpus_per_thread,
        )  # fmt: skip
        newest = newest or not np.allclose(latest, slow, rtol=1e-3)
    assert newest
