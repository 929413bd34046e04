"""Data types: every name a user may give one -> its canonical name and its size in bytes.

The one table of data types. Every entry point (``simulate``/``tune``/``stragglers -d``,
``calibrate run -d``, sweep specs, the torch benchmark, workload files) reads a type name through
:func:`canonical_dtype` and prints the canonical name, so ``bf16`` works wherever ``bfloat16``
does. The canonical names are nccl-tests' (``src/common.cu`` ``test_typenames``, the names its
``-d`` takes and its tables print; ``f8e4m3``/``f8e5m2`` since NCCL 2.24); the aliases are NCCL's
enum names (``ncclChar`` = int8, ``ncclInt`` = int32, ``ncclFloat16`` = half, ``ncclFloat32`` =
float, ``ncclFloat64`` = double), PyTorch's (``float16``, ``float8_e4m3fn``) and the usual short
forms (``fp16``, ``bf16``, ``fp32``, ``i32``, ``u8``, ``fp8``, ``e4m3``). A name is matched
without regard to case, ``_``, ``-``, spaces or a ``torch.`` prefix.

``tf32`` is no type a collective carries (NCCL moves those values as ``float``): it is known here
so that workload files can name the matmul mode, and refused where a collective's type is asked.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from collsim.errors import ScheduleError

NCCL_TYPES: tuple[str, ...] = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "half",
                               "float", "double", "bfloat16", "f8e4m3", "f8e5m2")  # fmt: skip
"""nccl-tests' ``-d`` types, in its order: the types a collective can carry."""

DTYPE_BYTES: dict[str, int] = {
    "int8": 1,
    "uint8": 1,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
    "half": 2,
    "float": 4,
    "double": 8,
    "bfloat16": 2,
    "f8e4m3": 1,
    "f8e5m2": 1,
    "tf32": 4,
}
"""Bytes per element of every canonical type (``tf32`` values are stored as 32-bit floats)."""

_SPELLINGS: dict[str, tuple[str, ...]] = {
    "int8": ("char", "i8", "signedchar"),
    "uint8": ("u8", "byte", "unsignedchar"),
    "int32": ("int", "i32"),
    "uint32": ("u32", "uint", "unsignedint"),
    "int64": ("i64", "long", "longlong"),
    "uint64": ("u64", "ulong", "unsignedlong"),
    "half": ("float16", "fp16", "f16"),
    "float": ("float32", "fp32", "f32", "single"),
    "double": ("float64", "fp64", "f64"),
    "bfloat16": ("bf16",),
    "f8e4m3": ("fp8", "f8", "float8", "e4m3", "fp8e4m3", "float8e4m3", "float8e4m3fn"),
    "f8e5m2": ("e5m2", "fp8e5m2", "float8e5m2"),
    "tf32": ("tensorfloat32",),
}
_ALIASES: dict[str, str] = {
    alias: name for name, spellings in _SPELLINGS.items() for alias in (name, *spellings)
}


def _key(name: object) -> str:
    text = str(name).strip().lower()
    text = text.removeprefix("torch.").removeprefix("nccl")
    return text.replace("_", "").replace("-", "").replace(" ", "")


def canonical_dtype(
    name: object, allowed: Sequence[str] = NCCL_TYPES, *, field: str = "dtype"
) -> str:
    """The canonical name of the type ``name`` calls (``bf16``, ``BFloat16``, ``torch.bfloat16``
    -> ``bfloat16``; ``fp16``/``float16`` -> ``half``; ``ncclInt`` -> ``int32``).

    ``allowed``: the canonical types this caller can use (default: those a collective carries).
    A name that is no type, or one not allowed here, raises :class:`ScheduleError` naming
    ``field``, the value and the types allowed (with a "did you mean" where one is close).
    """
    key = _key(name)
    canonical = _ALIASES.get(key)
    choices = ", ".join(allowed)
    if canonical is None:
        close = difflib.get_close_matches(key, list(_ALIASES), n=1, cutoff=0.75)
        hint = f"; did you mean {_ALIASES[close[0]]!r}?" if close else ""
        raise ScheduleError(
            f"unknown data type{hint} (choose from {choices})", field=field, value=name
        )
    if canonical not in allowed:
        raise ScheduleError(
            f"{canonical} is not supported here (choose from {choices})", field=field, value=name
        )
    return canonical


def dtype_bytes(name: object, allowed: Sequence[str] = NCCL_TYPES) -> int:
    """Bytes per element of the type ``name`` calls (any spelling :func:`canonical_dtype` takes)."""
    return DTYPE_BYTES[canonical_dtype(name, allowed)]


def aliases_of(name: str) -> tuple[str, ...]:
    """Every spelling (without separators) that means the canonical type ``name``."""
    return tuple(alias for alias, canonical in _ALIASES.items() if canonical == name)
