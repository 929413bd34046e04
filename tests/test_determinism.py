"""Determinism: the same command twice gives byte-identical output files.

Each command runs twice as a real process with a different ``PYTHONHASHSEED``, so an output that
depended on set or dict-of-hash order (or on time, or on where it was written) would differ.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _collsim() -> list[str]:
    script = Path(sys.executable).parent / "collsim"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from collsim.cli import main; main()"]


def _run_twice(tmp_path: Path, args: list[str], outputs: list[str]) -> list[tuple[bytes, bytes]]:
    """Run ``collsim args`` in two folders (OUT/ replaced by each); the two versions of each of
    ``outputs``."""
    got = []
    for seed in ("0", "12345"):
        out = tmp_path / f"run-{seed}"
        out.mkdir()
        env = {**os.environ, "PYTHONHASHSEED": seed}
        argv = [a.replace("OUT/", f"{out}/") for a in args]
        proc = subprocess.run(
            [*_collsim(), *argv], capture_output=True, text=True, env=env, timeout=300
        )
        assert proc.returncode == 0, proc.stderr
        got.append([(out / name).read_bytes() for name in outputs])
    return list(zip(*got, strict=True))


@pytest.mark.parametrize(
    ("args", "outputs"),
    [
        pytest.param(
            ["simulate", "all_reduce", "-t", "dgx-h100", "--nodes", "2", "-b", "1K", "-e", "16M",
             "-f", "16", "-a", "auto", "--json", "OUT/sim.json", "--trace", "OUT/trace.json"],
            ["sim.json", "trace.json"],
            id="simulate-des",
        ),
        pytest.param(
            ["simulate", "alltoall", "-t", "dgx-h100", "--nodes", "2", "-e", "64M",
             "--engine", "analytic", "--json", "OUT/sim.json"],
            ["sim.json"],
            id="simulate-analytic",
        ),
        pytest.param(
            ["tune", "all_reduce", "-t", "dgx-h100", "--nodes", "4", "--json", "OUT/tune.json"],
            ["tune.json"],
            id="tune",
        ),
        pytest.param(
            ["step", "-w", "gpt3-175b", "-t", "dgx-h100", "--nodes", "8", "--json",
             "OUT/step.json"],
            ["step.json"],
            id="step",
        ),
    ],
)  # fmt: skip
def test_same_command_same_bytes(tmp_path, args, outputs):
    for first, second in _run_twice(tmp_path, args, outputs):
        assert first and first == second


def test_sweep_twice_same_bytes(tmp_path):
    spec = {
        "name": "determinism",
        "topologies": ["dgx-h100"],
        "nodes": [1, 2],
        "collectives": ["all_reduce", "alltoall"],
        "algorithms": ["all", "auto"],
        "sizes": {"min": "1K", "max": "64M", "factor": 8},
        "engines": ["analytic"],
        "steps": {"workloads": ["gpt-1.3b-ddp"], "layouts": [{"tp": 1}, {"tp": 2}]},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    pairs = _run_twice(
        tmp_path, ["sweep", str(path), "-o", "OUT/res", "-j", "2"], ["res/points.csv",
        "res/spec.json"]
    )  # fmt: skip
    for first, second in pairs:
        assert first and first == second
    parts = [sorted((tmp_path / f"run-{s}/res/parts").iterdir()) for s in ("0", "12345")]
    assert [p.name for p in parts[0]] == [p.name for p in parts[1]]  # same task keys
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(*parts, strict=True))


@pytest.mark.parametrize(
    ("system", "args"),
    [
        ("selene", ["alltoall", "-a", "direct", "--channels", "2"]),
        ("roce-100g", ["all_reduce", "-a", "tree", "--channels", "2"]),
        ("roce-100g", ["all_reduce", "-a", "ring", "--engine", "analytic"]),
    ],
)
def test_the_order_of_devices_and_links_in_a_file_does_not_change_results(tmp_path, system, args):
    """ECMP and the bottleneck list go by names: the same system listed in another order (an
    edited export) routes the same flows the same way, to the byte (it did not: the hash took
    the devices' positions, and alltoall on eight selene nodes moved by 4%)."""
    import random

    from click.testing import CliRunner

    from collsim.cli import cli
    from collsim.topology.describe import to_explicit_yaml
    from collsim.topology.loader import load_topology

    doc = yaml.safe_load(to_explicit_yaml(load_topology(system, nodes=8)))
    shuffled = {**doc, "devices": list(doc["devices"]), "links": list(doc["links"])}
    rng = random.Random(5)
    rng.shuffle(shuffled["devices"])
    rng.shuffle(shuffled["links"])
    outputs = []
    for name, body in (("listed.yaml", doc), ("shuffled.yaml", shuffled)):
        path = tmp_path / name
        path.write_text(yaml.safe_dump(body, sort_keys=False))
        run = CliRunner().invoke(
            cli, ["simulate", *args, "-t", str(path), "-b", "64M", "-e", "64M"]
        )
        assert run.exit_code == 0, run.output
        # the wall-clock note (printed when the engine is slow, as on a loaded machine) is no result
        lines = run.output.replace(name, "T").splitlines()
        outputs.append([line for line in lines if "discrete-event engine took" not in line])
    assert outputs[0] == outputs[1]
