"""The manifest a stage gives Spack (dedal.model.spack_env.stage_manifest), and the digest of
what a concretization is made from (inputs_digest)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Tuple

import yaml

from dedal.model import spack_env
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


def _checkout(root: Path, recipe: str = "version('1.0')\n") -> Tuple[Path, Dict[str, Any]]:
    """A checkout at ``root`` with a package repository, and the manifest naming it."""
    pkg = root / "recipes" / "repo" / "packages" / "demo"
    pkg.mkdir(parents=True)
    (pkg / "package.py").write_text(recipe)
    (root / "recipes" / "repo" / "repo.yaml").write_text("repo:\n  namespace: dedal\n")
    manifest = {"spack": {"specs": ["demo"], "repos": [str(root / "recipes" / "repo")]}}
    path = root / "spack.yaml"
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    return path, manifest


def test_the_same_recipes_in_another_checkout_keep_the_digest(tmp_path: Path) -> None:
    one, two = _checkout(tmp_path / "a"), _checkout(tmp_path / "clone-b")
    assert spack_env.inputs_digest(*one) == spack_env.inputs_digest(*two)


def test_a_changed_or_moved_recipe_changes_the_digest(tmp_path: Path) -> None:
    base = spack_env.inputs_digest(*_checkout(tmp_path / "a"))
    assert spack_env.inputs_digest(*_checkout(tmp_path / "b", "version('1.1')\n")) != base
    moved = _checkout(tmp_path / "c")
    pkg = tmp_path / "c" / "recipes" / "repo" / "packages"
    (pkg / "demo").rename(pkg / "other")
    assert spack_env.inputs_digest(*moved) != base
    path, manifest = _checkout(tmp_path / "d")
    path.write_text(path.read_text().replace("- demo", "- demo@1.0"))
    assert spack_env.inputs_digest(path, manifest) != base


def test_a_staged_env_dir_carries_its_includes_and_its_lock(tmp_path: Path) -> None:
    """What fetch and prepare write into a work directory: spack.yaml naming the carried
    copies of its included files (build nodes see the work directory, not the machine the
    environment file was written on), the lock beside it; the manifest returned as written."""
    inc = tmp_path / "site" / "packages.yaml"
    inc.parent.mkdir()
    inc.write_text("packages: {}\n")
    lock = tmp_path / "given.lock"
    lock.write_text('{"roots": []}')
    work = tmp_path / "work"
    work.mkdir()
    manifest = {"spack": {"specs": ["zlib"], "include": [str(inc), "relative.yaml"]}}
    written = spack_env.stage_env_dir(work, manifest, lock)
    carried = work / "includes" / "00-packages.yaml"
    assert written["spack"]["include"] == [str(carried), "relative.yaml"] and carried.read_text() == inc.read_text()
    assert yaml.safe_load((work / "spack.yaml").read_text()) == written
    assert (work / "spack.lock").read_text() == lock.read_text()
    assert manifest["spack"]["include"][0] == str(inc)  # the caller's manifest is left as it was
    spack_env.stage_env_dir(work, {"spack": {"specs": ["zlib"]}}, None)  # no lock: the one there stays
    assert (work / "spack.lock").read_text() == lock.read_text()
