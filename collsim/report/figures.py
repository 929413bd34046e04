"""Draw a report's figures on every core: each is pickled as built and drawn in a worker process.

Drawing dominates a sweep report (a figure takes ~0.2 s to lay out, thin its tick labels and
write as PNG; building it takes milliseconds), and the figures are independent. So the report
builds each figure in order, as before, and hands it to :class:`FigureWriter`, which pickles it
(matplotlib figures pickle, provided their tick formatters are module-level functions,
:mod:`collsim.report.axes`) and draws it in a process pool; leaving the ``with`` block waits for
all of them and raises the first failure. With one core (or ``jobs=1``) figures are drawn at once,
in this process, from the same pickle (a figure drawn before pickling can differ in the
antialiasing of a few pixels), so the PNGs do not depend on the number of processes.
"""

from __future__ import annotations

import os
import pickle
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import matplotlib

from collsim.report.axes import thin_ticks

matplotlib.use("Agg")
import matplotlib.pyplot as plt

DPI = 110


def draw(fig: Any, path: Path) -> None:
    """Write ``fig`` to ``path`` (tick labels thinned until none overlap), cropped to what it
    draws. The crop is measured on the renderer the thinning drew with: ``bbox_inches="tight"``
    would draw the whole figure once more to find it."""
    renderer = thin_ticks(fig)
    box = fig.get_tightbbox(renderer).padded(plt.rcParams["savefig.pad_inches"])
    fig.savefig(path, dpi=DPI, bbox_inches=box)
    plt.close(fig)


def _draw_pickled(data: bytes, path: str) -> None:
    draw(pickle.loads(data), Path(path))  # a figure this process (or its parent) pickled


class FigureWriter:
    """Writes figures into ``folder``, in ``jobs`` worker processes (default: the machine's
    cores; 1: in this process). Use as a context manager."""

    def __init__(self, folder: Path, jobs: int | None = None) -> None:
        self.folder = folder
        self.jobs = jobs if jobs is not None else (os.cpu_count() or 1)
        self._pool: ProcessPoolExecutor | None = None
        self._pending: list[Future[None]] = []

    def __enter__(self) -> FigureWriter:
        if self.jobs > 1:
            self._pool = ProcessPoolExecutor(max_workers=self.jobs)
        return self

    def save(self, fig: Any, name: str) -> str:
        """Draw ``fig`` as ``folder/name`` (now, or in a worker); returns ``name``."""
        path = self.folder / name
        data = pickle.dumps(fig)
        plt.close(fig)
        if self._pool is None:  # the same pickled figure: the same pixels as a worker draws
            _draw_pickled(data, str(path))
        else:
            self._pending.append(self._pool.submit(_draw_pickled, data, str(path)))
        return name

    def __exit__(self, *exc: object) -> None:
        pool, pending = self._pool, self._pending
        self._pool, self._pending = None, []
        if pool is None:
            return
        try:
            for future in pending:
                if exc[0] is None:
                    future.result()  # the first failure is raised here
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
