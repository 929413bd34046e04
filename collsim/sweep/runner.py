"""Run a sweep's tasks on an executor, keeping each task's rows the moment it completes.

Results directory (``collsim sweep SPEC -o RESULTS``)::

    manifest.json         the tasks done: per task its file, size and SHA-256 (the calibration
                          :class:`~collsim.calibration.store.ResultStore`: atomic writes, recorded
                          only after the file is complete)
    parts/<key>.csv       one finished task's rows (key: a hash of the task's inputs and files)
    points.csv            every point of the spec done so far, one row per point, sorted by task
                          then by algorithm and size: rewritten at the end, on Ctrl-C and on resume
    spec.json             the validated spec (``collsim report`` reads its name)

A rerun skips the tasks whose part file is intact, so an interrupted or extended sweep resumes.
Executors: ``local`` (a process pool over the machine's cores) and ``dask`` (a
``dask.distributed`` scheduler); both run :func:`collsim.sweep.tasks.run_task`, so their
``points.csv`` are byte-identical.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import json
import math
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from collsim.calibration.store import ResultStore
from collsim.errors import CollsimError
from collsim.io import atomic_write_text, directory_lock
from collsim.sweep.spec import SweepError, SweepSpec, Task
from collsim.sweep.tasks import COLUMNS, run_task, to_csv

EXECUTORS = ("local", "dask")
POINTS = "points.csv"


@dataclass
class SweepOutcome:
    """What a run did."""

    path: Path
    tasks: int
    points: int
    reused_tasks: int
    computed_tasks: int
    computed_points: int
    interrupted: bool = False
    problems: tuple[str, ...] = ()  # what an earlier, interrupted or damaged run left (not used)
    errors: tuple[str, ...] = ()  # the 'error' cell of each row that could not be computed


@functools.cache
def code_version() -> str:
    """A fingerprint of this collsim's source (every module's bytes): results of another build
    are not mixed into a resumed sweep."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    from importlib import metadata

    try:
        version = metadata.version("collsim")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        version = "source"
    return f"{version}+{digest.hexdigest()[:12]}"


def _check_folder(root: Path) -> None:
    """A folder holding anything else is not ours to write in (checked before the lock, whose
    file would be left in it)."""
    ours = {"spec.json", POINTS, "parts", ".lock"}  # what a run writes before its first record
    if (root.exists() and not (root / "manifest.json").exists()
            and any(p.name not in ours for p in root.iterdir())):  # fmt: skip
        raise SweepError(
            "exists and is not a sweep results directory; use another -o", file=str(root)
        )


def _store(root: Path):  # type: ignore[no-untyped-def]
    _check_folder(root)
    try:
        store = ResultStore(root, {"kind": "collsim-sweep"})
    except CollsimError as exc:
        raise SweepError(exc.message, file=exc.file, field="--output") from None
    theirs = (store.manifest.get("identity") or {}).get("collsim")
    if theirs is not None and theirs != code_version() and store.manifest.get("points"):
        raise SweepError(
            f"holds results of another collsim build ({theirs}; this is {code_version()}): "
            "they would mix with this one's; use another -o, or delete it to start over",
            file=str(root),
            field="--output",
        )
    store.manifest.setdefault("identity", {})["collsim"] = code_version()
    return store


IDENTITY = (
    "kind", "topology", "faults", "nodes", "gpus", "engine", "model", "collective", "algorithm",
    "dtype", "protocol", "channels", "size_bytes", "workload", "layout",
)  # fmt: skip
"""The columns that say which point a row is (the rest are its results)."""


def _points(root: Path) -> tuple[set[tuple[str, ...]], str]:
    """The points ``root``'s ``points.csv`` holds (identities), and the name of the spec that
    wrote it ("?" where unreadable)."""
    try:
        with open(root / POINTS, newline="", encoding="utf-8") as f:
            ids = {tuple(row.get(k) or "" for k in IDENTITY) for row in csv.DictReader(f)}
    except (OSError, csv.Error, UnicodeDecodeError):
        ids = set()
    try:
        name = json.loads((root / "spec.json").read_text(encoding="utf-8")).get("name", "?")
    except (OSError, ValueError, AttributeError):
        name = "?"
    return ids, str(name)


def _dropped(root: Path, before: tuple[set[tuple[str, ...]], str]) -> tuple[str, ...]:
    """A warning where ``points.csv`` lost points it held before this run: another spec ran into
    this folder (its finished tasks stay in ``parts/``, so rerunning it restores its table)."""
    lost = before[0] - _points(root)[0]
    if not lost:
        return ()
    return (
        f"{len(lost)} point(s) of the results {root} held (spec {before[1]!r}) are not in this "
        "spec's points.csv. Their tasks stay in parts/ (rerunning that spec restores its table "
        "in seconds); use another -o to keep both tables",
    )


_ERROR = COLUMNS.index("error")


def merge(root: Path, spec: SweepSpec, store=None) -> tuple[int, tuple[str, ...]]:  # type: ignore[no-untyped-def]
    """Write ``points.csv`` from the intact parts of ``spec``'s tasks (in task order); returns
    its rows and the error of each row that could not be computed."""
    store = store or _store(root)
    text = [to_csv([], header=True)]
    n = 0
    errors: list[str] = []
    for task in spec.tasks:
        data = store.verified(task.key)
        if data is not None:
            part = data.decode()
            text.append(part)
            n += part.count("\n")
            rows = csv.reader(part.splitlines(keepends=True))
            errors += [row[_ERROR] for row in rows if row[_ERROR]]
    atomic_write_text(root / POINTS, "".join(text))
    return n, tuple(errors)


def _local(tasks: list[Task], jobs: int) -> Iterator[tuple[str, str, int]]:
    if jobs <= 1 or len(tasks) <= 1:
        for task in tasks:
            yield run_task(task)
        return
    import concurrent.futures as cf

    pool = cf.ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), initializer=_ignore_sigint)
    try:
        futures = [pool.submit(run_task, t) for t in tasks]
        for fut in cf.as_completed(futures):
            yield fut.result()
    finally:
        procs = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            if proc.is_alive():
                proc.terminate()  # a task still running on Ctrl-C: its points are not kept


def _term_as_interrupt() -> Callable[[], None]:
    """While a sweep runs, SIGTERM (what batch schedulers such as Slurm send) stops it as Ctrl-C
    does: finished tasks kept and merged, workers terminated. Returns what restores the old
    handler (a no-op off the main thread, where handlers cannot be set)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, interrupt)
    return lambda: signal.signal(signal.SIGTERM, old)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent terminates its workers
    _die_with_parent()


def _die_with_parent() -> None:
    """A worker ends when the sweep does, even if it is killed with SIGKILL (which leaves no
    chance to terminate the pool): Linux's PR_SET_PDEATHSIG, elsewhere nothing."""
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return


def _dask(tasks: list[Task], scheduler: str) -> Iterator[tuple[str, str, int]]:
    try:
        from dask.distributed import Client, as_completed
    except ImportError:
        raise SweepError(
            "needs dask.distributed (pip install 'dask[distributed]')", field="--executor",
            value="dask",
        ) from None  # fmt: skip
    try:
        client = Client(scheduler, timeout="20s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise SweepError(
            f"cannot reach the Dask scheduler: {exc}", field="--scheduler", value=scheduler
        ) from None
    try:
        futures = client.map(run_task, tasks, pure=False)
        try:
            for fut in as_completed(futures):
                yield fut.result()
        finally:
            client.cancel(futures)
    finally:
        client.close()


def run_sweep(
    spec: SweepSpec,
    output: str | os.PathLike[str],
    *,
    executor: str = "local",
    jobs: int | None = None,
    scheduler: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SweepOutcome:
    """Run every task of ``spec`` not already in ``output``; ``progress(points, total)`` is
    called as tasks finish. Ctrl-C (``KeyboardInterrupt``) keeps the finished tasks and returns
    with ``interrupted=True``."""
    if executor not in EXECUTORS:
        raise SweepError(
            f"unknown executor (choose from {', '.join(EXECUTORS)})", field="--executor",
            value=executor,
        )  # fmt: skip
    if executor == "dask" and not scheduler:
        raise SweepError("--executor dask needs --scheduler tcp://HOST:PORT", field="--scheduler")
    root = Path(output)
    _check_folder(root)
    with directory_lock(root, "sweep", "--output", SweepError):
        return _run(spec, root, executor, jobs, scheduler, progress)


def _run(
    spec: SweepSpec,
    root: Path,
    executor: str,
    jobs: int | None,
    scheduler: str | None,
    progress: Callable[[int, int], None] | None,
) -> SweepOutcome:
    store = _store(root)
    problems = tuple(store.problems())  # e.g. a truncated part: reported, then computed again
    store.clean()
    before = _points(root)
    atomic_write_text(root / "spec.json", json.dumps(spec.data, indent=1, sort_keys=True) + "\n")
    todo = [t for t in spec.tasks if not store.done(t.key)]
    reused = len(spec.tasks) - len(todo)
    by_key = {t.key: t for t in todo}
    total = spec.n_points
    done_points = sum(t.n_points for t in spec.tasks if t.key not in by_key)
    if progress:
        progress(done_points, total)
    computed = computed_points = 0
    interrupted = False
    runs = _local(todo, jobs or os.cpu_count() or 1) if executor == "local" else None
    restore = _term_as_interrupt()
    try:
        if runs is None:
            runs = _dask(todo, scheduler)  # type: ignore[arg-type]
        for key, text, _n in runs:
            task = by_key[key]
            store.record(key, f"parts/{key}.csv", text.encode(), rows=text.count("\n"))
            computed += 1
            computed_points += task.n_points
            done_points += task.n_points
            if progress:
                progress(done_points, total)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if runs is not None and hasattr(runs, "close"):
            runs.close()
        restore()
    points, errors = merge(root, spec, store)
    if not interrupted:  # an interrupted run's table is short of what it did not reach yet
        problems += _dropped(root, before)
    return SweepOutcome(root, len(spec.tasks), points, reused, computed, computed_points,
                        interrupted, problems, errors)  # fmt: skip


def read_points(path: str | os.PathLike[str]) -> list[dict[str, str]]:
    """The rows of a results directory's ``points.csv`` (or of a CSV file given directly)."""
    import csv

    p = Path(path)
    if p.is_dir():
        p = p / POINTS
    if not p.is_file():
        raise SweepError("no sweep results here (expected points.csv)", file=str(p))
    text = p.read_text(encoding="utf-8", errors="replace")
    if text and not text.endswith("\n"):  # every row ends a line: this one was cut off
        raise SweepError(
            "truncated: the last row does not end; rerun the sweep",
            file=str(p),
            field=f"line {text.count(chr(10)) + 1}",
        )
    with p.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in ("kind", "topology") if c not in (reader.fieldnames or [])]
        if missing:
            raise SweepError("not a collsim sweep results file", file=str(p), field=missing[0])
        rows = list(reader)
    for i, row in enumerate(rows):  # a cut-off file (copied while written, disk full): refuse it
        if None in row or None in row.values():
            got = sum(v is not None for k, v in row.items() if k is not None)
            raise SweepError(
                f"truncated or damaged: {got} of {len(COLUMNS)} columns; rerun the sweep",
                file=str(p),
                field=f"line {i + 2}",
            )
        _check_result(row, p, i + 2)
    return rows


_RESULT_COLUMN = {"collective": "time_us", "step": "step_time_s"}
"""The number a row of each kind exists for: a row without an error holds it, finite."""


def _check_result(row: dict[str, str], path: Path, line: int) -> None:
    """Refuse a row whose kind is unknown, or that claims no error yet lacks its result (a
    file edited by hand or damaged in place): reporting it would silently drop the point."""
    kind = row.get("kind", "")
    if kind not in _RESULT_COLUMN:
        raise SweepError("unknown row kind (collective or step)", file=str(path),
                         field=f"line {line}, kind", value=kind)  # fmt: skip
    if row.get("error"):
        return
    column = _RESULT_COLUMN[kind]
    text = row.get(column, "")
    try:
        ok = math.isfinite(float(text)) and float(text) >= 0
    except ValueError:
        ok = False
    if not ok:
        raise SweepError(
            "damaged: a row without an error needs a finite, non-negative result; rerun the sweep",
            file=str(path),
            field=f"line {line}, {column}",
            value=text,
        )


__all__ = ["COLUMNS", "EXECUTORS", "SweepOutcome", "merge", "read_points", "run_sweep"]
