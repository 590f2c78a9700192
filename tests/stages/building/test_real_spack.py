"""With a real Spack (DEDAL_SPACK_ROOT): the tiny repository built package by package in
separate stages, exactly as on separate nodes, then dedal-app run from its layers."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from dedal.adapters import runtime as rt
from dedal.adapters import squashfs
from dedal.model.layers import LayerStore
from tests.conftest import SPACK_DATA, fill_tiny_mirror

pytestmark = [pytest.mark.spack, pytest.mark.e2e]


def test_tiny_repo_per_package_on_separate_nodes(run_dedal, real_spack, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root (mount namespaces for the fixed install root)")
    mirror = fill_tiny_mirror(tmp_path / "mirror")
    envdir = tmp_path / "env"
    envdir.mkdir()
    (envdir / "env.yaml").write_text(
        yaml.safe_dump(
            {
                "spack": {
                    "repos": [str(SPACK_DATA / "tiny-repo" / "repo")],
                    "specs": ["dedal-app"],
                    "packages": {"all": {"require": "target=x86_64_v3"}},
                    "concretizer": {"unify": True},
                },
                "dedal": {"name": "tiny-real", "base_image": "host", "install_root": "/opt/esd/software"},
            }
        )
    )
    shutil.copyfile(SPACK_DATA / "tiny-dedal.spack.lock", envdir / "spack.lock")
    env = {
        "DEDAL_DATA_DIR": str(tmp_path / "data"),
        "DEDAL_MIRROR": str(mirror),
        "DEDAL_SPACK_ROOT": str(real_spack),
        "DEDAL_STAGE_DIR": str(tmp_path / "stage"),
        "DEDAL_CACHE_DIR": os.environ.get("DEDAL_CACHE_DIR", str(Path.home() / ".cache" / "dedal")),
    }
    if "SPACK_PYTHON" in os.environ:
        env["SPACK_PYTHON"] = os.environ["SPACK_PYTHON"]
    res = run_dedal("build", str(envdir / "env.yaml"), "-j", "1", "--json", env=env, timeout=1800)
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads(res.stdout)
    assert len(summary["built"]) == 5
    store = LayerStore(tmp_path / "data" / "layers")
    by_name = {m.name: m for m in store.manifests()}
    assert store.verify().clean
    tree = tmp_path / "tree"
    for name in ("gcc-runtime", "libdedal", "dedal-app"):  # runtime closure only: build-only layers dropped
        squashfs.extract(store.sqfs(by_name[name].key), tree)
    app = f"/opt/esd/software/{by_name['dedal-app'].prefix}/bin/dedal-app"
    res = rt.run_in(None, [app], binds=[rt.Bind(tree, "/opt/esd/software")], check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip(), "dedal-app prints its result"
