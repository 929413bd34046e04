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
    tree_threshold_bytes,
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
