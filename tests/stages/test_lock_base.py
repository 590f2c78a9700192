"""A bare spack.lock's base image (Spack's lock names none): recorded by a file of the same
environment next to the lock (plan.json written by `dedal fetch`, env.yaml), else the setting."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dedal.model.config import load_settings
from dedal.model.target import resolve
from dedal.stages.workspace import prepare
from tests.conftest import SPACK_DATA

LOCK = SPACK_DATA / "tiny-dedal.spack.lock"
CUDA = "debian-trixie-cuda"


@pytest.fixture
def settings(tmp_path):
    return load_settings(config_file=None, environ={}, overrides={"data_dir": str(tmp_path / "data")})


def _lock(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(LOCK, where / "spack.lock")
    return where / "spack.lock"


def _record_plan(lock: Path, settings, **changes) -> Path:
    """The plan.json `dedal fetch` writes next to its lock, made on the CUDA base."""
    cuda = load_settings(config_file=None, environ={}, overrides={"data_dir": settings.data_dir, "base_image": CUDA})
    plan = resolve(str(lock), cuda).plan().to_json()
    plan.update({"lock_path": str(lock), **changes})
    (lock.parent / "plan.json").write_text(json.dumps(plan))
    return lock.parent / "plan.json"


def test_a_bare_lock_says_its_base_is_the_setting(tmp_path, settings):
    target = resolve(str(_lock(tmp_path / "gpu")), settings)
    assert (target.base_image, target.base_source) == ("debian-trixie", "setting base_image")


def test_the_plan_json_beside_the_lock_records_its_base(tmp_path, settings):
    lock = _lock(tmp_path / "gpu")
    plan_file = _record_plan(lock, settings)
    target = resolve(str(lock), settings)
    assert (target.base_image, target.base_source) == (CUDA, str(plan_file))
    # a copy of the directory: the plan names the old path, but the lock has the same content
    copy = tmp_path / "copy" / "gpu"
    shutil.copytree(lock.parent, copy)
    assert resolve(str(copy / "spack.lock"), settings).base_image == CUDA


@pytest.mark.parametrize(
    "changes",
    [{"env_name": "other"}, {"lock_path": "/nowhere/spack.lock", "lock_sha256": "0" * 64}],
    ids=["another-environment", "another-lock"],
)
def test_a_plan_json_of_something_else_is_not_taken(tmp_path, settings, changes):
    lock = _lock(tmp_path / "gpu")
    _record_plan(lock, settings, **changes)
    assert resolve(str(lock), settings).base_source == "setting base_image"


def test_an_unreadable_plan_json_is_passed_over(tmp_path, settings):
    lock = _lock(tmp_path / "gpu")
    (lock.parent / "plan.json").write_text("{not json")
    assert resolve(str(lock), settings).base_image == "debian-trixie"


@pytest.mark.parametrize(
    "dedal, recorded",
    [({"base_image": CUDA}, True), ({"name": "other", "base_image": CUDA}, False), ({}, False)],
    ids=["same-env", "another-env", "no-base"],
)
def test_an_env_yaml_beside_the_lock_records_its_base(tmp_path, settings, dedal, recorded):
    lock = _lock(tmp_path / "gpu")
    data = {"spack": {"specs": ["dedal-app"]}, "dedal": dedal}
    (lock.parent / "env.yaml").write_text(json.dumps(data))
    target = resolve(str(lock), settings)
    assert target.base_image == (CUDA if recorded else "debian-trixie")
    assert target.base_source == (str(lock.parent / "env.yaml") if recorded else "setting base_image")


def test_the_work_directory_keeps_the_recorded_base(tmp_path, settings):
    """prepare() (what fetch and build do with a lock) copies the lock into the work directory: the plan.json
    written there keeps the base recorded beside the given lock, not the setting."""
    lock = _lock(tmp_path / "gpu")
    _record_plan(lock, settings)
    plan, path, _parsed = prepare(resolve(str(lock), settings))
    assert plan.base_image == CUDA and json.loads(path.read_text())["base_image"] == CUDA
    assert path.parent == Path(settings.work_dir) / "gpu"


def test_runtime_base_is_planned_but_keys_stay_the_build_bases(tmp_path, settings):
    """dedal.runtime_base goes into plan.json (so `dedal assemble plan.json` assembles on
    it) and nowhere into the layer keys; a plan.json from before has none (the build base)."""
    import yaml

    def plan_for(extra: dict, where: str):
        envdir = tmp_path / where
        envdir.mkdir()
        (envdir / "env.yaml").write_text(
            yaml.safe_dump({"spack": {"specs": ["dedal-app"]}, "dedal": {"name": "tiny", "base_image": CUDA, **extra}})
        )
        shutil.copyfile(LOCK, envdir / "spack.lock")
        target = resolve(str(envdir / "env.yaml"), settings)
        return target, prepare(target)

    target, (plan, plan_file, _parsed) = plan_for({"runtime_base": "debian-trixie-cuda-runtime"}, "with")
    assert target.runtime_base == "debian-trixie-cuda-runtime" and plan.runtime_base == "debian-trixie-cuda-runtime"
    again = resolve(str(plan_file), settings)
    assert (again.base_image, again.runtime_base) == (CUDA, "debian-trixie-cuda-runtime")
    assert prepare(again)[0].runtime_base == "debian-trixie-cuda-runtime"  # kept when the plan is refreshed
    plain_target, (plain, plain_file, _parsed) = plan_for({}, "without")
    assert plain_target.runtime_base == CUDA and plain.runtime_base == ""
    assert plain.layer_keys() == plan.layer_keys() and plain.base_id == plan.base_id
    old = json.loads(plain_file.read_text())
    del old["runtime_base"]
    plain_file.write_text(json.dumps(old))
    assert resolve(str(plain_file), settings).runtime_base == CUDA
