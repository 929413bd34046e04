"""Incremental max-min: recomputing only affected flows gives the full recomputation's results.

"components" must match "all" (every active flow recomputed at every change, the old replay)
bit for bit; "local" and "auto" must match it to 1e-12 relative on these cases. Each mode runs
in both replay kernels, the Python one and the compiled one (:mod:`collsim.engine.kernel_replay`),
and the compiled "all" and "components" must give the Python "all"'s floats, bit for bit.
Cases: random
contended DAGs on a ring with random link capacities (multi-hop routes, so components grow
through chains of shared links), incast, two flows sharing a link, in-network reductions, and
a fat-tree of DGX-H100 nodes with ECMP collisions.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collsim.collectives.schedule import Schedule, ScheduleBuilder
from collsim.engine import SimResult, simulate, star_fabric
from collsim.engine.fabric import Fabric, Link, SimpleFabric
from collsim.engine.maxmin import max_min_rates, max_min_small
from collsim.engine.network import FlowNetwork
from tests.engine.conftest import IDEAL, switch_fabric

B = 25e9
LAT = 1.5e-6
TIMES = ("op_start_s", "op_end_s", "rank_finish_s")
TRANSFER_TIMES = ("start_s", "flow_start_s", "end_s")


def _arrays(result: SimResult) -> dict[str, np.ndarray]:
    out = {name: getattr(result, name) for name in TIMES}
    out.update({f"t.{name}": getattr(result.transfers, name) for name in TRANSFER_TIMES})
    out["busy_s"] = result.links.busy_s
    out["bytes"] = result.links.bytes
    return out


def check_modes(
    schedule: Schedule,
    fabric: Fabric,
    protocol: object = IDEAL,
    kernels: tuple[str, ...] = ("python", "compiled"),
) -> SimResult:
    """Replay in every mode and kernel; "all" and "components" bit-identical to the first
    kernel's "all", "local" and "auto" within 1e-12."""
    runs = {
        (mode, kernel): simulate(
            schedule, fabric, protocol=protocol, fast_path=False, reshare=mode, kernel=kernel
        )
        for kernel in kernels
        for mode in ("all", "components", "local", "auto")
    }
    reference = runs[("all", kernels[0])]
    ref = _arrays(reference)
    for (mode, kernel), run in runs.items():
        for name, value in _arrays(run).items():
            msg = f"{name} ({mode}, {kernel})"
            if mode in ("all", "components"):
                np.testing.assert_array_equal(value, ref[name], err_msg=msg)
            else:
                np.testing.assert_allclose(value, ref[name], rtol=1e-12, atol=0, err_msg=msg)
    return reference


def random_ring(n: int, rng: np.random.Generator) -> SimpleFabric:
    """A bidirectional ring with random capacities; routes go the shorter way round."""
    caps = rng.choice([B, B / 2, 2 * B, 0.75 * B], size=2 * n)
    links = [Link(i, (i + 1) % n, caps[i], LAT) for i in range(n)]
    links += [Link((i + 1) % n, i, caps[n + i], LAT) for i in range(n)]

    def router(src: object, dst: object) -> list[object]:
        s, d = int(src), int(dst)  # type: ignore[call-overload]
        forward = (d - s) % n
        if forward <= n - forward:
            return [(s + k) % n for k in range(forward + 1)]
        return [(s - k) % n for k in range(n - forward + 1)]

    return SimpleFabric(n, links, router=router, memory_bytes_per_s=4e12)  # type: ignore[arg-type]


def random_dag(n: int, ops: int, rng: np.random.Generator) -> Schedule:
    """Transfers between random ranks (some fused reduces, some local reductions), each
    depending on up to two earlier ops: many overlapping multi-hop flows."""
    b = ScheduleBuilder()
    ids: list[int] = []
    for _ in range(ops):
        deps = [ids[i] for i in rng.choice(len(ids), size=min(len(ids), 2), replace=False)]
        deps = deps[: int(rng.integers(0, 3))]
        count = int(rng.choice([0, 256, 4096, 1 << 16, 3 << 15]))
        if rng.random() < 0.1:
            ids.append(b.reduction(int(rng.integers(n)), count, "input", 0, "output", 0, deps=deps))
            continue
        src, dst = (int(x) for x in rng.choice(n, size=2, replace=False))
        fused = bool(rng.random() < 0.2)
        ids.append(b.transfer(src, dst, count, "input", 0, "output", 0, reduce=fused, deps=deps))
    return b.build("custom", "random", n, 0, 4)


@pytest.mark.parametrize("seed", range(12))
def test_random_contended_dags(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 10))
    check_modes(random_dag(n, int(rng.integers(20, 120)), rng), random_ring(n, rng))


@pytest.mark.parametrize("seed", range(4))
def test_vectorised_and_fallback_paths(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every component through numpy, "local" giving up early (full recomputation) at every
    # reshare (no waiting after a give-up) and "auto" switching to "local" at its first
    # component of more than one flow.
    from collsim.engine import network

    monkeypatch.setattr(network, "_SMALL_PAIRS", 0)
    monkeypatch.setattr(network, "_LOCAL_FLOWS", 2)
    monkeypatch.setattr(network, "_MAX_BACKOFF", 0)  # "local" tries at every reshare
    monkeypatch.setattr(network, "_COMPONENT_FLOWS", 1)
    rng = np.random.default_rng(50 + seed)
    check_modes(random_dag(8, 100, rng), random_ring(8, rng), kernels=("python",))


@pytest.mark.parametrize("seed", range(4))
def test_random_dags_with_the_real_protocols(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    check_modes(random_dag(7, 80, rng), random_ring(7, rng), protocol="LL128")


def test_chain_of_shared_links_forms_one_growing_component() -> None:
    # On a unidirectional-use ring, flow i goes i -> i+2: it shares link i+1 with flow i+1,
    # which shares link i+2 with flow i+2, ... a chain whose members start one by one and
    # end at different times (sizes differ), so the component grows and shrinks transitively.
    n = 9
    rng = np.random.default_rng(7)
    fabric = random_ring(n, rng)
    b = ScheduleBuilder()
    prev = None
    for i in range(n):
        deps = [prev] if prev is not None and i % 3 else []
        size = 4096 * (1 + (i * 5) % 7)
        prev = b.transfer(i, (i + 2) % n, size, "input", 0, "output", 0, deps=deps)
    check_modes(b.build("custom", "chain", n, 0, 4), fabric)


@pytest.mark.parametrize("k", [2, 5, 17])
def test_incast_matches(k: int) -> None:
    fabric = star_fabric(k + 1, B, LAT, switch_latency=0.7e-6)
    b = ScheduleBuilder()
    sizes = (np.arange(1, k + 1) * 1024).astype(np.int64)
    b.transfers(np.arange(1, k + 1), np.zeros(k, dtype=np.int64), sizes, "input", 0, "output", 0)
    result = check_modes(b.build("custom", "incast", k + 1, 0, 4), fabric)
    assert np.all(np.diff(result.transfers.end_s) > 0)  # ends one by one: k reshares


def test_two_flows_sharing_a_link_and_a_late_third() -> None:
    fabric = switch_fabric([B / 4, B, B, B], [B, B, B, B], lat=LAT)
    b = ScheduleBuilder()
    b.transfer(0, 2, 1 << 20, "input", 0, "output", 0)
    first = b.transfer(1, 2, 1 << 18, "input", 0, "output", 0)
    b.transfer(3, 2, 1 << 19, "input", 0, "output", 0, deps=[first])
    check_modes(b.build("custom", "share", 4, 0, 4), fabric)


def test_in_network_reductions_with_contention() -> None:
    n = 6
    fabric = star_fabric(n, B, LAT, switch_latency=0.4e-6, reducing=True)
    b = ScheduleBuilder()
    b.network_reduce(list(range(n)), list(range(n)), 1 << 18, "input", 0, "output", 0)
    b.transfer(0, 3, 1 << 17, "input", 0, "output", 0)
    b.transfer(1, 3, 1 << 16, "input", 0, "output", 0)
    check_modes(b.build("custom", "nvls", n, 0, 4), fabric)


@pytest.mark.parametrize(
    ("collective", "algorithm"), [("all_reduce", "hierarchical"), ("alltoall", "direct")]
)
def test_fat_tree_of_dgx_nodes(collective: str, algorithm: str) -> None:
    yaml = pytest.importorskip("yaml")
    from collsim.collectives.registry import build_schedule
    from collsim.topology.loader import CATALOG_DIR, topology_from_dict
    from collsim.whatif import WhatIf

    doc = yaml.safe_load((CATALOG_DIR / "dgx-h100.yaml").read_text())
    doc["fabric"].update(kind="fat_tree", tiers=3, radix=64)
    nodes = 4
    w = WhatIf(topology_from_dict(doc, nodes=nodes))
    count = (1 << 24) // 4
    s = build_schedule(collective, algorithm, nranks=nodes * 8, count=count, layout=w.layout)
    result = check_modes(s, w.fabric, protocol="Simple")
    assert result.meta["engine_path"] == "replay"


def test_auto_switches_to_local_on_a_giant_component(monkeypatch: pytest.MonkeyPatch) -> None:
    from collsim.engine import network

    monkeypatch.setattr(network, "_COMPONENT_FLOWS", 1)
    caps = np.full(12, 10.0)
    net = FlowNetwork(caps)
    assert net.mode == "auto"
    one = np.array([1])
    # Two lone flows, then a chain 0-1-2 through links 1 and 2, one flow at a time.
    steps = [[10], [11], [0, 1], [1, 2], [2]]
    schemes = []
    for i, path in enumerate(steps):
        net.add(0.0, np.array([i]), np.array([5.0]), np.array([len(path)]), np.array(path))
        net.reshare(0.0)
        schemes.append(net._scheme)
    # The chain of 3 is more than half of the 5 flows: from then on, settle locally.
    assert schemes == ["components"] * 4 + ["local"]
    finished = net.pop_finished(0.5, 0.5)  # the lone flows: 5 bytes at 10 bytes/s
    assert sorted(finished.tolist()) == [0, 1]
    net.add(0.5, np.array([5]), np.array([5.0]), one, one)
    net.reshare(0.5)  # link 1 now split three ways; flow 4 takes the rest of link 2
    live = np.flatnonzero(net.live)
    live = live[np.argsort(net.order[live])]
    rows = net._links[live]
    expected = max_min_rates(rows[rows >= 0], net.nlinks[live], caps)
    np.testing.assert_allclose(expected, [10 / 3, 10 / 3, 20 / 3, 10 / 3], rtol=1e-15)
    np.testing.assert_allclose(net.rate_bytes_per_s[live], expected, rtol=1e-15)


def test_local_settling_backs_off_while_it_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A re-settling that gives up costs more than recomputing everything, so after one the
    next 1, 2, 4, ... (at most 64) reshares recompute everything without trying; a success
    resets the wait. The rates stay the full recomputation's throughout."""
    from collsim.engine import network

    real = network.settle
    attempts: list[int] = []
    step = [0]
    succeed_at = 200

    def counted(*args: object) -> object:
        attempts.append(step[0])
        return real(*args) if step[0] == succeed_at else None

    monkeypatch.setattr(network, "settle", counted)
    caps = np.full(4, 10.0)
    net = FlowNetwork(caps, mode="local")
    for i in range(205):
        step[0] = i
        links = np.array([i % 4, (i + 1) % 4])
        net.add(0.0, np.array([i]), np.array([5.0]), np.array([2]), links)
        net.reshare(0.0)
    # The first flow, alone, is recomputed in full. Given up at 1, 3, 6, 11, 20, 37, 70, 135
    # (waits 1, 2, 4, 8, 16, 32, 64, then 64 again: the cap); the attempt at 200 succeeds;
    # the one at 201 gives up and waits 1 again (reset), then 2.
    assert attempts == [1, 3, 6, 11, 20, 37, 70, 135, 200, 201, 203]
    live = np.flatnonzero(net.live)
    live = live[np.argsort(net.order[live])]
    rows = net._links[live]
    expected = max_min_rates(rows[rows >= 0], net.nlinks[live], caps)
    np.testing.assert_allclose(net.rate_bytes_per_s[live], expected, rtol=1e-12)


def test_modes_are_checked() -> None:
    with pytest.raises(ValueError, match="reshare mode"):
        FlowNetwork(np.ones(2), mode="some")


def test_slots_are_reused_and_grow() -> None:
    # 100 flows (more than the 64 initial slots) on paths wider than the initial 4 links.
    caps = np.full(12, 10.0)
    net = FlowNetwork(caps)
    nlinks = np.full(100, 6, dtype=np.int64)
    links = np.concatenate([np.arange(6) + (f % 7) for f in range(100)])
    net.add(0.0, np.arange(100), np.full(100, 5.0), nlinks, links)
    net.reshare(0.0)
    assert len(net) == 100
    full = max_min_rates(links, nlinks, caps)
    live = np.flatnonzero(net.live)
    np.testing.assert_array_equal(net.rate_bytes_per_s[live[np.argsort(net.order[live])]], full)
    done = net.pop_finished(net.next_end_s(), net.next_end_s())
    assert done.size and len(net) == 100 - done.size
    net.add(1.0, np.array([7]), np.array([1.0]), np.array([1]), np.array([11]))
    net.reshare(1.0)
    assert len(net) == 101 - done.size


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=5), min_size=1, max_size=14),
    st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0, 1.0 / 3.0, 7.25]), min_size=8, max_size=8),
)
def test_python_and_numpy_max_min_agree_bit_for_bit(
    paths: list[list[int]], capacity: list[float]
) -> None:
    links = np.array([link for path in paths for link in path], dtype=np.int64)
    nlinks = np.array([len(path) for path in paths], dtype=np.int64)
    expected = max_min_rates(links, nlinks, np.array(capacity))
    got, bottleneck = max_min_small(paths, capacity)
    np.testing.assert_array_equal(got, expected)
    # Each flow's bottleneck is on its path, saturated, and no flow on it is faster.
    load = np.zeros(8)
    np.add.at(load, links, np.repeat(expected, nlinks))
    for f, link in enumerate(bottleneck):
        assert link in paths[f]
        assert load[link] == pytest.approx(capacity[link], rel=1e-12)
        on_link = [g for g, p in enumerate(paths) if link in p]
        assert max(got[g] for g in on_link) <= got[f] * (1 + 1e-12)
