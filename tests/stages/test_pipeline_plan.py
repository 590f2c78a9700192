"""One plan per command: `build-image` (the pipeline) and `dedal assemble` parse spack.lock
once and write plan.json once, and every stage takes that plan."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List

import pytest
import yaml

from dedal.commands import assemble as assemble_cmd
from dedal.model import spack_lock
from dedal.model.config import load_settings
from dedal.model.image_options import ImageOptions
from dedal.model.plan import Plan
from dedal.model.target import resolve
from dedal.stages import assemble as assemble_stage, building, pipeline
from dedal.stages.building.executors import local
from dedal.stages.building.executors.common import BuildSummary
from dedal.stages.workspace import prepare
from tests.conftest import SPACK_DATA

LOCK = SPACK_DATA / "tiny-dedal.spack.lock"


@pytest.fixture
def env_file(tmp_path: Path) -> Path:
    envdir = tmp_path / "tiny"
    envdir.mkdir()
    (envdir / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "spack": {"specs": ["dedal-app"]},
                "dedal": {"name": "tiny", "base_image": "host", "labels": {"team": "hpc"}},
            }
        )
    )
    shutil.copyfile(LOCK, envdir / "spack.lock")
    return envdir / "env.yaml"


@pytest.fixture
def settings(tmp_path: Path):
    (tmp_path / "data" / "mirror").mkdir(parents=True)
    return load_settings(
        config_file=None,
        environ={},
        overrides={"data_dir": str(tmp_path / "data"), "mirror": str(tmp_path / "data" / "mirror")},
    )


@pytest.fixture
def counts(monkeypatch) -> Dict[str, int]:
    """Calls of the one lock parser (every reader of a spack.lock ends there) and of Plan.write."""
    seen = {"parse_lock": 0, "plan_write": 0}
    parse, write = spack_lock.parse_lock, Plan.write

    def counted_parse(*a, **k):  # noqa: ANN002, ANN003
        seen["parse_lock"] += 1
        return parse(*a, **k)

    def counted_write(self, path):  # noqa: ANN001
        seen["plan_write"] += 1
        return write(self, path)

    monkeypatch.setattr(spack_lock, "parse_lock", counted_parse)
    monkeypatch.setattr(Plan, "write", counted_write)
    return seen


def _assembled(calls: List[tuple]):
    def fake_assemble(plan, image, settings, *, lock=None, output=None, progress=None, force=False):  # noqa: ANN001
        calls.append((plan, image, lock))
        return SimpleNamespace(
            image=str(Path(settings.images_dir) / "tiny.sif"),
            size=1,
            sha256="0" * 64,
            layers=[],
            status="assembled",
            to_json=dict,
        )

    return fake_assemble


def test_build_image_parses_the_lock_once_and_writes_the_plan_once(env_file, settings, counts, monkeypatch):
    """fetch (here only its last step, prepare: Spack is not run), build and assemble of one
    build-image: one parse, one plan.json, the same plan handed to build and assemble."""
    fetched = []

    def fake_fetch(target, *, progress=None, sources_too=True):  # noqa: ANN001
        fetched.append(prepare(target))
        return SimpleNamespace(sources=0, fetched=0, concretized=False), fetched[0]

    built, assembled = [], []
    monkeypatch.setattr(pipeline, "run_fetch", fake_fetch)
    monkeypatch.setattr(building, "base_root", lambda *a, **k: None)
    monkeypatch.setattr(
        local,
        "build",
        lambda plan, plan_path, settings, **kw: (
            built.append((plan, plan_path)) or BuildSummary(env=plan.env_name, executor="local")
        ),
    )
    monkeypatch.setattr(pipeline, "do_assemble", _assembled(assembled))
    target = resolve(str(env_file), settings)
    image = ImageOptions.of(target.env, source_date_epoch=1700000000)
    summary = pipeline.run_pipeline(
        target, image, stages=["fetch", "build", "assemble"], executor="local", jobs=1, keep_going=False, quiet=True
    )
    assert summary.ok, summary.error
    assert counts == {"parse_lock": 1, "plan_write": 1}
    plan, path, lock = fetched[0]
    assert built == [(plan, path)] and assembled == [(plan, image, lock)]
    assert image.source_date_epoch == 1700000000 and image.labels == {"team": "hpc"}


def test_build_image_from_build_prepares_the_plan_once(env_file, settings, counts, monkeypatch):
    built, assembled = [], []
    monkeypatch.setattr(building, "base_root", lambda *a, **k: None)
    monkeypatch.setattr(
        local,
        "build",
        lambda plan, plan_path, settings, **kw: built.append(plan) or BuildSummary(env=plan.env_name, executor="local"),
    )
    monkeypatch.setattr(pipeline, "do_assemble", _assembled(assembled))
    target = resolve(str(env_file), settings)
    summary = pipeline.run_pipeline(
        target,
        ImageOptions.of(target.env),
        stages=["build", "assemble"],
        executor="local",
        jobs=1,
        keep_going=False,
        quiet=True,
    )
    assert summary.ok, summary.error
    assert counts == {"parse_lock": 1, "plan_write": 1}
    assert assembled[0][0] is built[0] and assembled[0][2] is not None
    assert (Path(settings.work_dir) / "tiny" / "plan.json").is_file()


def test_dedal_assemble_parses_the_lock_once(env_file, settings, counts, monkeypatch):
    """The command resolves its argument, prepares once and hands plan, image options and the
    parsed lock to the stage; SOURCE_DATE_EPOCH is read there, into the image options."""
    assembled = []
    monkeypatch.setattr(assemble_cmd, "from_args", lambda args, **kw: settings)
    monkeypatch.setattr(assemble_stage, "assemble", _assembled(assembled))  # the command imports it when it runs
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1600000000")
    args = SimpleNamespace(
        target=str(env_file),
        only=None,
        keep_build_deps=None,
        runtime_base=None,
        json=True,
        output=None,
        force=False,
        layers=None,
        stage_dir=None,
    )
    assert assemble_cmd.run(args) == 0
    assert counts == {"parse_lock": 1, "plan_write": 1}
    plan, image, lock = assembled[0]
    assert image.source_date_epoch == 1600000000 and lock is not None and lock.sha256 == plan.lock_sha256
