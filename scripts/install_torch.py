"""Install PyTorch for the torch runner's tests only where a CPU build is what pip would fetch.

`make test` calls this after installing the project. The torch runner (`collsim calibrate run
--runner torch`) is tested for real on gloo, which needs torch but no GPU. On plain PyPI, a Linux
x86-64 `pip install torch` resolves to the CUDA build, which drags in several GB of nvidia-*,
cuda-* and triton wheels: the suite must not cost a user that. So this script asks pip what it
*would* install (`pip install --dry-run --report`) and installs only if that is a CPU build with no
CUDA package. Otherwise it says why and how to get one, and the torch tests skip with that reason.

Environment:
  COLLSIM_TORCH  the requirement to ask for (default `torch==2.13.0`, the build this project's
                 machines keep as a CPU wheel); `COLLSIM_TORCH=none` skips torch altogether.
  COLLSIM_TORCH_INDEX  an index URL to take it from, e.g. https://download.pytorch.org/whl/cpu
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile

DEFAULT = "torch==2.13.0"
CUDA_PREFIXES = ("nvidia-", "cuda-", "triton")
CPU_HINT = (
    "for the CPU build: pip install torch --index-url https://download.pytorch.org/whl/cpu "
    "(or COLLSIM_TORCH_INDEX=https://download.pytorch.org/whl/cpu make test)"
)


def cuda_packages(report: dict) -> list[str]:
    """The CUDA-only packages a `pip install --report` would install, by name."""
    names = [item["metadata"]["name"].lower() for item in report.get("install", [])]
    return sorted(n for n in names if n.startswith(CUDA_PREFIXES))


def main() -> int:
    spec = os.environ.get("COLLSIM_TORCH", DEFAULT).strip()
    if spec.lower() == "none":
        print("torch: skipped (COLLSIM_TORCH=none); the torch runner's tests will be skipped")
        return 0
    if importlib.util.find_spec("torch") is not None:
        return 0
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    index = os.environ.get("COLLSIM_TORCH_INDEX", "").strip()
    if index:
        pip += ["--index-url", index]
    with tempfile.TemporaryDirectory() as tmp:
        report_path = os.path.join(tmp, "report.json")
        dry = subprocess.run(
            [*pip, "--dry-run", "--report", report_path, spec],
            capture_output=True,
            text=True,
        )
        if dry.returncode != 0:
            reason = (dry.stderr.strip().splitlines() or ["pip failed"])[-1]
            print(
                f"torch: {spec} is not installable here ({reason}); "
                f"the torch runner's tests will be skipped; {CPU_HINT}"
            )
            return 0
        with open(report_path, encoding="utf-8") as f:
            cuda = cuda_packages(json.load(f))
    if cuda:
        shown = ", ".join(cuda[:4]) + (f" and {len(cuda) - 4} more" if len(cuda) > 4 else "")
        print(
            f"torch: {spec} resolves to a CUDA build here ({shown}: several GB), not installed; "
            f"the torch runner's tests will be skipped; {CPU_HINT}"
        )
        return 0
    print(f"torch: installing {spec} (a CPU build) for the torch runner's tests")
    return subprocess.run([*pip, spec]).returncode


if __name__ == "__main__":
    sys.exit(main())
