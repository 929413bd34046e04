"""Sweep specs: validation errors are one line naming the field; grids expand to coarse tasks."""

from __future__ import annotations

import pytest

from collsim.sweep import SweepError, load_spec
from tests.sweep.conftest import SPEC


def test_expands_into_tasks_per_topology(spec_file):
    spec = load_spec(spec_file())
    coll = [t for t in spec.tasks if t.kind == "collective"]
    steps = [t for t in spec.tasks if t.kind == "step"]
    assert len(coll) == 2 * 2  # nodes x collectives (engines: 1)
    assert len(steps) == 2
    assert coll[0].sizes[0] == 1024 and coll[0].sizes[-1] == 32 * 2**20
    sizes = len(coll[0].sizes)
    # all_gather has no "tree": it is left out of that collective only
    algos = {t.collective: t.algorithms for t in coll}
    assert algos == {"all_reduce": ("ring", "tree", "auto"), "all_gather": ("ring", "auto")}
    assert spec.n_points == 2 * (3 + 2) * sizes + 2 * 3
    assert len({t.key for t in spec.tasks}) == len(spec.tasks)


def test_all_expands_to_the_systems_algorithms(spec_file):
    spec = load_spec(spec_file(algorithms=["all"], collectives=["all_reduce"]))
    from collsim.topology.loader import load_topology
    from collsim.whatif import WhatIf

    for task in [t for t in spec.tasks if t.kind == "collective"]:
        whatif = WhatIf(load_topology("dgx-h100", nodes=task.nodes))
        assert task.algorithms == tuple(whatif.candidates("all_reduce"))


def test_size_list(spec_file):
    spec = load_spec(spec_file(sizes=["1K", "1M", 1024]))
    assert spec.tasks[0].sizes == (1024, 2**20)


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"collectives": ["allreduse"]}, "collectives.0", "did you mean 'all_reduce'"),
        ({"algorithms": ["rign"]}, "algorithms.0", "did you mean 'ring'"),
        ({"topologies": ["dgx-h10"]}, "topologies.0", "did you mean 'dgx-h100'"),
        ({"nodes": [0]}, "nodes.0", "greater than or equal to 1"),
        ({"sizes": {"min": "1M", "max": "1K"}}, "sizes", "smaller than min"),
        ({"sizes": {"min": "1Q", "max": "1K"}}, "sizes.min", "1Q"),
        ({"engines": ["fast"]}, "engines.0", "fast"),
        ({"colectives": ["all_reduce"]}, "colectives", "did you mean 'collectives'"),
        ({"dtype": "float33"}, "dtype", "float33"),
        ({"steps": {"workloads": ["gpt-1.3b-ddp"], "layouts": [{"tq": 2}]}},
         "steps.layouts.0.tq", "expected one of: tp, pp"),
        ({"steps": {"workloads": ["nope"]}}, "steps.workloads.0", "nope"),
    ],
)  # fmt: skip
def test_malformed_spec_names_the_field(spec_file, changes, field, words):
    path = spec_file(**changes)
    with pytest.raises(SweepError) as info:
        load_spec(path)
    text = str(info.value)
    assert "\n" not in text
    assert str(path) in text
    assert f"field '{field}'" in text
    assert words in text


def test_missing_sizes_and_empty_grid(spec_file):
    data = {k: v for k, v in SPEC.items() if k not in ("sizes", "steps")}
    with pytest.raises(SweepError, match="field 'sizes'"):
        load_spec(spec_file(data))
    with pytest.raises(SweepError, match="nothing to sweep"):
        load_spec(spec_file({"topologies": ["dgx-h100"]}))


def test_yaml_syntax_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("topologies: [dgx-h100\n")
    with pytest.raises(SweepError, match="malformed YAML at line"):
        load_spec(path)


def test_all_algorithms_are_those_the_system_can_run():
    """dgx-h100's NVSwitches reduce, but each reaches only its node's GPUs: across 4 nodes there
    is no in-network all-reduce, so 'all' leaves it out (it used to fill rows with errors)."""
    from collsim.sweep.spec import spec_from_dict

    def algos(nodes: int) -> tuple[str, ...]:
        spec = spec_from_dict({"topologies": ["dgx-h100"], "nodes": [nodes],
                               "collectives": ["all_reduce"], "sizes": ["1M"]})  # fmt: skip
        return spec.tasks[0].algorithms

    assert "in_network" not in algos(4)
    assert "in_network" in algos(1)


def test_two_files_naming_one_topology_are_refused(tmp_path):
    """Rows carry the topology's name: two files under one name were merged in the results."""
    from collsim.sweep.spec import spec_from_dict
    from collsim.topology.loader import resolve

    text = resolve("dgx-h100").read_text()
    (tmp_path / "a.yaml").write_text(text)
    (tmp_path / "b.yaml").write_text(text.replace("400Gbps", "100Gbps"))
    with pytest.raises(SweepError, match=r"as topologies\.0 does"):
        spec_from_dict({"topologies": ["a.yaml", "b.yaml"], "collectives": ["all_reduce"],
                        "sizes": ["1M"]}, base=tmp_path)  # fmt: skip


def test_a_topology_file_named_relative_to_the_spec_is_found_from_anywhere(tmp_path, monkeypatch):
    """A Dask worker runs in its own folder: a spec's relative file name, kept relative, was
    looked up there (not found, or another file of that name hashed to an unknown task)."""
    from collsim.sweep.spec import spec_from_dict
    from collsim.topology.loader import resolve

    (tmp_path / "mine.yaml").write_text(resolve("dgx-h100").read_text())
    monkeypatch.chdir(tmp_path.parent)
    doc = {"topologies": ["mine.yaml"], "collectives": ["all_reduce"], "sizes": ["1M"]}
    spec = spec_from_dict(doc, base=tmp_path.relative_to(tmp_path.parent))
    paths = {task.topology_path for task in spec.tasks}
    assert paths == {str((tmp_path / "mine.yaml").resolve())}
