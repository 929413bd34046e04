"""Reading nccl-tests results: :func:`read_log` -> :class:`NcclTestsLog` of typed rows.

One reader serves published logs, logs from ``collsim calibrate run`` (nccl-tests or the torch
benchmark, which prints the same table) and nccl-tests' ``-J`` JSON files, so that fitting and
validation never care where a measurement came from.

What is taken from a log, and from where (first source that says wins):

* collective: ``# Collective test starting: X_perf``, else the binary named on a command line, else
  the JSON ``args``, else the ``collective=`` hint, else the file name;
* ranks: the ``# Using devices`` lines, else NCCL's ``Init COMPLETE ... nranks N``, else the command
  line (processes x ``-g`` x ``-t``), else the ``ranks=`` hint, else the printed counts
  (all_gather/reduce_scatter/alltoall print per-rank counts) or the busbw/algbw ratio. A device
  list elided by hand (``...``, ranks missing) or cut short is checked against those numbers:
  where they pin one count (see :func:`~collsim.calibration.rows.ranks_from_numbers`) it wins,
  else the highest listed rank counts; either way a note says which, and where the two disagree;
* nodes: distinct hosts of the device lines (of an incomplete list: the ``nodes=`` hint, else
  unknown), else of NCCL INFO lines, else the ``nodes=`` hint;
* GPU model, NCCL version (``NCCL version ...`` or ``nccl-library=NNNNN``), NCCL_* settings
  (``-x NCCL_X=..``, ``NCCL_X=..``, ``NCCL_X set by environment to ..``).

Every row is checked: ``#wrong > 0`` (or, in the legacy layout, a maximum error above nccl-tests'
own tolerance for the type), algbw that does not match size/time, busbw that is not algbw times
nccl-tests' factor for the rank count, and element counts that do not match size, type and ranks.
Problems become ``anomalies`` (``strict=True`` raises on the first); format observations become
``notes``. A row that never completed (a run killed mid-row, a line lost) is left out and noted,
with its line and text (``incomplete_rows``); the rows that did complete are read. Structural
problems (empty file, no table, not one complete row) raise
:class:`~collsim.errors.CalibrationError` naming the file and the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from collsim.calibration import _json, _text
from collsim.calibration.rows import (
    Draft,
    Group,
    Row,
    Value,
    check_rows,
    infer_ranks,
    ranks_from_numbers,
)
from collsim.errors import CalibrationError, CollsimError
from collsim.metrics import COLLECTIVES, canonical_collective

__all__ = ["NcclTestsLog", "Row", "read_log", "read_logs"]


@dataclass(frozen=True)
class NcclTestsLog:
    """Everything one nccl-tests result table says, plus where it came from."""

    file: str
    collective: str
    ranks: int
    nodes: int | None
    gpu: str | None
    nccl_version: str | None
    nccl_env: dict[str, str]
    dtype: str
    redop: str | None
    rows: tuple[Row, ...]
    avg_busbw: float | None
    anomalies: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    layout: str = "current"  # "current" (#wrong, root), "legacy" (error column), "json"
    hosts: tuple[str, ...] = ()
    nccl_tests_version: str | None = None
    ranks_source: str = ""
    nodes_source: str = ""
    incomplete_rows: tuple[int, ...] = ()
    """Lines of result rows left out because they never completed (a run cut short mid-row,
    a line lost); each is also a note."""
    gpus_per_thread: int = 1
    """GPUs one host thread drives (nccl-tests ``-g``; 1 where the log does not say): the
    thread issues each call to all of them in turn, so calls follow each other no faster than
    that many launches (:attr:`collsim.model.params.ModelParams.launch_floor_s`)."""

    @property
    def incomplete_notes(self) -> tuple[str, ...]:
        """The notes on rows left out (``incomplete_rows``): what ``validate`` and
        ``calibrate fit`` print besides their results, as the rows they use are fewer."""
        marks = tuple(f"result row at line {line} " for line in self.incomplete_rows)
        return tuple(n for n in self.notes if marks and n.startswith(marks))

    @property
    def gpus_per_node(self) -> int | None:
        """Ranks per node when the ranks divide evenly over the known nodes."""
        if not self.nodes or self.ranks % self.nodes:
            return None
        return self.ranks // self.nodes


@dataclass
class Hints:
    """What the caller (e.g. the dataset index) knows when the log does not say it."""

    collective: str | None = None
    ranks: int | None = None
    nodes: int | None = None
    gpu: str | None = None
    gpus_per_thread: int | None = None


def _collective_name(text: str, file: str) -> str | None:
    """``all_reduce_perf_mpi``/``AllReduce``/``all-reduce`` -> ``all_reduce``; error if unknown."""
    name = re.sub(r"_perf(_mpi)?$", "", Path(text).name)
    try:
        return canonical_collective(name)
    except CollsimError:
        raise CalibrationError(
            f"collective not supported by collsim (supported: {', '.join(COLLECTIVES)})",
            file=file,
            field="collective",
            value=text,
        ) from None


def _from_file_name(path: str) -> str | None:
    stem = Path(path).stem.lower()
    found = [c for c in COLLECTIVES if re.search(rf"(^|[^a-z]){c}($|[^a-z])", stem)]
    found = [c for c in found if not any(c != o and c in o for o in found)]  # reduce in all_reduce
    return found[0] if len(found) == 1 else None


def _drafts_from_text(section: _text.Section, file: str) -> list[Draft]:
    drafts = []
    for raw in section.rows:
        try:
            groups: list[Group | None] = []
            for g in raw.groups:
                group = Group(*(Value.parse(g.get(k)) for k in ("time", "algbw", "busbw", "wrong")))
                groups.append(None if group.time.value is None else group)
            root = None if raw.root is None else int(raw.root)
            drafts.append(
                Draft(raw.line, int(raw.size), int(raw.count), raw.dtype, raw.redop, root, groups)
            )
        except ValueError:
            raise CalibrationError(
                "result row has a value that is not a number",
                file=file,
                field=f"line {raw.line}",
                value=" ".join(_raw_tokens(raw)),
            ) from None
    return drafts


def _raw_tokens(raw: _text.RawRow) -> list[str]:
    out = [raw.size, raw.count, raw.dtype, raw.redop or "", raw.root or ""]
    for g in raw.groups:
        out += [g.get(k, "") for k in ("time", "algbw", "busbw", "wrong")]
    return [t for t in out if t]


def _version_from_code(code: int | None) -> str | None:
    """NCCL_VERSION_CODE -> ``2.26.2`` (codes >= 10000 are X.YY.ZZ, older ones X.Y.ZZ)."""
    if not code:
        return None
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def _check_device_list(
    collective: str, sec: _json.Facts, drafts: list[Draft]
) -> tuple[int, str, list[str]]:
    """(ranks, their source, notes) for a log with a device list, checked against the rows.

    A list elided by hand (``...``, ranks missing) or cut short counts too few ranks, and one
    edited by hand may count too many (a published "Rank 143" on a 128-rank run): where the rows'
    numbers pin one count they win, and a note says so; a complete list they contradict is kept
    (its rows are then anomalies) with a note."""
    assert sec.ranks is not None
    listed, shown, highest = sec.ranks, sec.listed_ranks, sec.ranks - 1
    evidence = ranks_from_numbers(collective, drafts)
    exact = evidence.exact if evidence else None
    one = "" if evidence is None or evidence.source.endswith("s") else "s"  # counts / ratio
    if evidence is None or exact is None:
        if not sec.devices_elided:
            if evidence is not None and evidence.low > listed:
                return (
                    listed,
                    sec.ranks_source,
                    [
                        f"the device list shows {listed} rank(s), but the rows' {evidence.source} "
                        f"allow{one} {evidence.describe()}: the list may be cut short"
                    ],
                )
            return listed, sec.ranks_source, []
        if evidence is None:
            why = f"the rows cannot tell ({collective} prints busbw = algbw)"
            if collective in ("all_reduce", "all_gather", "reduce_scatter", "alltoall"):
                why = "the rows cannot tell (no row with a bandwidth to compare)"
        elif evidence.allows(listed):
            why = f"which the rows' {evidence.source} allow{one} ({evidence.describe()})"
        else:
            why = (f"but the rows' {evidence.source} allow{one} {evidence.describe()}: the two "
                   "disagree")  # fmt: skip
        return (
            listed,
            sec.ranks_source,
            [
                f"the device list is elided ({shown} rank(s) shown, the highest {highest}); "
                f"ranks ({listed}) from the highest listed rank, {why}"
            ],
        )
    assert evidence is not None
    if exact > listed:
        how = "is elided" if sec.devices_elided else "is cut short"
        return (
            exact,
            evidence.source,
            [
                f"the device list {how} ({shown} rank(s) shown, the highest {highest}); the rows' "
                f"{evidence.source} give{one} {exact} ranks, which are taken"
            ],
        )
    if exact < listed and sec.devices_elided:
        return (
            exact,
            evidence.source,
            [
                f"the device list shows rank {highest}, but the rows' {evidence.source} "
                f"fit{one} only {exact} ranks: the two disagree, and the rows are trusted (a "
                "list edited by hand?)"
            ],
        )
    if exact < listed:
        return (
            listed,
            sec.ranks_source,
            [
                f"the device list shows {listed} ranks, but the rows' {evidence.source} fit{one} "
                f"{exact}: the two disagree (the list is kept; its rows are checked against it)"
            ],
        )
    if shown < listed:
        return (
            listed,
            sec.ranks_source,
            [
                f"the device list is elided ({shown} rank(s) shown, the highest {highest}); the "
                f"rows' {evidence.source} confirm{one} {listed} ranks"
            ],
        )
    return listed, sec.ranks_source, []


def _build(
    file: str, sec: _json.Facts, drafts: list[Draft], hints: Hints, strict: bool
) -> NcclTestsLog:
    """Resolve metadata (log first, then hints, then inference), check rows, make the log."""
    notes: list[str] = list(sec.notes)
    collective = None
    if sec.collective:
        collective = _collective_name(sec.collective, file)
    if hints.collective:
        hinted = _collective_name(hints.collective, file)
        if collective and hinted != collective:
            raise CalibrationError(
                f"the log is of {collective}, not {hinted}",
                file=file,
                field="collective",
                value=hints.collective,
            )
        collective = collective or hinted
    if not collective:
        collective = _from_file_name(file)
        if collective:
            notes.append(f"collective '{collective}' taken from the file name")
    if not collective:
        raise CalibrationError(
            "cannot tell which collective this log measures (no binary "
            "name in it); pass --collective (collective= in Python)",
            file=file,
            field="collective",
        )
    ranks, ranks_source = sec.ranks, sec.ranks_source
    said: list[str] = []
    if sec.listed_ranks and ranks is not None:
        ranks, ranks_source, said = _check_device_list(collective, sec, drafts)
        notes += said
    if ranks is None and hints.ranks:
        ranks, ranks_source = hints.ranks, "given"
    if ranks is None:
        ranks, ranks_source = infer_ranks(collective, drafts)
    if ranks is None:
        raise CalibrationError(
            "cannot tell the number of ranks (no device list); pass --ranks (ranks= in Python)",
            file=file,
            field="ranks",
        )
    per_thread = sec.gpus_per_thread
    if per_thread is not None and not (1 <= per_thread <= ranks and ranks % per_thread == 0):
        raise CalibrationError(  # each thread drives nGpus of the ranks: a divisor of them
            f"GPUs per host thread must divide the {ranks} ranks",
            file=file,
            field="nGpus",
            value=per_thread,
        )
    if hints.ranks and hints.ranks != ranks:
        notes.append(f"the log says {ranks} ranks ({ranks_source}), the caller said {hints.ranks}")
    if ranks_source not in ("devices", "given") and not said:
        notes.append(f"ranks ({ranks}) from {ranks_source}")
    nodes, nodes_source = (len(sec.hosts), "devices") if sec.hosts else (None, "")
    if sec.hosts and 0 < sec.listed_ranks < ranks:  # its hosts are some of the job's, not all
        nodes, nodes_source = None, ""
        if not hints.nodes:
            notes.append(f"nodes not known: the device list is incomplete ({len(sec.hosts)} "
                         "host(s) shown); pass --nodes")  # fmt: skip
    if nodes is None and len(sec.info_hosts) == ranks:  # INFO lines from every rank seen
        nodes, nodes_source = len({host for host, _, _ in sec.info_hosts}), "NCCL INFO lines"
    if nodes is None and hints.nodes:
        nodes, nodes_source = hints.nodes, "given"
    if sec.last_size and drafts:
        last = max(d.size for d in drafts)
        # nccl-tests rounds each size down to whole elements of every rank: allow for that.
        if last + 16 * ranks < sec.last_size:
            notes.append(f"rows stop at {last} B, the run asked for {sec.last_size} B: cut short?")
    sizes = [d.size for d in drafts if d.size > 0]
    again = sorted({x for x in sizes if sizes.count(x) > 1})
    if again:  # two pasted tables, or sizes that round to one count (alltoall with -i steps)
        notes.append(f"sizes measured more than once: {', '.join(map(str, again[:5]))}")
    dtypes = sorted({d.dtype for d in drafts})
    redops = sorted({d.redop for d in drafts if d.redop})
    anomalies = check_rows(collective, ranks, drafts, sec.legacy)
    if len(dtypes) > 1:
        anomalies.append(f"several data types in one table: {', '.join(dtypes)}")
    if sec.oob and sec.oob[0] > 0:
        anomalies.append(f"nccl-tests reports {sec.oob[0]} out-of-bounds values ({sec.oob[1]})")
    if strict and anomalies:
        raise CalibrationError(f"anomaly: {anomalies[0]}", file=file, field="rows")
    return NcclTestsLog(
        file=file,
        collective=collective,
        ranks=ranks,
        nodes=nodes,
        gpu=sec.gpu or hints.gpu,
        nccl_version=sec.nccl_version or _version_from_code(sec.library_code),
        nccl_env=dict(sec.env),
        dtype=dtypes[0],
        redop=redops[0] if len(redops) == 1 else None,
        rows=tuple(d.row() for d in drafts),
        avg_busbw=sec.avg_busbw,
        anomalies=tuple(anomalies),
        notes=tuple(notes),
        layout="json" if sec.json else ("legacy" if sec.legacy else "current"),
        hosts=tuple(sec.hosts),
        nccl_tests_version=sec.tests_version,
        ranks_source=ranks_source,
        nodes_source=nodes_source,
        gpus_per_thread=sec.gpus_per_thread or hints.gpus_per_thread or 1,
        incomplete_rows=tuple(sec.incomplete_rows),
    )


def read_logs(
    path: str | Path,
    *,
    strict: bool = False,
    collective: str | None = None,
    ranks: int | None = None,
    nodes: int | None = None,
    gpu: str | None = None,
    gpus_per_thread: int | None = None,
) -> list[NcclTestsLog]:
    """Every result table in one file (text or ``-J`` JSON), in order."""
    file = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CalibrationError(f"cannot read: {exc.strerror or exc}", file=file) from None
    packed = _packed(data)
    if packed:
        raise CalibrationError(packed, file=file)
    text = data.decode("utf-8", errors="replace")
    if not text.strip():
        raise CalibrationError("empty file: no nccl-tests output in it", file=file)
    for name, value in (("ranks", ranks), ("nodes", nodes), ("gpus_per_thread", gpus_per_thread)):
        if value is not None and not (isinstance(value, int) and value >= 1):
            raise CalibrationError("must be a whole number of at least 1", field=name, value=value)
    hints = Hints(collective, ranks, nodes, gpu, gpus_per_thread)
    if re.match(r'\s*\{\s*"', text):  # a JSON object ({'...' is a Python dict in a job log)
        facts, drafts = _json.read(text, file)
        return [_build(file, facts, drafts, hints, strict)]
    sections = _text.Scanner(file).scan(text)
    if not sections:
        raise CalibrationError(
            "no nccl-tests result table found (no 'size count type ... algbw busbw' header "
            "followed by rows)",
            file=file,
        )
    return [
        _build(file, _json.Facts.from_section(s), _drafts_from_text(s, file), hints, strict)
        for s in sections
    ]


_PACKED = {
    b"\x1f\x8b": "a gzip-compressed file: decompress it first (gunzip)",
    b"BZh": "a bzip2-compressed file: decompress it first (bunzip2)",
    b"\xfd7zXZ\x00": "an xz-compressed file: decompress it first (unxz)",
    b"\x28\xb5\x2f\xfd": "a zstd-compressed file: decompress it first (unzstd)",
    b"PK\x03\x04": "a zip archive: extract the log from it first",
    b"\xff\xfe": "UTF-16 text: convert it to UTF-8 first (iconv -f UTF-16 -t UTF-8)",
    b"\xfe\xff": "UTF-16 text: convert it to UTF-8 first (iconv -f UTF-16 -t UTF-8)",
}
"""Leading bytes of files that hold a log in a form to unpack first (a log saved from a job's
archive or a Windows editor), rather than "no table found"."""


def _packed(data: bytes) -> str | None:
    return next((why for magic, why in _PACKED.items() if data.startswith(magic)), None)


def read_log(
    path: str | Path,
    *,
    strict: bool = False,
    collective: str | None = None,
    ranks: int | None = None,
    nodes: int | None = None,
    gpu: str | None = None,
    gpus_per_thread: int | None = None,
) -> NcclTestsLog:
    """The one result table in ``path`` (see the module docstring for what is read and checked).

    The keyword hints are used only where the log itself does not say; ``strict=True`` turns the
    first anomaly (e.g. ``#wrong > 0``) into a :class:`CalibrationError`.
    """
    logs = read_logs(
        path, strict=strict, collective=collective, ranks=ranks, nodes=nodes, gpu=gpu,
        gpus_per_thread=gpus_per_thread,
    )  # fmt: skip
    if len(logs) > 1:
        raise CalibrationError(
            f"{len(logs)} result tables in one file; use read_logs()", file=str(path)
        )
    return logs[0]
