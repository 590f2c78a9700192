"""Environments built once per session with the Spack stand-in, for the assembly tests.

* ``host_env``: the recorded tiny-dedal lock built on base ``host`` (fast; the images
  carry no operating system: structure, audit, selection and reproducibility tests);
* ``trixie_env``: the same lock built on the real debian-trixie base (Open MPI 5), and
  ``trixie_image``: its assembled SIF (SOURCE_DATE_EPOCH fixed), which the tests run.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

import pytest
import yaml

from tests.conftest import SPACK_DATA, dedal_exe
from tests.standin import install_standin, standin_env

SDE = "1700000000"
TINY_RUNTIME = ("gcc-runtime", "libdedal", "dedal-app")        # glibc is external (the base's /usr)
TINY_BUILD_ONLY = ("dedal-bootstrap", "dedal-tool")


@dataclass
class Built:
    """One environment built into its own data directory."""

    root: Path
    env_file: Path
    data: Path
    stage: Path
    env: Dict[str, str]
    wrap: Tuple[str, ...] = ()  # a command the dedal runs under (e.g. unshare -u, another host name)

    @property
    def store(self) -> Path:
        return self.data / "layers"

    @property
    def images(self) -> Path:
        return self.data / "images"

    def dedal(self, *args: str, env: Optional[Dict[str, str]] = None, cwd: Optional[Path] = None,
              timeout: float = 600) -> subprocess.CompletedProcess:
        full = dict(self.env)
        full.update(env or {})
        return subprocess.run([*self.wrap, dedal_exe(), *args], env=full, cwd=cwd or self.root, text=True,
                              capture_output=True, timeout=timeout)

    def assemble_json(self, *args: str, env: Optional[Dict[str, str]] = None) -> dict:
        r = self.dedal("assemble", str(self.env_file), "--json", *args, env=env)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def settings(self, **overrides: str):
        from dedal.model import config

        return config.load_settings(overrides=dict(overrides), environ=self.env)


def _base_env(tmp: Path) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEDAL_") and k != "SOURCE_DATE_EPOCH"}
    env["HOME"] = str(tmp / "home")
    env["XDG_CONFIG_HOME"] = str(tmp / "home" / ".config")
    (tmp / "home").mkdir(parents=True, exist_ok=True)
    # the expensive base root filesystem is shared between tests and runs
    env["DEDAL_BASE_CACHE"] = os.environ.get("DEDAL_BASE_CACHE", str(Path.home() / ".cache" / "dedal" / "base"))
    return env


def build_env(tmp: Path, name: str, base_image: str, extra: Optional[dict] = None,
              wrap: Tuple[str, ...] = (), env_extra: Optional[Dict[str, str]] = None) -> Built:
    envdir = tmp / "env"
    envdir.mkdir(parents=True)
    env_file = envdir / "env.yaml"
    ded = {"name": name, "base_image": base_image, "install_root": "/opt/esd/software", "view": "/opt/view"}
    ded.update(extra or {})
    env_file.write_text(yaml.safe_dump({"spack": {"specs": ["dedal-app"], "concretizer": {"unify": True}},
                                        "dedal": ded}, sort_keys=False))
    shutil.copyfile(SPACK_DATA / "tiny-dedal.spack.lock", envdir / "spack.lock")
    spack_root = install_standin(tmp / "spack")
    mirror = tmp / "mirror"
    filler = tmp / "mirror-env"  # fill the mirror as fetch does, with `spack mirror create`
    filler.mkdir()
    (filler / "spack.yaml").write_text(yaml.safe_dump({"spack": {"specs": ["dedal-app"]}}))
    shutil.copyfile(envdir / "spack.lock", filler / "spack.lock")
    subprocess.run([str(spack_root / "bin" / "spack"), "-e", str(filler), "mirror", "create", "-d", str(mirror),
                    "--all"], check=True, capture_output=True, env=standin_env(cache=tmp / "spack-cache"))
    stage = tmp / "stage"
    stage.mkdir()
    data = tmp / "data"
    env = _base_env(tmp)
    env.update({"DEDAL_DATA_DIR": str(data), "DEDAL_MIRROR": str(mirror), "DEDAL_SPACK_ROOT": str(spack_root),
                "DEDAL_STAGE_DIR": str(stage), "DEDAL_CACHE_DIR": str(tmp / "cache")})
    env.update(env_extra or {})
    built = Built(envdir, env_file, data, stage, env, tuple(wrap))
    r = built.dedal("build", str(env_file))
    assert r.returncode == 0, f"dedal build failed:\n{r.stdout}\n{r.stderr}"
    return built


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (mount namespaces and the fixed install root)")


@pytest.fixture(scope="session")
def host_env(tmp_path_factory) -> Built:
    require_root()
    return build_env(tmp_path_factory.mktemp("asm-host"), "tiny", "host",
                     {"runscript": "exec dedal-app \"$@\"", "labels": {"maintainer": "dedal tests"},
                      "description": "tiny stand-in image"})


@pytest.fixture(scope="session")
def trixie_base_image():
    from tests.base import helpers

    require_root()
    helpers.require_tools("debootstrap", "bwrap", "mksquashfs", "squashfuse")
    return helpers.trixie_base()


@pytest.fixture(scope="session")
def trixie_env(tmp_path_factory, trixie_base_image) -> Built:
    return build_env(tmp_path_factory.mktemp("asm-trixie"), "tinympi", "debian-trixie")


@pytest.fixture(scope="session")
def trixie_image(trixie_env) -> dict:
    """The assembled image of ``trixie_env`` (result JSON of `dedal assemble --json`)."""
    return trixie_env.assemble_json(env={"SOURCE_DATE_EPOCH": SDE})


def partition_file(sif_path: Path, raw: Path) -> Path:
    """Copy the SIF's primary partition (the image's root filesystem) into the file ``raw``."""
    from dedal.model import sif

    part = sif.primary_partition(sif.read_sif(sif_path))
    with open(sif_path, "rb") as src, open(raw, "wb") as out:
        src.seek(part.offset)
        remaining = part.size
        while remaining:
            chunk = src.read(min(remaining, 8 << 20))
            out.write(chunk)
            remaining -= len(chunk)
    return raw


def partition_tree(sif_path: Path, dest: Path) -> Path:
    """Extract the SIF's primary partition into ``dest``."""
    from dedal.adapters import squashfs

    raw = partition_file(sif_path, dest.with_suffix(".sqfs"))
    squashfs.extract(raw, dest)
    raw.unlink()
    return dest
