"""``--global-batch`` and ``--micro-batch`` (``step``, ``scale``, ``plan``): the workload's batch
fields overridden and checked as the file's are, errors naming the option and its value."""

from __future__ import annotations

from typing import Any

import click

from collsim.errors import CollsimError

GLOBAL_BATCH = click.option(
    "--global-batch",
    type=int,
    default=None,
    help="Samples per step (overrides the workload's global_batch).",
)
MICRO_BATCH = click.option(
    "--micro-batch",
    type=int,
    default=None,
    help="Samples per micro-batch (overrides the workload's micro_batch).",
)
_OPTION_OF = {"global_batch": "--global-batch", "micro_batch": "--micro-batch"}


def batch_changes(global_batch: int | None, micro_batch: int | None) -> dict[str, int]:
    """The batch fields the options set."""
    given = (("global_batch", global_batch), ("micro_batch", micro_batch))
    for key, value in given:
        if value is not None and value < 1:  # one line, as the file's field gets
            raise CollsimError("must be a whole number >= 1", field=_OPTION_OF[key], value=value)
    return {k: v for k, v in given if v is not None}


def with_batch(w: Any, changes: dict[str, int]) -> Any:
    """The workload with ``--global-batch``/``--micro-batch`` applied and validated as the file's
    fields are (micro-batch dividing the global batch); an error names the option and value."""
    if not changes:
        return w
    from collsim.training.workload import WorkloadError, with_changes

    try:
        return with_changes(w, **changes)  # type: ignore[arg-type]
    except WorkloadError as exc:
        raise batch_error(exc, changes) from None


def batch_error(exc: CollsimError, changes: dict[str, int]) -> CollsimError:
    """An error about the batch fields (the file's rule, or the layout's ``global_batch`` vs
    data parallelism), blamed on the option that set one: the field it names where an option
    set it, else the micro-batch's option when given, else the global batch's."""
    field = exc.field if exc.field in changes else None
    if field is None:
        field = "micro_batch" if "micro_batch" in changes else "global_batch"
    other = {"global_batch": "micro_batch", "micro_batch": "global_batch"}[field]
    given = f" (with {_OPTION_OF[other]} {changes[other]})" if other in changes else ""
    return CollsimError(exc.message + given, field=_OPTION_OF[field], value=changes[field])
