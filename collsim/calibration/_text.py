"""Scanning nccl-tests' text output: the result table and the facts around it.

nccl-tests prints a preamble (parameters, ``# Using devices`` lines), one header, one row per size
and
a summary, but real logs wrap that in much else. This module copes with, in order of the pipeline:

* launcher prefixes: ``[1,0]<stdout>:`` (Open MPI ``--tag-output``, also in the middle of a line,
  where it acts as a line break) and ``  0: `` (``srun -l``);
* NCCL's own ``host:pid:tid [dev] NCCL INFO ...`` lines, between rows *and* inside one: the text
  before the marker is kept as a row fragment and the row is completed by the next numeric line
  (a number the marker is glued to, ``3.00nodeA:...``, stays in the row while the row lacks it);
* headers and device lines with or without their ``#`` (documentation often strips it), and
  device lists elided by hand (a ``...`` line, or ranks missing between those shown): the section
  records the elision, and the reader takes the rank count from the rows' numbers;
* both table layouts: current (``redop root ... #wrong``) and legacy (no ``root`` column for most
  collectives, an ``error`` column holding the maximum deviation instead of a count), with an
  optional per-iteration block and a timestamp column;
* anything else (shell echo, MPI warnings, job banners) is ignored;
* a row that never completes (a run killed mid-row, a line lost from the middle of a table) is
  left out and recorded in its table's ``dropped`` (line, text, why), which the reader turns into
  a note: the rows that did complete are read. Only a log with no complete row at all is an error.

The scanner returns raw sections (one per result table); :mod:`collsim.calibration.nccltests`
turns them into :class:`~collsim.calibration.nccltests.NcclTestsLog`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from collsim.errors import CalibrationError

_PREFIX_ANYWHERE = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:")
_SRUN_LABEL = re.compile(r"^\s*\d+: ")
# host:pid:tid [dev] NCCL INFO|WARN ...; a host may follow a row fragment with no space
# ("-1gcn151:..."), so a host starting with a digit must not be glued to preceding text.
_NCCL_MARKER = re.compile(
    r"(?P<host>(?<![\w.-])[A-Za-z0-9][\w.-]*|[A-Za-z][\w.-]*):(?P<pid>\d+):\d+ \[(?P<dev>\d+)\]"
    r"(?: \S+)? "
    r"NCCL (?:INFO|WARN|TRACE|ERROR|ABORT)\b ?"
)
# a number nccl-tests printed with a host glued on ("0nodeA", "3.00nodeA"): see Scanner.unglue
_GLUED_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?=[A-Za-z])")
_DEVICE = re.compile(
    r"^Rank\s+(?P<rank>\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(?P<host>\S+)\s+device\s+"
    r"(?P<dev>\d+)\s+\[[^\]]*\]\s+(?P<name>.+?)\s*$"
)
_VERSION = re.compile(r"\bNCCL version (\d+\.\d+\.\d+\S*)")
_TESTS_VERSION = re.compile(r"nccl-tests version (\S+)(?:.*nccl-library=(\d+))?")
_TEST_START = re.compile(r"Collective test starting: (\S+)")
_BINARY = re.compile(
    r"\b(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|reduce|sendrecv|gather|scatter|"
    r"hypercube|alltoallv)_perf(?:_mpi)?\b"
)
_ENV_ASSIGN = re.compile(r"\b((?:OFI_)?NCCL_[A-Z0-9_]+)=((?:\\.|[^\s\"'])+|\"[^\"]*\"|'[^']*')")
_ENV_INFO = re.compile(r"\b(NCCL_[A-Z0-9_]+) set by environment to (\S+)")
_PLUGIN_ENV = re.compile(
    r"\bSetting ((?:OFI_)?NCCL_[A-Z0-9_]*FLUSH[A-Z0-9_]*) environment variable to (\S+)"
)
"""A net plugin setting a flush variable itself (aws-ofi-nccl: "NET/OFI Setting
OFI_NCCL_GDR_FLUSH_DISABLE environment variable to 1"): what the receives ran with."""
_NRANKS_INFO = re.compile(r"\bnranks (\d+)\b")
_PARAMS = re.compile(r"nThread (-?\d+) nGpus (-?\d+)")
_RANGE = re.compile(r"minBytes (\d+) maxBytes (\d+) step: (\d+)\((factor|bytes)\)")
_AVG = re.compile(r"Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_OOB = re.compile(r"Out of bounds values\s*:\s*(\d+)\s*(\w*)")
_LAUNCHERS = re.compile(r"\b(mpirun|mpiexec|srun|orterun)\b")
_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")
_ELISION = re.compile(r"^(?:\.{3,}|\u2026)$")  # "..." or "…" on a line of its own

_GROUP_KEYS = {
    "time": "time",
    "cputime": "time",
    "algbw": "algbw",
    "busbw": "busbw",
    "#wrong": "wrong",
    "error": "wrong",
    "wrong": "wrong",
}


def ends_table(body: str) -> bool:
    """Whether a line ends the open table: its summary, or the next test's start, parameters,
    devices or header (a row cut before one of these never completes)."""
    if body.startswith("Using devices") or parse_header(body) is not None:
        return True
    return any(p.search(body) for p in (_AVG, _OOB, _TEST_START, _BINARY, _PARAMS))


def is_number(token: str) -> bool:
    """True for tokens nccl-tests prints as numbers (``12``, ``-1``, ``1e-07``, ``0.00``)."""
    return bool(_NUMBER.match(token))


@dataclass
class Columns:
    """What one header line says about the rows below it."""

    has_redop: bool
    has_root: bool
    groups: list[dict[str, int]]  # per group (out-of-place, in-place): key -> index in the tail
    tail: int  # numeric tokens after the text columns (timestamp counts as two)
    legacy: bool  # ``error`` column (maximum deviation) instead of ``#wrong`` (count)


@dataclass
class RawRow:
    """One row's tokens, split into text columns and the numeric tail."""

    line: int
    size: str
    count: str
    dtype: str
    redop: str | None
    root: str | None
    groups: list[dict[str, str]]


@dataclass
class Section:
    """One result table and the facts seen before and around it."""

    columns: Columns
    header_line: int
    rows: list[RawRow] = field(default_factory=list)
    devices: dict[int, tuple[str, str]] = field(default_factory=dict)  # rank -> (host, name)
    devices_elided: bool = False  # a ``...`` line in the device list (documentation excerpts)
    info_hosts: set[tuple[str, str, str]] = field(default_factory=set)  # (host, pid, device)
    nccl_version: str | None = None
    library_code: int | None = None
    tests_version: str | None = None
    collective: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    info_nranks: int | None = None
    command_ranks: int | None = None
    threads_gpus: tuple[int, int] | None = None
    command_gpus: int | None = None
    last_size: int | None = None  # the last size the header's -b/-e/-f or -i asks for
    avg_busbw: float | None = None
    oob: tuple[int, str] | None = None
    info_inside_row: int = 0
    dropped: list[Dropped] = field(default_factory=list)  # rows that never completed


@dataclass(frozen=True)
class Dropped:
    """A result row left out because it never completed: where it starts, what of it was
    there, why it cannot be completed, and the error it is when a log has no complete row."""

    line: int
    text: str
    why: str
    error: str


def parse_header(body: str) -> Columns | None:
    """Columns from a header line (``#`` already removed), or None if it is not one."""
    names = body.split()
    if names[:2] != ["size", "count"] or "algbw" not in names or "busbw" not in names:
        return None
    text = [n for n in names[: names.index("algbw")] if n in ("type", "redop", "root")]
    rest = names[2 + len(text) :]
    groups: list[dict[str, int]] = []
    tail = 0
    for name in rest:
        if name in ("time", "cputime"):
            groups.append({})
        if name == "timestamp":
            tail += 2
            continue
        if groups and name in _GROUP_KEYS:
            groups[-1][_GROUP_KEYS[name]] = tail
        tail += 1
    if not groups or any(set(g) < {"time", "algbw", "busbw"} for g in groups):
        return None
    return Columns(
        has_redop="redop" in text,
        has_root="root" in text,
        groups=groups,
        tail=tail,
        legacy="error" in rest,
    )


def split_row(tokens: list[str], cols: Columns) -> tuple[int, int] | None:
    """(text columns, total tokens) a row needs, once enough tokens are there to tell; else None.

    Legacy logs leave ``redop`` blank for collectives without one, so it is taken only when the
    token is a word.
    """
    if len(tokens) < 3:
        return None
    left = 3
    if cols.has_redop:
        if len(tokens) < 4:
            return None
        if not is_number(tokens[3]):
            left += 1
    if cols.has_root:
        left += 1
    return left, left + cols.tail


def make_row(tokens: list[str], cols: Columns, line: int) -> RawRow:
    """A raw row from exactly the tokens one row needs."""
    left, _ = split_row(tokens, cols) or (3, 0)
    text = tokens[:left]
    tail = tokens[left:]
    redop = text[3] if cols.has_redop and len(text) > 3 and not is_number(text[3]) else None
    root = text[-1] if cols.has_root else None
    groups = [{key: tail[i] for key, i in g.items()} for g in cols.groups]
    return RawRow(line, text[0], text[1], text[2], redop, root, groups)


def clean_segments(raw: str) -> list[str]:
    """A physical line without launcher prefixes; a prefix in mid-line starts a new segment."""
    parts = _PREFIX_ANYWHERE.split(raw)
    return [_SRUN_LABEL.sub("", part, count=1) if i == 0 else part for i, part in enumerate(parts)]


def _from_command(line: str) -> tuple[int | None, int]:
    """(total ranks, GPUs per thread) of an nccl-tests command line: ranks = processes x ``-g`` x
    ``-t`` (None if the launcher's process count is unclear); each thread drives ``-g`` GPUs."""
    match = _BINARY.search(line)
    assert match is not None
    before, after = line[: match.start()], line[match.end() :].split()
    opts = {"g": 1, "t": 1}
    rest = " ".join(after)
    for key, flags in (("g", "-g|--ngpus"), ("t", "-t|--nthreads")):
        # -g 4, -g4, --ngpus 4, --ngpus=4
        if found := re.search(rf"(?:^|\s)(?:{flags})(?:=|\s*)(\d+)(?=\s|$)", rest):
            opts[key] = int(found.group(1))
    procs = 1
    if _LAUNCHERS.search(before):
        found = re.search(r"(?:^|\s)(?:-np|-n|--np|--ntasks)[\s=](\d+)", before)
        if not found:
            return None, opts["g"]
        procs = int(found.group(1))
    return procs * opts["g"] * opts["t"], opts["g"]


def _last_size(low: int, high: int, step: int, *, factor: bool) -> int | None:
    """The last size nccl-tests runs from ``-b low -e high`` and ``-f step`` (or ``-i step``
    bytes), before its rounding to whole elements; None for a degenerate step."""
    if low < 1 or high < low:
        return None
    if not factor:
        return low + (high - low) // step * step if step > 0 else None
    if step < 2:
        return None
    size = low
    while size * step <= high:
        size *= step
    return size


class Scanner:
    """Line-by-line state machine over one text log; :meth:`scan` returns its sections."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.sections: list[Section] = []
        self.current: Section | None = None  # the section whose table is open
        self.pending: list[str] = []
        self.pending_line = 0
        self.pending_last = 0  # the last line that added to the pending row
        self.lost: list[Dropped] = []  # rows left out of tables that have no complete row
        # facts seen outside any table, handed to the next section
        self.ctx = Section(columns=Columns(False, False, [], 0, False), header_line=0)

    def error(self, line: int, message: str, value: object = None) -> CalibrationError:
        return CalibrationError(message, file=self.file, field=f"line {line}", value=value)

    def scan(self, text: str) -> list[Section]:
        lines = text.splitlines()
        for lineno, raw in enumerate(lines, start=1):
            for segment in clean_segments(raw):
                marker = _NCCL_MARKER.search(segment)
                if marker:
                    start, host = self.unglue(segment, marker)
                    fragment = segment[:start]
                    if fragment.strip():
                        self.text(fragment, lineno)
                        if self.pending and self.current is not None:
                            self.current.info_inside_row += 1
                    self.info(segment[marker.end() :], (host, marker["pid"], marker["dev"]))
                else:
                    self.text(segment, lineno)
        if self.pending:
            at_end = not any(  # only blank, INFO or launcher-prefix lines after the row's last
                seg.strip() and not _NCCL_MARKER.search(seg)
                for line in lines[self.pending_last :]
                for seg in clean_segments(line)
            )
            if at_end:
                self.drop(
                    "the file ends inside it", "result row is cut short (file ends inside it)"
                )
            else:
                self.drop("nothing after it completes it",
                          "result row incomplete: no numbers after it complete it")  # fmt: skip
        self.close()
        if not self.sections and self.lost:  # not one complete row: that row is the error
            first = self.lost[0]
            raise self.error(first.line, first.error, first.text)
        return self.sections

    def drop(self, why: str, error: str | None = None) -> None:
        """Leave the pending row out, recording where it was, what of it, and why."""
        assert self.current is not None
        error = error or f"result row is cut short ({why})"
        row = Dropped(self.pending_line, " ".join(self.pending), why, error)
        self.current.dropped.append(row)
        self.pending = []

    def unglue(self, segment: str, marker: re.Match[str]) -> tuple[int, str]:
        """(where the row fragment before an INFO marker ends, the host). NCCL can print its
        line right after a number of a row (``... 3.00      0nodeA:11:99 [0] NCCL INFO``), and a
        host may start with a digit: the leading number is given back to the row when that row
        still lacks values, else the host keeps it (a complete row needs no more numbers)."""
        host, start = marker["host"], marker.start()
        number = _GLUED_NUMBER.match(host)
        fragment = segment[:start]
        if number is None or self.current is None or not fragment.strip():
            return start, host
        tokens = [*self.pending, *fragment.split()]
        if not tokens[0].isdecimal():
            return start, host  # not a row: leave the host whole
        shape = split_row(tokens, self.current.columns)
        if shape is not None and len(tokens) >= shape[1]:
            return start, host
        return start + number.end(), host[number.end() :]

    def close(self) -> None:
        """End the open table: kept if it has a complete row. The rows a table without one left
        out go to the table before it, or, with none, make the log an error (:meth:`scan`)."""
        if self.current is not None:
            if self.pending:
                self.drop("its table ends inside it")
            if self.current.rows:
                self.sections.append(self.current)
            elif self.sections:
                self.sections[-1].dropped += self.current.dropped
            else:
                self.lost += self.current.dropped
            self.current = None

    def info(self, message: str, who: tuple[str, str, str]) -> None:
        """Facts from one NCCL INFO/WARN message (``who``: host, pid, device)."""
        target = self.current or self.ctx
        target.info_hosts.add(who)
        for name, value in _ENV_INFO.findall(message) + _PLUGIN_ENV.findall(message):
            target.env[name] = value.rstrip(".")
        if version := _VERSION.search(message):
            target.nccl_version = version.group(1)
        if "Init COMPLETE" in message and (nranks := _NRANKS_INFO.search(message)):
            target.info_nranks = int(nranks.group(1))

    def text(self, segment: str, lineno: int) -> None:
        stripped = segment.strip()
        body = stripped.lstrip("#").strip()
        if self.pending and ends_table(body):
            self.drop("its table ends before it does")  # the run went on: a row was lost
        if self.pending:
            self.continue_row(body.split(), lineno)
            return
        if not body:
            return
        if (cols := parse_header(body)) is not None:
            self.close()
            self.current = Section(columns=cols, header_line=lineno)
            self.inherit(self.current)
            return
        section = self.current
        tokens = body.split()
        if section is not None and not stripped.startswith("#") and tokens[0].isdecimal():
            self.start_row(tokens, lineno)
            return
        self.fact(body, lineno)

    def inherit(self, section: Section) -> None:
        """Give a new table the facts seen before it (devices are per test, the rest carries on)."""
        ctx = self.ctx
        section.devices = dict(ctx.devices)
        section.devices_elided = ctx.devices_elided
        section.info_hosts = set(ctx.info_hosts)
        section.env = dict(ctx.env)
        for name in (
            "nccl_version",
            "library_code",
            "tests_version",
            "collective",
            "info_nranks",
            "command_ranks",
            "threads_gpus",
            "command_gpus",
            "last_size",
        ):
            setattr(section, name, getattr(ctx, name))
        section.info_inside_row = 0

    def start_row(self, tokens: list[str], lineno: int) -> None:
        assert self.current is not None
        shape = split_row(tokens, self.current.columns)
        if shape is not None and len(tokens) > shape[1]:
            raise self.error(
                lineno,
                f"result row has {len(tokens)} values, the header has {shape[1]}",
                " ".join(tokens),
            )
        if shape is not None and len(tokens) == shape[1]:
            self.current.rows.append(make_row(tokens, self.current.columns, lineno))
            return
        self.pending, self.pending_line, self.pending_last = tokens, lineno, lineno

    def continue_row(self, tokens: list[str], lineno: int) -> None:
        """More tokens for a row that an INFO line (or a launcher prefix) cut in two."""
        assert self.current is not None
        cols = self.current.columns
        # a whole row of its own: the cut row's rest never came (checked before the noise test,
        # which once took such a row, words and all, for noise and dropped it)
        own = split_row(tokens, cols) if tokens else None
        if own is not None and tokens[0].isdecimal() and len(tokens) == own[1] and cols.tail:
            self.drop(f"line {lineno} is a whole row of its own")
            self.start_row(tokens, lineno)
            return
        words_allowed = len(self.pending) < 5  # the text columns may still be missing
        if not tokens or not all(
            is_number(t) or t == "N/A" or (words_allowed and t.isalpha()) for t in tokens
        ):
            return  # job noise between the two halves
        joined = self.pending + tokens
        shape = split_row(joined, cols)
        if shape is None or len(joined) < shape[1]:
            self.pending, self.pending_last = joined, lineno
            return
        if len(joined) > shape[1]:
            self.drop(f"line {lineno} holds more values than it lacks")
            if tokens[0].isdecimal():  # perhaps the next row, itself cut: try it as one
                self.start_row(tokens, lineno)
            return
        self.current.rows.append(make_row(joined, cols, self.pending_line))
        self.pending = []

    def fact(self, body: str, lineno: int) -> None:
        """Anything that is not a row: preamble, summary, command lines."""
        summary = _AVG.search(body) or _OOB.search(body)
        if ends_table(body) and not summary:  # the next test: a table without a summary ends
            self.close()
        target = self.current or self.ctx
        if body.startswith("Using devices"):
            self.close()
            self.ctx.devices = {}
            self.ctx.devices_elided = False
            return
        if _ELISION.match(body) and self.current is None:  # lines left out of the preamble
            self.ctx.devices_elided = True
            return
        if device := _DEVICE.match(body):
            self.ctx.devices[int(device["rank"])] = (device["host"], device["name"])
            return
        if avg := _AVG.search(body):
            target.avg_busbw = float(avg.group(1))
            self.close()
            return
        if oob := _OOB.search(body):
            target.oob = (int(oob.group(1)), oob.group(2))
            return
        if version := _VERSION.search(body):
            target.nccl_version = version.group(1)
        if tests := _TESTS_VERSION.search(body):
            target.tests_version = tests.group(1)
            target.library_code = int(tests.group(2)) if tests.group(2) else None
        if start := _TEST_START.search(body):
            target.collective = start.group(1)
        elif binary := _BINARY.search(body):
            target.collective = binary.group(0)
            ranks, target.command_gpus = _from_command(body)
            if ranks is not None:
                target.command_ranks = ranks
        if params := _PARAMS.search(body):
            target.threads_gpus = (int(params.group(1)), int(params.group(2)))
        if sizes := _RANGE.search(body):
            target.last_size = _last_size(*(int(sizes.group(i)) for i in (1, 2, 3)),
                                          factor=sizes.group(4) == "factor")  # fmt: skip
        for name, value in _ENV_ASSIGN.findall(body):
            target.env[name] = value.strip("\"'").replace("\\", "")
