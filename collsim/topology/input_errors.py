"""Pydantic validation errors of input files -> one clear line (a :class:`TopologyError` naming
the field and the value). Every input format (topologies, profiles, workloads, sweeps, plan
candidates) reports its errors through :func:`one_line`, so they read alike."""

from __future__ import annotations

import difflib
import re
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from collsim.errors import TopologyError

_UNION_TAG = re.compile(r"^[a-z][a-z-]*\[.*\]$|^constrained-[a-z]+$")
"""How pydantic names a union member in an error's path (``list[constrained-int]``)."""


def one_line(exc: ValidationError, model: type[BaseModel]) -> TopologyError:
    """A pydantic validation error of an input file read as ``model`` -> one line naming the
    field and the value (an unknown key first, with the nearest known key as a hint)."""
    errors = exc.errors()
    # an unknown key first: a misspelt key also makes the key it was meant to be "missing"
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    # union members name themselves in the path ('list[constrained-int]', 'literal['auto']'):
    # they are pydantic's, not the file's
    kind = err["type"]
    parts = [str(p) for p in err["loc"]]
    keep_last = kind == "extra_forbidden"  # the file's own (unknown) key, whatever it looks like
    loc = [p for i, p in enumerate(parts)
           if (keep_last and i == len(parts) - 1) or not _UNION_TAG.match(p)]  # fmt: skip
    field = ".".join(loc)
    value = err.get("input")
    if kind == "extra_forbidden":
        known = _fields_at(model, err["loc"][:-1])
        hint = difflib.get_close_matches(loc[-1], known, n=1)
        extra = f"; did you mean {hint[0]!r}?" if hint else f"; expected one of: {', '.join(known)}"
        return TopologyError(f"unknown key{extra}", field=field)
    if kind == "missing":
        return TopologyError("required field is missing", field=field)
    message = err["msg"].removeprefix("Value error, ")
    return TopologyError(message, field=field, value=value, has_value=True)


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the (nested) model found at ``loc``, for "did you mean" hints."""
    current: Any = model
    keyed = False  # the field before was a mapping: this part is one of its keys
    for part in loc:
        if isinstance(part, int) or keyed:
            keyed = False
            continue
        field = current.model_fields.get(part) if isinstance(current, type) else None
        if field is None:
            return []
        keyed = _is_mapping(field.annotation)
        current = _model_in(field.annotation)
    return list(current.model_fields) if isinstance(current, type) else []


def _is_mapping(annotation: Any) -> bool:
    """A ``dict[...]`` annotation (or an optional one)."""
    if typing.get_origin(annotation) is dict:
        return True
    return any(typing.get_origin(a) is dict for a in typing.get_args(annotation))


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    if isinstance(annotation, types.UnionType):
        return None
    return None
