"""Install weight: `make demo` needs no torch; `make test` adds torch only as a CPU build."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _install_torch():
    spec = importlib.util.spec_from_file_location(
        "install_torch", ROOT / "scripts/install_torch.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recipe(target: str) -> str:
    """The recipe lines of one Makefile target."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", text, re.MULTILINE)
    assert match, f"no {target} rule in the Makefile"
    return match.group(1)


def test_demo_installs_the_project_without_extras():
    """`make demo` depends on the core stamp alone, and that installs `.` with no extra."""
    assert re.search(r"^demo: \$\(CORE\)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    installs = [line for line in _recipe("$(CORE)").splitlines() if "pip install" in line]
    assert installs[-1].split()[-1] == "." and "torch" not in _recipe("$(CORE)")
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith(("torch", "nvidia"))]


def test_the_demo_runs_where_torch_cannot_be_imported(tmp_path):
    """The main job on its default: torch made unimportable, the demo still completes."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from collsim.cli import main\n"
        "sys.argv = ['collsim', 'demo']\n"
        "main()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tuned choice" in done.stdout and "bottleneck links" in done.stdout


def _report(*names: str) -> dict:
    return {"install": [{"metadata": {"name": n, "version": "1"}} for n in names]}


def test_cuda_packages_are_recognised():
    module = _install_torch()
    cuda = _report("torch", "nvidia-cublas-cu12", "triton", "cuda-toolkit", "sympy")
    assert module.cuda_packages(cuda) == ["cuda-toolkit", "nvidia-cublas-cu12", "triton"]
    assert module.cuda_packages(_report("torch", "sympy", "filelock")) == []


@pytest.mark.parametrize(
    ("resolved", "installs"),
    [(("torch", "sympy"), True), (("torch", "nvidia-cudnn-cu12", "triton"), False)],
)
def test_torch_is_installed_only_as_a_cpu_build(monkeypatch, capsys, resolved, installs):
    """A dry run that resolves CUDA packages installs nothing and says why; a CPU one installs."""
    module = _install_torch()
    calls: list[list[str]] = []

    def fake_run(cmd, **_kwargs):
        calls.append(cmd)
        if "--dry-run" in cmd:
            Path(cmd[cmd.index("--report") + 1]).write_text(json.dumps(_report(*resolved)))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(module.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(module.subprocess, "run", fake_run)
    monkeypatch.delenv("COLLSIM_TORCH", raising=False)
    assert module.main() == 0
    assert len(calls) == (2 if installs else 1)
    said = capsys.readouterr().out
    if installs:
        assert calls[1][-1] == "torch==2.13.0" and "--dry-run" not in calls[1]
    else:
        assert "CUDA build" in said and "nvidia-cudnn-cu12" in said and "skipped" in said
        assert "download.pytorch.org/whl/cpu" in said


def test_a_failed_resolution_is_a_skip_not_a_failure(monkeypatch, capsys):
    module = _install_torch()

    def fake_run(cmd, **_kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution\n")

    monkeypatch.setattr(module.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(module.subprocess, "run", fake_run)
    assert module.main() == 0
    assert "No matching distribution" in capsys.readouterr().out
