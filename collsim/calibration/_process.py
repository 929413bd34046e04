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
import re
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


_NCCL_TESTS_FAILURE = re.compile(
    r"Test (NCCL|CUDA) failure|Test failure|NCCL WARN|Out of bounds values : [1-9]\d* FAILED"
    r"|below the (minimum|expected) bandwidth|NCCL_TESTS_MIN_BW"
)
"""What nccl-tests prints (to stdout, with printf) when it fails: NCCLCHECK / CUDACHECK /
TESTCHECK messages, NCCL's own warnings, and its summary of wrong results."""


def failure_reason(err: str, status: int, out: str = "") -> str:
    """The line that says why a command failed: the first failure nccl-tests printed (stdout),
    else the benchmark's own message (stderr), else the last stderr line naming an error, else the
    last stderr line with words (not a ruler of '=')."""
    lines = [e.strip() for e in err.splitlines() if e.strip()]
    ours = [e for e in lines if "collsim torchbench:" in e]
    told = [e.strip() for e in (*err.splitlines(), *out.splitlines())
            if _NCCL_TESTS_FAILURE.search(e)]  # fmt: skip
    named = [e for e in lines if re.search(r"Error|error:|Exception|No such|not found", e)]
    worded = [e for e in lines if re.search(r"[A-Za-z]{2}", e)]
    if told:  # the first: what went wrong, before what it made fail after it
        return told[0].lstrip("#. ")
    pick = ours or named or worded
    return pick[-1] if pick else _exit_status(status)


def _exit_status(status: int) -> str:
    """``exit status 3``, or for a command a signal ended (``-11``) the signal's name."""
    if status < 0:
        try:
            return f"killed by signal {signal.Signals(-status).name} ({-status})"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


def _pump(stream: object, sink: queue.Queue[str | None]) -> None:
    for line in iter(stream.readline, ""):  # type: ignore[attr-defined]
        sink.put(line)
    sink.put(None)


def _is_progress(line: str) -> bool:
    body = line.split(":", 1)[1] if line.startswith("[") and "]<std" in line else line
    tokens = body.split()
    return bool(tokens) and (tokens[0].isdecimal() or "done in an earlier run" in line)


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
    per_point: bool = False,
) -> None:
    """Copy the output to ``partial`` line by line; fail after ``timeout`` s of silence.

    ``per_point``: the command records each point itself (the torch benchmark), so a rerun
    resumes after the last; an nccl-tests log is recorded only whole, so a rerun measures its
    collective again from the first size (this output is kept aside, never used)."""
    last = ""
    with partial.open("w", encoding="utf-8") as sink:
        while True:
            try:
                line = lines.get(timeout=timeout)
            except queue.Empty:
                first = last.split()[0] if last.split() else ""
                where = (f"after the {first} B row: the size after it did not finish"
                         if first.isdecimal() else f"after '{last.strip()[:60]}'")  # fmt: skip
                after = (
                    "the points it completed are kept, and a rerun resumes after them"
                    if per_point
                    else f"its output so far stays in {partial}, unused; a rerun moves it aside "
                    f"({label}.interrupted-<k>.txt) and measures {label} again from its first size"
                )
                raise CalibrationError(
                    f"{label}: no output for {timeout:g} s {where}; a hung collective? "
                    f"(stopped; {after})",
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
        _follow(proc, lines, partial, stdout, label, timeout, on_line, step.collective is None)
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


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 (the torch rendezvous of a local run binds only there)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
