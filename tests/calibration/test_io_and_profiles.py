"""Profiles across scales and edited topologies, fits at their bounds, JSON logs without a GPU
count, and writing to /dev/stdout."""

from __future__ import annotations

import json

from collsim.calibration import read_log
from collsim.calibration.fit import fit_samples
from collsim.calibration.report import dataset_samples
from collsim.io import atomic_write_text
from collsim.model.profile import profile_from_dict
from collsim.topology.loader import load_topology


def test_a_scale_without_a_link_kind_is_not_an_edited_topology():
    one_node = [s for s in dataset_samples() if s.name.startswith("h100-snellius-1n4g-all_r")]
    prof = fit_samples(one_node)
    single_gpu_nodes = load_topology("h100-4gpu-ib", nodes=2, gpus_per_node=1)  # no NVLink
    assert not any("differ" in n for n in prof.check_topology(single_gpu_nodes))


def test_a_full_duplex_fit_is_not_a_bound_hit():
    two = [s for s in dataset_samples() if s.name.startswith("2080ti-2gpu")]
    prof = fit_samples(two)
    assert not any(b.startswith("duplex_efficiency") and "upper" in b
                   for b in prof.doc.provenance.at_bounds)  # fmt: skip


def test_a_profile_keeps_what_a_fit_can_produce():
    doc = fit_samples([s for s in dataset_samples() if s.name.startswith("h100-8gpu")][:1]).doc
    data = json.loads(doc.model_dump_json())
    data["link_classes"]["nvlink"]["bandwidth_efficiency"] = 0.001  # eff 0.02 x net 0.05
    assert profile_from_dict(data).doc.link_classes["nvlink"].bandwidth_efficiency == 0.001


def test_a_json_log_without_a_gpu_count_takes_the_callers(tmp_path):
    doc = {"config": {"nthreads": 1, "devices": [{"hostname": "a", "device_info": "X"}]},
           "args": ["./all_reduce_perf"],
           "results": [{"size": 1024, "count": 256, "type": "float", "redop": "sum",
                        "root": -1, "out_of_place": {"time": 10.0, "alg_bw": 0.1,
                                                      "bus_bw": 0.0}}]}  # fmt: skip
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    assert read_log(path, gpus_per_thread=4).gpus_per_thread == 4
    assert read_log(path).gpus_per_thread == 1


def test_writing_to_standard_output_appends_to_it(capfd):
    atomic_write_text("/dev/stdout", "profile\n")
    assert capfd.readouterr().out == "profile\n"


def test_fits_record_the_tree_correction_and_older_profiles_keep_theirs():
    """A fit prices tree all-reduces with NCCL's medium-size correction, as the uncalibrated
    model, and says so in the profile; a profile written without the key was fitted without it
    and is read that way."""
    from collsim.calibration.predict import uncalibrated_params

    assert uncalibrated_params().tree_correction
    two_nodes = [s for s in dataset_samples() if s.name == "h100-snellius-ib-2n-all_reduce-1.txt"]
    prof = fit_samples(two_nodes)
    assert prof.doc.tree_correction and prof.params().tree_correction
    data = json.loads(prof.doc.model_dump_json())
    assert "tree_correction: true" in prof.to_yaml()
    del data["tree_correction"]
    assert not profile_from_dict(data).params().tree_correction
