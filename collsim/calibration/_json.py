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
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from collsim.calibration.rows import Draft, Group, Value
from collsim.errors import CalibrationError

if TYPE_CHECKING:
    from collsim.calibration._text import Section


@dataclass
class Facts:
    """What a log says about its run, whatever its format."""

    collective: str | None = None
    ranks: int | None = None
    ranks_source: str = ""
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
        elif s.info_nranks:
            facts.ranks, facts.ranks_source = s.info_nranks, "NCCL INFO 'nranks'"
        elif s.command_ranks:
            facts.ranks, facts.ranks_source = s.command_ranks, "the command line"
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
    config = doc.get("config") or {}
    devices = config.get("devices") or []
    facts = Facts(json=True, library_code=doc.get("nccl_version"))
    if cut:
        facts.notes.append(cut)
    args = doc.get("args") or []
    facts.collective = str(args[0]) if args else None
    facts.gpus_per_thread = int(config["ngpus"]) if config.get("ngpus") else None
    if devices:
        per_process = int(config.get("nthreads") or 1) * (facts.gpus_per_thread or 1)
        facts.ranks, facts.ranks_source = len(devices) * per_process, "devices"
        facts.hosts = list(dict.fromkeys(str(d.get("hostname")) for d in devices))
        facts.gpu = " / ".join(dict.fromkeys(str(d.get("device_info")) for d in devices))
    for entry in doc.get("env") or []:
        name, sep, value = str(entry).partition("=")
        if sep and name.startswith("NCCL_"):
            facts.env[name] = value
    avg = doc.get("average_bus_bandwidth") or {}
    facts.avg_busbw = avg.get("bandwidth")
    oob = doc.get("out_of_bounds") or {}
    if "count" in oob:
        okay = oob.get("okay", True)  # nccl-tests writes booleans as "true" / "false"
        okay = okay.strip().lower() == "true" if isinstance(okay, str) else bool(okay)
        facts.oob = (int(oob["count"]), "OK" if okay else "FAILED")
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
