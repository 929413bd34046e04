"""Failures over a long run: checkpoint interval, goodput and time-to-train inflation.

A job on ``N`` nodes whose nodes fail independently (exponentially, node MTBF ``M_node``) fails
as a whole with the system MTBF ``M = M_node / N``. It writes a checkpoint of ``C`` bytes every
``tau`` seconds of computation at the storage bandwidth ``B`` (write time ``delta = C / B``); after
a failure it restarts (``R`` seconds) from the last checkpoint and redoes the lost work.

* Young 1974, "A first order approximation to the optimum checkpoint interval", CACM 17(9):
  ``tau_Y = sqrt(2 delta M)``.
* Daly 2006, "A higher order estimate of the optimum checkpoint interval for restart dumps",
  FGCS 22(3), 303-312: the expected wall time of ``T_s`` seconds of useful work
  ``T_w = M e^(R/M) (e^((tau + delta)/M) - 1) T_s / tau`` (failures may strike during
  computation, checkpoints and restarts), and its higher-order optimum
  ``tau_D = sqrt(2 delta M) [1 + sqrt(delta/(2M))/3 + (delta/(2M))/9] - delta`` for
  ``delta < 2M``, else ``tau_D = M``.
* The exact minimum of ``T_w`` solves ``(1 - tau/M) e^((tau+delta)/M) = 1`` (set
  ``dT_w/dtau = 0``), i.e. ``tau* = M (1 + W_0(-e^(-1 - delta/M)))``; found here by bisection.

Goodput = ``T_s / T_w`` (in (0, 1]); time-to-train inflation = ``T_w / T_s``. To first order
(``delta, tau, R << M``) the overhead splits into checkpoints ``delta/tau``, rework
``(tau + delta)/(2M)`` and restarts ``R/M``.

Repair (when ``repair_time`` is given): with no spare node, each failure also costs either the
whole repair ``D`` (**wait** for repair, then restart on ``N`` nodes) or, **elastic**, the repair
window run on ``N - k`` nodes at the throughput ratio ``f = t(N) / t(N - k)`` (``t``: the step
time, passed in as a function) plus one more restart to grow back: ``D (1 - f) + R``. Failures
occur at rate ``1/M`` of running time, so ``T_w`` grows by the factor ``1 + loss / M`` (first
order: failures inside the repair window are not compounded). Elastic wins when ``f D > R``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from collsim.errors import CollsimError
from collsim.tables import plural
from collsim.training.layout import optimizer_state_bytes
from collsim.training.transformer import total_params
from collsim.training.workload import DTYPE_BYTES, WorkloadIn
from collsim.units import format_duration
from collsim.units import parse_duration_s as parse_duration_s  # re-exported

HOUR_S = 3600.0


class ResilienceError(CollsimError):
    """A failure-model input that is not a positive (or non-negative) finite number."""


def _check(name: str, value: float, *, zero_ok: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero_ok):
        need = "a non-negative" if zero_ok else "a positive"
        raise ResilienceError(f"must be {need} finite number", field=name, value=value)
    return float(value)


def system_mtbf_s(node_mtbf_s: float, nodes: int) -> float:
    """MTBF of the whole job: ``M_node / N`` (independent exponential node failures)."""
    return _check("node_mtbf_s", node_mtbf_s) / _check("nodes", nodes)


def checkpoint_write_s(checkpoint_bytes: float, storage_bytes_per_s: float) -> float:
    """Checkpoint write time ``delta = C / B``."""
    return _check("checkpoint_bytes", checkpoint_bytes) / _check(
        "storage_bytes_per_s", storage_bytes_per_s
    )


def young_interval_s(write_s: float, mtbf_s: float) -> float:
    """Young 1974: ``tau = sqrt(2 delta M)``."""
    return math.sqrt(2 * _check("write_s", write_s) * _check("mtbf_s", mtbf_s))


def daly_interval_s(write_s: float, mtbf_s: float) -> float:
    """Daly 2006: ``sqrt(2dM) [1 + sqrt(d/2M)/3 + (d/2M)/9] - d`` for ``d < 2M``, else M."""
    d, m = _check("write_s", write_s), _check("mtbf_s", mtbf_s)
    if d >= 2 * m:
        return m
    x = d / (2 * m)
    return math.sqrt(2 * d * m) * (1 + math.sqrt(x) / 3 + x / 9) - d


def optimal_interval_s(write_s: float, mtbf_s: float) -> float:
    """The exact minimiser of Daly's ``T_w``: root of ``(1 - tau/M) e^((tau+delta)/M) = 1``."""
    d, m = _check("write_s", write_s) / _check("mtbf_s", mtbf_s), mtbf_s
    lo, hi = 0.0, 1.0  # x = tau/M; (1 - x) e^x falls from 1 to 0 on (0, 1)
    for _ in range(200):
        mid = (lo + hi) / 2
        if (1 - mid) * math.exp(mid) > math.exp(-d):
            lo = mid
        else:
            hi = mid
    return m * (lo + hi) / 2


def wall_per_useful(interval_s: float, write_s: float, restart_s: float, mtbf_s: float) -> float:
    """Daly 2006, per unit of work: ``T_w / T_s = M e^(R/M) (e^((tau+delta)/M) - 1) / tau``."""
    tau, d = _check("interval_s", interval_s), _check("write_s", write_s, zero_ok=True)
    r, m = _check("restart_s", restart_s, zero_ok=True), _check("mtbf_s", mtbf_s)
    try:
        return m * math.exp(r / m) * math.expm1((tau + d) / m) / tau
    except OverflowError:  # failures far more often than a checkpoint or restart completes
        return math.inf


def default_checkpoint_bytes(w: WorkloadIn) -> float:
    """Weights in the training dtype + optimizer state (fp32 master weights and moments, as
    :mod:`collsim.training.layout` counts memory) of all parameters, once (not per replica)."""
    params = total_params(w.model) if w.model.kind == "transformer" else w.model.params
    return params * (DTYPE_BYTES[w.value_dtype] + optimizer_state_bytes(w))


def dp_step_time(step_s: float, gpus: int, gpus_per_node: int, replica_gpus: int = 1):  # type: ignore[no-untyped-def]
    """Data-parallel scaling at a fixed global batch, whole replicas of ``replica_gpus``
    (TP x CP x PP) GPUs: ``t(n) = t(N) dp / dp(n)``, ``dp(n) = n gpus_per_node // replica_gpus``;
    None if 0."""
    dp = _check("gpus", gpus) // _check("replica_gpus", replica_gpus)

    def at(nodes: int) -> float | None:
        left = min(gpus, nodes * gpus_per_node) // replica_gpus
        return step_s * dp / left if left else None

    return at


@dataclass
class Resilience:
    """The failure model of one job (seconds; goodputs in (0, 1]; ``goodput``: with spare nodes,
    a failure costs a restart, Daly's model at ``daly_s``)."""

    nodes: int
    node_mtbf_s: float
    mtbf_s: float
    checkpoint_bytes: float
    write_s: float
    restart_s: float
    young_s: float
    daly_s: float
    optimal_s: float
    goodput: float
    repair_s: float | None = None
    elastic: bool = False
    goodput_wait: float | None = None
    goodput_elastic: float | None = None
    elastic_nodes: int | None = None  # nodes left after a failure (elastic)
    elastic_throughput: float | None = None  # t(N) / t(N - k)
    overhead: dict[str, float] = field(default_factory=dict)

    @property
    def policy(self) -> str:
        if self.repair_s is None:
            return "spares"
        return "elastic" if self.elastic and self.goodput_elastic is not None else "wait"

    @property
    def expected_goodput(self) -> float:
        """The goodput of the workload's policy (spares, wait for repair, or elastic)."""
        by = {"spares": self.goodput, "wait": self.goodput_wait, "elastic": self.goodput_elastic}
        return by[self.policy]  # type: ignore[return-value]

    @property
    def inflation(self) -> float:
        """Time-to-train inflation: wall time / useful time."""
        g = self.expected_goodput
        return 1 / g if g > 0 else math.inf  # 0: failures outpace checkpoints and restarts

    def as_json(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes, "node_mtbf_hours": self.node_mtbf_s / HOUR_S,
            "system_mtbf_s": self.mtbf_s, "checkpoint_bytes": self.checkpoint_bytes,
            "checkpoint_write_s": self.write_s, "restart_s": self.restart_s,
            "interval_young_s": self.young_s, "interval_daly_s": self.daly_s,
            "interval_optimal_s": self.optimal_s, "goodput_spares": self.goodput,
            "overhead_first_order": self.overhead, "repair_s": self.repair_s,
            "goodput_wait": self.goodput_wait, "goodput_elastic": self.goodput_elastic,
            "elastic_nodes": self.elastic_nodes, "elastic_throughput": self.elastic_throughput,
            "policy": self.policy, "goodput": self.expected_goodput,
            "time_to_train_inflation": self.inflation,
        }  # fmt: skip

    def report(self) -> str:
        """The block ``collsim step`` prints."""
        ft = format_duration
        lines = [
            f"resilience: {self.nodes} nodes, node MTBF {self.node_mtbf_s / HOUR_S:.4g} h -> "
            f"system MTBF {ft(self.mtbf_s)}; checkpoint {self.checkpoint_bytes / 1e9:.4g} GB "
            f"written in {ft(self.write_s)}; restart {ft(self.restart_s)}",
            f"  checkpoint interval: Young {ft(self.young_s)}, Daly {ft(self.daly_s)} "
            f"(exact optimum {ft(self.optimal_s)})",
            f"  with spare nodes: goodput {100 * self.goodput:.1f}% (checkpoints "
            f"{100 * self.overhead['checkpoint']:.1f}%, rework {100 * self.overhead['rework']:.1f}%"
            f", restarts {100 * self.overhead['restart']:.1f}% of useful time, first order)",
        ]
        if self.repair_s is not None:
            lines.append(f"  repair {ft(self.repair_s)}: wait for repair: goodput "
                         f"{100 * self.goodput_wait:.1f}%")  # type: ignore[operator]  # fmt: skip
            if self.goodput_elastic is None:
                lines[-1] += "; elastic: impossible (no smaller layout)"
            else:
                f = 100 * self.elastic_throughput  # type: ignore[operator]
                lines[-1] += (
                    f"; elastic with {self.elastic_nodes} nodes left (the best layout they "
                    f"hold: {f:.1f}% throughput): "
                    f"goodput {100 * self.goodput_elastic:.1f}%"
                )
        lines.append(
            f"  goodput ({self.policy}): {100 * self.expected_goodput:.1f}%; time to train "
            f"x{self.inflation:.3f} (30 days of steps -> {30 * self.inflation:.1f} days)"
        )
        return "\n".join(lines)


def analyze(
    *,
    node_mtbf_s: float,
    nodes: int,
    checkpoint_bytes: float,
    storage_bytes_per_s: float,
    restart_s: float,
    repair_s: float | None = None,
    elastic: bool = False,
    step_time_s: Callable[[int], float | None] | None = None,
    nodes_lost: int = 1,
) -> Resilience:
    """The whole failure model; ``step_time_s(n)`` (step seconds on ``n`` nodes, None when no
    layout fits) prices the elastic option, by default :func:`dp_step_time`-like ``N / n``."""
    mtbf = system_mtbf_s(node_mtbf_s, nodes)
    write = checkpoint_write_s(checkpoint_bytes, storage_bytes_per_s)
    restart = _check("restart_s", restart_s, zero_ok=True)
    daly = daly_interval_s(write, mtbf)
    ratio = wall_per_useful(daly, write, restart, mtbf)
    if not math.isfinite(ratio):
        raise ResilienceError(
            f"the job never completes: the system fails every {format_duration(mtbf)} on "
            f"average ({plural(nodes, 'node')}), while a checkpoint takes "
            f"{format_duration(write)} to write and a restart {format_duration(restart)}; raise "
            "the storage bandwidth or the node MTBF",
            field="resilience",
            value={"node_mtbf_s": node_mtbf_s, "checkpoint_write_s": write, "restart_s": restart},
        )
    out = Resilience(
        nodes=nodes, node_mtbf_s=node_mtbf_s, mtbf_s=mtbf, checkpoint_bytes=checkpoint_bytes,
        write_s=write, restart_s=restart, young_s=young_interval_s(write, mtbf), daly_s=daly,
        optimal_s=optimal_interval_s(write, mtbf), goodput=1 / ratio, elastic=elastic,
        overhead={"checkpoint": write / daly, "rework": (daly + write) / (2 * mtbf),
                  "restart": restart / mtbf},
    )  # fmt: skip
    if repair_s is None:
        return out
    out.repair_s = _check("repair_s", repair_s)
    out.goodput_wait = 1 / (ratio * (1 + out.repair_s / mtbf))
    left = int(nodes) - int(_check("nodes_lost", nodes_lost))
    if left >= 1:
        step = step_time_s or (lambda n: nodes / n)
        full, reduced = step(int(nodes)), step(left)
        if full is not None and reduced is not None and reduced > 0:
            f = min(1.0, full / reduced)
            loss = out.repair_s * (1 - f) + restart
            out.goodput_elastic = 1 / (ratio * (1 + loss / mtbf))
            out.elastic_nodes, out.elastic_throughput = left, f
    return out


def for_job(
    w: WorkloadIn, gpus: int, gpus_per_node: int, step_time_s: Callable[[int], Any] | None = None
) -> Resilience | None:
    """The failure model of workload ``w`` on ``gpus`` GPUs (whole nodes of ``gpus_per_node``),
    from its ``resilience`` section; None when the workload has none."""
    res = w.resilience
    if res is None:
        return None
    return analyze(
        node_mtbf_s=res.node_mtbf_hours * HOUR_S, nodes=max(1, math.ceil(gpus / gpus_per_node)),
        checkpoint_bytes=res.checkpoint_bytes or default_checkpoint_bytes(w),
        storage_bytes_per_s=res.storage_bytes_per_s, restart_s=res.restart_s,
        repair_s=res.repair_s, elastic=res.elastic, step_time_s=step_time_s,
    )  # fmt: skip
