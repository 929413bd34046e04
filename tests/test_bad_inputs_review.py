"""Bad inputs a review found taking a traceback, a hang or a silent default (each was one)."""

from __future__ import annotations

import json

import pytest
import yaml

from collsim.cli import main
from collsim.io import YAML_MAX_VALUES, yaml_load


def _error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_yaml_within_the_limits_still_loads():
    assert yaml_load("a: " + "[" * 100 + "]" * 100) is not None  # deep, but parseable
    base = {"x": [1, 2, 3]}
    assert yaml_load("b: &b [1, 2, 3]\nc: [*b, *b]\n<<: {d: 1}") == {
        "b": [1, 2, 3], "c": [[1, 2, 3], [1, 2, 3]], "d": 1}  # fmt: skip
    assert yaml_load(yaml.safe_dump(base)) == base


def test_yaml_aliases_that_expand_past_the_limit_are_refused():
    lines = ["a0: &a0 [" + ", ".join(["x"] * 10) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 7)]
    with pytest.raises(yaml.YAMLError) as err:
        yaml_load("\n".join(lines))  # 10**7 values in 7 lines
    assert f"{YAML_MAX_VALUES:,}" in str(err.value)


def test_a_json_profile_nested_too_deeply_is_one_line(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    err = _error(["step", "-w", "resnet50", "-t", "dgx-h100", "--profile", str(deep)], capsys)
    assert "nested too deeply" in err and str(deep) in err


@pytest.mark.parametrize(
    ("profile", "field"),
    [
        ({"step": {"efficency": 0.5}}, "'step.efficency'"),  # a typo was ignored
        ({"step": {"efficiency": 0.5, "bogus": 3}}, "'step.bogus'"),
        ({"step": "fast"}, "'step'"),
        ({"step": {"efficiency": 2}}, "'step.efficiency'"),
    ],
)
def test_a_profiles_step_block_is_checked(profile, field, tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    err = _error(["step", "-w", "resnet50", "-t", "dgx-h100", "--profile", str(path)], capsys)
    assert field in err


def test_a_profiles_step_efficiency_is_used(tmp_path, capsys):
    def mfu(eff: float) -> str:
        path = tmp_path / f"p{eff}.json"
        path.write_text(json.dumps({"step": {"efficiency": eff}}))
        with pytest.raises(SystemExit) as info:
            main(["step", "-w", "gpt-1.3b-ddp", "-t", "dgx-h100", "--profile", str(path)])
        assert info.value.code == 0
        return next(ln for ln in capsys.readouterr().out.splitlines() if "MFU" in ln)

    assert mfu(0.3) != mfu(0.6)


def test_straggler_jobs_are_bounded(capsys):
    args = ["stragglers", "all_reduce", "-t", "dgx-h100", "--nodes", "1", "-n", "2"]
    err = _error([*args, "-j", "100000"], capsys)
    assert "'--jobs'" in err and "100000" in err


def test_two_clusters_of_one_name_are_refused(tmp_path, capsys):
    cand = tmp_path / "c.yaml"
    cluster = {"name": "a", "topology": "dgx-h100", "nodes": [1], "gpu_hour_usd": 2}
    cand.write_text(yaml.safe_dump({"clusters": [cluster, {**cluster, "gpu_hour_usd": 3}]}))
    err = _error(["plan", "-w", "gpt-1.3b-ddp", "-c", str(cand)], capsys)
    assert "'clusters'" in err and "'a'" in err


def test_report_on_a_corrupt_sweep_spec_is_one_line(tmp_path, capsys):
    from collsim.sweep import load_spec, run_sweep
    from tests.sweep.conftest import SPEC

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({**SPEC, "sizes": ["1K"], "nodes": [1], "steps": None}))
    run_sweep(load_spec(spec), tmp_path / "res", jobs=1)
    (tmp_path / "res" / "spec.json").write_text("{bad")
    err = _error(["report", str(tmp_path / "res"), "-o", str(tmp_path / "rep")], capsys)
    assert "spec.json" in err and "unreadable sweep spec" in err
