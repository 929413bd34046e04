"""GPUDirect receive flush: which (release, GPU, transport, plugin setting) flush, what a flush
costs in the engine and in the analytic model (hand-computed, the two alike), how the log reader
finds the plugin's own setting, and what it does to the p4d pair of logs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from collsim.calibration import read_log
from collsim.calibration.predict import Predictor, uncalibrated_params
from collsim.cli import cli
from collsim.model.nccl_release import (
    NcclVersion,
    nic_transport,
    receive_flush,
    with_receive_flushes,
)
from collsim.topology.fabric import TopologyFabric
from collsim.topology.graph import Network
from collsim.topology.loader import load_topology
from collsim.transports import FLUSH_STEP_BYTES, TRANSPORTS
from collsim.whatif import WhatIf
from tests.calibration.conftest import standard_log

LOGS = Path(__file__).resolve().parents[2] / "data" / "nccl-tests" / "logs"
FLUSHED = LOGS / "a100-p4d-efa-2n-all_reduce-2.txt"  # NCCL 2.8.3, the plugin flushes
UNFLUSHED = LOGS / "a100-p4d-efa-2n-all_reduce-1.txt"  # 2.9.9, the plugin turned it off

EFA, IB, HOST = TRANSPORTS["efa"], TRANSPORTS["ib_verbs"], TRANSPORTS["efa_host"]
V = NcclVersion


def test_efa_flush_costs_its_serial_read_per_512_kib_step():
    assert FLUSH_STEP_BYTES == 512 * 1024  # 4 MiB Simple buffer / NCCL_STEPS (8)
    assert EFA.flush_us == 27.7
    assert EFA.flush_s_per_byte == pytest.approx(27.7e-6 / (512 * 1024))
    # other transports: no serial flush (IB reads on its own loopback QP; no GPUDirect)
    assert all(t.flush_us == 0 for name, t in TRANSPORTS.items() if name != "efa")


@pytest.mark.parametrize(
    ("release", "cc", "transport", "env", "flushes"),
    [
        (V(2, 8, 3), 80, EFA, {}, True),  # every receive, the plugin decides: it reads
        (V(2, 8, 3), 80, EFA, {"OFI_NCCL_GDR_FLUSH_DISABLE": "1"}, False),
        (V(2, 8, 3), 80, IB, {"NCCL_GDR_FLUSH_DISABLE": "1"}, False),  # net_ib's switch
        (V(2, 8, 3), 80, IB, {"OFI_NCCL_GDR_FLUSH_DISABLE": "1"}, True),  # not net_ib's
        (V(2, 12, 12), 90, EFA, {}, True),  # before 2.15 NCCL asks on Hopper too
        (V(2, 18, 3), 90, EFA, {}, True),  # ncclTopoNeedFlush: NET_FORCE_FLUSH defaults to 1
        (V(2, 18, 3), 90, EFA, {"NCCL_NET_FORCE_FLUSH": "0"}, False),  # aws-ofi-nccl on p5
        (V(2, 19, 3), 90, IB, {}, False),  # 2.19.1: Hopper needs no flush
        (V(2, 19, 3), 90, IB, {"NCCL_NET_FORCE_FLUSH": "1"}, True),
        (V(2, 19, 3), 80, IB, {}, True),  # Ampere always
        (V(2, 19, 3), 80, IB, {"NCCL_GDRCOPY_FLUSH_ENABLE": "1"}, False),  # CPU read instead
        (V(2, 8, 3), 70, HOST, {}, False),  # host-staged EFA: no GPUDirect receive
        (V(2, 8, 3), 80, None, {}, False),
    ],
)
def test_which_receives_nccl_flushes(release, cc, transport, env, flushes):
    assert receive_flush(release, cc, transport, env) is flushes


def test_the_fabric_puts_the_flush_on_nic_cables_only():
    topology = load_topology("p4d")
    assert nic_transport(topology) is EFA
    plain = TopologyFabric(Network(topology))
    assert not plain.flush_s_per_byte.any()
    flushed = TopologyFabric(Network(with_receive_flushes(topology, 1.0)))
    per_link = flushed.flush_s_per_byte
    at_nic = per_link > 0
    assert at_nic.any()
    assert per_link[at_nic] == pytest.approx(27.7e-6 / (512 * 1024))
    net = flushed.network
    kinds = [d.kind for d in net.devices]
    for k in np.flatnonzero(at_nic):
        assert "nic" in (kinds[net.link_src[k]], kinds[net.link_dst[k]])


@pytest.mark.parametrize("size", [8 << 20, 64 << 20])
def test_engine_and_model_add_one_flush_per_received_step_of_a_ring(size):
    # Two p4d nodes, one GPU each: a ring all-reduce on one channel is two network steps of
    # S/2 each, in series. Flushed, each 512 KiB received waits 27.7 us more: S / 512 KiB x
    # 27.7 us in all (64 MiB: 128 x 27.7 = 3545.6 us), in the engine and in the model alike.
    topology = load_topology("p4d", gpus_per_node=1)
    times = []
    for flushes in (0.0, 1.0):
        whatif = WhatIf(with_receive_flushes(topology, flushes))
        sim, _ = whatif.run("all_reduce", "ring", size, protocol="Simple")
        model = whatif.cost_model("collsim")
        pred = float(model.predict("all_reduce", "ring", [size], protocol="Simple")[0])
        times.append((sim.time_s, pred))
    expected = size / (512 * 1024) * 27.7e-6
    assert times[1][0] - times[0][0] == pytest.approx(expected, rel=1e-9)
    assert times[1][1] - times[0][1] == pytest.approx(expected, rel=1e-9)
    assert times[1][0] == pytest.approx(times[1][1], rel=1e-9)


def test_only_simple_is_flushed():
    topology = with_receive_flushes(load_topology("p4d", gpus_per_node=1), 1.0)
    plain = WhatIf(load_topology("p4d", gpus_per_node=1))
    whatif = WhatIf(topology)
    for protocol in ("LL", "LL128"):
        a, _ = whatif.run("all_reduce", "ring", 1 << 20, protocol=protocol)
        b, _ = plain.run("all_reduce", "ring", 1 << 20, protocol=protocol)
        assert a.time_s == b.time_s


def test_the_reader_takes_the_plugins_own_flush_setting(tmp_path):
    def write(text: str, name: str = "log.txt") -> Path:
        (tmp_path / name).write_text(text, encoding="utf-8")
        return tmp_path / name

    info = (
        "node1:1000:1100 [0] NCCL INFO NET/OFI Setting OFI_NCCL_GDR_FLUSH_DISABLE environment "
        "variable to 1"
    )
    rows = standard_log().split("\n")
    log = read_log(write("\n".join([rows[0], info, *rows[1:]])))
    assert log.nccl_env == {"OFI_NCCL_GDR_FLUSH_DISABLE": "1"}
    # the same setting on the launch line
    cmd = "mpirun -np 4 -x OFI_NCCL_GDR_FLUSH_DISABLE=1 ./all_reduce_perf -b 1K -e 4K"
    log = read_log(write("\n".join([cmd, *rows]), "cmd.txt"))
    assert log.nccl_env.get("OFI_NCCL_GDR_FLUSH_DISABLE") == "1"
    # the p4d pair: the 2.9.9 run's plugin turned its flush off, the 2.8.3 run's did not
    assert read_log(UNFLUSHED).nccl_env.get("OFI_NCCL_GDR_FLUSH_DISABLE") == "1"
    assert "OFI_NCCL_GDR_FLUSH_DISABLE" not in read_log(FLUSHED).nccl_env


def test_the_flushed_p4d_run_is_predicted_slower_by_its_flushes():
    # 1 GiB on two p4d nodes: 8 tree channels of 128 MiB, reduce then broadcast (NCCL 2.8):
    # 512 received steps per channel in series, each flushed: ~512 x 27.7 us = 14.2 ms, what
    # the 2.8.3 log takes beyond the 2.9.9 one (61556 vs 47392 us).
    predictor = Predictor(load_topology("p4d"), uncalibrated_params())
    size = np.array([1 << 30])
    off = {"OFI_NCCL_GDR_FLUSH_DISABLE": "1"}
    flushed, labels = predictor.predict("all_reduce", size, nccl_version="2.8.3+cuda11.2")
    plain, labels_off = predictor.predict(
        "all_reduce", size, env=off, nccl_version="2.8.3+cuda11.2"
    )
    assert labels == labels_off == ["tree/Simple/8ch"]  # NCCL's tuner knows no flush
    assert flushed[0] - plain[0] == pytest.approx(512 * 27.7e-6, rel=0.1)
    # a log that names no release: its plugin and libfabric are unknown, nothing is charged
    unknown, _ = predictor.predict("all_reduce", size)
    assert unknown[0] == pytest.approx(predictor.predict("all_reduce", size, env=off)[0][0])


def test_validate_takes_the_plugin_setting_and_refuses_a_bad_one():
    runner = CliRunner()
    base = ["validate", "-t", "p4d", str(FLUSHED)]
    flushed = runner.invoke(cli, base)
    off = runner.invoke(cli, [*base, "--nccl-env", "OFI_NCCL_GDR_FLUSH_DISABLE=1"])
    assert flushed.exit_code == 0 and off.exit_code == 0, flushed.output + off.output
    assert "not modelled" not in off.output
    last = [line for line in flushed.output.splitlines() if line.strip().startswith("1073741824")]
    last_off = [line for line in off.output.splitlines() if line.strip().startswith("1073741824")]
    assert float(last[0].split()[2]) > 1.15 * float(last_off[0].split()[2])
    bad = runner.invoke(cli, [*base, "--nccl-env", "NCCL_NET_FORCE_FLUSH=yes"])
    assert bad.exit_code == 2
    assert "NCCL_NET_FORCE_FLUSH=yes" in bad.output and "Traceback" not in bad.output
    assert len(bad.output.strip().splitlines()) == 1
