"""nccl-tests' ``-J FILE`` JSON output, and the source-neutral facts both readers hand over.

The JSON document (nccl-tests ``src/util.cu``, format version 2) holds ``args``, ``env``,
``nccl_version`` (a version code), ``config`` (with ``devices``: one entry per process, so ranks are
devices x ``nthreads`` x ``ngpus``), ``results`` (``size``, ``count``, ``type``, ``redop``,
``root``,
``out_of_place``/``in_place`` objects with ``time``, ``alg_bw``, ``bus_bw``, ``nwrong``, either may
be ``null``) and ``average_bus_bandwidth``/``out_of_bounds``. nccl-tests writes the file as it
goes, so a killed run leaves it truncated: the results completed before the cut are read (and the
cut is noted); a document cut before its first complete result is an error naming the line where
it stops.

Every header field is type-checked as the results are: a list given as a string, a count that is
not a whole number or an object that is not one is a :class:`CalibrationError` naming the field
(``config.ngpus``) and its value, never a crash or a misreading. ``nccl_version`` may also be a
version string (``"2.27.3"``); ``out_of_bounds.okay``, when given, must agree with its count.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from collsim.calibration.rows import Draft, Group, Value
from collsim.errors import CalibrationError

if TYPE_CHECKING:
    from collsim.calibration._text import Section

_VERSION_TEXT = re.compile(r"\d+\.\d+\.\d+\S*")


@dataclass
class Facts:
    """What a log says about its run, whatever its format."""

    collective: str | None = None
    ranks: int | None = None
    ranks_source: str = ""
    listed_ranks: int = 0  # device lines in the log (0: none)
    devices_elided: bool = False  # ranks left out of the device list ("...", or a gap)
    hosts: list[str] = field(default_factory=list)
    info_hosts: set[tuple[str, str, str]] = field(default_factory=set)  # (host, pid, device)
    gpu: str | None = None
    nccl_version: str | None = None
    library_code: int | None = None
    tests_version: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    avg_busbw: float | None = None
    oob: tuple[int, str] | None = None
    gpus_per_thread: int | None = None
    last_size: int | None = None  # the last size the run asked for
    legacy: bool = False
    json: bool = False
    notes: list[str] = field(default_factory=list)
    incomplete_rows: list[int] = field(default_factory=list)  # lines of rows left out

    @classmethod
    def from_section(cls, s: Section) -> Facts:
        facts = cls(
            collective=s.collective,
            info_hosts=set(s.info_hosts),
            nccl_version=s.nccl_version,
            library_code=s.library_code,
            tests_version=s.tests_version,
            env=dict(s.env),
            avg_busbw=s.avg_busbw,
            oob=s.oob,
            gpus_per_thread=s.threads_gpus[1] if s.threads_gpus else s.command_gpus,
            last_size=s.last_size,
            legacy=s.columns.legacy,
        )
        if s.devices:
            facts.ranks, facts.ranks_source = len(s.devices), "devices"
            ordered = [s.devices[r] for r in sorted(s.devices)]
            facts.hosts = list(dict.fromkeys(host for host, _ in ordered))
            facts.gpu = " / ".join(dict.fromkeys(name for _, name in ordered))
            facts.listed_ranks = len(s.devices)
            facts.devices_elided = s.devices_elided or max(s.devices) + 1 > len(s.devices)
            if max(s.devices) + 1 > len(s.devices):  # an elided list ("Rank 0, ..., Rank 7")
                facts.ranks, facts.ranks_source = max(s.devices) + 1, "the highest listed rank"
        elif s.info_nranks:
            facts.ranks, facts.ranks_source = s.info_nranks, "NCCL INFO 'nranks'"
        elif s.command_ranks:
            facts.ranks, facts.ranks_source = s.command_ranks, "the command line"
        for row in s.dropped:  # a run cut short, or a line lost: the complete rows are read
            facts.incomplete_rows.append(row.line)
            facts.notes.append(
                f"result row at line {row.line} left out: {row.why} ({row.text!r}); "
                f"{len(s.rows)} complete row(s) read"
            )
        if s.info_inside_row:
            facts.notes.append(f"{s.info_inside_row} row(s) split by NCCL INFO output, rejoined")
        if s.avg_busbw is None:
            facts.notes.append("no 'Avg bus bandwidth' line: an excerpt, or a run cut short")
        return facts


def _group(obj: Any, file: str, index: int) -> Any:
    if obj is None:
        return None
    try:
        values = {"time": obj.get("time", obj.get("cpu_time")), "alg_bw": obj["alg_bw"],
                  "bus_bw": obj["bus_bw"]}  # fmt: skip
        numbers = {k: float(v) for k, v in values.items()}
        wrong = obj.get("nwrong")
        wrong_value = None if wrong is None or wrong == "nan" else float(wrong)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise CalibrationError(
            "JSON result lacks time/alg_bw/bus_bw", file=file, field=f"results[{index}]", value=obj
        ) from None
    for key, number in numbers.items():
        if not math.isfinite(number):
            raise CalibrationError("not a number", file=file, field=f"results[{index}].{key}",
                                   value=values[key])  # fmt: skip
    return Group(*(Value(numbers[k], 5e-7) for k in values), Value(wrong_value))


def _salvage(text: str) -> tuple[dict[str, Any], int] | None:
    """A truncated document's header and its complete results (and how many), or None where
    nothing before the cut is a complete result. nccl-tests writes ``results`` after the run's
    ``args``/``env``/``config``, one object per size as each completes."""
    key = text.find('"results"')
    start = text.find("[", key) if key >= 0 else -1
    if start < 0 or text[key + len('"results"') : start].strip() != ":":
        return None
    try:
        head = json.loads(text[:start] + "[]}")
    except json.JSONDecodeError:
        return None
    if not isinstance(head, dict):
        return None
    decoder, pos, results = json.JSONDecoder(), start + 1, []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        if not isinstance(obj, dict):
            break
        results.append(obj)
    if not results:
        return None
    head["results"] = results
    return head, len(results)


def _bad(message: str, file: str, name: str, value: Any) -> CalibrationError:
    return CalibrationError(message, file=file, field=name, value=value, has_value=True)


MOST = 2**31 - 1
"""No count in a header is larger: nccl-tests prints them as C ints (ranks, GPUs, threads,
out-of-bounds values); 1e30 is not a rank count."""


def _whole(value: Any, file: str, name: str, least: int, what: str = "a whole number") -> int:
    """A count nccl-tests writes as a JSON int (a digit string or a whole float is taken too)."""
    if isinstance(value, str) and value.strip().isdecimal():
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"not {what}", file, name, value)
    if value < least:
        raise _bad(f"must be >= {least}", file, name, value)
    if value > MOST:
        raise _bad(f"must be <= {MOST}", file, name, value)
    return value


def _object(doc: dict[str, Any], key: str, file: str) -> dict[str, Any]:
    """``doc[key]`` as an object ({} where absent or null); anything else is an error."""
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(f"not a JSON object ({type(value).__name__})", file, key, value)
    return value


def _strings(doc: dict[str, Any], key: str, file: str, what: str) -> list[str]:
    """``doc[key]`` as a list of strings ([] where absent or null); anything else is an error
    (a string would otherwise be read character by character)."""
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise _bad(f"not a list of {what}", file, key, value)
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise _bad(f"not a string ({what})", file, f"{key}[{i}]", item)
    return value


def _devices(config: dict[str, Any], file: str) -> list[dict[str, Any]]:
    """``config.devices``: one object per process; host and GPU name, where given, are strings."""
    devices = config.get("devices")
    if devices is None:
        return []
    if not isinstance(devices, list):
        raise _bad("not a list of device objects", file, "config.devices", devices)
    for i, d in enumerate(devices):
        if not isinstance(d, dict):
            raise _bad("not a device object", file, f"config.devices[{i}]", d)
        for key in ("hostname", "device_info"):
            if d.get(key) is not None and not isinstance(d[key], str):
                raise _bad("not a string", file, f"config.devices[{i}].{key}", d[key])
    return devices


def _header(doc: dict[str, Any], file: str, facts: Facts) -> None:
    """Fill ``facts`` from the document's header fields, each type-checked: a wrongly typed one
    is an error naming it (it used to crash the reader, or be misread: ``args`` given as a string
    made the collective its first character)."""
    args = _strings(doc, "args", file, "command-line words")
    facts.collective = args[0] if args and args[0] else None
    for entry in _strings(doc, "env", file, "NAME=value settings"):
        name, sep, value = entry.partition("=")
        if sep and name.startswith("NCCL_"):
            facts.env[name] = value
    version = doc.get("nccl_version")
    if isinstance(version, str) and _VERSION_TEXT.fullmatch(version.strip()):
        facts.nccl_version = version.strip()  # "2.27.3": a version, not a code
    elif version is not None:
        facts.library_code = _whole(version, file, "nccl_version", 0,
                                    "an NCCL version code (22703) or version (2.27.3)")  # fmt: skip
    config = _object(doc, "config", file)
    counts = {}
    for key in ("ngpus", "nthreads"):
        if config.get(key) is not None:
            counts[key] = _whole(config[key], file, f"config.{key}", 1)
    facts.gpus_per_thread = counts.get("ngpus")
    devices = _devices(config, file)
    if devices:
        per_process = counts.get("nthreads", 1) * counts.get("ngpus", 1)
        facts.ranks, facts.ranks_source = len(devices) * per_process, "devices"
        hosts = [d.get("hostname") for d in devices]
        facts.hosts = list(dict.fromkeys(hosts)) if all(hosts) else []  # one missing: unknown
        names = [d["device_info"] for d in devices if d.get("device_info")]
        facts.gpu = " / ".join(dict.fromkeys(names)) or None
    average = _object(doc, "average_bus_bandwidth", file)
    if average.get("bandwidth") is not None:
        facts.avg_busbw = _bandwidth(average["bandwidth"], file, facts)
    oob = _object(doc, "out_of_bounds", file)
    if oob.get("count") is not None:
        count = _whole(oob["count"], file, "out_of_bounds.count", 0)
        okay = oob.get("okay")  # nccl-tests writes booleans as "true" / "false"
        if isinstance(okay, str) and okay.strip().lower() in ("true", "false"):
            okay = okay.strip().lower() == "true"
        if okay is not None and not isinstance(okay, bool):
            raise _bad("not true or false", file, "out_of_bounds.okay", oob["okay"])
        if okay is not None and okay != (count == 0):  # nccl-tests: okay is count == 0
            raise _bad(f"says {'OK' if okay else 'FAILED'} for {count} out-of-bounds values",
                       file, "out_of_bounds.okay", oob["okay"])  # fmt: skip
        facts.oob = (count, "OK" if count == 0 else "FAILED")


def _bandwidth(value: Any, file: str, facts: Facts) -> float | None:
    """The average bus bandwidth, a number (nccl-tests writes a NaN as ``"nan"``: noted, None)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        raise _bad("not a number", file, "average_bus_bandwidth.bandwidth", value) from None
    if not math.isfinite(number):
        facts.notes.append(f"average bus bandwidth is {value!r}: not a number, left out")
        return None
    return number


def read(text: str, file: str) -> tuple[Facts, list[Draft]]:
    """Facts and draft rows from a ``-J`` JSON document (a truncated one: what it completed)."""
    cut: str | None = None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        salvaged = _salvage(text)
        if salvaged is None:
            raise CalibrationError(
                f"malformed or truncated JSON: {exc.msg} (character {exc.pos} of {len(text)})",
                file=file,
                field=f"line {exc.lineno}",
            ) from None
        doc, kept = salvaged
        cut = (
            f"the JSON stops at line {exc.lineno} ({exc.msg}): a run cut short? "
            f"{kept} complete result(s) before it read"
        )
    results = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(results, list) or not results:
        raise CalibrationError(
            "no nccl-tests results in this JSON document", file=file, field="results"
        )
    facts = Facts(json=True)
    if cut:
        facts.notes.append(cut)
    _header(doc, file, facts)
    drafts = []
    for i, r in enumerate(results):
        try:
            root = str(r.get("root", "")).strip()
            drafts.append(
                Draft(
                    0,
                    int(r["size"]),
                    int(r["count"]),
                    str(r["type"]),
                    r.get("redop") or None,
                    int(root) if root else None,
                    [_group(r.get("out_of_place"), file, i), _group(r.get("in_place"), file, i)],
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise CalibrationError(
                "JSON result lacks size/count/type", file=file, field=f"results[{i}]", value=r
            ) from None
    return facts, drafts
