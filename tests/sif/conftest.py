from __future__ import annotations

from pathlib import Path

import pytest

from tests.base import helpers


@pytest.fixture(scope="session")
def siftool_exe() -> str:
    return helpers.siftool_or_fail()


@pytest.fixture(scope="session")
def small_sqfs(tmp_path_factory) -> Path:
    """A small real squashfs root filesystem (busybox-free: a few files and a symlink)."""
    from dedal.adapters import squashfs

    helpers.require_tools("mksquashfs")
    d = tmp_path_factory.mktemp("small")
    src = d / "root"
    (src / "etc").mkdir(parents=True)
    (src / "etc" / "os-release").write_text('ID=dedaltest\nVERSION_ID="1"\n')
    (src / "data").mkdir()
    (src / "data" / "blob").write_bytes(bytes(range(256)) * 300)
    (src / "bin").symlink_to("usr/bin")
    out = d / "root.sqfs"
    squashfs.pack([src], out)
    return out


@pytest.fixture(scope="session")
def trixie_base():
    helpers.require_tools("debootstrap", "bwrap", "mksquashfs", "squashfuse")
    return helpers.trixie_base()
