"""The NCCL release a log ran changes what collsim predicts NCCL chose
(collsim/model/nccl_release.py): parsing, the per-release rules with hand-computed values, the
Predictor following them, and the CLI's --nccl-version."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from collsim.calibration.predict import Predictor, uncalibrated_params
from collsim.cli import cli
from collsim.errors import CalibrationError
from collsim.model.nccl_release import (
    NEWEST,
    NcclVersion,
    effective_version,
    parse_nccl_version,
    tree_connections_per_nic,
    tree_nic_share,
    tree_threshold_bytes,
    with_nic_share,
)
from collsim.topology.loader import load_topology


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("2.9.9+cuda11.2", (2, 9, 9)),
        ("2.26.2 (nccl-headers=22602 nccl-library=22602)", (2, 26, 2)),
        ("v2.21.5-1", (2, 21, 5)),
        ("22602", (2, 26, 2)),  # NCCL_VERSION_CODE from 2.9: major*10000 + minor*100 + patch
        ("2406", (2, 4, 6)),  # before 2.9: major*1000 + minor*100 + patch
    ],
)
def test_versions_as_logs_and_indexes_write_them(text, want):
    assert parse_nccl_version(text) == NcclVersion(*want)


def test_no_version_is_none_and_nonsense_is_one_line_naming_the_field():
    assert parse_nccl_version(None) is None and parse_nccl_version("  ") is None
    with pytest.raises(CalibrationError) as info:
        parse_nccl_version("banana", field="--nccl-version")
    assert info.value.field == "--nccl-version" and info.value.value == "banana"


def test_ll128_and_the_tree_threshold_by_release():
    # v2.4.6-1 has no LL128 and picks the tree by a threshold; both change with v2.5.6-1
    old, new = NcclVersion(2, 4, 6), NcclVersion(2, 5, 6)
    assert not old.has_ll128 and old.tree_by_threshold
    assert new.has_ll128 and not new.tree_by_threshold
    assert NcclVersion(2, 9, 9) < NcclVersion(2, 22, 3) < NEWEST


def test_a_log_without_a_release_gets_the_newest_unless_it_sets_an_old_only_variable():
    assert effective_version(None, {}) == NEWEST
    assert effective_version(None, {"NCCL_TREE_THRESHOLD": "0"}).tree_by_threshold
    assert effective_version(NcclVersion(2, 9, 9), {"NCCL_TREE_THRESHOLD": "0"}) == NcclVersion(
        2, 9, 9
    )


def test_nccl_2_4_tree_threshold_by_hand():
    # NVLink, 2 nodes: tree bandwidth 2 x 3/4 of the ring's -> the tree at every size
    assert tree_threshold_bytes(2, 16, 4, True, {}) == math.inf
    # NVLink, 4 nodes x 8 GPUs, 4 channels: ringbw 20000, treebw 15000 (MB/s);
    # ringlat 6 x 31 = 186, treelat 15 x 2 + 4 x 7 = 58 (us) -> 20000*15000/5000 * 128 bytes
    assert tree_threshold_bytes(4, 32, 4, True, {}) == 7_680_000
    # one node: never a tree; NCCL_TREE_THRESHOLD wins
    assert tree_threshold_bytes(1, 8, 4, True, {}) == 0
    assert tree_threshold_bytes(2, 16, 4, True, {"NCCL_TREE_THRESHOLD": "4096"}) == 4096
    with pytest.raises(CalibrationError):
        tree_threshold_bytes(2, 16, 4, True, {"NCCL_TREE_THRESHOLD": "lots"})


@pytest.fixture(scope="module")
def p3dn_predictor() -> Predictor:
    return Predictor(load_topology("p3dn", nodes=2), uncalibrated_params())


SIZES = np.array([1 << 10, 64 << 10, 1 << 20, 64 << 20, 1 << 30])


def test_predictor_follows_nccl_2_4_on_two_nvlink_nodes(p3dn_predictor):
    _, new = p3dn_predictor.predict("all_reduce", SIZES)
    _, old = p3dn_predictor.predict("all_reduce", SIZES, nccl_version="2.4.6+cuda10.0")
    assert any("LL128" in label for label in new)  # V100 + NVLink: NCCL >= 2.5 enables it
    assert all(label.startswith("tree/") for label in old)  # 2.4: tree at every size here
    assert not any("LL128" in label for label in old)  # 2.4 has no LL128


def test_nccl_tree_threshold_binds_2_4_only(p3dn_predictor):
    env = {"NCCL_TREE_THRESHOLD": "0"}
    _, old = p3dn_predictor.predict("all_reduce", SIZES, env=env, nccl_version="2.4.6")
    assert all(label.startswith("ring/") for label in old)  # 0: never a tree
    _, new = p3dn_predictor.predict("all_reduce", SIZES, env=env, nccl_version="2.22.3")
    assert any(label.startswith("tree/") for label in new)  # gone from 2.5: ignored
    _, unknown = p3dn_predictor.predict("all_reduce", SIZES, env=env)
    assert unknown == old  # a log that sets it ran a release that reads it


LOG = "data/nccl-tests/logs/a100-80g-p4de-efa-2n-all_reduce-1.txt"  # says no NCCL release


def test_validate_takes_the_release_where_the_log_does_not_say(tmp_path):
    runner = CliRunner()
    predicted, tables = {}, {}
    for version in (None, "2.4.6"):
        out = tmp_path / f"{version}.json"
        args = ["validate", LOG, "-t", "p4de", "--json", str(out)]
        result = runner.invoke(cli, [*args, *(["--nccl-version", version] if version else [])])
        assert result.exit_code == 0, result.output
        points = json.loads(out.read_text())["logs"][0]["points"]
        predicted[version] = [p["predicted_us"] for p in points]
        tables[version] = result.output
    assert "LL128" in tables[None] and "LL128" not in tables["2.4.6"]
    assert predicted[None] != predicted["2.4.6"]


def test_validate_refuses_a_version_that_is_not_one():
    result = CliRunner().invoke(
        cli, ["validate", LOG, "-t", "p4de", "--summary", "--nccl-version", "banana"]
    )
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "--nccl-version" in lines[0] and "banana" in lines[0]


# --- the tree's reduce and broadcast in turn (NCCL <= 2.9; CUDA 11.2/11.3 builds for sm >= 80) ---


def test_the_cuda_build_is_read_from_the_version_line_and_does_not_order():
    v = parse_nccl_version("2.9.9+cuda11.2")
    assert v.cuda == (11, 2) and str(v) == "2.9.9+cuda11.2"
    assert v == NcclVersion(2, 9, 9)  # the build is not part of the release's identity
    assert parse_nccl_version("2.26.2 (nccl-headers=22602 nccl-library=22602)").cuda is None


@pytest.mark.parametrize(
    ("text", "cc", "want"),
    [
        ("2.8.3+cuda11.2", 80, True),  # all_reduce.h v2.8.3-1: `#if 1` up then down
        ("2.9.9", 70, True),  # every GPU before 2.10
        ("2.10.3+cuda11.2", 80, True),  # CUDART 11020..11039 on sm_80+
        ("2.10.3+cuda11.3", 90, True),
        ("2.10.3+cuda11.4", 80, False),  # split from 11.4
        ("2.10.3+cuda11.2", 70, False),  # Volta: split
        ("2.18.3", 80, False),  # build unknown: split
    ],
)
def test_which_builds_run_the_tree_up_then_down(text, cc, want):
    assert parse_nccl_version(text).tree_up_then_down(cc) is want
    assert not parse_nccl_version(text).tree_up_then_down(None)  # not an NVIDIA GPU
    assert not parse_nccl_version(text).tree_up_then_down(cc, "LL128")  # NCCL_LL128_SPLIT


def test_the_ll_tree_runs_up_then_down_before_2_10_only():
    # v2.9.9-1 all_reduce.h: the LL tree's up loop, then its down loop; 2.10: runTreeSplit
    assert parse_nccl_version("2.9.9+cuda11.2").tree_up_then_down(80, "LL")
    assert not parse_nccl_version("2.10.3+cuda11.2").tree_up_then_down(80, "LL")


def test_up_then_down_halves_the_connections_per_nic_on_p4d():
    # p4d: 8 tree channels over 4 EFA NICs (the log's `via NET/AWS Libfabric/<nic>` lines): two
    # connections per NIC direction with the phases overlapped, one when they run in turn
    p4d = load_topology("p4d", nodes=2)
    assert tree_connections_per_nic(p4d, 8, up_then_down=False) == 2
    assert tree_connections_per_nic(p4d, 8, up_then_down=True) == 1
    # one EFA connection attains half the line rate: two fill the NIC, one does not
    assert tree_nic_share(p4d, 8, up_then_down=False) == 1.0
    assert tree_nic_share(p4d, 8, up_then_down=True) == 0.5
    # verbs connections fill a NIC alone; one node has no NIC to share
    assert tree_nic_share(load_topology("dgx-a100", nodes=2), 8, up_then_down=True) == 1.0
    assert tree_nic_share(load_topology("p4d", nodes=1), 8, up_then_down=True) == 1.0


def test_with_nic_share_scales_only_the_network_cables():
    p4d = load_topology("p4d", nodes=2)
    half = with_nic_share(p4d, 0.5)
    kinds = {d.name: d.kind for d in p4d.devices}
    for before, after in zip(p4d.links, half.links, strict=True):
        cable = "nic" in (kinds[before.a], kinds[before.b]) and before.kind == "efa"
        assert after.bandwidth_factor == ((0.5, 0.5) if cable else before.bandwidth_factor)


P4D_LOG = "data/nccl-tests/logs/a100-p4d-efa-2n-all_reduce-1.txt"  # NCCL 2.9.9+cuda11.2


def test_p4d_tree_under_nccl_2_9_runs_its_nics_at_half_rate():
    predictor = Predictor(load_topology("p4d", nodes=2), uncalibrated_params())
    sizes = np.array([1 << 30, 4 << 30])
    env = {"NCCL_PROTO": "Simple"}
    old, labels = predictor.predict("all_reduce", sizes, env=env, nccl_version="2.9.9+cuda11.2")
    new, new_labels = predictor.predict("all_reduce", sizes, env=env, nccl_version="2.22.3")
    assert labels == new_labels == ["tree/Simple/8ch"] * 2  # NCCL's choice does not change
    # the NIC-bound tree takes about twice as long with one connection per NIC direction
    assert old / new == pytest.approx([2.0, 2.0], rel=0.05)
    # a CUDA 12 build of a later release splits the phases again
    split, _ = predictor.predict("all_reduce", sizes, env=env, nccl_version="2.18.3+cuda12.2")
    assert split == pytest.approx(new)


def test_validate_predicts_the_p4d_logs_largest_rows_from_its_release(tmp_path):
    # the log's header says NCCL 2.9.9+cuda11.2: its Simple tree reaches half the tree bound
    # (measured 43.8 GB/s busbw at 4 GiB; at line rate collsim predicted 94, +115%)
    out = tmp_path / "p4d.json"
    args = ["validate", P4D_LOG, "-t", "p4d", "--json", str(out), "--nccl-env", "NCCL_PROTO=Simple"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    points = json.loads(out.read_text())["logs"][0]["points"]
    big = [p for p in points if p["bytes"] >= 1 << 30]
    assert big and all(abs(p["measured_us"] / p["predicted_us"] - 1) < 0.12 for p in big), [
        (p["measured_us"], p["predicted_us"]) for p in big
    ]
