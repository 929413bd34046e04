"""Amdahl / Gustafson fits and Karp-Flatt on synthetic data with a known serial fraction."""

from __future__ import annotations

import numpy as np
import pytest

from collsim.errors import CollsimError
from collsim.report.step_plots import plot_scaling
from collsim.training.amdahl import karp_flatt, scaling_curve


@pytest.mark.parametrize("f", [0.0, 0.01, 0.05, 0.3])
def test_amdahl_fit_recovers_the_serial_fraction(f):
    n = np.array([1, 2, 4, 8, 16, 64, 256])
    t1 = 10.0
    t = t1 * (f + (1 - f) / n)
    curve = scaling_curve(n, t, "strong")
    assert curve.serial_fraction == pytest.approx(f, abs=1e-9)
    assert curve.fit_t1_s == pytest.approx(t1)
    # Karp-Flatt of pure Amdahl data is the serial fraction at every n > 1.
    np.testing.assert_allclose(curve.karp_flatt[1:], f, atol=1e-9)
    np.testing.assert_allclose(curve.speedup, 1 / (f + (1 - f) / n))
    np.testing.assert_allclose(curve.efficiency, curve.speedup / n)


def test_karp_flatt_grows_when_overhead_grows_with_n():
    n = np.array([1, 2, 4, 8, 16, 32])
    t = 1.0 / n + 0.001 * np.log2(n)  # communication that grows with the machine
    e = scaling_curve(n, t).karp_flatt[1:]
    assert np.all(np.diff(e) > 0)
    assert np.isnan(karp_flatt(np.array([1.0]), np.array([1]))[0])


def test_weak_scaling_gustafson():
    n = np.array([8, 16, 32, 64])
    f = 0.02
    speed = n - f * (n - 1)
    t = 1.0 * n / speed * (8 - f * 7) / 8  # T(n) with T(n0) chosen so the fit sees S(n)
    curve = scaling_curve(n, t, "weak")
    assert 0 <= curve.serial_fraction < 0.05
    assert curve.efficiency[0] == pytest.approx(1.0)
    assert np.all(np.diff(curve.efficiency) < 0)


def test_bad_inputs_and_plot(tmp_path):
    with pytest.raises(CollsimError):
        scaling_curve([8], [1.0])
    with pytest.raises(CollsimError):
        scaling_curve([1, 2], [1.0, 0.0])
    curve = scaling_curve([1, 2, 4], [1.0, 0.55, 0.3])
    png = plot_scaling(curve, tmp_path / "s.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
