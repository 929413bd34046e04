from __future__ import annotations

import pytest
import yaml

SPEC = {
    "name": "small",
    "topologies": ["dgx-h100"],
    "nodes": [1, 2],
    "collectives": ["all_reduce", "all_gather"],
    "algorithms": ["ring", "tree", "auto"],
    "sizes": {"min": "1K", "max": "64M", "factor": 8},
    "engines": ["analytic"],
    "steps": {"workloads": ["gpt-1.3b-ddp"], "layouts": [{"tp": 1}, {"tp": 2}, {"tp": 3}]},
}


@pytest.fixture
def spec_file(tmp_path):
    def write(data=None, **changes):
        path = tmp_path / "spec.yaml"
        path.write_text(yaml.safe_dump({**(data or SPEC), **changes}))
        return path

    return write
