"""The validation report machinery on a slice of the dataset (the full report is
``python benchmarks/validation_report.py``; it takes about a minute and a half)."""

from __future__ import annotations

import re

import numpy as np

from collsim.calibration.report import (
    MODES,
    TITLES,
    alpha_beta,
    build,
    dataset_samples,
    exact_logs,
    system_of,
    write,
)


def test_report_modes_baselines_and_plots(tmp_path):
    # Two systems: rtx4090-kalavai has two scales (cross-scale), the superbench A100 node six
    # collectives (cross-collective) and a busbw plot. The snellius logs took three times as long.
    keep = ("a100-40g-8gpu-superbench", "rtx4090-kalavai-")
    samples = [s for s in dataset_samples() if s.name.startswith(keep)]
    rep = build(samples, exact_logs())
    for mode in MODES:
        assert rep.mape.get(mode), mode
        assert all(np.isfinite(v) for v in rep.mape[mode].values())
    # cross-scale: fitted at the fewest ranks, predicting the larger runs only
    assert set(rep.mape["cross_scale"]) == {
        s.name for s in samples if s.name.startswith("rtx4090-kalavai-4")
    }
    assert set(rep.mape["cross_collective"]) == {
        s.name for s in samples if s.log.collective != "all_reduce"
    }
    out = write(rep, tmp_path / "validation.md")
    text = out.read_text()
    for mode in MODES:
        assert TITLES[mode] in text
    assert "Targets:" in text and "**median**" in text
    assert (tmp_path / "validation" / "scatter.png").stat().st_size > 1000
    linked = re.findall(r"validation/[\w.-]+\.png", text)
    assert "validation/scatter.png" in linked
    assert "validation/busbw-a100-40g-8gpu-superbench.png" in linked
    assert all((tmp_path / name).stat().st_size > 1000 for name in linked)


def test_alpha_beta_baseline_recovers_a_line():
    s = next(x for x in dataset_samples() if x.name.startswith("h100-8gpu-together-ring-all_r"))
    s.measured_s = 20e-6 + s.sizes / 100e9
    np.testing.assert_allclose(alpha_beta(s), s.measured_s, rtol=1e-6)


def test_system_names():
    assert system_of("h100-snellius-ib-2n-all_reduce-1.txt") == "h100-snellius-ib-2n"
    assert system_of("a100pcie-ib-2n1g-gdr-reduce_scatter-1.txt") == "a100pcie-ib-2n1g-gdr"
