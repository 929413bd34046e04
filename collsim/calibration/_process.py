"""Running one launched command: its output followed line by line, silence timed, shut down cleanly.

The command runs in its own session, so stopping it (on a timeout, Ctrl-C or SIGTERM) ends every
process it started: a launcher's ranks do not outlive the run. Its stdout is copied as it comes
to ``<label>.partial``, which becomes ``<label>.stdout`` only when the command has finished, so a
``.partial`` file always means "did not finish" (the result store reports it, and never uses it);
a rerun moves it aside (``<label>.interrupted-<k>.txt``) rather than writing over the rows it
holds.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from collsim.errors import CalibrationError
from collsim.io import atomic_write_text

if TYPE_CHECKING:
    from collsim.calibration.runners import Step


def _pump(stream: object, sink: queue.Queue[str | None]) -> None:
    for line in iter(stream.readline, ""):  # type: ignore[attr-defined]
        sink.put(line)
    sink.put(None)


def _is_progress(line: str) -> bool:
    body = line.split(":", 1)[1] if line.startswith("[") and "]<std" in line else line
    tokens = body.split()
    return bool(tokens) and (tokens[0].isdigit() or "done in an earlier run" in line)


def _stop(proc: subprocess.Popen[str]) -> None:
    """End a launched command and everything it started (it runs in its own session)."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _follow(
    proc: subprocess.Popen[str],
    lines: queue.Queue[str | None],
    partial: Path,
    stdout: list[str],
    label: str,
    timeout: float,
    on_line: Callable[[str], None],
) -> None:
    """Copy the output to ``partial`` line by line; fail after ``timeout`` s of silence."""
    last = ""
    with partial.open("w", encoding="utf-8") as sink:
        while True:
            try:
                line = lines.get(timeout=timeout)
            except queue.Empty:
                first = last.split()[0] if last.split() else ""
                where = (f"after the {first} B row: the size after it did not finish"
                         if first.isdigit() else f"after '{last.strip()[:60]}'")  # fmt: skip
                raise CalibrationError(
                    f"{label}: no output for {timeout:g} s {where}; a hung collective? "
                    "(stopped; completed results are kept, rerun to resume)",
                    field="--timeout",
                    value=timeout,
                ) from None
            if line is None:
                break
            stdout.append(line)
            sink.write(line)
            sink.flush()
            last = line if line.strip() else last
            if _is_progress(line):
                on_line(line)


def keep_interrupted(partial: Path) -> Path | None:
    """Move an interrupted run's output aside (``<label>.interrupted-<k>``, never overwritten),
    so a rerun of the same command does not write over the rows it completed."""
    if not partial.exists():
        return None
    if partial.stat().st_size == 0:  # nothing was measured: nothing to keep
        partial.unlink()
        return None
    k = 1
    while (kept := partial.with_name(f"{partial.stem}.interrupted-{k}.txt")).exists():
        k += 1
    partial.rename(kept)
    return kept


def execute(
    step: Step,
    out: Path,
    label: str,
    timeout: float,
    on_line: Callable[[str], None],
    on_note: Callable[[str], None] = lambda _: None,
) -> tuple[int, str, str]:
    """Run one command; return (exit status, stdout, its stderr lines but warnings). Kills it
    when silent for ``timeout`` seconds."""
    env = {**os.environ, **step.env}
    proc = subprocess.Popen(
        step.argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        bufsize=1,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    errors: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    threading.Thread(target=_pump, args=(proc.stderr, errors), daemon=True).start()
    partial = out / f"{label}.partial"
    kept = keep_interrupted(partial)
    if kept is not None:
        on_note(f"{partial}: output of an interrupted run, kept as {kept}")
    stdout: list[str] = []
    try:
        _follow(proc, lines, partial, stdout, label, timeout, on_line)
    finally:  # interrupted (Ctrl-C, SIGTERM) or timed out: take the whole launch down with us
        if proc.poll() is None:
            _stop(proc)
    status = proc.wait()
    err: list[str] = []
    while (item := errors.get()) is not None:
        err.append(item)
    atomic_write_text(out / f"{label}.stderr", "".join(err))
    partial.unlink()
    atomic_write_text(out / f"{label}.stdout", "".join(stdout))
    said = "".join(e for e in err if e.strip() and "Warning" not in e)
    return status, "".join(stdout), said
