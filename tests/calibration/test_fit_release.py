"""``calibrate fit --nccl-version``: a log that names no NCCL release is fitted with the given
release's choices (as ``validate --nccl-version`` predicts it), the profile records which release
each log was fitted with, and a value that is no release is one line, exit 2."""

from __future__ import annotations

import json

from click.testing import CliRunner

from collsim.calibration.session import load_samples, release_lines
from collsim.cli import cli

L = "data/nccl-tests/logs"
NO_RELEASE = f"{L}/a100-40g-8gpu-superbench-all_reduce-1.txt"  # its header names none
OWN_RELEASE = f"{L}/a100pcie-2gpu-pcie-all_reduce-1.txt"  # NCCL 2.16.5+cuda11.8


def _fit(tmp_path, *extra: str) -> tuple[str, dict]:
    out = tmp_path / f"p{len(list(tmp_path.iterdir()))}.json"
    result = CliRunner().invoke(
        cli, ["calibrate", "fit", NO_RELEASE, "-t", "dgx-a100", "-o", str(out), *extra]
    )
    assert result.exit_code == 0, result.output
    return result.output, json.loads(out.read_text())


def test_fit_follows_the_given_release_where_the_log_names_none(tmp_path):
    newest_out, newest = _fit(tmp_path)
    old_out, old = _fit(tmp_path, "--nccl-version", "2.4.6")
    assert "NCCL release not known: the newest behaviour" in newest_out
    assert "NCCL release 2.4.6 (--nccl-version): a100-40g-8gpu-superbench" in old_out
    assert newest["provenance"]["nccl_releases"] == {}
    assert old["provenance"]["nccl_releases"] == {
        "a100-40g-8gpu-superbench-all_reduce-1.txt": "2.4.6"
    }
    # 2.4 has no LL128 and picks tree or ring by a size threshold: another model was fitted
    assert old["fit_error"]["per_log"] != newest["fit_error"]["per_log"]
    # the profile fitted under 2.4.6 predicts its log as `validate --nccl-version 2.4.6` does
    prof = tmp_path / "old.json"
    prof.write_text(json.dumps(old))
    val = CliRunner().invoke(
        cli,
        ["validate", NO_RELEASE, "-t", "dgx-a100", "--profile", str(prof), "--summary",
         "--nccl-version", "2.4.6"],
    )  # fmt: skip
    assert val.exit_code == 0, val.output
    mape = old["fit_error"]["per_log"]["a100-40g-8gpu-superbench-all_reduce-1.txt"]
    assert f"{100 * mape:.1f}%" in val.output


def test_fit_refuses_a_version_that_is_not_one(tmp_path):
    out = tmp_path / "p.yaml"
    result = CliRunner().invoke(
        cli, ["calibrate", "fit", NO_RELEASE, "-t", "dgx-a100", "-o", str(out),
              "--nccl-version", "2.x"],
    )  # fmt: skip
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "--nccl-version" in lines[0] and "2.x" in lines[0]
    assert "Traceback" not in result.output and not out.exists()


def test_a_logs_own_release_wins_over_the_given_one():
    own, none = load_samples([OWN_RELEASE, NO_RELEASE], "dgx-a100", nccl_version="2.9.9")
    assert (own.nccl_version, none.nccl_version) == ("2.16.5+cuda11.8", "2.9.9")
    lines = release_lines([own, none], "2.9.9")
    assert lines == [
        "NCCL release 2.16.5+cuda11.8 (the log's own): a100pcie-2gpu-pcie-all_reduce-1.txt",
        "NCCL release 2.9.9 (--nccl-version): a100-40g-8gpu-superbench-all_reduce-1.txt",
    ]
