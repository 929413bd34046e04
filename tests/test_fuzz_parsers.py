"""Fuzzing every parser of user input: whatever comes in, only a :class:`CollsimError` (one line
naming the file, the field and the value) or a result comes out, never another exception.

Each parser gets 1,000 examples: random values of the shapes YAML can produce, and random
mutations (values replaced, keys removed or added, lines cut or changed) of a valid document.
Integers stay small so that a mutated node count cannot ask for a million-GPU topology.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from collsim import units
from collsim.calibration.nccltests import read_log
from collsim.errors import CollsimError
from collsim.model.profile import load_profile, profile_from_dict
from collsim.sweep.spec import spec_from_dict
from collsim.topology.loader import topology_from_dict
from collsim.training.workload import workload_from_dict
from tests.fuzzing import mutate_lines

FUZZ = settings(
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
ROOT = Path(__file__).resolve().parents[1]

TINY_TOPOLOGY = {
    "name": "tiny",
    "nodes": 1,
    "gpu": {"model": "X", "peak_tflops": {"bf16": 100}, "memory": "40GB",
            "memory_bandwidth": "1TB/s"},
    "node": {
        "gpus": 2,
        "intra": {"kind": "nvswitch",
                  "link": {"kind": "nvlink", "bandwidth": "100GB/s", "latency": "1us"}},
        "pcie": {"kind": "pcie", "bandwidth": "32GB/s", "latency": "0.5us"},
    },
    "fabric": {"kind": "none"},
}  # fmt: skip
TINY_EXPLICIT = {
    "name": "pair",
    "gpu": TINY_TOPOLOGY["gpu"],
    "devices": [{"name": "g0", "kind": "gpu", "node": 0}, {"name": "g1", "kind": "gpu", "node": 0},
                {"name": "sw", "kind": "switch"}],
    "links": [{"a": "g0", "b": "sw", "kind": "nvlink", "bandwidth": "100GB/s", "latency": "1us"},
              {"a": "g1", "b": "sw", "kind": "nvlink", "bandwidth": "100GB/s", "latency": "1us"}],
}  # fmt: skip
WORKLOAD = yaml.safe_load((ROOT / "workloads" / "gpt-1.3b-ddp.yaml").read_text())
GENERIC_WORKLOAD = {
    "name": "job",
    "model": {"kind": "generic", "flops_per_sample": "12G", "params": "1B"},
    "global_batch": 64,
    "micro_batch": 8,
    "dtype": "bf16",
}
PROFILE = {
    "collsim_profile": 2,
    "topology": {"name": "dgx-h100", "nodes": 4, "gpus_per_node": 8},
    "link_classes": {"nvlink": {"bandwidth_efficiency": 0.8, "latency_scale": 1.5}},
    "base_latency_us": 3.0,
    "memory_efficiency": 1.0,
    "size_efficiency": [[1024, 0.5], [1048576, 0.9]],
    "provenance": {"logs": ["a.txt"], "collectives": ["all_reduce"], "ranks": [8],
                   "method": "fit", "fitted": ["nvlink"]},
}  # fmt: skip
LOG = (ROOT / "data/nccl-tests/logs/2080ti-2gpu-pcie-nop2p-all_gather-1.txt").read_text()

# -- strategies ----------------------------------------------------------------------------------

UNITS_TEXT = st.from_regex(
    r"\s?-?[0-9]{0,4}\.?[0-9]{0,3}([eE][+-]?[0-9]{1,3})?\s?(B|K|M|G|T|KiB|MB|GB|GiB|GB/s|Gbps|"
    r"GBps|Gb/s|TB/s|s|ms|us|µs|ns|x|)\s?",
    fullmatch=True,
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-3, max_value=64)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | UNITS_TEXT
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=10) | st.integers(-2, 5), inner, max_size=4)
    ),
    max_leaves=12,
)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            out += _paths(value, (*prefix, i))
    return out


def _get(doc: Any, path: tuple) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _like(value: Any) -> st.SearchStrategy[Any]:
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers(min_value=-2, max_value=40)
    if isinstance(value, float):
        return st.floats(min_value=-1, max_value=1e7) | st.sampled_from([0.0, 1e-300, 1e300])
    if isinstance(value, str):
        return UNITS_TEXT | st.sampled_from(WORDS) | st.text(max_size=6)
    return VALUES


# fmt: off
WORDS = ["gpu", "switch", "nic", "nvlink", "pcie", "infiniband", "ring", "tree", "auto", "all",
         "des", "analytic", "fat_tree", "torus", "none", "full", "selective", "interleaved",
         "all_reduce", "alltoall", "LL", "LL128", "g0", "g1", "sw", "generic", "transformer"]
# fmt: on


@st.composite
def mutated(draw: Any, *bases: dict[str, Any]) -> Any:
    """A valid document with 1-3 random changes (replace, delete, add a key)."""
    doc = copy.deepcopy(draw(st.sampled_from(bases)))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(doc)))
        op = draw(st.sampled_from(["perturb", "perturb", "replace", "delete", "add"]))
        if not path:
            if op == "replace":
                doc = draw(VALUES)
            continue
        parent = _get(doc, path[:-1])
        if op == "perturb":  # a value of the same type: reaches the checks past the schema
            parent[path[-1]] = draw(_like(parent[path[-1]]))
        elif op == "replace":
            parent[path[-1]] = draw(VALUES)
        elif op == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(VALUES)
        else:
            parent.append(draw(VALUES))
        if not isinstance(doc, dict | list):
            break
    return doc


SMALL = mock.patch("collsim.topology.loader.MAX_GPUS", 4096)
"""Systems the fuzzing builds stay small (the limit's own error is what a larger one gets)."""


def _ok_or_collsim_error(func: Any, *args: Any, **kwargs: Any) -> None:
    try:
        func(*args, **kwargs)
    except CollsimError as exc:
        event("refused")
        assert str(exc) and "\n" not in str(exc)
    else:
        event("accepted")


# -- units ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("parse", [units.parse_size, units.parse_rate, units.parse_time])
@FUZZ
@given(value=UNITS_TEXT | SCALARS | VALUES)
def test_units(parse, value):
    _ok_or_collsim_error(parse, value)


# -- topologies ----------------------------------------------------------------------------------


@FUZZ
@given(doc=mutated(TINY_TOPOLOGY, TINY_EXPLICIT) | VALUES)
def test_topology_from_dict(doc):
    with SMALL:  # a drawn 70000.0 nodes would build (minutes, gigabytes): this is about errors
        _ok_or_collsim_error(topology_from_dict, doc, file="fuzz.yaml")


# -- workloads -----------------------------------------------------------------------------------


@FUZZ
@given(doc=mutated(WORKLOAD, GENERIC_WORKLOAD) | VALUES)
def test_workload_from_dict(doc):
    _ok_or_collsim_error(workload_from_dict, doc, file="fuzz.yaml")


# -- sweep specs ---------------------------------------------------------------------------------

_DIR = Path(tempfile.mkdtemp(prefix="collsim-fuzz-"))
(_DIR / "tiny.yaml").write_text(yaml.safe_dump(TINY_TOPOLOGY))
SWEEP = {
    "name": "fuzz",
    "topologies": ["tiny.yaml"],
    "nodes": [1],
    "collectives": ["all_reduce", "all_gather"],
    "algorithms": ["ring", "auto"],
    "sizes": {"min": "1K", "max": "1M", "factor": 4},
    "engines": ["analytic"],
}
SWEEP_LIST = {**SWEEP, "sizes": ["1K", "8K"], "algorithms": ["all"], "protocol": "LL128"}


@FUZZ
@given(doc=mutated(SWEEP, SWEEP_LIST) | VALUES)
def test_sweep_spec(doc):
    with SMALL:
        _ok_or_collsim_error(spec_from_dict, doc, file="fuzz.yaml", base=_DIR)


# -- profiles ------------------------------------------------------------------------------------


@FUZZ
@given(doc=mutated(PROFILE) | VALUES)
def test_profile_from_dict(doc):
    _ok_or_collsim_error(profile_from_dict, doc, file="fuzz.yaml")


@FUZZ
@given(text=st.text(max_size=200) | st.builds(yaml.safe_dump, mutated(PROFILE)))
def test_load_profile_text(text):
    path = _DIR / "profile.yaml"
    path.write_text(text, encoding="utf-8")
    _ok_or_collsim_error(load_profile, path)


# -- nccl-tests logs -----------------------------------------------------------------------------

LINES = LOG.splitlines()


@st.composite
def mutated_log(draw: Any) -> str:
    token = (
        UNITS_TEXT
        | st.text(max_size=8)
        | st.sampled_from(
            ["-1", "nan", "inf", "N/A", "1e999", "0", "-0.5", "#", "float", "all_reduce_perf"]
        )
    )
    return mutate_lines(draw, LINES, token, sep="   ")


@FUZZ
@given(text=mutated_log() | st.text(max_size=300) | st.binary(max_size=200).map(repr))
def test_read_log(text):
    path = _DIR / "all_gather.txt"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _ok_or_collsim_error(read_log, path)


@FUZZ
@given(doc=mutated({"nccl_tests": {"results": [{"size": 8, "time": 1.0}]}}) | VALUES)
def test_read_log_json(doc):
    import json

    path = _DIR / "all_reduce.json"
    path.write_text(json.dumps(doc, allow_nan=True))
    _ok_or_collsim_error(read_log, path)
