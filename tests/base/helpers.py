"""Shared by tests/base and tests/sif: the real Debian trixie base (built once, cached outside
the repository) and small real artifacts made from it."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import pytest

from dedal.model import config

BASE_NAME = "debian-trixie"
_cache: dict = {}

MPI_HELLO = r"""
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
    int rank, size, len, sum = 0;
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Get_library_version(version, &len);
    printf("hello %d/%d sum=%d %.*s\n", rank, size, sum, 20, version);
    MPI_Finalize();
    return 0;
}
"""


def base_cache() -> Path:
    return Path(os.environ.get("DEDAL_BASE_CACHE") or Path.home() / ".cache" / "dedal" / "base")


def settings(**overrides: str):
    return config.load_settings(overrides={"base_cache": str(base_cache()), **overrides}, environ={})


def trixie_base():
    """The built debian-trixie base: from the cache, else built now (about 2 minutes, needs root)."""
    if "base" not in _cache:
        from dedal.model import base
        from dedal.stages.base import ensure_base

        s = settings(debian_mirror=os.environ.get("DEDAL_DEBIAN_MIRROR", ""))
        found = base.find_base(BASE_NAME, s)
        if found is None and os.geteuid() != 0:
            pytest.skip("building the debian-trixie base needs root (debootstrap) and it is not cached "
                        f"in {base_cache()}")
        _cache["base"] = found or ensure_base(BASE_NAME, s, progress=print)
    return _cache["base"]


def siftool_or_fail() -> str:
    from dedal.adapters import siftool
    from dedal.errors import ToolMissing

    try:
        return siftool.executable()
    except ToolMissing:
        pytest.fail("siftool is not installed (run ./setup.sh)")
    return ""


def require_tools(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.fail(f"missing tools {', '.join(missing)} (run ./setup.sh)")


def mounts_under(prefix: str) -> list:
    with open("/proc/self/mounts") as fh:
        return [line.split()[1] for line in fh if line.split()[1].startswith(prefix)]


def _root_mounts() -> list:
    """dedal's image mounts in this process's temporary directory (a run with its own TMPDIR
    does not see those of other runs on the same machine)."""
    tmp = tempfile.gettempdir()
    with open("/proc/self/mounts") as fh:
        return [m for m in (line.split()[1] for line in fh)
                if "dedal-root-" in m and os.path.dirname(m) == tmp]


_BEFORE_TESTS = set(_root_mounts())  # a dedal killed earlier on this machine may have left one


def fuse_mounts() -> list:
    """Image mounts (dedal's ``dedal-root-*`` mount points) made since the tests began and
    still there: a test that leaks one fails; a stray one from before does not."""
    return [m for m in _root_mounts() if m not in _BEFORE_TESTS]


def maybe(value: Optional[str]) -> str:
    return value or ""
