"""The ``collsim`` command line: parse, call the library, print. No modelling happens here.

Each command family lives in its own module and registers itself on the root group when imported.
"""

from collsim.cli import (  # noqa: F401  (registers the commands)
    calibrate,
    plan,
    simulate,
    step,
    stragglers,
    sweep,
    topo,
    tune,
    validate,
)
from collsim.cli.base import cli, main

__all__ = ["cli", "main"]
