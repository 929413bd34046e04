"""Fuzzing ``topo import``'s readers: mutated real dumps, matrices and scans give a topology or
one :class:`CollsimError`, never another exception."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collsim.errors import CollsimError
from collsim.topology.imports.files import ImportRequest, import_files
from tests.fuzzing import mutate_lines

DATA = Path(__file__).parent / "imports_data"
SAMPLES = {
    "topo.xml": DATA / "nccl_ibmcloud_gx3d_h100_8gpu_topo.xml",
    "nvsmi.txt": DATA / "nvsmi_topo_dgx1_v100_msccl-tools.txt",
    "scan.topo": DATA / "ibnetdiscover_ibm_pcm_sdr_2009.topo",
}
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_DIR = Path(tempfile.mkdtemp(prefix="collsim-import-fuzz-"))
TOKENS = ["0", "-1", "", "x", "16.0 GT/s PCIe", "9 GT/s", "0x9999", "NV99", "PIX", "4xHDR", '"',
          "<", ">", "</pci>", "nan", "1e999"]  # fmt: skip


@st.composite
def mutated(draw: Any, name: str) -> str:
    lines = SAMPLES[name].read_text().splitlines()
    return mutate_lines(draw, lines, st.sampled_from(TOKENS) | st.text(max_size=8))


def _import(files: dict[str, str], **options: Any) -> None:
    paths = []
    for name, text in files.items():
        path = _DIR / name
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        paths.append(str(path))
    try:
        import_files(paths, ImportRequest("fuzz", **options))
    except CollsimError as exc:
        assert "\n" not in str(exc)


@FUZZ
@given(text=mutated("topo.xml"))
def test_mutated_nccl_dumps(text):
    _import({"topo.xml": text})


@FUZZ
@given(text=mutated("nvsmi.txt"))
def test_mutated_nvidia_smi_matrices(text):
    _import({"nvsmi.txt": text}, gpu="dgx1-v100", nic_speed_gbps=100.0)


@FUZZ
@given(text=mutated("scan.topo"))
def test_mutated_ibnetdiscover_scans(text):
    xml = (DATA / "nccl_rwkvinllama_rtx4090_2gpu_topo.xml").read_text()
    _import({"topo.xml": xml, "scan.topo": text})
