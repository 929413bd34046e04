"""The validation report's jobs: cached by what they read, reused unchanged, recomputed after a
change, kept when a later job fails, the same in a process pool as in one process."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from collsim.calibration import report_jobs
from collsim.calibration.dataset import DATA_DIR
from collsim.calibration.report_jobs import Job, digest, run_jobs

LOG = "a100pcie-2gpu-pcie-all_reduce-1.txt"
OTHER = "a100pcie-2gpu-pcie-sendrecv-1.txt"


@pytest.fixture
def dataset(tmp_path):
    """A two-log copy of the bundled dataset, to change."""
    index = yaml.safe_load((DATA_DIR / "index.yaml").read_text())
    keep = [e for e in index["logs"] if e["file"].endswith((LOG, OTHER))]
    folder = tmp_path / "data"
    (folder / "logs").mkdir(parents=True)
    for e in keep:
        shutil.copy(DATA_DIR / e["file"], folder / e["file"])
    (folder / "index.yaml").write_text(yaml.safe_dump({"logs": keep}))
    return folder


def job(name=LOG, **kw):
    return Job(f"predict/{name}", (name,), **kw)


def test_an_unchanged_rerun_reuses_and_a_changed_log_recomputes(dataset, tmp_path):
    cache = tmp_path / "cache"
    first = run_jobs([job()], data_dir=dataset, cache=cache)[job().key]
    assert not first.cached and first.result["uncalibrated"]["s"]
    again = run_jobs([job()], data_dir=dataset, cache=cache)[job().key]
    assert again.cached and again.result == first.result
    log = dataset / "logs" / LOG
    log.write_text(log.read_text() + "# a comment changes the file\n")
    assert not run_jobs([job()], data_dir=dataset, cache=cache)[job().key].cached


def test_the_digest_covers_profiles_and_the_source(dataset, monkeypatch):
    plain = digest(job(), str(dataset))
    assert digest(job(profiles=(("in_sample", "{}"),)), str(dataset)) != plain
    monkeypatch.setattr(report_jobs, "source_version", lambda: "another collsim")
    assert digest(job(), str(dataset)) != plain


def test_results_finished_before_a_failure_are_kept(dataset, tmp_path):
    cache = tmp_path / "cache"
    bad = job(OTHER, cost=0.0, profiles=(("cross_scale", "not a profile"),))  # fails when run
    with pytest.raises(json.JSONDecodeError):
        run_jobs([job(cost=1.0), bad], data_dir=dataset, cache=cache)  # the costlier runs first
    assert run_jobs([job()], data_dir=dataset, cache=cache)[job().key].cached
    stored = json.loads(next(cache.glob("predict_*.json")).read_text())
    assert stored["key"] == job().key and stored["seconds"] >= 0


def test_a_pool_gives_the_same_results_in_the_callers_order(dataset):
    jobs = [job(OTHER, cost=2.0), job(LOG, cost=1.0)]
    lines: list[str] = []
    one = run_jobs(jobs, data_dir=dataset)
    two = run_jobs(jobs, data_dir=dataset, workers=2, progress=lines.append)
    assert list(two) == [j.key for j in jobs]
    assert {k: o.result for k, o in two.items()} == {k: o.result for k, o in one.items()}
    assert len(lines) == 2 and all(line.startswith(("[1/2]", "[2/2]")) for line in lines)
    assert two[jobs[0].key].result["nccl"] == {"error": one[jobs[0].key].result["nccl"]["error"]}
