"""A results directory that survives being killed: each measurement is kept the moment it completes.

Layout of a store directory::

    manifest.json              what is done: per point its file, size and SHA-256, plus the run's
                               identity (runner, ranks, type, ...) and each collective's preamble
    points/<coll>/<size>.json  one torch-benchmark measurement (one collective at one size)
    logs/<coll>.txt            the nccl-tests-compatible log of a collective (``read_log`` reads it)
    *.partial                  output of a command still running (or killed while running)

Every file is written atomically (:mod:`collsim.io`: temporary file + ``os.replace``) and recorded
in the manifest only afterwards, so a kill at any moment loses at most the measurement in flight.
On the next run, :meth:`ResultStore.problems` reports what an interrupted run left behind (stray
temporary files, ``.partial`` output, files that no longer match their checksum, files the manifest
does not list) and none of it is used: those points are measured again.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from collsim.calibration.nccltests import Row
from collsim.calibration.writer import format_rows
from collsim.errors import CalibrationError
from collsim.io import atomic_write_bytes, atomic_write_text, make_folders

MANIFEST = "manifest.json"
_FORMAT = "collsim-calibration-store"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def point_key(collective: str, size_bytes: int) -> str:
    """The manifest key of one collective at one size."""
    return f"{collective}/{size_bytes}"


class ResultStore:
    """One results directory; ``identity`` names the run it belongs to (mixing runs is an error)."""

    def __init__(self, root: str | Path, identity: Mapping[str, Any]) -> None:
        self.root = Path(root)
        self.identity = dict(identity)
        self.manifest_path = self.root / MANIFEST
        self.manifest: dict[str, Any] = {
            "format": _FORMAT,
            "version": 1,
            "identity": self.identity,
            "points": {},
            "preambles": {},
        }
        if self.manifest_path.exists():
            self._load()

    def _load(self) -> None:
        path = str(self.manifest_path)
        try:
            doc = json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise CalibrationError(
                f"unreadable manifest ({exc}); move the directory aside", file=path
            ) from None
        if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
            raise CalibrationError("not a collsim results manifest", file=path)
        theirs = doc.get("identity") or {}
        for key, value in self.identity.items():
            if key in theirs and theirs[key] != value:
                raise CalibrationError(
                    f"this directory holds a run with {key}={theirs[key]!r}, this run has "
                    f"{value!r}; use another --out",
                    file=path,
                    field=key,
                )
        doc.setdefault("points", {})
        doc.setdefault("preambles", {})
        points = doc["points"]
        bad = (
            [points] if not isinstance(points, dict)
            else [k for k, e in points.items() if not isinstance(e, dict)
                  or not isinstance(e.get("file"), str) or not isinstance(e.get("sha256"), str)]
        )  # fmt: skip
        preambles = doc["preambles"]
        if not isinstance(preambles, dict) or not all(
            isinstance(v, list) and all(isinstance(x, str) for x in v) for v in preambles.values()
        ):
            bad = bad or [preambles]
        if bad:  # hand-edited: every entry names its file and checksum, a preamble its lines
            raise CalibrationError(
                "a manifest entry is not {file, sha256, ...} (or a preamble not a list of "
                "lines): edited by hand? move the directory aside",
                file=path, field="points", value=bad[0],
            )  # fmt: skip
        doc["identity"] = {**theirs, **self.identity}
        self.manifest = doc

    def _save(self) -> None:
        atomic_write_text(self.manifest_path, json.dumps(self.manifest, indent=1) + "\n")

    # -- what is there ---------------------------------------------------------------------------

    def verified(self, key: str) -> bytes | None:
        """The bytes recorded under ``key`` if the file is still exactly what was recorded."""
        entry = self.manifest["points"].get(key)
        if not entry:
            return None
        try:
            data = (self.root / entry["file"]).read_bytes()
        except OSError:
            return None
        return data if _sha256(data) == entry["sha256"] else None

    def done(self, key: str) -> bool:
        """True when ``key`` completed in an earlier run and its file is intact."""
        return self.verified(key) is not None

    def problems(self) -> list[str]:
        """What an interrupted or tampered-with run left behind; none of it is used."""
        found: list[str] = []
        if not self.root.exists():
            return found
        for tmp in sorted(self.root.rglob(".*.tmp")):
            found.append(f"{tmp}: temporary file of an interrupted write; ignored")
        for partial in sorted(self.root.rglob("*.partial")):
            found.append(
                f"{partial}: output of a run that did not finish; not used as a result (kept "
                "aside when its command runs again)"
            )
        recorded = set()
        for key, entry in sorted(self.manifest["points"].items()):
            recorded.add(entry["file"])
            path = self.root / entry["file"]
            if not path.exists():
                found.append(f"{path}: recorded as done but missing; redoing {key}")
            elif self.verified(key) is None:
                found.append(
                    f"{path}: truncated or changed since it was recorded "
                    f"(checksum mismatch); redoing {key}"
                )
        for path in sorted((self.root / "points").rglob("*.json")):
            if path.relative_to(self.root).as_posix() not in recorded:
                found.append(
                    f"{path}: not in the manifest (killed before it was recorded); redoing it"
                )
        return found

    def clean(self) -> None:
        """Remove stray temporary files of interrupted atomic writes (never anything recorded)."""
        for tmp in self.root.rglob(".*.tmp"):
            tmp.unlink(missing_ok=True)

    # -- recording -------------------------------------------------------------------------------

    def record(self, key: str, relpath: str, data: bytes, **meta: Any) -> Path:
        """Write ``data`` to ``relpath`` atomically, then list it in the manifest as done."""
        path = atomic_write_bytes(make_folders(self.root / relpath, within=self.root), data)
        self.manifest["points"][key] = {
            "file": relpath,
            "sha256": _sha256(data),
            "bytes": len(data),
            "completed": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            **meta,
        }
        self._save()
        return path

    def set_preamble(self, collective: str, lines: Sequence[str]) -> None:
        """The lines printed before a collective's table (devices, versions, parameters)."""
        self.manifest["preambles"][collective] = list(lines)
        self._save()

    def record_point(self, collective: str, row: Row) -> Path:
        """Keep one measured row, then re-render the collective's log from all its rows."""
        payload = json.dumps({"collective": collective, "row": asdict(row)}, indent=1) + "\n"
        key = point_key(collective, row.size_bytes)
        self.record(
            key,
            f"points/{collective}/{row.size_bytes}.json",
            payload.encode(),
            collective=collective,
            size_bytes=row.size_bytes,
        )
        return self.render_log(collective)

    def rows(self, collective: str) -> list[Row]:
        """The intact recorded rows of ``collective``, by size."""
        rows = []
        for key, entry in self.manifest["points"].items():
            if entry.get("collective") != collective or "size_bytes" not in entry:
                continue
            data = self.verified(key)
            if data is not None:
                rows.append(Row(**json.loads(data)["row"]))
        return sorted(rows, key=lambda r: r.size_bytes)

    def settle(self) -> list[Path]:
        """Re-render the log of every collective with recorded points from what the manifest holds.

        A benchmark process stopped between keeping a point and re-rendering its log leaves the log
        one row behind; the points are the truth, so the run calls this whenever it ends.
        """
        if self.manifest_path.exists():
            self._load()
        names = sorted(
            {
                e["collective"]
                for e in self.manifest["points"].values()
                if "size_bytes" in e and isinstance(e.get("collective"), str)
            }
        )
        return [self.render_log(name) for name in names]

    def render_log(self, collective: str) -> Path:
        """Write ``logs/<collective>.txt`` (nccl-tests format) from the recorded rows."""
        preamble = self.manifest["preambles"].get(collective, [])
        text = format_rows(self.rows(collective), preamble=preamble)
        path = make_folders(self.root / "logs" / f"{collective}.txt", within=self.root)
        return atomic_write_text(path, text)
