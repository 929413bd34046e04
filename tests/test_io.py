"""Atomic writes keep what the user pointed at: links are written through, devices are not
replaced, permissions follow the umask; an unknown figure format is a clear error."""

from __future__ import annotations

import os
import stat

import pytest

from collsim.errors import CollsimError
from collsim.io import atomic_write_bytes, atomic_write_text, save_figure


def test_a_new_file_follows_the_umask_and_a_replaced_one_keeps_its_mode(tmp_path):
    old = os.umask(0o022)
    try:
        fresh = tmp_path / "new.json"
        atomic_write_text(fresh, "{}\n")
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o644
        kept = tmp_path / "kept.json"
        kept.write_text("old")
        kept.chmod(0o640)
        atomic_write_text(kept, "new")
        assert kept.read_text() == "new" and stat.S_IMODE(kept.stat().st_mode) == 0o640
    finally:
        os.umask(old)


def test_a_link_is_written_through_and_a_device_is_not_replaced(tmp_path):
    real = tmp_path / "real.yaml"
    real.write_text("old")
    link = tmp_path / "link.yaml"
    link.symlink_to(real)
    atomic_write_text(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    atomic_write_text(os.devnull, "discarded")
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_an_unknown_figure_format_names_the_file(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    with pytest.raises(CollsimError, match=r"cannot draw a '\.txt'.*v\.txt"):
        save_figure(fig, tmp_path / "v.txt")
    assert not (tmp_path / "v.txt").exists()


def test_yaml_refuses_repeated_keys_but_keeps_merges():
    """Plain YAML keeps the last of two equal keys (a second 'nodes:' silently overrode the
    first); an anchor merged in and then overridden is legitimate and stays."""
    import yaml

    from collsim.io import yaml_load

    assert yaml_load("b: &b {x: 1, y: 2}\nd:\n  <<: *b\n  y: 3\n")["d"] == {"x": 1, "y": 3}
    with pytest.raises(yaml.YAMLError, match="duplicate key 'nodes'"):
        yaml_load("nodes: 4\nnodes: 1\n")


def test_a_folder_name_is_not_written_as_a_file(tmp_path):
    """``--plot out/`` (a folder that does not exist yet) wrote a file named ``out``."""
    target = tmp_path / "out"
    with pytest.raises(IsADirectoryError):
        atomic_write_bytes(f"{target}/", b"x")
    assert not target.exists()
