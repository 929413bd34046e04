"""``collsim step``, ``scale`` and ``plan``: training step times, scaling, capacity planning."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import click

from collsim.cli.base import (
    FILE,
    OUT_FILE,
    cli,
    context_faults,
    fault_meta_option,
    refuse_overwriting_inputs,
)
from collsim.cli.batch import GLOBAL_BATCH, MICRO_BATCH, batch_changes, batch_error, with_batch
from collsim.errors import CollsimError
from collsim.io import figure_format
from collsim.whatif import profile_classes

# Options step, scale and plan (collsim.cli.plan) share: one definition each.
WORKLOAD = click.option(
    "--workload",
    "-w",
    required=True,
    metavar="NAME|PATH",
    help="Workload file, or a bundled name (workloads/).",
)
TOPOLOGY = click.option(
    "--topology", "-t", required=True, metavar="NAME|PATH", help="Catalog name or file."
)
JSON_OUT = click.option("--json", "json_file", type=OUT_FILE, help="Write JSON here.")
ENGINE = click.option(
    "--engine",
    default="analytic",
    show_default=True,
    help="analytic (closed forms, fast) or des (discrete-event engine, slow at scale).",
)
PROFILE = click.option(
    "--profile",
    type=FILE,
    help="Calibration profile (JSON/YAML): analytic-model parameters and/or gpu_efficiency.",
)
EFFICIENCY = click.option(
    "--efficiency",
    type=click.FloatRange(0, 1, min_open=True),
    default=None,
    help="GEMM efficiency in (0, 1] (overrides profile/workload).",
)


def insert_after(row: dict[str, Any], key: str, new: str, value: Any) -> dict[str, Any]:
    """``row`` with ``new: value`` inserted after ``key``."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        out[k] = v
        if k == key:
            out[new] = value
    return out


def _json_or_yaml(path: Path) -> Any:
    """A ``.json`` file as JSON unless it is not (an older fit wrote YAML whatever the name),
    everything else as YAML."""
    from collsim.topology.loader import read_yaml

    if path.suffix.lower() == ".json":
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            pass  # YAML under a .json name; read_yaml reports what is wrong with it
    return read_yaml(path)


def load_profile(path: str | None) -> tuple[Any, float | None]:
    """A profile file -> (analytic ModelParams or None, GPU efficiency or None).

    Accepted: ``ModelParams.to_dict()`` at the top level or under ``params``/``model_params``,
    and ``gpu_efficiency`` (or ``step: {efficiency: ...}``)."""
    if not path:
        return None, None
    from collsim.model.params import ModelParams

    try:
        data = _json_or_yaml(Path(path))
    except CollsimError as exc:
        raise CollsimError(exc.message, file=path, field="--profile") from None
    except RecursionError:
        raise CollsimError(
            "cannot read profile: nested too deeply", file=path, field="--profile"
        ) from None
    except (OSError, ValueError) as exc:
        raise CollsimError(f"cannot read profile: {exc}", file=path, field="--profile") from None
    if not isinstance(data, dict):
        raise CollsimError("a profile must be a mapping", file=path, field="--profile")
    if "collsim_profile" in data:  # a fitted profile (collsim calibrate fit)
        from collsim.model.profile import profile_from_dict

        return profile_from_dict(data, path).params(), None
    absent = object()  # a given null is an error, not an absent efficiency
    eff, eff_field = data.pop("gpu_efficiency", absent), "gpu_efficiency"
    step = data.pop("step", None)
    if step is not None:
        extra = sorted(set(step) - {"efficiency"}) if isinstance(step, dict) else None
        if extra is None or extra:
            raise CollsimError(
                "step holds only 'efficiency' (the GEMM efficiency in (0, 1])",
                file=path,
                field=f"step.{extra[0]}" if extra else "step",
                value=step,
            )
        if "efficiency" in step:
            eff, eff_field = step["efficiency"], "step.efficiency"
    for meta in ("name", "topology", "description", "created", "fitted_on"):
        data.pop(meta, None)
    params_data = data.get("params", data.get("model_params", data))
    params = None
    if params_data:
        try:
            params = ModelParams.from_dict(params_data)
        except CollsimError as exc:
            raise exc.located(file=path) from None
    if eff is absent:
        return params, None
    if not (isinstance(eff, int | float) and not isinstance(eff, bool) and 0 < eff <= 1):
        raise CollsimError("must be a number in (0, 1]", file=path, field=eff_field, value=eff)
    return params, float(eff)


def _setup(  # type: ignore[no-untyped-def]
    workload: str,
    topology: str,
    nodes: int | None,
    engine: str,
    profile: str | None,
    faults: tuple[str, ...] | None = None,
    quiet: bool = False,
):
    from collsim.topology.loader import load_topology
    from collsim.training.comm import make_timer
    from collsim.training.step import StepModel
    from collsim.training.workload import load_workload

    w = load_workload(workload)
    topo = load_topology(
        topology, nodes=nodes, faults=context_faults() if faults is None else faults
    )
    if topo.faults and not quiet:
        click.echo(f"# faults: {'; '.join(topo.faults)}")
    params, eff = load_profile(profile)
    simulated = None
    if params is not None and str(params.source).startswith("profile "):
        from collsim.model.profile import load_profile as read_fitted

        fitted = read_fitted(profile)  # type: ignore[arg-type]
        for note in fitted.check_topology(topo) if not quiet else ():
            click.echo(f"# note: {note}")
        classes = profile_classes(fitted, topo)  # at another scale: what carries over
        params = fitted.params(topology=topo, classes=classes)
        if engine == "des":  # the engine sees the calibrated links (the model its parameters)
            simulated = fitted.apply_to_topology(topo, classes)
    elif params is not None and engine == "des" and not quiet:
        click.echo("# note: the des engine times the topology's own links; the profile's model "
                   "parameters steer only its algorithm choices")  # fmt: skip
    model = StepModel(topo, make_timer(engine, topo, params=params, simulated=simulated), eff)
    return w, topo, model, params, eff


_LONGEST_STEP_S = 86_400.0
"""The longest measured step accepted (a day; a larger number is a unit slip, e.g. ms or us)."""


def _read_measured(path: str) -> list[float]:
    """Step times (seconds) from a CSV with a ``step_time_s`` column (or one number per line;
    a spreadsheet's byte-order mark is fine). Which column holds the times is never guessed."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise CollsimError(f"cannot read file: {exc.strerror}", file=path) from None
    except UnicodeDecodeError:
        raise CollsimError("not a UTF-8 text (CSV) file", file=path, field="--measured") from None
    rows = list(csv.reader(text.splitlines()))
    if not rows:
        raise CollsimError("no step times", file=path, field="--measured")
    head = [h.strip() for h in rows[0]]
    if head.count("step_time_s") > 1:  # which one holds the times is never guessed
        raise CollsimError(
            f"{head.count('step_time_s')} columns named step_time_s in the header; keep one",
            file=path,
            field="step_time_s",
            value=",".join(rows[0]),
        )
    col = head.index("step_time_s") if "step_time_s" in head else 0
    body = rows[1:] if "step_time_s" in head else rows
    out = []
    for i, row in enumerate(body, start=2 if "step_time_s" in head else 1):
        if not any(cell.strip() for cell in row):
            continue
        if "step_time_s" not in head and len([c for c in row if c.strip()]) > 1:
            raise CollsimError(
                f"line {i}: {len(row)} columns but no step_time_s header naming the times",
                file=path,
                field="step_time_s",
                value=",".join(row),
            )
        if len(row) <= col or not row[col].strip():
            raise CollsimError(
                f"line {i}: no step_time_s value", file=path, field="step_time_s", value=row
            )
        try:
            value = float(row[col])
        except ValueError:
            raise CollsimError(
                f"line {i}: not a number", file=path, field="step_time_s", value=row[col]
            ) from None
        if not (math.isfinite(value) and 0 < value <= _LONGEST_STEP_S):
            raise CollsimError(
                f"line {i}: a step time must be a positive number of seconds, at most a day",
                file=path,
                field="step_time_s",
                value=row[col],
            )
        out.append(value)
    if not out:
        raise CollsimError("no step times", file=path, field="--measured")
    return out


def _elastic_step(model: Any, w: Any, result: Any, gpus_per_node: int):  # type: ignore[no-untyped-def]
    """Step seconds on ``n`` nodes for the elastic option: the same TP x CP x PP with as many
    data-parallel replicas as fit in ``n`` nodes (and the global batch allows); None if none."""
    from collsim.training.workload import with_changes

    unit = result.layout.replica_gpus

    def at(nodes: int) -> float | None:
        if nodes * gpus_per_node >= result.n_gpus:
            return float(result.step_time_s)
        for dp in range(nodes * gpus_per_node // unit, 0, -1):
            try:
                r = model.evaluate(with_changes(w, parallel={"dp": dp}), dp * unit)
            except CollsimError:
                continue
            if r.fits or not result.fits:
                return float(r.step_time_s)
        return None

    return at


def _print_breakdown(model: Any, w: Any, result: Any) -> dict[str, Any]:
    """Print ``collsim step --breakdown``'s tables (times in ms, shares of the step / layer)
    and return them for ``--json``."""
    from collsim.tables import table
    from collsim.training.breakdown import breakdown_json, layer_parts

    data = breakdown_json(result, layer_parts(model, w) if w.model.kind == "transformer" else None)
    rows = [
        {
            "phase": r["phase"],
            "total_ms": 1e3 * r["total_s"],
            "hidden_ms": 1e3 * r["hidden_s"],
            "exposed_ms": 1e3 * r["exposed_s"],
            "share_%": 100 * r["share"],
        }
        for r in data["phases"]
    ]
    rows.append({"phase": "step", "total_ms": "", "hidden_ms": "",
                 "exposed_ms": 1e3 * result.step_time_s, "share_%": 100.0})  # fmt: skip
    click.echo(
        "# step per phase (exposed = what the step pays; hidden = overlapped behind compute)"
    )
    click.echo(table(rows, list(rows[0])))
    if "layer" in data:
        click.echo("# one layer of the slowest stage, one micro-batch (exposed communication)")
        layer = [{"pass": r["pass"], "part": r["part"], "ms": 1e3 * r["seconds"],
                  "share_%": 100 * r["share"]} for r in data["layer"]]  # fmt: skip
        click.echo(table(layer, ["pass", "part", "ms", "share_%"]))
    return data


@cli.command()
@WORKLOAD
@TOPOLOGY
@click.option("--nodes", type=int, default=None, help="Override the number of nodes.")
@ENGINE
@PROFILE
@EFFICIENCY
@click.option(
    "--measured",
    type=FILE,
    help="Measured step times (seconds): a CSV with a step_time_s column, or one number per line; "
    "their mean is compared with the prediction.",
)
@click.option(
    "--breakdown",
    "show_breakdown",
    is_flag=True,
    help="Also print the step per phase (compute parts; TP/CP/EP/PP/DP communication as total, "
    "hidden and exposed; bubble; optimizer; stragglers) and one layer of the slowest stage "
    "per part; --json then holds it under 'phases'.",
)
@GLOBAL_BATCH
@MICRO_BATCH
@JSON_OUT
@fault_meta_option
def step(
    workload: str,
    topology: str,
    nodes: int | None,
    engine: str,
    profile: str | None,
    efficiency: float | None,
    measured: str | None,
    show_breakdown: bool,
    global_batch: int | None,
    micro_batch: int | None,
    json_file: str | None,
) -> None:
    """Predict the training step of a workload on a cluster, with its breakdown and memory."""
    from collsim.io import atomic_write_text
    from collsim.training.summary import step_report
    from collsim.training.tp_span import span_cost
    from collsim.training.workload import WorkloadError, resolve

    refuse_overwriting_inputs([workload, topology, profile, measured], json=json_file)
    w, _topo, model, _, _ = _setup(workload, topology, nodes, engine, profile)
    batch = batch_changes(global_batch, micro_batch)
    w = with_batch(w, batch)
    model.force_efficiency = efficiency
    try:
        result = model.evaluate(w)
    except WorkloadError as exc:  # a layout rule: the workload file's parallel/batch fields
        if batch and exc.field == "global_batch":  # or the batch the options set
            raise batch_error(exc, batch) from None
        raise exc.located(file=str(resolve(workload))) from None
    out = result.as_json()
    split = span_cost(model, w, result)
    if split is not None:
        out["tp_span"] = split.as_json()
    out["engine"] = engine
    if _topo.faults:
        out["faults"] = list(_topo.faults)
    if measured:
        times = _read_measured(measured)
        mean = sum(times) / len(times)
        out["measured_step_time_s"] = mean
        out["error"] = (result.step_time_s - mean) / mean
    click.echo(step_report(result, out.get("measured_step_time_s")))
    if split is not None:
        click.echo(f"# warning: {split.message()}")
    if show_breakdown:
        out["phases"] = _print_breakdown(model, w, result)
    if w.resilience is not None:
        from collsim.training.resilience import for_job

        gpn = _topo.gpus_per_node
        try:
            res = for_job(w, result.n_gpus, gpn, _elastic_step(model, w, result, gpn))
        except CollsimError as exc:
            raise exc.located(file=workload) from None
        out["resilience"] = res.as_json()  # type: ignore[union-attr]
        click.echo(res.report())  # type: ignore[union-attr]
    if json_file:
        atomic_write_text(json_file, json.dumps(out, indent=2) + "\n")
        click.echo(f"# wrote {json_file}")


@cli.command()
@WORKLOAD
@TOPOLOGY
@click.option(
    "--nodes",
    "node_list",
    default="1,2,4,8,16",
    show_default=True,
    help="Comma-separated node counts.",
)
@click.option(
    "--mode",
    type=click.Choice(["strong", "weak"]),
    default="strong",
    show_default=True,
    help="strong: fixed global batch; weak: global batch grows with the GPUs.",
)
@ENGINE
@PROFILE
@EFFICIENCY
@click.option(
    "--plot",
    type=OUT_FILE,
    help="Write the scaling plot (PNG or SVG, by suffix).",
)
@GLOBAL_BATCH
@MICRO_BATCH
@JSON_OUT
@fault_meta_option
def scale(
    workload: str,
    topology: str,
    node_list: str,
    mode: str,
    engine: str,
    profile: str | None,
    efficiency: float | None,
    plot: str | None,
    global_batch: int | None,
    micro_batch: int | None,
    json_file: str | None,
) -> None:
    """Step time vs GPU count with the Amdahl (strong) or Gustafson (weak) fit and Karp-Flatt."""
    from collsim.io import atomic_write_text
    from collsim.report.step_plots import plot_scaling
    from collsim.training.scaling import scale_workload
    from collsim.training.summary import scaling_report
    from collsim.training.tp_span import span_cost
    from collsim.training.workload import with_changes

    refuse_overwriting_inputs([workload, topology, profile], plot=plot, json=json_file)
    if plot:
        figure_format(plot)
    try:
        counts = sorted({int(x) for x in node_list.split(",") if x.strip()})
    except ValueError:
        raise CollsimError(
            "expected comma-separated integers", field="--nodes", value=node_list
        ) from None
    if not counts or counts[0] < 1:
        raise CollsimError("node counts must be >= 1", field="--nodes", value=node_list)
    w, topo, model, _, _ = _setup(workload, topology, max(counts), engine, profile)
    w = with_batch(w, batch_changes(global_batch, micro_batch))
    model.force_efficiency = efficiency
    faults = context_faults()
    models: dict[int, Any] = {}

    def model_at(nodes: int) -> Any:
        """The system of ``nodes`` nodes with the faults whose target it has (a GPU of node 3
        does not slow a 2-node point); built once per size."""
        if not faults or nodes == max(counts):
            return model
        if nodes in models:
            return models[nodes]
        from collsim.topology.loader import load_topology

        kept = []
        for fault in faults:
            try:
                load_topology(topology, nodes=nodes, faults=(fault,))
            except CollsimError:  # its target is beyond this size (checked at the largest)
                click.echo(f"# note: {nodes} node(s): fault '{fault}' does not apply")
                continue
            kept.append(fault)
        at = _setup(workload, topology, nodes, engine, profile, tuple(kept), quiet=True)[2]
        at.force_efficiency = efficiency
        models[nodes] = at
        return at

    curve, results, skipped = scale_workload(model, w, counts, mode, model_at=model_at)
    click.echo(scaling_report(curve, results, skipped))
    splits = {}
    for r in results:  # each point's own workload: weak scaling grows its global batch
        at = model_at(r.n_gpus // topo.gpus_per_node)
        wl = with_changes(w, parallel={"dp": "auto"}, global_batch=r.layout.global_batch)  # type: ignore[arg-type]
        cost = span_cost(at, wl, r)  # (free where no TP group spans nodes)
        if cost is not None:
            splits[r.n_gpus] = cost
            click.echo(f"# warning: {cost.message(f'{r.n_gpus} GPUs: ')}")
    if plot:
        plot_scaling(curve, plot, title=f"{w.name} on {topo.name} ({mode} scaling)")
        click.echo(f"# wrote {plot}")
    if json_file:
        data = curve.as_json() | {"workload": w.name, "topology": topo.name, "skipped": skipped}
        if topo.faults:
            data["faults"] = list(topo.faults)
        from collsim.training.step import BREAKDOWN_KEYS

        by_gpus = {r.n_gpus: r for r in results}  # what the printed table also shows
        for point in data["points"]:
            r = by_gpus.get(point["gpus"])
            if r is not None:
                point["layout"] = r.layout.label()
                point["breakdown"] = {k: r.breakdown[k] for k in BREAKDOWN_KEYS}
                point["memory_gb_per_gpu"] = r.memory.total / 1e9
                point["fits_in_memory"] = r.fits
                point["global_batch"] = r.layout.global_batch
                point["micro_batch"] = r.layout.micro
                if r.n_gpus in splits:
                    point["tp_span"] = splits[r.n_gpus].as_json()
        atomic_write_text(json_file, json.dumps(data, indent=2) + "\n")
        click.echo(f"# wrote {json_file}")
