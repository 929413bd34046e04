"""Stragglers in collectives: seeded per-rank start skew and slowdown, many samples, tail times.

A collective is as slow as its slowest participant: one rank entering late (a long kernel, a
data-loader hiccup, OS noise) or running its reductions slowly (thermal throttling, a shared GPU)
delays every rank that waits on it. This module draws per-rank start times and slowdown factors
from small distributions, times each draw on the discrete-event engine
(:func:`collsim.engine.simulate` with ``rank_start_s`` / ``rank_slowdown``, see
:mod:`collsim.engine.skew`) and summarises the completion times: mean, p50, p99, and their
ratio to the healthy (no-straggler) time.

Specs (``--skew``, ``--slowdown``), compact strings; times take units (``50us``, ``1.2ms``; a
bare number is microseconds):

========================  ==============================================================
skew                      each rank's start delay
========================  ==============================================================
``none``                  every rank starts together
``uniform:MAX``           uniform in [0, MAX]
``exp:MEAN``              exponential with mean MEAN
``lognormal:MEDIAN[,S]``  MEDIAN * exp(S * N(0, 1)); S (sigma) defaults to 0.5
``one:DELAY[@RANK]``      one rank (RANK, or a uniformly random one per sample) DELAY late
========================  ==============================================================

========================  ==============================================================
slowdown                  each rank's local-work factor (>= 1)
========================  ==============================================================
``none``                  1 everywhere
``uniform:MAX``           uniform in [1, MAX]
``exp:MEAN``              1 + exponential with mean MEAN - 1 (so the mean factor is MEAN)
``lognormal:S``           exp(S * abs(N(0, 1))): half-lognormal, 1 at best
``one:FACTOR[@RANK]``     one rank (RANK, or a random one per sample) FACTOR times slower
========================  ==============================================================

Sampled start times are shifted so the first rank enters at 0. Per sample two times are kept:
``completion_s``, from the first rank entering to the last rank finishing (what a job waits
for), and ``after_last_start_s``, from the last rank entering (what a profiler on the straggler
sees). Sample ``i`` draws from its own stream (``SeedSequence(seed).spawn``), so the numbers
depend only on (seed, i): the same whatever the sample count or the number of worker processes.

The analytic engine is not offered: a late rank's delay is absorbed by slack in some schedules
and not in others, and no closed form here says which exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from collsim import units
from collsim.collectives.registry import build_schedule
from collsim.dtypes import dtype_bytes
from collsim.engine import simulate
from collsim.errors import CollsimError
from collsim.model.tuner import tuned_algorithms
from collsim.protocols import get_protocol
from collsim.units import MAX_JOBS
from collsim.whatif import WhatIf, element_count

SKEW_KINDS = ("none", "uniform", "exp", "lognormal", "one")
SLOWDOWN_KINDS = ("none", "uniform", "exp", "lognormal", "one")
_ALIASES = {"exponential": "exp", "fixed": "one"}
DEFAULT_SIGMA = 0.5


@dataclass(frozen=True)
class Distribution:
    """A parsed skew or slowdown spec: ``kind``, its numbers (seconds or factors), an optional
    fixed rank; ``what`` is ``skew`` or ``slowdown``."""

    what: str
    kind: str
    params: tuple[float, ...] = ()
    rank: int | None = None
    spec: str = "none"

    @property
    def is_none(self) -> bool:
        return self.kind == "none"

    def sample(self, rng: np.random.Generator, nranks: int) -> np.ndarray:
        """One draw for every rank: start delays (seconds) or slowdown factors."""
        base = 0.0 if self.what == "skew" else 1.0
        out = np.full(nranks, base)
        k, p = self.kind, self.params
        if k == "uniform":
            out = rng.uniform(base, p[0], nranks) if p[0] > base else out
        elif k == "exp":
            out = base + rng.exponential(p[0] - base, nranks) if p[0] > base else out
        elif k == "lognormal" and self.what == "skew":
            out = p[0] * np.exp(p[1] * rng.standard_normal(nranks))
        elif k == "lognormal":
            out = np.exp(p[0] * np.abs(rng.standard_normal(nranks)))
        elif k == "one":
            rank = self.rank if self.rank is not None else int(rng.integers(nranks))
            out[rank] = p[0]
        return out


def _bad(what: str, spec: str, why: str) -> CollsimError:
    return CollsimError(why, field=f"--{what}", value=spec)


def _number(what: str, spec: str, text: str, *, time: bool) -> float:
    try:
        if not time:
            value = float(text)
        elif text.strip().startswith("-"):  # units reads times unsigned: say what is wrong
            value = -units.parse_time(text.strip()[1:])
        else:
            value = units.parse_time(text)
    except (CollsimError, ValueError):
        raise _bad(what, spec, f"not a {'time' if time else 'number'}: {text!r}") from None
    if not np.isfinite(value):
        raise _bad(what, spec, "must be finite")
    return float(value)


def parse_spec(what: str, spec: str) -> Distribution:
    """Parse a ``--skew`` (``what="skew"``) or ``--slowdown`` spec (grammar: module doc)."""
    if what not in ("skew", "slowdown"):
        raise ValueError(what)
    text = str(spec).strip()
    kind, _, args = text.partition(":")
    kind = _ALIASES.get(kind.strip().lower(), kind.strip().lower())
    if kind in ("none", "0", "1", "") and not args:
        return Distribution(what, "none", spec=text or "none")
    if kind == "none":
        raise _bad(what, text, "'none' takes no value")
    if kind not in SKEW_KINDS:
        raise _bad(what, text, f"unknown distribution (use {', '.join(SKEW_KINDS)})")
    if not args.strip():
        raise _bad(what, text, f"'{kind}' needs a value ({kind}:VALUE)")
    rank: int | None = None
    if "@" in args:
        if kind != "one":
            raise _bad(what, text, "only 'one' takes @RANK")
        args, _, rank_text = args.partition("@")
        try:
            rank = int(rank_text)
        except ValueError:
            raise _bad(what, text, f"not a rank: {rank_text!r}") from None
        if rank < 0:
            raise _bad(what, text, "rank must be >= 0")
    parts = [a.strip() for a in args.split(",")]
    nmax = 2 if (kind == "lognormal" and what == "skew") else 1
    if len(parts) > nmax:
        raise _bad(what, text, f"'{kind}' takes {nmax} value{'s' * (nmax > 1)}")
    if what == "skew":
        values = [_number(what, text, parts[0], time=True)]
        if kind == "lognormal":
            sigma = parts[1] if len(parts) > 1 else str(DEFAULT_SIGMA)
            values.append(_number(what, text, sigma, time=False))
        if values[0] < 0 or (kind == "lognormal" and values[1] < 0):
            raise _bad(what, text, "must be >= 0")
        if values[0] > 3600 or (kind == "lognormal" and values[1] > 10):
            raise _bad(what, text, "too large (a skew of at most 1 h, a sigma of at most 10)")
    else:
        values = [_number(what, text, parts[0], time=False)]
        if kind == "lognormal" and values[0] < 0:
            raise _bad(what, text, "sigma must be >= 0")
        if kind != "lognormal" and values[0] < 1:
            raise _bad(what, text, "a slowdown factor must be >= 1")
        if values[0] > (10 if kind == "lognormal" else 1e6):
            raise _bad(what, text, "too large (a factor of at most 1e6, a sigma of at most 10)")
    return Distribution(what, kind, tuple(values), rank, text)


def summary(values: np.ndarray) -> dict[str, float]:
    """Mean, standard deviation, min, p50, p99 and max of ``values`` (linear percentiles)."""
    v = np.asarray(values, dtype=np.float64)
    return {
        "mean": float(v.mean()),
        "std": float(v.std()),
        "min": float(v.min()),
        "p50": float(np.percentile(v, 50)),
        "p99": float(np.percentile(v, 99)),
        "max": float(v.max()),
    }


def draw(
    skew: Distribution, slowdown: Distribution, nranks: int, seed: int, indices: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Start times (shifted to a first start of 0) and slowdown factors of samples ``indices``:
    arrays of shape (len(indices), nranks)."""
    starts = np.zeros((len(indices), nranks))
    slow = np.ones((len(indices), nranks))
    for row, i in enumerate(indices):
        # what SeedSequence(seed).spawn(n)[i] gives, without spawning i + 1 children
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(i,))))
        s = skew.sample(rng, nranks)
        starts[row] = s - s.min()
        slow[row] = slowdown.sample(rng, nranks)
    return starts, slow


@dataclass
class StragglerPoint:
    """One size: the healthy time and every sample's times."""

    size_bytes: int
    algorithm: str
    healthy_s: float
    completion_s: np.ndarray
    after_last_start_s: np.ndarray
    max_skew_s: np.ndarray

    def as_json(self) -> dict[str, Any]:
        comp = summary(self.completion_s)
        return {
            "bytes": self.size_bytes,
            "algorithm": self.algorithm,
            "healthy_us": self.healthy_s * 1e6,
            "completion_us": {k: v * 1e6 for k, v in comp.items()},
            "after_last_start_us": {
                k: v * 1e6 for k, v in summary(self.after_last_start_s).items()
            },
            "max_skew_us": {k: v * 1e6 for k, v in summary(self.max_skew_s).items()},
            "mean_over_healthy": comp["mean"] / self.healthy_s if self.healthy_s > 0 else None,
            "p99_over_healthy": comp["p99"] / self.healthy_s if self.healthy_s > 0 else None,
            "samples_completion_us": [float(x) * 1e6 for x in self.completion_s],
        }


@dataclass
class StragglerStudy:
    """Every size of one straggler study, and how it was drawn."""

    collective: str
    topology: str
    ranks: int
    nodes: int
    protocol: str
    channels: int
    skew: str
    slowdown: str
    samples: int
    seed: int
    points: list[StragglerPoint] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "collective": self.collective,
            "topology": self.topology,
            "ranks": self.ranks,
            "nodes": self.nodes,
            "protocol": self.protocol,
            "channels": self.channels,
            "skew": self.skew,
            "slowdown": self.slowdown,
            "samples": self.samples,
            "seed": self.seed,
            "engine": "des",
            "points": [p.as_json() for p in self.points],
        }


def _time_samples(
    whatif: Any, job: dict[str, Any], starts: np.ndarray, slow: np.ndarray, skewed: bool,
    slowed: bool, progress: Callable[[int], None] | None = None,
) -> np.ndarray:  # fmt: skip
    """Engine time of each row of ``starts`` / ``slow`` for one (collective, algorithm, size)."""
    schedule = _schedule(whatif, **job["schedule"])
    times = np.empty(starts.shape[0])
    for row in range(starts.shape[0]):
        res = simulate(
            schedule, whatif.fabric, protocol=job["protocol"],
            rank_start_s=starts[row] if skewed else None,
            rank_slowdown=slow[row] if slowed else None,
        )  # fmt: skip
        # Every rank's call ends no earlier than it starts (an empty call: at its start).
        times[row] = max(res.time_s, float(starts[row].max()) if skewed else 0.0)
        if progress is not None:
            progress(1)
    return times


def _schedule(
    whatif: Any, collective: str, algorithm: str, size_bytes: int, elem_bytes: int,
    channels: int, chunk_bytes: int | None,
) -> Any:  # fmt: skip
    """The schedule ``WhatIf.run`` times for one size (ranks on every GPU, nccl-tests counts)."""
    n = whatif.topology.n_gpus
    return build_schedule(
        collective, algorithm, nranks=n,
        count=element_count(collective, size_bytes, elem_bytes, n), elem_bytes=elem_bytes,
        layout=whatif.layout, channels=channels, chunk_bytes=chunk_bytes,
    )  # fmt: skip


def _worker(args: tuple[Any, ...]) -> np.ndarray:
    """A process-pool task: a chunk of samples of one size (rebuilds the topology's routes)."""
    topology, job, starts, slow, skewed, slowed = args
    return _time_samples(WhatIf(topology), job, starts, slow, skewed, slowed)


def run_stragglers(
    topology: Any,
    collective: str,
    algorithm: str,
    sizes: Sequence[int],
    *,
    skew: str | Distribution = "none",
    slowdown: str | Distribution = "none",
    samples: int = 100,
    seed: int = 0,
    dtype: str = "float",
    protocol: str = "Simple",
    channels: int = 1,
    chunk_bytes: int | None = None,
    jobs: int = 1,
    progress: Callable[[int], None] | None = None,
) -> StragglerStudy:
    """Time ``samples`` straggler draws of ``collective`` at every size on ``topology``.

    ``algorithm="auto"`` takes the tuner's pick per size (as ``simulate -a auto``). ``jobs`` > 1
    spreads samples over processes; results do not depend on it. ``progress(n)`` is called as
    ``n`` more samples finish.
    """
    skew_d = skew if isinstance(skew, Distribution) else parse_spec("skew", skew)
    slow_d = slowdown if isinstance(slowdown, Distribution) else parse_spec("slowdown", slowdown)
    if samples < 1:
        raise CollsimError("must be at least 1", field="--samples", value=samples)
    if not 1 <= jobs <= MAX_JOBS:
        raise CollsimError(f"must be from 1 to {MAX_JOBS}", field="--jobs", value=jobs)
    if channels < 1:
        raise CollsimError("must be at least 1", field="--channels", value=channels)
    whatif = WhatIf(topology)
    nranks = topology.n_gpus
    for d in (skew_d, slow_d):
        if d.rank is not None and d.rank >= nranks:
            raise CollsimError(f"rank outside 0..{nranks - 1}", field=f"--{d.what}", value=d.spec)
    elem = dtype_bytes(dtype)
    proto = get_protocol(protocol).name
    starts, slow = draw(skew_d, slow_d, nranks, seed, range(samples))
    skewed, slowed = not skew_d.is_none, not slow_d.is_none
    if algorithm == "auto":
        picks = tuned_algorithms(
            whatif.cost_model(), collective, list(sizes), elem_bytes=elem, protocol=proto,
            channels=channels,
        )  # fmt: skip
    else:
        picks = [algorithm] * len(sizes)
    study = StragglerStudy(
        collective=collective, topology=topology.name, ranks=nranks, nodes=topology.nodes,
        protocol=proto, channels=channels, skew=skew_d.spec, slowdown=slow_d.spec,
        samples=samples, seed=seed,
    )  # fmt: skip
    for size, name in zip(sizes, picks, strict=True):
        sched_args = {
            "collective": collective,
            "algorithm": name,
            "size_bytes": int(size),
            "elem_bytes": elem,
            "channels": channels,
            "chunk_bytes": chunk_bytes,
        }
        job = {"schedule": sched_args, "protocol": proto}
        schedule = _schedule(whatif, **sched_args)
        healthy = simulate(schedule, whatif.fabric, protocol=proto)
        if jobs == 1 or samples == 1:
            times = _time_samples(whatif, job, starts, slow, skewed, slowed, progress)
        else:
            chunks = np.array_split(np.arange(samples), min(jobs * 4, samples))
            tasks = [(topology, job, starts[c], slow[c], skewed, slowed) for c in chunks]
            with ProcessPoolExecutor(max_workers=min(jobs, len(chunks))) as pool:
                parts = []
                for c, part in zip(chunks, pool.map(_worker, tasks), strict=True):
                    parts.append(part)
                    if progress is not None:
                        progress(len(c))
            times = np.concatenate(parts)
        study.points.append(
            StragglerPoint(
                size_bytes=schedule.count * elem,
                algorithm=name,
                healthy_s=healthy.time_s,
                completion_s=times,
                after_last_start_s=times - starts.max(axis=1),
                max_skew_s=starts.max(axis=1),
            )
        )
    return study
