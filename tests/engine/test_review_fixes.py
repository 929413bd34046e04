"""Engine fixes from a physics review: a broadcast root copies its chunks one after another (its
memory copies them), and a ring all-reduce's all-gather follows its reduce-scatter on the
connection (no extra latency)."""

from __future__ import annotations

import pytest

from collsim.topology.loader import load_topology, topology_from_dict
from collsim.whatif import WhatIf


def _slow_memory():
    """4 GPUs on an NVSwitch at 100 GB/s whose memory copies at only 15 GB/s."""
    return topology_from_dict(
        {
            "name": "slow-memory",
            "gpu": {"model": "T", "peak_tflops": {"bf16": 100}, "memory": "80GB",
                    "memory_bandwidth": "30GB/s"},
            "node": {"gpus": 4, "intra": {"kind": "nvswitch", "switch_latency": "0us",
                     "link": {"kind": "nvlink", "bandwidth": "100GB/s", "latency": "1us"}}},
        }
    )  # fmt: skip


@pytest.mark.parametrize("chunk", [64 << 20, 16 << 20, 1 << 20])
def test_a_broadcast_root_copies_its_chunks_in_turn(chunk):
    """The root of a chain broadcast copies 64 MiB into its output: at 15 GB/s that takes 4474 us
    however it is chunked (chunked copies ran side by side, each at the full rate: 4x and 6x
    faster than the memory allows), and the engine stays on its contention-free path."""
    wi = WhatIf(_slow_memory())
    size = 64 << 20
    sim = wi.run("broadcast", "chain", size, chunk_bytes=chunk)[0]
    des = sim.time_s
    assert sim.meta.get("engine_path") == "contention_free"
    model = wi.cost_model("collsim").predict("broadcast", "chain", [size], chunk_bytes=chunk)
    assert des >= size / 15e9
    assert des == pytest.approx(float(model[0]), rel=1e-6)


@pytest.mark.parametrize("size", [16 << 10, 4 << 20, 64 << 20])
def test_ring_all_reduce_pays_no_extra_latency_between_its_halves(size):
    """One channel, nothing contending: the engine equals the closed form at every size (it paid
    one more network latency where the all-gather began, 16 us on two DGX A100 nodes)."""
    wi = WhatIf(load_topology("dgx-a100", nodes=2))
    des = wi.run("all_reduce", "ring", size)[0].time_s
    model = float(wi.cost_model("collsim").predict("all_reduce", "ring", [size])[0])
    assert des == pytest.approx(model, rel=1e-9)


def test_nvls_moves_one_share_more_than_the_buffer_at_the_switchs_efficiency():
    """NVLS all-reduce on one DGX H100: each GPU loads its reduced 1/8 and stores it back to all,
    S (1 + 1/8) each way over its 450 GB/s link, at NCCL's Hopper NVLS efficiency 0.85 (the
    data at 450 x 8/9 x 0.85 = 340 GB/s; it was 450: busbw 31-49% above what nccl-tests
    measures on H100 and B300 nodes), plus one route trip (0.7 + 0.1 + 0.7 us) per chunk of
    each of NCCL's 16 NVLS channels: 1 GiB / 16 / 128 KiB = 512 chunks (collsim.nvls), in
    the engine and the model alike."""
    wi = WhatIf(load_topology("dgx-h100", nodes=1))
    size = 1 << 30
    sim = wi.run("all_reduce", "in_network", size)[0]
    model = float(wi.cost_model("collsim").predict("all_reduce", "in_network", [size])[0])
    assert sim.time_s == pytest.approx(model, rel=1e-6)
    expected_s = size / (450e9 * 8 / 9 * 0.85) + 512 * 1.5e-6
    assert sim.time_s == pytest.approx(expected_s, rel=0.01)


def test_one_rank_is_a_copy_of_the_buffer_for_every_algorithm_and_engine() -> None:
    """On one GPU NCCL copies the out-of-place buffer: every collective and algorithm costs
    that copy (2 bytes of memory traffic per byte), on both engines. The analytic model had
    ring all-reduce at 0 us and tree at 1.5x the copy, the engine tree at half of it, and the
    engine refused a one-rank sendrecv, which nccl-tests runs."""
    from collsim.collectives.registry import algorithms_for
    from collsim.collectives.verify import COLLECTIVES
    from collsim.topology.loader import load_topology
    from collsim.whatif import WhatIf

    whatif = WhatIf(load_topology("dgx-h100", nodes=1, gpus_per_node=1))
    size = 1 << 20
    copy_s = size / (whatif.topology.gpu.memory_bandwidth_bytes_per_s / 2)
    for collective in COLLECTIVES:
        for algorithm in algorithms_for(collective):
            if algorithm == "in_network" or whatif.why_not(collective, algorithm):
                continue  # needs an NVSwitch that reduces (or several nodes), as NCCL
            for engine in ("analytic", "des"):
                sweep = whatif.sweep(collective, algorithm, [size], engine=engine)
                got = sweep.points[0].time_s
                assert got == pytest.approx(copy_s, rel=1e-6), (collective, algorithm, engine)
