"""The manifest a stage gives Spack (dedal.model.spack_env.stage_manifest)."""

from __future__ import annotations

import os
from pathlib import Path

from dedal.model.spack_env import stage_manifest


def test_a_mirror_that_is_a_symbolic_link_is_named_as_given(tmp_path: Path) -> None:
    """The sandbox binds the mirror at the path the setting gives; the mirror URL must name
    that path, not where a symbolic link leads (that path does not exist in the sandbox's
    base image: fetch failed with every source missing)."""
    real = tmp_path / "real-mirror"
    real.mkdir()
    link = tmp_path / "mirror"
    link.symlink_to(real)
    data = stage_manifest(
        {"spack": {"specs": ["zlib"]}}, install_root="/opt/esd/software", stage=tmp_path / "stage", mirror=link
    )
    assert data["spack"]["mirrors:"] == {"dedal": f"file://localhost{link}"}


def test_a_relative_mirror_is_made_absolute(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    data = stage_manifest(
        {"spack": {"specs": ["zlib"]}}, install_root="/opt/esd/software", stage=tmp_path / "stage", mirror=Path("m")
    )
    assert data["spack"]["mirrors:"] == {"dedal": f"file://localhost{os.path.join(str(tmp_path), 'm')}"}
