"""Regenerate ``reports/validation.md`` (and ``reports/validation/*.png``) from the bundled
nccl-tests dataset: every validation mode and both baselines (``collsim/calibration/report.py``).

    python benchmarks/validation_report.py [OUT.md]
"""

from __future__ import annotations

import sys
from pathlib import Path

from collsim.calibration.report import (
    MODES,
    TITLES,
    build,
    dataset_samples,
    exact_logs,
    summary,
    write,
)


def main(argv: list[str]) -> int:
    out = (
        Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "reports" / "validation.md"
    )
    rep = build(dataset_samples(), exact_logs())
    write(rep, out)
    for mode in MODES:
        mean, med, n = summary(rep, mode)
        print(f"{TITLES[mode]:24s} logs {n:2d}  mean {100 * mean:6.1f}%  median {100 * med:6.1f}%")
    print(f"wrote {out} in {rep.seconds:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
