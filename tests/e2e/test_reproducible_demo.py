"""The demo environment built twice with the real Spack, as two independent builders would:
separate data, cache and stage directories, the second as another user on another host
name, the same lock, base and Spack commit, no SOURCE_DATE_EPOCH: the same SIF, byte for
byte (issue 28). About 7 minutes per build on 2 cores."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from dedal.stages.sifdiff import diff_images, render
from tests.conftest import ROOT, dedal_exe

pytestmark = [pytest.mark.spack, pytest.mark.slow, pytest.mark.e2e]
LONG = 2 * 3600


@pytest.mark.timeout(LONG)
def test_demo_twice_is_byte_identical(real_spack, isolated_env, tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root (base image root filesystem, mount and UTS namespaces)")
    src = tmp_path / "src"
    (src / "spack-envs" / "demo").mkdir(parents=True)
    env_file = src / "spack-envs" / "demo" / "env.yaml"
    shutil.copyfile(ROOT / "spack-envs" / "demo" / "env.yaml", env_file)
    (src / "recipes").symlink_to(ROOT / "recipes")  # the env file's ../../recipes/repo
    images = []
    for n, wrap, who in (
        (1, [], {}),
        (
            2,
            ["unshare", "-u", "sh", "-c", 'hostname dedal-rebuilder && exec "$@"', "sh"],
            {"USER": "rebuilder", "LOGNAME": "rebuilder"},
        ),
    ):
        env = dict(
            isolated_env,
            DEDAL_SPACK_ROOT=str(real_spack),
            DEDAL_DATA_DIR=str(tmp_path / f"data{n}"),
            DEDAL_CACHE_DIR=str(tmp_path / f"cache{n}"),
            DEDAL_STAGE_DIR=str(tmp_path / f"stage{n}"),
            **who,
        )
        env.pop("SOURCE_DATE_EPOCH", None)
        (tmp_path / f"stage{n}").mkdir()
        for args in (
            ["fetch", str(env_file)],
            ["build", str(env_file)],
            ["assemble", str(env_file), "-o", str(tmp_path / f"demo{n}.sif")],
        ):
            r = subprocess.run([*wrap, dedal_exe(), *args], env=env, text=True, capture_output=True, timeout=LONG)
            assert r.returncode == 0, f"run {n}: dedal {' '.join(args)}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
            if n == 1 and args[0] == "fetch":  # the same lock for the second builder
                shutil.copyfile(tmp_path / "data1" / "work" / "demo" / "spack.lock", env_file.parent / "spack.lock")
        images.append(tmp_path / f"demo{n}.sif")
    result = diff_images(*images)
    assert result.identical, render(result)
