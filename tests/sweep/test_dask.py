"""The same sweep on a Dask LocalCluster (loopback only) gives byte-identical results."""

from __future__ import annotations

import signal

import pytest

from collsim.sweep import load_spec, run_sweep

distributed = pytest.importorskip("dask.distributed")

TIME_LIMIT_S = 120


@pytest.fixture
def scheduler():
    def give_up(*_):  # a hung cluster must fail the test, not the suite
        raise TimeoutError(f"Dask test took over {TIME_LIMIT_S} s")

    old = signal.signal(signal.SIGALRM, give_up)
    signal.alarm(TIME_LIMIT_S)
    try:
        with distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
            dashboard_address=None,
        ) as cluster:  # fmt: skip
            yield cluster.scheduler_address
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_dask_matches_local(spec_file, tmp_path, scheduler):
    assert scheduler.startswith("tcp://127.0.0.1:")
    spec = load_spec(spec_file(engines=["analytic", "des"], sizes=["1K", "1M"]))
    local = run_sweep(spec, tmp_path / "local", jobs=2)
    dask = run_sweep(spec, tmp_path / "dask", executor="dask", scheduler=scheduler)
    assert dask.computed_tasks == len(spec.tasks) and not dask.interrupted
    assert dask.points == local.points == spec.n_points
    a = (tmp_path / "local/points.csv").read_bytes()
    b = (tmp_path / "dask/points.csv").read_bytes()
    assert a == b
    again = run_sweep(spec, tmp_path / "dask", executor="dask", scheduler=scheduler)
    assert again.computed_tasks == 0  # resumes on Dask too
