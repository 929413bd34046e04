"""Regenerate ``reports/validation.md`` (and ``reports/validation/*.png``) from the bundled
nccl-tests dataset: every validation mode, both baselines, issue 28's targets and the scale
series (``collsim/calibration/report.py``).

    python benchmarks/validation_report.py [--jobs N] [--only PATTERN] [OUT.md]

Each fit and each log's predictions is a job whose result is cached under ``--cache`` (default
``.cache/validation-report/``), keyed by a digest of the logs, index entries, topology files and
collsim source it reads: an interrupted run resumes, an unchanged rerun reuses every result, a
rerun after a change recomputes what the change touches. ``--jobs N`` runs N worker processes
(results are assembled in the dataset's order whatever order they finish in). ``--only PATTERN``
keeps the logs whose file name matches the glob (or contains the text); it prints the summary and
writes the Markdown only to an OUT given (the bundled report covers every log). ``--exclude
PATTERN`` leaves logs out, and the report says which.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
import time
from pathlib import Path

from collsim.calibration.report import (
    FIT_MAX_RANKS,
    MODES,
    TITLES,
    build,
    dataset_samples,
    exact_logs,
    summary,
    write,
)
from collsim.calibration.report_text import targets_of
from collsim.report.scale_plots import plot_scale

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", type=Path, help="Markdown to write")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--only", help="only the logs whose name matches this glob or contains it")
    ap.add_argument("--exclude", action="append", default=[],
                    help="leave out the logs whose name matches this glob or contains it "
                         "(repeatable); the report names them")  # fmt: skip
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache" / "validation-report",
                    help="folder of cached job results")  # fmt: skip
    ap.add_argument("--no-cache", action="store_true", help="compute everything, store nothing")
    ap.add_argument("--fit-max-ranks", type=int, default=FIT_MAX_RANKS,
                    help=f"largest ranks per log of a system fitted in modes b-d "
                         f"(default {FIT_MAX_RANKS})")  # fmt: skip
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be at least 1, not {args.jobs}")
    t0 = time.perf_counter()

    def progress(line: str) -> None:
        print(f"{time.perf_counter() - t0:7.0f} s  {line}", file=sys.stderr, flush=True)

    def matches(name: str, pattern: str) -> bool:
        return fnmatch.fnmatch(name, pattern) or pattern in name

    samples = dataset_samples()
    if args.only:
        samples = [s for s in samples if matches(s.name, args.only)]
        if not samples:
            ap.error(f"--only {args.only!r} matches no log of data/nccl-tests")
    left_out = sorted(s.name for s in samples if any(matches(s.name, p) for p in args.exclude))
    samples = [s for s in samples if s.name not in left_out]
    progress(f"{len(samples)} logs read")
    rep = build(
        samples,
        exact_logs(),
        workers=args.jobs,
        cache=None if args.no_cache else args.cache,
        progress=progress,
        fit_max_ranks=args.fit_max_ranks,
        left_out=left_out,
    )
    out = args.out or (None if args.only else ROOT / "reports" / "validation.md")
    for mode in MODES:
        mean, med, n = summary(rep, mode)
        print(f"{TITLES[mode]:24s} logs {n:2d}  mean {100 * mean:6.1f}%  median {100 * med:6.1f}%")
    for t in targets_of(rep):
        value = "--" if t.value is None else f"{100 * t.value:.1f}%"
        op = ">=" if t.higher_is_better else "<="
        print(f"{t.verdict}  {t.name}: {value} ({op} {100 * t.limit:.0f}%, over {t.over})")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        command = "python benchmarks/validation_report.py" + (
            f" --jobs {args.jobs}" if args.jobs > 1 else ""
        )  # the bundled report's command: with --exclude, the left-out logs are named in it
        write(rep, out, scale_plotter=plot_scale, command=command)
        print(f"wrote {out}")
    print(f"{time.perf_counter() - t0:.0f} s wall ({rep.stats.computed} jobs computed, "
          f"{len(rep.stats.outcomes) - rep.stats.computed} reused)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
