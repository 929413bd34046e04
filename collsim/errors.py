"""Exceptions that users see. Each renders as one line naming the file, the field and the value.

The CLI turns any :class:`CollsimError` into that line on stderr and exit code 2; everything else
in collsim raises these for bad *user* input (never ``assert``, which ``python -O`` strips).
"""

from __future__ import annotations

from typing import Any


class CollsimError(Exception):
    """Base of all user-facing errors: a message, and where it came from."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        field: str | None = None,
        value: Any = None,
        has_value: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.field = field
        self.value = value
        self.has_value = has_value or value is not None

    def located(self, *, file: str | None = None, field: str | None = None) -> CollsimError:
        """The same error with a file and/or an outer field prefix filled in."""
        if file is not None and self.file is None:
            self.file = file
        if field is not None:
            self.field = f"{field}.{self.field}" if self.field else field
        return self

    def __str__(self) -> str:
        parts = []
        if self.file:
            parts.append(self.file)
        if self.field:
            parts.append(f"field '{self.field}'")
        text = f"{self.message}"
        if self.has_value:
            shown = repr(self.value)
            if len(shown) > 80:
                shown = shown[:77] + "..."
            text += f" (value: {shown})"
        line = ": ".join([*parts, text])
        # one line whatever the input held (a key, a file name or a message with a line break)
        return line.replace("\r", "\\r").replace("\n", "\\n")


class UnitError(CollsimError):
    """A size, rate or time that cannot be parsed."""


class TopologyError(CollsimError):
    """A topology file or override that does not describe a usable system."""


class ScheduleError(CollsimError):
    """A collective/algorithm request that cannot be scheduled (bad ranks, sizes, algorithm)."""


class CalibrationError(CollsimError):
    """A measurement log, profile or calibration run that cannot be used."""
