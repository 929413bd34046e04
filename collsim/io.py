"""Atomic file writes: a reader never sees half a file, and a crash never leaves one behind."""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temporary file in the same folder and ``os.replace``."""
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def save_figure(fig: Any, path: str | os.PathLike[str], *, dpi: int = 110) -> Path:
    """Render a matplotlib figure (format from the suffix, PNG by default), write it atomically
    and close it."""
    import matplotlib.pyplot as plt

    target = Path(path)
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format=target.suffix.lstrip(".") or "png", dpi=dpi)
    finally:
        plt.close(fig)
    return atomic_write_bytes(target, buffer.getvalue())
