"""``collsim validate`` and profiles: JSON schema, plots, --profile on simulate, clear errors for
a profile of another topology and for malformed profile files."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import collsim.cli.base as cli_base
from collsim.calibration.dataset import DATA_DIR
from collsim.cli import cli
from collsim.errors import CalibrationError
from collsim.model.profile import load_profile

LOGS = DATA_DIR / "logs"
AR = str(LOGS / "h100-8gpu-together-ring-all_reduce-1.txt")
AG = str(LOGS / "h100-8gpu-together-ring-all_gather-1.txt")


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("prof") / "h100.yaml"
    result = CliRunner().invoke(
        cli, ["calibrate", "fit", AR, "-t", "dgx-h100", "--nodes", "1", "-o", str(path)]
    )
    assert result.exit_code == 0, result.output
    return path


def test_validate_json_schema_and_plot(profile, tmp_path):
    js, png = tmp_path / "v.json", tmp_path / "v.png"
    result = CliRunner().invoke(
        cli,
        ["validate", AR, AG, "-t", "dgx-h100", "--nodes", "1", "--profile", str(profile),
         "--json", str(js), "--plot", str(png)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "overall MAPE" in result.output and "pred us" in result.output
    doc = json.loads(js.read_text())
    assert set(doc) == {"mape", "logs"}
    assert [e["collective"] for e in doc["logs"]] == ["all_reduce", "all_gather"]
    entry = doc["logs"][0]
    assert set(entry) == {"file", "collective", "ranks", "nodes", "mape", "points"}
    assert entry["ranks"] == 8 and entry["nodes"] == 1
    point = entry["points"][-1]
    assert set(point) == {"bytes", "measured_us", "predicted_us", "measured_busbw_gbps",
                          "predicted_busbw_gbps", "rel_err"}  # fmt: skip
    rel = abs(point["predicted_us"] - point["measured_us"]) / point["measured_us"]
    assert point["rel_err"] == pytest.approx(rel)
    mean = sum(p["rel_err"] for p in entry["points"]) / len(entry["points"])
    assert entry["mape"] == pytest.approx(mean)
    assert png.stat().st_size > 1000


def test_calibrated_beats_uncalibrated(profile):
    def mape(extra):
        r = CliRunner().invoke(cli, ["validate", AR, "-t", "dgx-h100", "--nodes", "1",
                                     "--summary", *extra])  # fmt: skip
        assert r.exit_code == 0, r.output
        return float(r.output.split("overall MAPE ")[1].split("%")[0])

    assert mape(["--profile", str(profile)]) < mape([])
    assert mape(["--model", "nccl"]) > 0


def test_profile_for_another_topology_is_an_error(profile):
    result = CliRunner().invoke(
        cli, ["validate", AR, "-t", "dgx-a100", "--nodes", "1", "--profile", str(profile)]
    )
    assert result.exit_code == 2
    assert "dgx-h100" in result.output and "dgx-a100" in result.output
    assert str(profile) in result.output
    sim = CliRunner().invoke(
        cli, ["simulate", "all_reduce", "-t", "dgx-a100", "--profile", str(profile)]
    )
    assert sim.exit_code == 2 and "dgx-h100" in sim.output


def test_simulate_and_step_accept_the_profile(profile):
    base = ["simulate", "all_reduce", "-t", "dgx-h100", "--nodes", "1", "-b", "1G", "-e", "1G"]
    for engine in ("analytic", "des"):
        raw = CliRunner().invoke(cli, [*base, "--engine", engine])
        cal = CliRunner().invoke(cli, [*base, "--engine", engine, "--profile", str(profile)])
        assert raw.exit_code == 0 and cal.exit_code == 0, cal.output
        assert "calibrated with" in cal.output and cal.output != raw.output
        assert "NCCL picks the protocol and channels per size" in cal.output


def test_tune_prices_its_candidates_under_the_profile(profile, tmp_path):
    """simulate times what it is asked (Simple on one channel by default); tune shows what NCCL
    would pick per size, now under a fitted profile too (the bundled profile's links are
    slower than the datasheet, so every candidate takes longer)."""
    base = ["tune", "all_reduce", "-t", "dgx-h100", "--nodes", "1", "-b", "1M", "-e", "1G"]
    raw = CliRunner().invoke(cli, [*base, "--json", str(tmp_path / "raw.json")])
    cal = CliRunner().invoke(
        cli, [*base, "--profile", str(profile), "--json", str(tmp_path / "cal.json")]
    )
    assert raw.exit_code == 0 and cal.exit_code == 0, cal.output
    assert "calibrated with" in cal.output
    before = json.loads((tmp_path / "raw.json").read_text())["points"]
    after = json.loads((tmp_path / "cal.json").read_text())["points"]
    assert all(a["time_us"] > b["time_us"] for a, b in zip(after, before, strict=True))
    refused = CliRunner().invoke(cli, [*base, "--model", "nccl", "--profile", str(profile)])
    assert refused.exit_code == 2 and "NCCL's model takes no profile" in refused.output


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d.update(bogus=1), "bogus"),
        (lambda d: d.update(base_latency_us="fast"), "base_latency_us"),
        (lambda d: d.pop("topology"), "topology"),
        (lambda d: d["link_classes"]["nvlink"].update(bandwidth_efficiency=-1), "link_classes"),
    ],
)
def test_malformed_profile_is_one_line(profile, tmp_path, edit, field):
    import yaml

    doc = yaml.safe_load(profile.read_text())
    edit(doc)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(CalibrationError) as err:
        load_profile(bad)
    msg = str(err.value)
    assert str(bad) in msg and field in msg and "\n" not in msg
    result = CliRunner().invoke(cli, ["validate", AR, "-t", "dgx-h100", "--nodes", "1",
                                      "--profile", str(bad)])  # fmt: skip
    assert result.exit_code == 2 and field in result.output


def test_bad_logs_are_clear_errors(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    notable = tmp_path / "notable.txt"
    notable.write_text("# nothing here\nhello\n")
    for path in (empty, notable):
        for cmd in (["validate"], ["calibrate", "fit"]):
            args = [
                *cmd,
                str(path),
                "-t",
                "dgx-h100",
                "-o" if cmd[0] != "validate" else "--summary",
            ]
            if cmd[0] != "validate":
                args.append(str(tmp_path / "p.yaml"))
            result = CliRunner().invoke(cli, args)
            assert result.exit_code == 2, result.output
            assert str(path) in result.output


def test_step_accepts_the_profile(profile):
    base = ["step", "-w", "gpt-1.3b-ddp", "-t", "dgx-h100", "--nodes", "1"]
    raw = CliRunner().invoke(cli, base)
    cal = CliRunner().invoke(cli, [*base, "--profile", str(profile)])
    assert raw.exit_code == 0 and cal.exit_code == 0, cal.output
    assert cal.output != raw.output
    other = CliRunner().invoke(
        cli, ["step", "-w", "gpt-1.3b-ddp", "-t", "dgx-a100", "--nodes", "1",
              "--profile", str(profile)]
    )  # fmt: skip
    assert other.exit_code == 2 and "dgx-h100" in other.output and "dgx-a100" in other.output


def test_a_log_cut_mid_row_is_validated_and_fitted_on_its_complete_rows(tmp_path):
    """A run killed mid-row was refused whole (exit 2, "result row is cut short"): validate and
    fit now use the rows it completed and say which row was left out, at which line (issue 26)."""
    text = (LOGS / "h100-8gpu-together-ring-all_reduce-1.txt").read_text()
    lines = text.splitlines()
    last_row = max(i for i, line in enumerate(lines) if line.strip()[:1].isdigit())
    cut = tmp_path / "cut.txt"
    cut.write_text("\n".join([*lines[:last_row], lines[last_row][:40]]) + "\n")
    note = f"# note: cut.txt: result row at line {last_row + 1} left out: the file ends inside it"
    result = CliRunner().invoke(cli, ["validate", str(cut), "-t", "dgx-h100", "--nodes", "1"])
    assert result.exit_code == 0, result.output
    assert note in result.output and "complete row(s) read" in result.output
    measured = [line for line in result.output.splitlines() if line[:1] == " "]
    assert len(measured) == sum(line.strip()[:1].isdigit() for line in lines) - 1
    fit = ["calibrate", "fit", str(cut), "-t", "dgx-h100", "--nodes", "1", "-o",
           str(tmp_path / "p.yaml")]  # fmt: skip
    result = CliRunner().invoke(cli, fit)
    assert result.exit_code == 0, result.output
    assert note in result.output and (tmp_path / "p.yaml").is_file()
    full = str(LOGS / "h100-8gpu-together-ring-all_reduce-1.txt")
    whole = CliRunner().invoke(cli, ["validate", full, "-t", "dgx-h100", "--nodes", "1"])
    assert whole.exit_code == 0 and "left out" not in whole.output


def test_rank_mismatch_is_a_clear_error():
    p4d = str(LOGS / "a100-p4d-efa-2n-all_reduce-1.txt")  # 16 ranks on 2 nodes
    result = CliRunner().invoke(cli, ["validate", p4d, "-t", "dgx-a100", "--nodes", "1"])
    assert result.exit_code == 2
    assert "16 ranks" in result.output and "8 GPUs" in result.output
    ok = CliRunner().invoke(cli, ["validate", p4d, "-t", "p4d", "--summary"])
    assert ok.exit_code == 0, ok.output


def test_a_log_is_not_modelled_on_other_nodes_than_it_ran_on(tmp_path):
    """8 ranks on one host are not h100-4gpu-ib's default 2 nodes x 4 GPUs, although the GPU
    counts agree: its network was never used (it was modelled there silently, 55% off). A
    template resizes to the log's nodes (as it does for another rank count); a fixed graph
    cannot, which is an error naming the nodes; the flags still decide."""
    from collsim.calibration.log_context import topology_for_log
    from collsim.calibration.nccltests import read_log
    from collsim.topology.loader import load_topology

    log = read_log(AR)
    sized = topology_for_log("h100-4gpu-ib", log)
    assert (sized.nodes, sized.gpus_per_node) == (1, 8)
    fixed = load_topology("h100-4gpu-ib")  # a built topology is taken as it is
    with pytest.raises(CalibrationError) as err:
        topology_for_log(fixed, log)
    assert err.value.field == "nodes" and "ran on 1 node (8 ranks" in err.value.message
    assert "2 nodes x 4 GPUs" in err.value.message
    forced = ["validate", AR, "-t", "h100-4gpu-ib", "--nodes", "2", "--summary"]
    result = CliRunner().invoke(cli, forced)
    assert result.exit_code == 0 and "(2 nodes)" in result.output  # what was modelled
    assert "the log ran on 1 node; modelled on 2 nodes of 4 GPUs" in result.output
    two = str(LOGS / "h100-snellius-ib-2n-all_reduce-1.txt")  # 2 hosts x 4 GPUs
    result = CliRunner().invoke(cli, ["validate", two, "-t", "dgx-h100", "--summary"])
    assert result.exit_code == 0 and "(2 nodes)" in result.output  # 2 DGX nodes of 4 GPUs
    one = str(LOGS / "h100-snellius-1n4g-all_reduce-1.txt")  # the template shrinks to 1 x 4
    result = CliRunner().invoke(cli, ["validate", one, "-t", "h100-4gpu-ib", "--summary"])
    assert result.exit_code == 0 and "(1 node)" in result.output


def test_nccl_settings_a_log_does_not_record_can_be_given(tmp_path):
    """The Together AI H100 logs ran with NCCL_ALGO=RING, which only their source says (the
    dataset's notes): --nccl-env gives it, and validate then reproduces the report's number
    for the log; a malformed setting is a one-line error naming the flag."""
    from collsim.calibration.predict import uncalibrated_params
    from collsim.calibration.report import dataset_samples
    from collsim.calibration.validate import validate_samples

    name = "h100-8gpu-together-ring-all_reduce-1.txt"
    report = validate_samples([s for s in dataset_samples() if s.name == name],
                              uncalibrated_params())  # fmt: skip
    log = f"data/nccl-tests/logs/{name}"
    base = ["validate", log, "-t", "dgx-h100", "--nodes", "1", "--json"]
    ring, plain = tmp_path / "ring.json", tmp_path / "plain.json"
    runner = CliRunner()
    assert runner.invoke(cli, [*base, str(ring), "--nccl-env", "NCCL_ALGO=Ring"]).exit_code == 0
    assert runner.invoke(cli, [*base, str(plain)]).exit_code == 0
    got = json.loads(ring.read_text())["mape"]
    assert got == pytest.approx(report.mape, rel=1e-9)
    assert json.loads(plain.read_text())["mape"] != pytest.approx(got)
    for wrong in ("ALGO=Ring", "NCCL_ALGO=bogus", "NCCL_PROTO=LL256", "NCCL_MIN_NCHANNELS=x"):
        bad = runner.invoke(cli, [*base[:-1], "--nccl-env", wrong])
        assert bad.exit_code == 2 and "'--nccl-env'" in bad.output, wrong


def test_nccl_settings_collsim_does_not_model_are_named_not_dropped():
    """A real NCCL setting collsim ignores (an interface name) or a typo of one it models is
    said, with the name meant; the prediction is the same as without it."""
    log = "data/nccl-tests/logs/h100-8gpu-together-ring-all_reduce-1.txt"
    base = ["validate", log, "-t", "dgx-h100", "--nodes", "1", "--summary"]
    runner = CliRunner()
    plain = runner.invoke(cli, base)
    extra = runner.invoke(cli, [*base, "--nccl-env", "NCCL_SOCKET_IFNAME=eth0",
                                "--nccl-env", "NCCL_ALG0=Ring"])  # fmt: skip
    assert plain.exit_code == 0 and extra.exit_code == 0
    notes = [ln for ln in extra.output.splitlines() if ln.startswith("# note: --nccl-env")]
    assert len(notes) == 2
    assert "NCCL_ALG0 is not modelled" in notes[0] and "did you mean NCCL_ALGO?" in notes[0]
    assert "NCCL_SOCKET_IFNAME is not modelled" in notes[1] and "did you mean" not in notes[1]
    assert [ln for ln in extra.output.splitlines() if ln not in notes] == plain.output.splitlines()


def test_validate_shows_progress_on_a_terminal(monkeypatch):
    """Long validations (a 540-node log takes minutes) show a bar per log on a terminal only."""
    args = ["validate", AR, AG, "-t", "dgx-h100", "--nodes", "1", "--summary"]
    quiet = CliRunner().invoke(cli, args)
    assert quiet.exit_code == 0 and "validate" not in quiet.stderr
    monkeypatch.setattr(cli_base, "show_progress", lambda: True)
    shown = CliRunner().invoke(cli, args)
    assert shown.exit_code == 0, shown.output
    assert "validate: 100%" in shown.stderr and "2/2" in shown.stderr
    assert shown.stdout == quiet.stdout  # the bar goes to stderr, the results are unchanged
