"""What a measured nccl-tests log says its prediction must follow: the system it ran on, the NCCL
settings that bind it, and its timed rows.

:func:`topology_for_log` builds the measured system: the ranks (and nodes, where known) come
from the log, ``--nodes`` / ``--gpus-per-node`` override, and a rank count the topology cannot
hold is a clear error. :func:`log_env` gives the ``NCCL_*`` settings the log records over the
caller's, :func:`constraints` what they allow NCCL to run (``NCCL_ALGO``, ``NCCL_PROTO``,
``NCCL_TREE_THRESHOLD``, ``NCCL_{MIN,MAX}_NCHANNELS``; NCCL's ``docs/env.rst``) and
:func:`check_env` refuses what NCCL itself would. :func:`measured_points` takes the out-of-place
rows (the time nccl-tests reports first). The predictions themselves are
:mod:`collsim.calibration.predict`'s.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from collsim.calibration.nccltests import NcclTestsLog
from collsim.collectives.registry import NCCL_ALGORITHMS
from collsim.dtypes import dtype_bytes
from collsim.errors import CalibrationError, CollsimError
from collsim.model.nccl_release import FLUSH_ENV
from collsim.model.tuner import NCCL_CHANNELS, PROTOCOL_ORDER
from collsim.tables import plural
from collsim.topology.loader import load_topology
from collsim.topology.spec import Topology

_ALGO_ENV = {"ring": "ring", "tree": "tree", "nvls": "in_network", "nvlstree": "nvls_tree",
             "collnet": "collnet", "collnetdirect": "collnet", "pat": "pat",
             "collnetchain": "collnet"}  # fmt: skip


@dataclass(frozen=True)
class Constraints:
    """What a log's NCCL_* settings allow: algorithms, protocols and channel counts."""

    algorithms: tuple[str, ...] | None = None
    protocols: tuple[str, ...] = PROTOCOL_ORDER
    channels: tuple[int, ...] = NCCL_CHANNELS


def _env_list(value: str) -> tuple[list[str], bool]:
    """NCCL's list syntax: ``a,b`` enables, ``^a,b`` disables (returns names, negated)."""
    value = value.strip()
    neg = value.startswith("^")
    names = [v.strip().lower() for v in value.lstrip("^").split(",") if v.strip()]
    return names, neg


MODELLED_ENV = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS",
                "NCCL_TREE_THRESHOLD", *FLUSH_ENV)  # fmt: skip
"""The NCCL (and net plugin) settings that change collsim's predictions (:func:`constraints`;
the GPUDirect receive flush's, :func:`collsim.model.nccl_release.receive_flush`); others
(network interface names, debug levels, ...) are real NCCL settings that collsim does not
model."""


def unmodelled_env(env: dict[str, str]) -> list[str]:
    """One note per setting of ``env`` that changes no prediction, with the modelled name a
    typo was probably meant to be (``NCCL_ALG0`` -> ``NCCL_ALGO``)."""
    import difflib

    notes = []
    for key in sorted(set(env) - set(MODELLED_ENV)):
        close = difflib.get_close_matches(key, MODELLED_ENV, n=1, cutoff=0.8)
        hint = f" (did you mean {close[0]}?)" if close else ""
        notes.append(f"{key} is not modelled by collsim and changes no prediction{hint}")
    return notes


def check_env(env: dict[str, str]) -> None:
    """Refuse NCCL settings NCCL itself would refuse: an unknown algorithm (``NCCL_ALGO``) or
    protocol (``NCCL_PROTO``), a channel count that is not a positive integer, a flush switch
    (:data:`~collsim.model.nccl_release.FLUSH_ENV`) that is not an integer."""
    known = {"NCCL_ALGO": {*_ALGO_ENV, "pat"}, "NCCL_PROTO": {p.lower() for p in PROTOCOL_ORDER}}
    for key, names in known.items():
        if key in env:
            bad = [n for n in _env_list(env[key])[0] if n not in names]
            if bad or not _env_list(env[key])[0]:
                raise CalibrationError(
                    f"{key} takes {', '.join(sorted(names))} (comma-separated, ^ to exclude)",
                    field="--nccl-env",
                    value=f"{key}={env[key]}",
                )
    for key in ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS"):
        if key in env and not (env[key].strip().isdecimal() and int(env[key]) >= 1):
            raise CalibrationError("must be a positive integer", field="--nccl-env",
                                   value=f"{key}={env[key]}")  # fmt: skip
    for key in FLUSH_ENV:  # NCCL reads them as integers (0 off), the plugin too
        if key in env and not env[key].strip().lstrip("-").isdecimal():
            raise CalibrationError("takes an integer (0: off, 1: on)", field="--nccl-env",
                                   value=f"{key}={env[key]}")  # fmt: skip


def constraints(
    env: dict[str, str], collective: str, usual: tuple[int, ...] = NCCL_CHANNELS
) -> Constraints:
    """The algorithms / protocols / channels NCCL may use under the settings ``env``, ``usual``
    being the channel counts it considers unconstrained (one and its own count here,
    :func:`~collsim.model.tuner.nccl_channel_options`)."""
    algos: tuple[str, ...] | None = None
    protos = PROTOCOL_ORDER
    channels = usual
    if "NCCL_ALGO" in env:
        names, neg = _env_list(env["NCCL_ALGO"])
        chosen = {_ALGO_ENV[n] for n in names if n in _ALGO_ENV}
        base = NCCL_ALGORITHMS.get(collective, ())
        algos = tuple(a for a in base if (a in chosen) != neg)
        if collective in ("broadcast", "reduce") and ("ring" in chosen) != neg:
            algos = ("chain",)  # NCCL runs broadcast/reduce as a ring chain
        if not algos:
            algos = None  # a setting that does not concern this collective
    if env.get("NCCL_TREE_THRESHOLD", "").strip() == "0" and collective == "all_reduce":
        algos = tuple(a for a in (algos or NCCL_ALGORITHMS[collective]) if a != "tree")
    if "NCCL_PROTO" in env:
        names, neg = _env_list(env["NCCL_PROTO"])
        picked = tuple(p for p in PROTOCOL_ORDER if (p.lower() in names) != neg)
        protos = picked or PROTOCOL_ORDER
    lo = max(1, _int_env(env, "NCCL_MIN_NCHANNELS", 1))
    hi = max(1, _int_env(env, "NCCL_MAX_NCHANNELS", max(max(usual), lo)))
    # Where no usual count is allowed (NCCL_MIN_NCHANNELS=32, or 2..4), the most allowed.
    channels = tuple(c for c in usual if lo <= c <= hi) or (max(lo, min(hi, max(usual))),)
    return Constraints(algos, protos, channels)


def asked_for_ll128(env: dict[str, str]) -> bool:
    """``NCCL_PROTO`` names LL128 (not negated)."""
    if "NCCL_PROTO" not in env:
        return False
    names, neg = _env_list(env["NCCL_PROTO"])
    return "ll128" in names and not neg


def _int_env(env: dict[str, str], key: str, default: int) -> int:
    try:
        return int(env[key])
    except (KeyError, ValueError):
        return default


def env_from_notes(notes: str) -> dict[str, str]:
    """``NCCL_X=value`` settings quoted in free text (the dataset index's notes)."""
    return {k: v for k, v in re.findall(r"\b(NCCL_[A-Z0-9_]+)=([A-Za-z0-9_,^]+)", notes)}


def topology_for_log(
    topology: str | Topology,
    log: NcclTestsLog,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
) -> Topology:
    """The measured system: ``topology`` sized to the log's ranks (and nodes), flags overriding.

    Raises :class:`CalibrationError` naming the log, its ranks (or nodes) and the topology's
    GPUs when they cannot be made to agree: 8 ranks on one node are not two nodes of 4 GPUs,
    whose network the run never used.
    """
    if isinstance(topology, Topology):
        base = topology
    else:
        base = load_topology(topology, nodes=nodes, gpus_per_node=gpus_per_node)
        # One of the two given: the log's ranks give the other (--nodes 1 for a 4-rank log
        # means 4 GPUs of the node; never more GPUs per node than the template has).
        if (nodes is None) != (gpus_per_node is None) and base.n_gpus != log.ranks:
            given = nodes or gpus_per_node or 1
            other = log.ranks // given
            fits = gpus_per_node is not None or other <= base.gpus_per_node
            if log.ranks % given == 0 and fits:
                with contextlib.suppress(CollsimError):  # a fixed graph: the check below says why
                    base = load_topology(
                        topology,
                        nodes=nodes if nodes is not None else other,
                        gpus_per_node=gpus_per_node if gpus_per_node is not None else other,
                    )
    flags = nodes is not None or gpus_per_node is not None
    other_nodes = bool(log.nodes) and base.nodes != log.nodes
    if not flags and (base.n_gpus != log.ranks or other_nodes) and base.is_template:
        log_nodes = log.nodes
        if log_nodes and log.ranks % log_nodes == 0 and not isinstance(topology, Topology):
            with contextlib.suppress(CollsimError):  # a fixed graph: the check below says why
                base = load_topology(
                    topology, nodes=log_nodes, gpus_per_node=log.ranks // log_nodes
                )
    where = plural(log.nodes, "node") if log.nodes else "? nodes"
    if base.n_gpus != log.ranks:
        raise CalibrationError(
            f"the log ran on {log.ranks} ranks ({where}) but topology "
            f"{base.name} has {base.n_gpus} GPUs ({plural(base.nodes, 'node')} x "
            f"{base.gpus_per_node}); "
            "pass --nodes / --gpus-per-node to size it",
            file=log.file,
            field="ranks",
            value=log.ranks,
        )
    if not flags and log.nodes and base.nodes != log.nodes:
        raise CalibrationError(
            f"the log ran on {where} ({log.ranks} ranks; hosts from "
            f"{_NODES_FROM.get(log.nodes_source, 'the log')}) but topology {base.name} has "
            f"{plural(base.nodes, 'node')} x {base.gpus_per_node} GPUs; pass --nodes / "
            "--gpus-per-node to size it",
            file=log.file,
            field="nodes",
            value=log.nodes,
        )
    return base


_NODES_FROM = {"devices": "its device lines", "NCCL INFO lines": "its NCCL INFO lines",
               "given": "the index"}  # fmt: skip


def _gpu_families(name: str) -> set[str]:
    """Model numbers in a GPU's name (``A100``, ``H100``, ``MI300X``, ``4090``), not sizes."""
    words = re.sub(r"[-_/]", " ", name.upper())
    found = re.findall(r"\b[A-Z]{0,3}\d{3,4}[A-Z]{0,2}\b", words)
    return {w for w in found if not w.endswith(("GB", "W"))}


def gpu_mismatch(log: NcclTestsLog, topology: Topology) -> str | None:
    """A note when the log's GPU is not the one the topology models (an A100 log predicted on
    a DGX H100): the prediction is then of another system."""
    if not log.gpu:
        return None
    theirs, ours = _gpu_families(log.gpu), _gpu_families(topology.gpu.model)
    if theirs and not theirs & ours:  # a topology of no numbered GPU (CPUs under gloo) too
        return (
            f"{Path(log.file).name} ran on {log.gpu}, but topology {topology.name} models "
            f"{topology.gpu.model}: predicted for that system, not the measured one"
        )
    return None


def log_env(log: NcclTestsLog, env: dict[str, str] | None = None) -> dict[str, str]:
    """The NCCL_* settings that bind ``log``'s prediction: those it records (NCCL_ALGO=Ring,
    NCCL_MIN_NCHANNELS=32, ...) over ``env`` (a dataset's notes, the caller's): the log says what
    NCCL ran with."""
    return {**(env or {}), **log.nccl_env}


def measured_points(log: NcclTestsLog) -> tuple[np.ndarray, np.ndarray]:
    """(sizes in bytes, out-of-place time in seconds) of every row with a time and data.

    Rows of 0 bytes are left out: they time an empty call, which NCCL may return from at once
    (nccl-tests prints them where the count rounds down to 0 per rank)."""
    rows = [r for r in log.rows if r.time_us is not None and r.time_us > 0 and r.size_bytes > 0]
    if not rows:
        raise CalibrationError("the log has no timed rows with data", file=log.file)
    sizes = np.array([r.size_bytes for r in rows], dtype=np.int64)
    times = np.array([r.time_us for r in rows], dtype=np.float64) * 1e-6
    return sizes, times


def elem_bytes(log: NcclTestsLog) -> int:
    """Bytes per element of ``log``'s data type (4 where collsim does not know it)."""
    try:
        return dtype_bytes(log.dtype)
    except CollsimError:
        return 4
