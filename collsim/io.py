"""Atomic file writes: a reader never sees half a file, and a crash never leaves one behind."""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temporary file in the same folder and ``os.replace``.

    A symbolic link is written through (its target is replaced); a device or pipe
    (``/dev/stdout``, a FIFO) is written directly, as replacing it would destroy it. A new file
    gets the permissions the umask allows (as ``open`` gives), a replaced one keeps its own."""
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_file() and not target.is_dir():
        with open(target, "wb") as handle:  # a device or pipe: nothing to replace atomically
            handle.write(data)
        return Path(path)
    folder = target.parent
    folder.mkdir(parents=True, exist_ok=True)
    mode = _mode_for(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return Path(path)


def _mode_for(target: Path) -> int:
    """The permissions ``target`` has, or a new file would get under the umask."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def save_figure(fig: Any, path: str | os.PathLike[str], *, dpi: int = 110) -> Path:
    """Render a matplotlib figure (format from the suffix, PNG by default), write it atomically
    and close it."""
    import matplotlib.pyplot as plt

    target = Path(path)
    fmt = target.suffix.lstrip(".").lower() or "png"
    buffer = io.BytesIO()
    try:
        if fmt not in fig.canvas.get_supported_filetypes():
            from collsim.errors import CollsimError

            kinds = ", ".join(sorted(fig.canvas.get_supported_filetypes()))
            raise CollsimError(
                f"cannot draw a '.{fmt}' file (use one of: {kinds})", file=str(path), field="--plot"
            )
        fig.savefig(buffer, format=fmt, dpi=dpi, bbox_inches="tight")  # no label cut off
    finally:
        plt.close(fig)
    return atomic_write_bytes(target, buffer.getvalue())
