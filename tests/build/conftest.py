"""A tiny environment (the recorded tiny-dedal lock) built with the Spack stand-in on the
host (base image ``host``: a private mount namespace provides the install root)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional

import pytest
import yaml

from tests.conftest import SPACK_DATA
from tests.standin import install_standin, standin_env


@dataclass
class TinyEnv:
    root: Path
    env_file: Path
    spack_root: Path
    mirror: Path
    data: Path
    stage: Path
    env: Dict[str, str]

    @property
    def store(self) -> Path:
        return self.data / "layers"

    def reconfigure(self, fail: Iterable[str] = (), sleep: Optional[Dict[str, float]] = None) -> None:
        install_standin(self.spack_root, fail=fail, sleep=sleep)


def make_env(tmp_path: Path, lock: str = "tiny-dedal", specs=("dedal-app",), name: str = "tiny",
             fail: Iterable[str] = (), sleep: Optional[Dict[str, float]] = None) -> TinyEnv:
    envdir = tmp_path / "env"
    envdir.mkdir(parents=True)
    env_file = envdir / "env.yaml"
    env_file.write_text(yaml.safe_dump({
        "spack": {"specs": list(specs), "concretizer": {"unify": True}},
        "dedal": {"name": name, "base_image": "host", "install_root": "/opt/esd/software"},
    }, sort_keys=False))
    shutil.copyfile(SPACK_DATA / f"{lock}.spack.lock", envdir / "spack.lock")
    spack_root = install_standin(tmp_path / "spack", fail=fail, sleep=sleep)
    mirror = tmp_path / "mirror"
    # fill the mirror the way the fetch stage does, with the stand-in's `mirror create`
    filler = tmp_path / "mirror-env"
    filler.mkdir()
    (filler / "spack.yaml").write_text(env_file.read_text())
    shutil.copyfile(envdir / "spack.lock", filler / "spack.lock")
    subprocess.run([str(spack_root / "bin" / "spack"), "-e", str(filler), "mirror", "create", "-d", str(mirror), "--all"],
                   check=True, capture_output=True, env=standin_env(cache=tmp_path / "spack-cache"))
    stage = tmp_path / "stage"
    stage.mkdir()
    data = tmp_path / "data"
    env = {"DEDAL_DATA_DIR": str(data), "DEDAL_MIRROR": str(mirror), "DEDAL_SPACK_ROOT": str(spack_root),
           "DEDAL_STAGE_DIR": str(stage), "DEDAL_CACHE_DIR": str(tmp_path / "cache")}
    return TinyEnv(envdir, env_file, spack_root, mirror, data, stage, env)


@pytest.fixture
def tiny(tmp_path: Path) -> TinyEnv:
    return make_env(tmp_path)


def stage_leftovers(stage: Path):
    return sorted(p.name for p in stage.iterdir()) if stage.is_dir() else []


def node_builds_of(tiny: TinyEnv, package: str = "") -> List[int]:
    """PIDs of the running ``dedal node-build`` processes of this environment (of the job
    whose main package is ``package``, when given)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "node-build" not in argv or not any(str(tiny.stage) in a for a in argv):
            continue
        job = argv[argv.index("--job") + 1] if "--job" in argv[:-1] else ""
        main = job.rsplit(":", 1)[-1]  # local: name@version/hash; Slurm: dedal:ENV:name[+N]
        if not package or re.match(re.escape(package) + "($|[@+])", main):
            pids.append(int(entry.name))
    return pids


@pytest.fixture
def as_root():
    if os.geteuid() != 0:
        pytest.skip("needs root (mount namespaces for the fixed install root)")
