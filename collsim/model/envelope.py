"""Affine times and their upper envelopes: how a family's structure becomes a few lines.

Every cost in the model is affine in the collective's size ``S`` (bytes): a latency plus ``S``
times seconds-per-byte. Sums and maxima of affine functions are convex and piecewise linear, so
an algorithm's whole time is ``T(S) = max_i (a_i + b_i S)`` over a handful of lines. The family
formulas evaluate their critical paths with :class:`Aff` values (each carries the intercept and
slope of the path that attains it), :func:`discover` finds every piece of ``T`` by querying at
the intersections of the pieces found so far (a few evaluations), and :func:`evaluate` is then a
vectorised max over lines -- millions of sizes per second.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

S_MAX_BYTES = float(2**46)
"""Largest size the envelope is resolved for (64 TiB); beyond it the last piece extends."""


@dataclass(frozen=True)
class Aff:
    """Arrays of affine functions ``a + b * S`` (intercept seconds, slope seconds per byte)."""

    a: np.ndarray
    b: np.ndarray

    @classmethod
    def const(cls, a: np.ndarray | float, b: np.ndarray | float = 0.0) -> Aff:
        a_arr, b_arr = np.broadcast_arrays(np.asarray(a, np.float64), np.asarray(b, np.float64))
        return cls(a_arr, b_arr)

    @classmethod
    def zeros(cls, shape: int | tuple[int, ...]) -> Aff:
        return cls(np.zeros(shape), np.zeros(shape))

    def at(self, s: float) -> np.ndarray:
        return self.a + self.b * s

    def __add__(self, other: Aff) -> Aff:
        return Aff(self.a + other.a, self.b + other.b)

    def __getitem__(self, idx: object) -> Aff:
        return Aff(self.a[idx], self.b[idx])  # type: ignore[index]

    def maximum(self, other: Aff, s: float) -> Aff:
        """Elementwise the larger at size ``s`` (keeping that one's intercept and slope)."""
        pick = other.at(s) > self.at(s)
        return Aff(np.where(pick, other.a, self.a), np.where(pick, other.b, self.b))

    def max(self, s: float, axis: int | None = None) -> Aff:
        """The largest at size ``s`` along ``axis`` (all elements when ``None``)."""
        if axis is None:
            if self.a.size == 0:
                return Aff(np.zeros(()), np.zeros(()))
            i = int(np.argmax(self.at(s)))
            return Aff(self.a.reshape(-1)[i], self.b.reshape(-1)[i])
        idx = np.expand_dims(np.argmax(self.at(s), axis=axis), axis)
        return Aff(
            np.take_along_axis(self.a, idx, axis).squeeze(axis),
            np.take_along_axis(self.b, idx, axis).squeeze(axis),
        )


@dataclass(frozen=True)
class Lines:
    """``T(S) = max_i (a_s[i] + b_s_per_byte[i] * S)``: a convex piecewise-linear time."""

    a_s: np.ndarray
    b_s_per_byte: np.ndarray

    def __call__(self, size_bytes: np.ndarray) -> np.ndarray:
        return evaluate(self, size_bytes)

    def merge(self, other: Lines) -> Lines:
        """The envelope of both sets (the max of two times)."""
        return upper_envelope(
            np.concatenate((self.a_s, other.a_s)),
            np.concatenate((self.b_s_per_byte, other.b_s_per_byte)),
        )

    def shift(self, a_s: float) -> Lines:
        return Lines(self.a_s + a_s, self.b_s_per_byte)


def evaluate(lines: Lines, size_bytes: np.ndarray) -> np.ndarray:
    """``T`` at every size (vectorised; one pass per line, lines are few)."""
    s = np.asarray(size_bytes, dtype=np.float64)
    out = lines.a_s[0] + lines.b_s_per_byte[0] * s
    for a, b in zip(lines.a_s[1:], lines.b_s_per_byte[1:], strict=True):
        np.maximum(out, a + b * s, out=out)
    return out


def upper_envelope(a: np.ndarray, b: np.ndarray) -> Lines:
    """The lines of ``a + b S`` that are the maximum somewhere on ``0 <= S <= S_MAX_BYTES``."""
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    if a.size == 0:
        return Lines(np.zeros(1), np.zeros(1))
    order = np.lexsort((a, b))  # by slope, then intercept
    a, b = a[order], b[order]
    keep = np.r_[b[1:] != b[:-1], True]  # same slope: the largest intercept (last)
    a, b = a[keep], b[keep]
    hull: list[int] = []
    for i in range(a.size):
        while hull:
            j = hull[-1]
            # line j is useless if i overtakes it before j overtakes its predecessor (or at S<=0)
            x_ji = (a[j] - a[i]) / (b[i] - b[j])
            if x_ji <= 0:
                hull.pop()
                continue
            if len(hull) >= 2:
                k = hull[-2]
                x_kj = (a[k] - a[j]) / (b[j] - b[k])
                if x_ji <= x_kj:
                    hull.pop()
                    continue
            break
        hull.append(i)
    # drop lines that only take over beyond S_MAX_BYTES
    while len(hull) >= 2:
        j, i = hull[-2], hull[-1]
        if (a[j] - a[i]) / (b[i] - b[j]) >= S_MAX_BYTES:
            hull.pop()
        else:
            break
    idx = np.asarray(hull, dtype=np.int64)
    return Lines(a[idx].copy(), b[idx].copy())


def discover(oracle: Callable[[float], Aff], s_max: float = S_MAX_BYTES) -> Lines:
    """All pieces of the convex ``T`` that ``oracle(S)`` evaluates (with its argmax line).

    Starts from the pieces at 1 byte and at ``s_max`` and queries at the intersection of every
    two adjacent pieces; a query above both reveals a new piece between them (the classic
    parametric longest-path search). Typically 3-7 oracle calls.
    """
    found: dict[tuple[float, float], None] = {}

    def ask(s: float) -> tuple[float, float]:
        t = oracle(s)
        line = (float(t.a), float(t.b))
        found[line] = None
        return line

    lo, hi = ask(1.0), ask(s_max)
    stack = [(lo, hi)]
    while stack and len(found) < 64:
        p, q = stack.pop()
        if q[1] <= p[1]:
            continue
        x = (p[0] - q[0]) / (q[1] - p[1])
        if not 1.0 < x < s_max:
            continue
        v = oracle(x)
        line = (float(v.a), float(v.b))
        here = p[0] + p[1] * x
        if line not in found and float(v.at(x)) > here * (1 + 1e-12) + 1e-18:
            found[line] = None
            stack += [(p, line), (line, q)]
    a, b = zip(*found, strict=True)
    return upper_envelope(np.array(a), np.array(b))
