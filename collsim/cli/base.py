"""The root ``collsim`` group, shared options and the error handling every command gets.

Every :class:`~collsim.errors.CollsimError` becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import click
from click.shell_completion import CompletionItem

from collsim.dtypes import NCCL_TYPES, canonical_dtype
from collsim.errors import CollsimError
from collsim.io import folder_problem
from collsim.metrics import COLLECTIVES, canonical_collective


class CollsimGroup(click.Group):
    """A click group that turns collsim's input errors into one clean line and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CollsimError as exc:
            click.echo(f"collsim: error: {exc}", err=True)
            ctx.exit(2)
        except BrokenPipeError:  # the reader went away (`collsim ... | head`): stop quietly
            # Point stdout at /dev/null so the interpreter's final flush does not fail again
            # (the Python docs' recipe, signal module, "Note on SIGPIPE").
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            ctx.exit(1)
        except OSError as exc:  # a file we were asked to write or read: say which, and why
            where = exc.filename or ""
            click.echo(f"collsim: error: {where}: {exc.strerror or exc}", err=True)
            ctx.exit(2)


class _Path(click.Path):
    """``click.Path`` that refuses an empty name (``--json ""`` would otherwise write nothing
    and say nothing)."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("an empty name names no file or folder", param, ctx)
        return super().convert(value, param, ctx)


class _OutputPath(_Path):
    """An output file or folder, checked before any work: one whose folder collsim would not
    make (:func:`collsim.io.folder_problem`) is one line naming the option."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        value = super().convert(value, param, ctx)
        if value == "-" or str(value).startswith(("/dev/", "/proc/")):
            return value
        problem = folder_problem(value)
        if problem is not None:
            flags = [o for o in getattr(param, "opts", ()) if o.startswith("--")]
            name = flags[0] if flags else (getattr(param, "name", None) or "output").upper()
            raise CollsimError(problem, field=name, value=str(value))
        return value


FILE = _Path(dir_okay=False)
"""An input file option or argument."""
FOLDER = _Path(file_okay=False)
"""An input folder option."""
OUT_FILE = _OutputPath(dir_okay=False)
"""An output file option (``--json``, ``--plot``, ``-o``): its folder must exist or lie inside
the working directory."""
OUT_FOLDER = _OutputPath(file_okay=False)
"""An output folder option (results and report directories), made if missing: its parent must
exist or lie inside the working directory."""


class NameType(click.ParamType):
    """A name read through one of collsim's normalisers (:func:`canonical_collective`,
    :func:`canonical_dtype`): any alias is taken and the command gets the canonical name; help
    and shell completion list the canonical names. A name that is none is a
    :class:`CollsimError` (one line, as every bad input) naming the option or argument, the
    value and what is supported, with a "did you mean" where a name is close."""

    def __init__(self, name: str, normalise: Callable[[str], str], canonical: tuple[str, ...],
                 metavar: str | None = None) -> None:  # fmt: skip
        self.name = name
        self.normalise = normalise
        self.canonical = canonical
        self.metavar = metavar

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str | None:
        if self.metavar:
            return self.metavar
        names = "|".join(self.canonical)
        required = param.required and param.param_type_name == "argument"
        return f"{{{names}}}" if required else f"[{names}]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return self.normalise(value)
        except CollsimError as exc:
            if param is not None:
                exc.field = param.opts[-1] if param.param_type_name == "option" else param.name
            raise

    def shell_complete(
        self, ctx: click.Context, param: click.Parameter, incomplete: str
    ) -> list[CompletionItem]:
        return [CompletionItem(n) for n in self.canonical if n.startswith(incomplete)]


COLLECTIVE = NameType("collective", canonical_collective, COLLECTIVES)
"""A collective argument: ``all_reduce``, ``allreduce``, ``AllReduce``, ``all_reduce_perf``, ..."""
DTYPE = NameType("datatype", canonical_dtype, NCCL_TYPES, metavar="TYPE")
"""A ``-d`` data type: nccl-tests' names or any alias (``bf16``, ``fp16``, ``float32``, ...)."""
DTYPE_HELP = (
    f"nccl-tests type: {', '.join(NCCL_TYPES)}; or an alias (bf16, fp16, fp32, float32, ...)."
)


def refuse_overwriting_inputs(inputs: Any, **outputs: str | None) -> None:
    """An output path (``--json``, ``-o``, ...) that names one of the input files would destroy
    a measurement, and two outputs on one path would lose one: refuse them, naming the option."""
    given = {os.path.realpath(p) for p in inputs if p}
    written: dict[str, str] = {}
    for flag, path in outputs.items():
        option = f"--{flag.replace('_', '-')}"
        if not path or path == "-" or path.startswith("/dev/"):
            continue
        real = os.path.realpath(path)
        if real in given:
            raise CollsimError("would overwrite an input file", field=option, value=path)
        if real in written:
            raise CollsimError(f"is also {written[real]}: one would overwrite the other",
                               field=option, value=path)  # fmt: skip
        written[real] = option


def topology_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """TOPOLOGY argument plus the --nodes / --gpus-per-node overrides."""

    @click.argument("topology", metavar="NAME|PATH")
    @click.option("--nodes", type=int, default=None, help="Override the number of nodes.")
    @click.option("--gpus-per-node", type=int, default=None, help="Override the GPUs in each node.")
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    return wrapper


def run_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """How a collective runs, as nccl-tests and NCCL take it: size step, data type, channels,
    protocol and the tree/chain pipelining chunk (``simulate`` and ``stragglers``)."""
    options = [
        click.option(
            "-f", "--stepfactor", type=float, default=2.0, show_default=True, help="Size step."
        ),
        click.option(
            "-d", "--datatype", type=DTYPE, default="float", show_default=True, help=DTYPE_HELP
        ),
        click.option(
            "--channels",
            type=int,
            default=1,
            show_default=True,
            help="Parallel channels (1-64); each moves at most one NCCL channel's rate (38.7 "
            "GB/s on H100); sendrecv: channels to the peer, alltoall: spread over the peers.",
        ),
        click.option(
            "--protocol",
            type=click.Choice(["LL", "LL128", "Simple"], case_sensitive=False),
            default="Simple",
            show_default=True,
        ),
        click.option(
            "--chunk-bytes",
            default=None,
            help="Pipelining chunk for tree/chain algorithms (default 512K, NCCL Simple's step).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def fault_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--fault TEXT`` (repeatable): a what-if fault applied to the topology (docs/faults.md)."""
    return click.option(
        "--fault",
        "faults",
        multiple=True,
        metavar="KIND:TARGET:PARAMS",
        help="What-if fault, repeatable: link:A-B:bw=0.5,lat=+2us | nic:N:fail | "
        "switch:S:fail | gpu:G:slow=2 | background:A-B:rate=100Gbps | "
        "background:ring[2,3]:rate=50GB/s (docs/faults.md).",
    )(func)


def _keep_faults(ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]) -> None:
    ctx.meta["collsim.faults"] = tuple(value)


fault_meta_option = click.option(
    "--fault",
    multiple=True,
    expose_value=False,
    callback=_keep_faults,
    metavar="KIND:TARGET:PARAMS",
    help="What-if fault on the topology, repeatable (as in `collsim simulate`; docs/faults.md).",
)
"""``--fault`` for commands whose signature stays as is: read it back with
:func:`context_faults`."""


def context_faults() -> tuple[str, ...]:
    """The ``--fault`` texts of the running command (``fault_meta_option``), or none."""
    ctx = click.get_current_context(silent=True)
    return tuple(ctx.meta.get("collsim.faults", ())) if ctx is not None else ()


@click.group(cls=CollsimGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="collsim")
def cli() -> None:
    """collsim: what-if simulations of collective communication on GPU clusters."""


def chunk_option(text: str | None) -> int | None:
    """``--chunk-bytes``: a size of at least one byte, or None where not given."""
    if not text:
        return None
    chunk = size_option("--chunk-bytes", text)
    if chunk < 1:
        raise CollsimError("a pipelining chunk must hold at least one byte",
                           field="--chunk-bytes", value=text)  # fmt: skip
    return chunk


def nccl_env_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--nccl-env KEY=VALUE`` (repeatable): NCCL settings a run used that its log does not
    record (:func:`nccl_env`)."""
    return click.option(
        "--nccl-env",
        "nccl_env_items",
        multiple=True,
        metavar="NCCL_KEY=VALUE",
        help="NCCL setting the measured run used, where its log does not record it (e.g. "
        "NCCL_ALGO=Ring; the aws-ofi-nccl plugin's OFI_NCCL_GDR_FLUSH_DISABLE=1 too), "
        "repeatable; settings the log records win.",
    )(func)


def nccl_env(items: tuple[str, ...]) -> dict[str, str]:
    """``--nccl-env`` values as a dict; a malformed one is a one-line error naming the flag."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.startswith(("NCCL_", "OFI_NCCL_")) or not value.strip():
            raise CollsimError("expected NCCL_KEY=VALUE, e.g. NCCL_ALGO=Ring",
                               field="--nccl-env", value=item)  # fmt: skip
        if key in out and out[key] != value.strip():  # an environment holds a name once
            raise CollsimError(f"{key} is given twice ({key}={out[key]} before)",
                               field="--nccl-env", value=item)  # fmt: skip
        out[key] = value.strip()
    from collsim.calibration.log_context import check_env, unmodelled_env

    check_env(out)
    for note in unmodelled_env(out):
        click.echo(f"# note: --nccl-env {note}")
    lo, hi = out.get("NCCL_MIN_NCHANNELS"), out.get("NCCL_MAX_NCHANNELS")
    if lo and hi and int(lo) > int(hi):
        click.echo(f"# note: --nccl-env NCCL_MIN_NCHANNELS={lo} is above NCCL_MAX_NCHANNELS="
                   f"{hi}: collsim runs {lo} channels (the minimum wins)")  # fmt: skip
    return out


def whatif_for(topo: Any, profile: str | None, engine: str, model: str) -> tuple[Any, Any]:
    """(the ``WhatIf`` of ``topo``, its loaded profile or None): under ``profile`` where given,
    printing its notes (``simulate`` and ``tune`` share this). NCCL's model takes none."""
    from collsim.whatif import WhatIf

    if not profile:
        return WhatIf(topo), None
    from collsim.model.profile import load_profile
    from collsim.whatif import whatif_with_profile

    if engine == "analytic" and model == "nccl":
        raise CollsimError("NCCL's model takes no profile", field="--profile", value=profile)
    prof = load_profile(profile)
    for note in prof.check_topology(topo):
        click.echo(f"# note: {note}")
    whatif = whatif_with_profile(topo, prof, engine)
    click.echo(f"# calibrated with {profile}")
    return whatif, prof


def size_option(flag: str, text: str) -> int:
    """Parse a size given to ``flag``; a bad one names the flag."""
    from collsim import units

    try:
        return units.parse_size(text)
    except CollsimError as exc:
        raise exc.located(field=flag) from None


def show_progress() -> bool:
    """A progress bar on a terminal only (quiet in CI and when stderr is a file or a pipe)."""
    return sys.stderr.isatty() and not os.environ.get("CI")


class ProgressBar:
    """tqdm over work items (``unit``): done, total and the rate, on stderr."""

    def __init__(self, unit: str, desc: str) -> None:
        self.unit, self.desc = unit, desc
        self.bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, unit=self.unit, desc=self.desc,
                            file=sys.stderr, dynamic_ncols=True)  # fmt: skip
        else:
            self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@contextlib.contextmanager
def progress_bar(unit: str, desc: str, *, worth_it: bool = True) -> Iterator[ProgressBar | None]:
    """A :class:`ProgressBar` for the ``with`` block where :func:`show_progress` says so (and
    the work is ``worth_it``), else None; closed however the block ends."""
    bar = ProgressBar(unit, desc) if worth_it and show_progress() else None
    try:
        yield bar
    finally:
        if bar is not None:
            bar.close()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv, prog_name="collsim")
