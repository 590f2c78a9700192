"""What a command's argument names (dedal.model.target.Target): here, the spack.yaml it names,
which fetch and prepare both stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from dedal.model.config import load_settings
from dedal.model.spack_lock import load_lock
from dedal.model.target import resolve
from tests.conftest import ROOT, SPACK_DATA


def _settings(tmp_path: Path):
    return load_settings(config_file=None, environ={}, overrides={"data_dir": str(tmp_path / "data")})


def test_an_environment_file_names_its_own_manifest(tmp_path: Path) -> None:
    target = resolve(str(ROOT / "spack-envs" / "demo" / "env.yaml"), _settings(tmp_path))
    assert target.env is not None
    assert target.manifest(None) == target.env.spack_yaml()  # the lock is not read for it


def test_a_bare_lock_names_a_manifest_of_its_roots(tmp_path: Path) -> None:
    path = SPACK_DATA / "tiny-dedal.spack.lock"
    target = resolve(str(path), _settings(tmp_path))
    lock = load_lock(path)
    specs = target.manifest(lock)["spack"]["specs"]
    assert specs and sorted(specs) == sorted(lock.root_specs.values())
    with pytest.raises(ValueError):
        target.manifest(None)
