"""NCCL's tree figures by release: the tree efficiency (``busBw * .92``) and the
``treeCorrectionFactor`` table each release's ``tuning.cc`` carries, in the model's parameters,
the Predictor and ``validate``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from collsim.calibration.predict import Predictor, Scale, uncalibrated_params
from collsim.cli import cli
from collsim.model.nccl import tree_correction, tree_efficiency
from collsim.model.nccl_release import parse_nccl_version
from collsim.model.params import ModelParams
from collsim.topology.loader import load_topology

MB = 1 << 20


def test_the_ll128_tree_correction_ends_at_092_from_2_8_to_2_9_only():
    """128 and 256 MB: LL128 .92 in v2.8.3-1..v2.9.9-1, 1.0 from v2.10.3-1 (and the newest)."""
    sizes = np.array([128 * MB, 256 * MB])
    for release in ((2, 8, 3), (2, 9, 9)):
        assert list(tree_correction("LL128", sizes, release)) == [0.92, 0.92]
    for release in ((2, 10, 3), (2, 22, 3), None):
        assert list(tree_correction("LL128", sizes, release)) == [1.0, 1.0]
    # Simple is .9 at both sizes in every release from 2.8
    assert list(tree_correction("Simple", sizes, (2, 9, 9))) == [0.9, 0.9]


def test_older_tables_are_their_own_and_2_5_has_none():
    # 16 MiB (column 18): Simple .6 in 2.7's table, .7 from 2.8; 128 MiB is 2.7's last column
    # (.9) and 256 MiB lies past it (1.0)
    assert tree_correction("Simple", np.array([16 * MB]), (2, 7, 8))[0] == 0.6
    assert tree_correction("Simple", np.array([16 * MB]), (2, 22, 3))[0] == 0.7
    assert list(tree_correction("Simple", np.array([128 * MB, 256 * MB]), (2, 7, 8))) == [0.9, 1.0]
    # 2.6's LL128 row differs from 2.7's at 512 KiB (column 13): .6 against .5
    assert tree_correction("LL128", np.array([512 << 10]), (2, 6, 4))[0] == 0.6
    assert tree_correction("LL128", np.array([512 << 10]), (2, 7, 8))[0] == 0.5
    # v2.5.6-1 has no correction table
    assert list(tree_correction("Simple", np.array([32 * MB, 256 * MB]), (2, 5, 6))) == [1.0, 1.0]


def test_tree_efficiency_by_release():
    assert tree_efficiency((2, 4, 6)) == 1.0  # no tuning model before 2.5
    assert tree_efficiency((2, 5, 6)) == tree_efficiency((2, 7, 8)) == 0.9
    assert tree_efficiency((2, 8, 3)) == tree_efficiency((2, 22, 3)) == 0.92
    assert tree_efficiency() == 0.92


def test_the_release_moves_only_the_tree_all_reduce_and_is_not_stored():
    size = np.array([256 * MB])
    old = ModelParams(tree_correction=True, nccl_release=(2, 9, 9))
    new = ModelParams(tree_correction=True, nccl_release=(2, 22, 3))
    assert old.stretch("all_reduce", "tree", "LL128", size)[0] == pytest.approx(1 / (0.92 * 0.92))
    assert new.stretch("all_reduce", "tree", "LL128", size)[0] == pytest.approx(1 / 0.92)
    assert old.stretch("all_reduce", "ring", "LL128", size) == 1.0
    assert "nccl_release" not in old.to_dict()
    # off (the datasheet defaults the engine shares): no tree figure at all, whatever the release
    plain = ModelParams(nccl_release=(2, 9, 9))
    assert plain.stretch("all_reduce", "tree", "LL128", size) == 1.0


def test_predictor_picks_the_tree_protocol_by_the_logs_release():
    """256 MiB on two p4d nodes: 2.9.9's table prices LL128 at .915 x .92 of the tree against
    Simple's .9, so NCCL runs Simple there; 2.22's keeps LL128 (1.0)."""
    predictor = Predictor(load_topology("p4d", nodes=2), uncalibrated_params())
    sizes = np.array([256 * MB])
    _, old = predictor.predict("all_reduce", sizes, nccl_version="2.9.9+cuda11.2")
    _, new = predictor.predict("all_reduce", sizes, nccl_version="2.22.3")
    assert old == ["tree/Simple/8ch"]
    assert new == ["tree/LL128/8ch"]


def test_predictor_times_the_tree_at_its_releases_efficiency():
    """1 GiB Simple tree on two Snellius-like nodes (IB, no up-then-down): 2.7 prices it at .9,
    2.22 at .92 of its bandwidth; the release leaves the predictor's own model as it was."""
    predictor = Predictor(load_topology("h100-4gpu-ib", nodes=2), uncalibrated_params())
    sizes = np.array([1 << 30])
    env = {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Tree"}
    t27, _ = predictor.predict("all_reduce", sizes, env=env, nccl_version="2.7.8")
    t222, _ = predictor.predict("all_reduce", sizes, env=env, nccl_version="2.22.3")
    assert t27[0] / t222[0] == pytest.approx(0.92 / 0.9, rel=0.005)
    assert predictor.model.params.nccl_release is None


P4D_LOG = "data/nccl-tests/logs/a100-p4d-efa-2n-all_reduce-1.txt"  # NCCL 2.9.9+cuda11.2


def test_validate_runs_the_p4d_logs_256_mib_row_as_its_release_would(tmp_path):
    """The log's 256 MiB row (measured 13.2 ms) ran NCCL 2.9.9's Simple tree at half the NIC:
    collsim priced it as LL128 at the full NIC (6.3 ms, -52%) before the release's table."""
    out = tmp_path / "p4d.json"
    result = CliRunner().invoke(cli, ["validate", P4D_LOG, "-t", "p4d", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "268435456" in result.output and "tree/Simple/8ch" in result.output
    row = next(p for p in json.loads(out.read_text())["logs"][0]["points"]
               if p["bytes"] == 256 * MB)  # fmt: skip
    assert abs(row["rel_err"]) < 0.1, row


def test_a_scaled_model_follows_the_release_too():
    """A profile's view (ScaledModel, as the report predicts with a fit) picks by the release's
    table as the plain model does, and keeps its scale."""
    scale = Scale(bandwidth=0.9)
    predictor = Predictor(load_topology("p4d", nodes=2), uncalibrated_params(), scale=scale)
    sizes = np.array([256 * MB])
    _, old = predictor.predict("all_reduce", sizes, nccl_version="2.9.9+cuda11.2")
    _, new = predictor.predict("all_reduce", sizes, nccl_version="2.22.3")
    assert (old, new) == (["tree/Simple/8ch"], ["tree/LL128/8ch"])
    view = predictor._of_release(parse_nccl_version("2.9.9"))
    assert view.scale is scale and view.model.params.nccl_release == (2, 9, 9)
