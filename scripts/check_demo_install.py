"""What `make demo` would install from plain PyPI: no torch, no CUDA package.

Runs `pip install --dry-run --report` for the project alone (what `make demo` installs) with every
pip configuration file and PIP_* variable of this machine ignored, so that a local mirror or a
pre-configured CPU wheel cannot hide what a user on plain PyPI would get, and fails if the
resolution holds torch or any nvidia-*/cuda-*/triton package. Needs network access to PyPI; not part
of the test suite (which must pass offline).

    python scripts/check_demo_install.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "nvidia-", "cuda-", "triton")


def main() -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # no pip.conf anywhere: plain PyPI
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
               "--report", str(report), str(ROOT)]  # fmt: skip
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"pip could not resolve the project: {done.stderr.strip()[-500:]}")
            return 1
        names = sorted(
            i["metadata"]["name"].lower() for i in json.loads(report.read_text())["install"]
        )
    heavy = [n for n in names if n.startswith(HEAVY)]
    print(f"make demo installs {len(names)} packages from PyPI: {', '.join(names)}")
    if heavy:
        print(f"FAIL: it would install {', '.join(heavy)}")
        return 1
    print("OK: no torch, no CUDA package")
    return 0


if __name__ == "__main__":
    sys.exit(main())
