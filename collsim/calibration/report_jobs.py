"""The validation report's work as jobs: cached on disk, run in a process pool.

Two kinds of job, each a pure function of its inputs:

* a *fit* (``fit/<mode>/<group>``): :func:`~.fit.fit_samples` on some logs (all their rows, or
  those <= 64 MiB for cross-size); the result is the profile, or why it could not be fitted;
* a *prediction* (``predict/<log>``): one log's predicted time per row, uncalibrated, under
  NCCL's model and under every profile that applies to it, all on one system whose routes are
  built once (at 2160 GPUs routing takes minutes; the models on top of it far less).

Each result is a JSON file under the cache folder, written atomically when its job finishes,
named by the job and a digest of everything it reads: the log files, their index entries and
topology files, the profiles it applies, and the collsim source the jobs run
(:func:`source_version`), so an interrupted run loses only the jobs in flight, an unchanged rerun
reuses every result, and a rerun after any change to that code or the data recomputes. Results
do not depend on the order jobs run in; the caller assembles them in its own fixed order.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from collsim.calibration.dataset import DATA_DIR, load_index, read_entry
from collsim.calibration.fit import Sample, fit_samples
from collsim.calibration.log_context import elem_bytes, env_from_notes, topology_for_log
from collsim.calibration.predict import Predictor, uncalibrated_params
from collsim.calibration.validate import profile_params
from collsim.errors import CollsimError
from collsim.io import atomic_write_text, make_folders
from collsim.model.profile import profile_from_dict
from collsim.topology.loader import resolve
from collsim.whatif import WhatIf

CACHE_FORMAT = 1
"""Bumped when a result's layout changes (part of every digest)."""
SMALL_BYTES = 64 * 1024**2
"""Cross-size fits take the rows up to this size."""
AT_OWN_SCALE = ("in_sample", "cross_collective", "cross_size")
"""Modes whose profile applies as fitted (``Profile.params()``); a cross-scale profile applies on
each system as ``collsim validate`` applies it (:func:`~.validate.profile_params`)."""


@dataclass(frozen=True)
class Job:
    """One unit of work. ``profiles``: (mode, profile as JSON) a prediction applies."""

    key: str
    logs: tuple[str, ...]
    small_rows: bool = False
    profiles: tuple[tuple[str, str], ...] = ()
    cost: float = 0.0  # for the order jobs start in: biggest first

    @property
    def kind(self) -> str:
        return self.key.split("/", 1)[0]


@dataclass
class Outcome:
    """A job's result and where it came from."""

    result: dict[str, Any]
    seconds: float
    cached: bool


@dataclass
class RunStats:
    """What a run did: per job its outcome, and the run's wall time."""

    outcomes: dict[str, Outcome] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def computed(self) -> int:
        return sum(not o.cached for o in self.outcomes.values())


NOT_RUN_BY_JOBS = ("cli/", "report/", "sweep/", "calibration/report.py",
                   "calibration/report_text.py", "calibration/targets.py",
                   "calibration/scale_series.py")  # fmt: skip
"""Source files no job imports (the CLI, the plots, the report's assembly and text): changing
them leaves every cached result valid, so the report's wording and plots regenerate in seconds."""


@lru_cache(maxsize=1)
def source_version() -> str:
    """A digest of the collsim source the jobs run: every ``.py`` file of the package (path and
    content) but :data:`NOT_RUN_BY_JOBS`."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(f"format {CACHE_FORMAT}".encode())
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix().startswith(NOT_RUN_BY_JOBS):
            continue
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@lru_cache(maxsize=4)
def _entries(data_dir: str) -> dict[str, Any]:
    return {e.name: e for e in load_index(data_dir)}


def _entry_digest(data_dir: str, name: str) -> str:
    e = _entries(data_dir)[name]
    h = hashlib.sha256(e.path.read_bytes())
    h.update(repr({k: v for k, v in vars(e).items() if k != "path"}).encode())
    h.update(resolve(e.topology).read_bytes())
    return h.hexdigest()


def digest(job: Job, data_dir: str) -> str:
    """Everything ``job`` reads, hashed (module docstring)."""
    h = hashlib.sha256(source_version().encode())
    h.update(json.dumps([job.key, job.small_rows, job.profiles]).encode())
    for name in job.logs:
        h.update(_entry_digest(data_dir, name).encode())
    return h.hexdigest()


def load_sample(data_dir: str, name: str) -> Sample:
    """One dataset log on its sized catalog topology (as ``report.dataset_samples`` builds it)."""
    e = _entries(data_dir)[name]
    log = read_entry(e)
    topo = topology_for_log(e.topology, log, **e.topology_overrides())
    return Sample(log, topo, env_from_notes(e.notes), e.name, e.nccl_version)


def _small(s: Sample) -> Sample:
    out = Sample(s.log, s.topology, s.env, s.name, s.nccl_version)
    keep = s.sizes <= SMALL_BYTES
    out.sizes, out.measured_s = s.sizes[keep], s.measured_s[keep]
    return out


def run_job(job: Job, data_dir: str) -> dict[str, Any]:
    """``job``'s result as JSON-ready data (a failure the data explains is a result too)."""
    samples = [load_sample(data_dir, n) for n in job.logs]
    if job.kind == "fit":
        group = [_small(s) for s in samples] if job.small_rows else samples
        try:
            return {"profile": fit_samples(group).to_dict()}
        except CollsimError as exc:
            return {"error": exc.message}
    (s,) = samples
    system = WhatIf(s.topology)  # one system: every model below shares its routes
    out: dict[str, Any] = {}
    version = s.nccl_version  # the release the log names, else the index's (as the fit's)

    def predict(mode: str, params: Any = None, model: str = "collsim") -> None:
        try:
            pred = Predictor(system, params if params is not None else uncalibrated_params(),
                             model=model)  # fmt: skip
            t, labels = pred.predict(s.log.collective, s.sizes, env=s.env,
                                     elem=elem_bytes(s.log),
                                     gpus_per_thread=s.log.gpus_per_thread,
                                     nccl_version=version)  # fmt: skip
            out[mode] = {"s": [float(x) for x in np.asarray(t)], "labels": list(labels)}
        except CollsimError as exc:  # NCCL's model has no alltoall / sendrecv
            out[mode] = {"error": exc.message}

    predict("uncalibrated")
    predict("nccl", model="nccl")
    for mode, text in job.profiles:
        prof = profile_from_dict(json.loads(text))
        on = prof.params() if mode in AT_OWN_SCALE else profile_params(prof, system)
        predict(mode, on)
    return out


def _cache_path(cache: Path, job: Job, key_digest: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", job.key)
    return cache / f"{safe}.{key_digest[:20]}.json"


def _timed(job: Job, data_dir: str) -> tuple[dict[str, Any], float]:
    t0 = time.perf_counter()
    result = run_job(job, data_dir)
    return result, time.perf_counter() - t0


def run_jobs(
    jobs: Sequence[Job],
    *,
    data_dir: str | Path | None = None,
    cache: str | Path | None = None,
    workers: int = 1,
    progress: Callable[[str], None] | None = None,
    stats: RunStats | None = None,
) -> dict[str, Outcome]:
    """Every job's outcome, from the cache where its digest is there, else computed (in
    ``workers`` processes, the costliest first) and stored at once. ``progress`` gets one line
    per job."""
    folder = str(data_dir if data_dir is not None else DATA_DIR)
    store = make_folders(Path(cache), folder=True) if cache is not None else None
    stats = stats if stats is not None else RunStats()
    t0 = time.perf_counter()
    todo: list[tuple[Job, Path | None]] = []
    for job in jobs:
        path = _cache_path(store, job, digest(job, folder)) if store is not None else None
        if path is not None and path.is_file():
            doc = json.loads(path.read_text())
            stats.outcomes[job.key] = Outcome(doc["result"], doc["seconds"], True)
        else:
            todo.append((job, path))
    total, done = len(jobs), len(jobs) - len(todo)
    if progress is not None and done:
        progress(f"[{done}/{total}] reused from the cache")

    def finish(job: Job, path: Path | None, result: dict[str, Any], seconds: float) -> None:
        nonlocal done
        done += 1
        stats.outcomes[job.key] = Outcome(result, seconds, False)
        if path is not None:
            atomic_write_text(path, json.dumps({"key": job.key, "seconds": seconds,
                                                "result": result}))  # fmt: skip
        if progress is not None:
            elapsed = time.perf_counter() - t0
            progress(f"[{done}/{total}] {job.key}: {seconds:.0f} s (run {elapsed:.0f} s)")

    todo.sort(key=lambda jp: -jp[0].cost)
    if workers <= 1 or len(todo) <= 1:
        for job, path in todo:
            finish(job, path, *_timed(job, folder))
    else:
        with ProcessPoolExecutor(max_workers=min(workers, len(todo))) as pool:
            running = {pool.submit(_timed, job, folder): (job, path) for job, path in todo}
            while running:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    job, path = running.pop(fut)
                    finish(job, path, *fut.result())
    stats.wall_s += time.perf_counter() - t0
    return {job.key: stats.outcomes[job.key] for job in jobs}
