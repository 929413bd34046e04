"""CI end to end for real: the torch runner on gloo over loopback (2 and 4 processes), then
read -> fit -> validate through the CLI. CPU timing on a shared machine is noisy, so only
completion and a finite, reported in-sample error are asserted (not an accuracy)."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from collsim.calibration import read_log
from collsim.cli import cli
from collsim.model.profile import load_profile

pytest.importorskip("torch")


@pytest.mark.parametrize("nprocs", [2, 4])
def test_gloo_run_read_fit_validate(tmp_path, nprocs):
    runner = CliRunner()
    out = tmp_path / "res"
    run = runner.invoke(
        cli,
        ["calibrate", "run", "--runner", "torch", "--backend", "gloo", "--nprocs", str(nprocs),
         "-c", "all_reduce,all_gather", "-b", "1K", "-e", "256K", "-f", "4", "-w", "1", "-n", "3",
         "--timeout", "60", "--out", str(out)],
        catch_exceptions=False,
    )  # fmt: skip
    assert run.exit_code == 0, run.output
    logs = [str(out / "logs" / f"{c}.txt") for c in ("all_reduce", "all_gather")]
    for path in logs:
        log = read_log(path)
        assert log.ranks == nprocs and len(log.rows) == 5

    profile = tmp_path / "gloo.yaml"
    fit = runner.invoke(
        cli,
        ["calibrate", "fit", *logs, "--topology", "localhost-gloo", "-o", str(profile)],
        catch_exceptions=False,
    )
    assert fit.exit_code == 0, fit.output
    assert "in-sample MAPE" in fit.output
    prof = load_profile(profile)
    assert prof.doc.topology.name == "localhost-gloo"
    assert prof.doc.topology.gpus_per_node == nprocs
    assert prof.doc.fit_error is not None and math.isfinite(prof.doc.fit_error.mape)
    assert sorted(prof.doc.provenance.collectives) == ["all_gather", "all_reduce"]

    report = tmp_path / "v.json"
    val = runner.invoke(
        cli,
        ["validate", *logs, "--topology", "localhost-gloo", "--profile", str(profile),
         "--json", str(report)],
        catch_exceptions=False,
    )  # fmt: skip
    assert val.exit_code == 0, val.output
    assert "overall MAPE" in val.output
    doc = json.loads(report.read_text())
    assert math.isfinite(doc["mape"]) and len(doc["logs"]) == 2
    assert all(len(entry["points"]) == 5 for entry in doc["logs"])
