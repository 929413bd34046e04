"""Small topology documents for tests, built as dicts so each test can mutate one field."""

import copy

import pytest

GPU = {
    "model": "TestGPU",
    "peak_tflops": {"bf16": 100},
    "memory": "16GB",
    "memory_bandwidth": "1TB/s",
}


def template(nodes=2, gpus=4, fabric=None, intra=None, nics=None, pcie="32GB/s"):
    node = {
        "gpus": gpus,
        "intra": intra or {"kind": "nvswitch", "link": {"kind": "nvlink", "bandwidth": "100GB/s"}},
        "nics": nics or {"count": gpus, "link": {"kind": "infiniband", "bandwidth": "200Gbps"}},
    }
    if pcie:
        node["pcie"] = {"kind": "pcie", "bandwidth": pcie, "latency": "0.5us"}
    return {
        "name": "test",
        "nodes": nodes,
        "gpu": copy.deepcopy(GPU),
        "node": node,
        "fabric": fabric or {"kind": "fat_tree", "radix": 8, "switch_latency": "0.1us"},
    }


def endpoints_only(nodes, fabric):
    """One GPU and one NIC per node: the fabric's endpoints are the nodes."""
    return template(
        nodes=nodes,
        gpus=1,
        intra={"kind": "none"},
        nics={"count": 1, "link": {"kind": "infiniband", "bandwidth": "100GB/s"}},
        fabric=fabric,
        pcie="10TB/s",
    )


@pytest.fixture
def doc():
    return template()
