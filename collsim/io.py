"""Atomic file writes: a reader never sees half a file, and a crash never leaves one behind."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from collsim.errors import CollsimError


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temporary file in the same folder and ``os.replace``.

    A symbolic link is written through (its target is replaced). What is not a regular file --
    a device, a pipe, ``/dev/stdout`` whatever it points at -- is written to directly (appending,
    so a shell's ``>>`` keeps what came before), as replacing it would destroy it. A new file
    gets the permissions the umask allows (as ``open`` gives), a replaced one keeps its own."""
    given = os.fspath(path)
    if given.endswith(("/", os.sep)):  # a folder's name: "ro/" must not become a file "ro"
        raise IsADirectoryError(errno.EISDIR, "names a folder, not a file", given)
    try:
        regular = stat.S_ISREG(os.stat(given).st_mode)  # follows links; a loop raises OSError
        exists = True
    except FileNotFoundError:
        regular, exists = True, False
    if (exists and not regular) or given.startswith(("/dev/", "/proc/")):
        with open(given, "ab") as handle:
            handle.write(data)
        return Path(given)
    target = Path(os.path.realpath(given))
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
    return Path(given)


def _mode_for(target: Path) -> int:
    """The permission bits ``target`` has, or a new file would get under the umask."""
    try:
        return target.stat().st_mode & 0o777
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process umask, read without changing it where Linux says it (/proc), else by the
    set-and-restore dance."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def figure_format(path: str | os.PathLike[str], field: str = "--plot") -> str:
    """The image format ``path``'s suffix names (PNG without one); an unknown one is an error
    naming the option, raised before any work (check outputs before computing them)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    kinds = FigureCanvasAgg.get_supported_filetypes()
    if fmt not in kinds:
        raise CollsimError(f"cannot draw a '.{fmt}' file (use one of: {', '.join(sorted(kinds))})",
                           field=field, value=str(path))  # fmt: skip
    return fmt


def save_figure(
    fig: Any, path: str | os.PathLike[str], *, dpi: int = 110, field: str = "--plot"
) -> Path:
    """Render a matplotlib figure (format from the suffix, PNG by default), write it atomically
    and close it."""
    import matplotlib.pyplot as plt

    target = Path(path)
    buffer = io.BytesIO()
    try:
        fmt = figure_format(path, field)
        fig.savefig(buffer, format=fmt, dpi=dpi, bbox_inches="tight")  # no label cut off
    finally:
        plt.close(fig)
    return atomic_write_bytes(target, buffer.getvalue())


YAML_MAX_VALUES = 1_000_000
"""The most values a YAML document may expand to, its aliases followed: a configuration file
holds thousands; a document of aliases of aliases ("billion laughs") holds billions in a few lines
and would hang whatever walks it."""


def _expanded_values(data: Any, limit: int) -> int:
    """How many values ``data`` holds with every alias expanded (shared containers counted each
    time they appear, each counted once per identity with a memo), stopping above ``limit``."""
    memo: dict[int, int] = {}

    def count(x: Any) -> int:
        if not isinstance(x, dict | list):
            return 1
        if id(x) not in memo:
            items = x.values() if isinstance(x, dict) else x
            memo[id(x)] = min(limit + 1, 1 + sum(count(v) for v in items))
        return memo[id(x)]

    return count(data)


_SCIENTIFIC = re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$")


def yaml_load(text: str) -> Any:
    """``yaml.safe_load`` that refuses a mapping naming one key twice (plain YAML keeps the last,
    so a repeated ``nodes:`` would silently override the first): a ``yaml.YAMLError`` whose
    mark gives the line of the second. Also a ``yaml.YAMLError``: a document nested too deeply to
    parse, or expanding to more than :data:`YAML_MAX_VALUES` values through its aliases."""
    import yaml

    class _Unique(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue  # merge keys (<<: *anchor) may be overridden; others: the schema's
            key = loader.construct_object(key_node)  # type: ignore[no-untyped-call]
            if not isinstance(key, (str, int, float, bool)):
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return loader.construct_mapping(node)

    _Unique.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    # YAML 1.1 (PyYAML) reads 1e6 and 5e-06 as strings: it wants a dot and a signed exponent.
    # YAML 1.2 and every user read them as numbers, so this loader does too.
    _Unique.add_implicit_resolver("tag:yaml.org,2002:float", _SCIENTIFIC, list("-+0123456789."))
    try:
        data = yaml.load(text, Loader=_Unique)
        values = _expanded_values(data, YAML_MAX_VALUES)
    except RecursionError:
        raise yaml.MarkedYAMLError(problem="nested too deeply (hundreds of levels)") from None
    if values > YAML_MAX_VALUES:
        raise yaml.MarkedYAMLError(
            problem=f"expands to more than {YAML_MAX_VALUES:,} values through its aliases"
        )
    return data


@contextlib.contextmanager
def directory_lock(
    out: Path, what: str, flag: str, error: type[Exception] | None = None
) -> Iterator[None]:
    """One run per results directory at a time (a second would overwrite the first's records
    or take its live output for stale): refused at once, not waited for. ``what`` names the
    command in the error, ``flag`` its output option; ``error`` the error class (a
    :class:`~collsim.errors.CollsimError`)."""
    import fcntl

    error = error or CollsimError
    out.mkdir(parents=True, exist_ok=True)
    with (out / ".lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise error(
                f"another {what} is writing to this directory", field=flag, value=str(out)
            ) from None
        yield  # closing the file releases the lock


def beside(name: str, base: Path | None) -> str:
    """A file named in another file (a sweep spec, a candidates file) is looked up in that
    file's folder ``base`` first, then the working folder, and given as an absolute path (a Dask
    worker runs elsewhere); catalog names are kept."""
    p = Path(name)
    if p.suffix in (".yaml", ".yml") or "/" in name:
        if base is not None and not p.is_absolute() and (base / p).exists():
            return str((base / p).resolve())
        if p.exists():
            return str(p.resolve())
    return name
