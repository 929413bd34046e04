"""The tuner: for every size, the (algorithm, protocol, channels) with the smallest predicted time.

NCCL picks its algorithm and protocol per call by evaluating its cost model for each enabled
combination and taking the fastest (``ncclTopoGetAlgoInfo`` -> ``ncclTopoGetAlgoTime``); this does
the same over collsim's algorithms with the analytic model (or, with ``model="nccl"``, over NCCL's
own algorithms with NCCL's model). Ties go to the earlier candidate: the registry's default
algorithm first, Simple before LL128 before LL -- so an algorithm or protocol changes only where
it is strictly faster -- and more channels before fewer (NCCL spreads a collective over all its
channels; a model that prices two counts alike still gets that spread).

:func:`ranges` compresses the per-size winners into size ranges, with each range's speed-up over
the default algorithm with Simple on one channel (ring/Simple for all_reduce, all_gather and
reduce_scatter), what ``collsim tune`` prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from collsim.collectives.registry import NCCL_ALGORITHMS, default_algorithm, runs_protocol
from collsim.errors import ScheduleError
from collsim.model.nccl import NcclModel
from collsim.model.nccl_choice import follow_nccl
from collsim.model.params import under_floor

PROTOCOL_ORDER = ("Simple", "LL128", "LL")
CHANNEL_OPTIONS = (1, 2, 4, 8)
"""Channel counts the tuner considers over every schedule collsim knows (``tune --candidates
all``, the step model), with NCCL's own count on the system where the model knows it
(:func:`all_channel_options`): a channel moves at most its own rate, so eight channels do not
fill an H100's NVLink port (8 x 38.7 < 450 GB/s) where NCCL's 24 do."""


def all_channel_options(model: Any, collective: str) -> tuple[int, ...]:
    """:data:`CHANNEL_OPTIONS` and NCCL's count for ``collective`` (the model's
    ``nccl_channels``) where it has one."""
    count = getattr(model, "nccl_channels", None)
    extra = {int(count(collective))} if count is not None else set()
    return tuple(sorted(set(CHANNEL_OPTIONS) | extra))


NCCL_CHANNELS = (1, 8)
"""Channel counts an NCCL-like choice considers for a model that does not know NCCL's own count
on its system (:func:`nccl_channel_options`; NCCL's model, which prices a channel count by the
search's bandwidth, keeps these)."""


def nccl_channel_options(model: Any, collective: str) -> tuple[int, ...]:
    """Channel counts an NCCL-like choice considers (``validate``, ``simulate --tuned``, ``tune``):
    the count NCCL runs ``collective`` on here (the model's ``nccl_channels``,
    :mod:`collsim.model.nccl_channels`: 24 in one DGX H100, 16 across nodes, 2 on PCIe; the
    per-peer count for ``sendrecv``), and fewer: 1 and 8 where NCCL's is larger. Every channel
    has a rate ceiling, so the count decides how much of a port the collective fills; NCCL runs
    fewer channels on small messages (``enqueue.cc``: while a channel would get under its
    threads x ``NCCL_*_THREAD_THRESHOLD`` bytes), and collsim's pipelines keep a fixed chunk, so
    at medium sizes a count between can be faster. :data:`NCCL_CHANNELS` for a model without
    the count."""
    count = getattr(model, "nccl_channels", None)
    if count is None:
        return NCCL_CHANNELS
    most = int(count(collective))
    return tuple(c for c in sorted({1, min(8, most), most}))


@dataclass(frozen=True)
class Choice:
    """One tuner candidate."""

    algorithm: str
    protocol: str
    channels: int

    def label(self) -> str:
        return f"{self.algorithm}/{self.protocol}/{self.channels}ch"


@dataclass
class Tuning:
    """Per-size winners of one collective: choices, their times and the baseline's."""

    collective: str
    sizes_bytes: np.ndarray
    choices: list[Choice]
    times_s: np.ndarray  # (len(choices), len(sizes))
    best: np.ndarray  # index into choices per size
    baseline: Choice
    baseline_s: np.ndarray
    candidates: str = "all"
    """Which question the winners answer: ``nccl`` (what NCCL would run: NCCL's algorithms,
    default protocols, :func:`nccl_channel_options`) or ``all`` (every candidate the tuner was
    given)."""

    def question(self) -> str:
        """What the winners are, in words, naming the candidates that were ranked."""
        algos = ", ".join(dict.fromkeys(c.algorithm for c in self.choices))
        protos = ", ".join(dict.fromkeys(c.protocol for c in self.choices))
        chans = _either(sorted({c.channels for c in self.choices}))
        if self.candidates == "nccl":
            return (
                f"what NCCL would run: per size the fastest of NCCL's algorithms here ({algos}), "
                f"the protocols it enables by default ({protos}) and {chans} channels"
            )
        return (
            f"the fastest schedule collsim knows, not what NCCL runs: per size the fastest of "
            f"every algorithm here ({algos}), protocol ({protos}) and {chans} channels"
        )

    @property
    def best_s(self) -> np.ndarray:
        return self.times_s[self.best, np.arange(self.sizes_bytes.size)]

    def choice_at(self, i: int) -> Choice:
        return self.choices[int(self.best[i])]


def _either(counts: list[int]) -> str:
    """``1``, ``1 or 8``, ``1, 2, 4 or 8``."""
    words = [str(c) for c in counts]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


@dataclass(frozen=True)
class Range:
    """Sizes ``lo..hi`` (inclusive, bytes) where ``choice`` wins, and its speed-up over baseline."""

    lo_bytes: int
    hi_bytes: int
    choice: Choice
    speedup_min: float
    speedup_max: float

    def as_json(self) -> dict[str, Any]:
        return {
            "from_bytes": self.lo_bytes,
            "to_bytes": self.hi_bytes,
            "algorithm": self.choice.algorithm,
            "protocol": self.choice.protocol,
            "channels": self.choice.channels,
            "speedup_min": self.speedup_min,
            "speedup_max": self.speedup_max,
        }


class CostModel(Protocol):
    """What the tuner needs of a cost model -- :class:`~collsim.model.analytic.AnalyticModel`,
    :class:`~collsim.model.nccl.NcclModel` and the calibration's
    :class:`~collsim.calibration.predict.ScaledModel` are the three: the algorithms it can time
    for a collective, and the time (seconds) of one (algorithm, protocol, channels) per size --
    with ``floor=False``, without the host's floor every choice shares (``floor_s``, a
    calibration's launch and point-to-point costs; 0 where absent), which is what ranks choices
    below it. A model may also say why it prices none of a collective's algorithms
    (``no_estimate(collective)``: the error to raise, or None)."""

    nranks: int

    def candidates(self, collective: str) -> list[str]: ...

    def predict(
        self,
        collective: str,
        algorithm: str,
        sizes_bytes: np.ndarray | list[int] | int,
        *,
        elem_bytes: int = 4,
        protocol: str = "Simple",
        channels: int = 1,
        floor: bool = True,
    ) -> np.ndarray: ...


def host_floor_s(model: Any, collective: str) -> float:
    """The floor ``model`` puts under back-to-back calls of ``collective`` (its ``floor_s``; 0 for
    a model without one, such as NCCL's)."""
    floor = getattr(model, "floor_s", None)
    return float(floor(collective)) if floor is not None else 0.0


class Tuner:
    """Best choice per size from a :class:`CostModel`."""

    def __init__(
        self,
        model: CostModel,
        *,
        protocols: tuple[str, ...] = PROTOCOL_ORDER,
        channels: tuple[int, ...] | None = None,
        defaults: bool = True,
        chunk_bytes: int | None = None,
    ) -> None:
        self.model = model
        self.protocols = protocols
        self.channels = channels
        """Channel counts to rank; ``None``: :func:`all_channel_options` per collective."""
        self.extra = {"chunk_bytes": chunk_bytes} if chunk_bytes is not None else {}
        """What else the model prices with (a pipelining chunk the user chose)."""
        self.defaults = defaults
        """Keep to what NCCL enables by default (the model's ``enabled``, e.g. LL128 only on
        NVLink systems); false where the user enabled protocols explicitly (``NCCL_PROTO``)."""

    def _enabled(self, collective: str, choice: Choice) -> bool:
        if not runs_protocol(choice.algorithm, choice.protocol):
            return False
        check = getattr(self.model, "enabled", None) if self.defaults else None
        if check is None:
            return True
        return bool(check(collective, choice.algorithm, choice.protocol, choice.channels))

    def tune(
        self,
        collective: str,
        sizes_bytes: np.ndarray | list[int],
        *,
        elem_bytes: int = 4,
        algorithms: list[str] | None = None,
    ) -> Tuning:
        """Evaluate every candidate at every size and keep the fastest per size."""
        sizes = np.asarray(sizes_bytes, dtype=np.int64)
        algos = algorithms if algorithms is not None else self.model.candidates(collective)
        why = getattr(self.model, "no_estimate", None)
        if not algos and why is not None and (error := why(collective)) is not None:
            raise error  # e.g. NCCL's model, which prices no all-to-all
        chans = self.channels or all_channel_options(self.model, collective)
        choices: list[Choice] = []
        rows: list[np.ndarray] = []
        first_error: ScheduleError | None = None
        for algo in algos:
            for proto in self.protocols:
                # More channels first, so ties go to them: NCCL spreads a collective over all
                # its channels unless the size is too small to fill them, and where a model
                # prices two counts alike (NCCL's own has no channel term for many cases) the
                # larger is what NCCL runs, and what the engine then times.
                for ch in sorted(chans, reverse=True):
                    choice = Choice(algo, proto, ch)
                    try:
                        if not self._enabled(collective, choice):
                            continue
                        t = self.model.predict(
                            collective, algo, sizes, elem_bytes=elem_bytes, protocol=proto,
                            channels=ch, floor=False, **self.extra,
                        )  # fmt: skip
                    except ScheduleError as exc:  # e.g. in-network without a reachable switch
                        first_error = first_error or exc
                        break
                    choices.append(choice)
                    rows.append(np.asarray(t, dtype=np.float64))
        if not choices:
            raise first_error or ScheduleError(
                f"no algorithm can run {collective} here", field="algorithm", value="auto"
            )
        # Rank on the time above the launch floor (every choice shares it), report with it.
        unfloored = np.vstack(rows)
        best = np.argmin(np.where(np.isfinite(unfloored), unfloored, np.inf), axis=0)
        times = under_floor(unfloored, host_floor_s(self.model, collective))
        base_algo = default_algorithm(collective)
        baseline = Choice(base_algo, "Simple", 1)
        try:
            base_s = np.asarray(
                self.model.predict(collective, base_algo, sizes, elem_bytes=elem_bytes),
                dtype=np.float64,
            )
        except ScheduleError:
            baseline = choices[0]
            base_s = times[0]
        return Tuning(collective, sizes, choices, times, best, baseline, base_s)


def ranges(tuning: Tuning) -> list[Range]:
    """Consecutive sizes with the same winner, merged, with min/max speed-up over the baseline."""
    out: list[Range] = []
    best_s = tuning.best_s
    with np.errstate(divide="ignore", invalid="ignore"):
        speed = np.where(best_s > 0, tuning.baseline_s / best_s, 1.0)
    start = 0
    n = tuning.sizes_bytes.size
    for i in range(1, n + 1):
        if i == n or tuning.best[i] != tuning.best[start]:
            seg = speed[start:i]
            out.append(
                Range(
                    int(tuning.sizes_bytes[start]),
                    int(tuning.sizes_bytes[i - 1]),
                    tuning.choice_at(start),
                    float(seg.min()),
                    float(seg.max()),
                )
            )
            start = i
    return out


def tuned_algorithms(
    model: CostModel,
    collective: str,
    sizes_bytes: list[int],
    *,
    elem_bytes: int,
    protocol: str,
    channels: int,
    chunk_bytes: int | None = None,
) -> list[str]:
    """The fastest algorithm per size with protocol, channels (and chunk) fixed (``simulate -a
    auto``; the protocol is the user's, so it runs even where NCCL would not pick it by
    default)."""
    tuner = Tuner(model, protocols=(protocol,), channels=(channels,), defaults=False,
                  chunk_bytes=chunk_bytes)  # fmt: skip
    result = tuner.tune(collective, sizes_bytes, elem_bytes=elem_bytes)
    return [result.choice_at(i).algorithm for i in range(len(sizes_bytes))]


def nccl_algorithms(
    model: CostModel, collective: str, allowed: tuple[str, ...] | None = None
) -> list[str]:
    """NCCL's algorithms for ``collective`` (or those ``allowed``, e.g. by ``NCCL_ALGO``) that
    ``model`` can run here; its first runnable one where none is."""
    runnable = model.candidates(collective)
    wanted = allowed if allowed is not None else NCCL_ALGORITHMS.get(collective, ())
    return [a for a in wanted if a in runnable] or runnable[:1]


def nccl_tuning(
    model: CostModel, collective: str, sizes_bytes: list[int] | np.ndarray, *, elem_bytes: int
) -> Tuning:
    """What NCCL would run per size (``simulate --tuned``, ``tune --candidates nccl``): the
    fastest of NCCL's own algorithms (:data:`collsim.collectives.registry.NCCL_ALGORITHMS`, those
    the model can run here), over the protocols NCCL enables by default and
    :func:`nccl_channel_options`, as its tuner picks; an all-reduce across nodes runs the one of
    ring and tree NCCL's own tuning table ranks first (:func:`collsim.model.nccl_choice.
    follow_nccl`), timed by ``model``. One function for both commands, so they agree."""
    tuner = Tuner(model, protocols=PROTOCOL_ORDER, channels=nccl_channel_options(model, collective))
    algos = nccl_algorithms(model, collective)
    result = tuner.tune(collective, sizes_bytes, elem_bytes=elem_bytes, algorithms=algos)
    result.candidates = "nccl"
    topology = getattr(model, "topology", None)
    if isinstance(model, NcclModel) or topology is None:
        return result  # NCCL's own model ranks ring and tree itself
    system = getattr(model, "system", None)
    return follow_nccl(result, topology, getattr(system, "network", None), elem_bytes=elem_bytes)


def nccl_choices(
    model: CostModel, collective: str, sizes_bytes: list[int], *, elem_bytes: int
) -> list[Choice]:
    """:func:`nccl_tuning`'s choice per size."""
    result = nccl_tuning(model, collective, sizes_bytes, elem_bytes=elem_bytes)
    return [result.choice_at(i) for i in range(len(sizes_bytes))]


CANDIDATES = ("nccl", "all")
"""``tune --candidates``: ``nccl``, what NCCL would run (:func:`nccl_tuning`); ``all``, the
fastest of every schedule the model prices here (every algorithm, the protocols NCCL enables by
default, :data:`CHANNEL_OPTIONS`), which NCCL may not have."""


def tuning(
    model: CostModel,
    collective: str,
    sizes_bytes: list[int] | np.ndarray,
    *,
    elem_bytes: int,
    candidates: str = "nccl",
) -> Tuning:
    """The winners per size among ``candidates`` (:data:`CANDIDATES`)."""
    if candidates not in CANDIDATES:
        raise ScheduleError(
            f"unknown candidate set (choose from {', '.join(CANDIDATES)})",
            field="candidates",
            value=candidates,
        )
    if candidates == "nccl":
        return nccl_tuning(model, collective, sizes_bytes, elem_bytes=elem_bytes)
    return Tuner(model).tune(collective, sizes_bytes, elem_bytes=elem_bytes)


def model_description(model: Any) -> str:
    """Which cost model priced a choice, in words (its ``description``; the class name of a
    model without one)."""
    return str(getattr(model, "description", type(model).__name__))
