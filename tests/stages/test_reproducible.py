"""Reproducible images: one date for every time stamp, and two independent builds of one
environment and lock giving the same SIF, byte for byte."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import git
import pytest

from dedal.model import sif
from dedal.model.layers import LayerStore
from dedal.model.sif import source_date_epoch
from dedal.stages.reproducible import LABEL, image_date
from dedal.stages.sifdiff import diff_images, render
from tests.fixtures.images import build_env, require_root


class _Plan:
    spack_commit = ""


class _Settings:
    def __init__(self, spack_root: Path) -> None:
        self.spack_root = spack_root


def test_image_date_rules(tmp_path, monkeypatch):
    spack = tmp_path / "spack"
    (spack / "bin").mkdir(parents=True)
    (spack / "bin" / "spack").write_text("#!/bin/sh\n")
    repo = git.Repo.init(spack)
    repo.index.add(["bin/spack"])
    commit = repo.index.commit("spack", author_date="1717734514 -0600", commit_date="1717734514 -0600").hexsha
    plan, settings = _Plan(), _Settings(spack)
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    plan.spack_commit = commit
    # the command reads SOURCE_DATE_EPOCH once (source_date_epoch) and hands the value on
    assert image_date(plan, settings, source_date_epoch()) == (1717734514, f"the date of Spack commit {commit[:10]}")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert image_date(plan, settings, source_date_epoch()) == (1700000000, "SOURCE_DATE_EPOCH")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", " ")  # empty counts as unset
    assert image_date(plan, settings, source_date_epoch())[0] == 1717734514
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    plan.spack_commit = "0" * 40  # not in the checkout: no date known, never the wall clock
    assert image_date(plan, settings, None)[0] == 0
    shutil.rmtree(spack / ".git")
    plan.spack_commit = commit
    assert image_date(plan, settings, None)[0] == 0
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    from dedal.errors import UserError

    with pytest.raises(UserError, match="SOURCE_DATE_EPOCH: expected seconds"):
        source_date_epoch()


def test_two_builds_give_the_same_bytes(tmp_path):
    """The tiny environment built and assembled twice with different data, cache and stage
    directories, the second as another user on another host name (its own UTS namespace),
    no SOURCE_DATE_EPOCH: the same SIF."""
    require_root()
    if not shutil.which("unshare"):
        pytest.skip("needs unshare (util-linux)")
    first = build_env(tmp_path / "one", "tiny", "host")
    second = build_env(
        tmp_path / "two",
        "tiny",
        "host",
        wrap=("unshare", "-u", "sh", "-c", 'hostname dedal-rebuilder && exec "$@"', "sh"),
        env_extra={"USER": "rebuilder", "LOGNAME": "rebuilder"},
    )
    images = [b.assemble_json("-o", str(tmp_path / f"{n}.sif")) for n, b in (("one", first), ("two", second))]
    assert images[0]["sha256"] == images[1]["sha256"], render(diff_images(tmp_path / "one.sif", tmp_path / "two.sif"))
    assert (tmp_path / "one.sif").read_bytes() == (tmp_path / "two.sif").read_bytes()
    # the stand-in Spack is no git checkout: the documented default, not the wall clock
    labels = sif.read_json_object(tmp_path / "one.sif", sif.read_sif(tmp_path / "one.sif").by_name("labels.json"))
    assert labels[LABEL] == "0" and labels["org.opencontainers.image.created"] == "1970-01-01T00:00:00Z"
    # the layers are the same bytes; what differed went beside them, and did differ
    stores = [LayerStore(b.store) for b in (first, second)]
    for key in stores[0].keys():
        one, two = stores[0].manifest(key), stores[1].manifest(key)
        assert one.sha256 == two.sha256 and one.records == two.records
    envs = [json.loads((s.records_dir(key) / "install_environment.json").read_text()) for s in stores]
    assert envs[1]["hostname"] == "dedal-rebuilder" != envs[0]["hostname"]
