from __future__ import annotations

from pathlib import Path

import pytest

from tests.base import helpers


@pytest.fixture(scope="session")
def trixie_base():
    helpers.require_tools("debootstrap", "bwrap", "mksquashfs", "squashfuse")
    return helpers.trixie_base()


@pytest.fixture(scope="session")
def base_sif(trixie_base, tmp_path_factory) -> Path:
    """A SIF whose primary partition is the base's squashfs, with an image environment script."""
    from dedal.model import sif

    out = tmp_path_factory.mktemp("basesif") / "base.sif"
    sif.write_sif(out, trixie_base.squashfs, definition="Bootstrap: dedal\nFrom: debian-trixie\n",
                  labels={"org.label-schema.schema-version": "1.0"}, metadata={"type": "container"})
    return out


@pytest.fixture(scope="session")
def mpi_hello(trixie_base, tmp_path_factory) -> Path:
    """A tiny MPI program compiled with the base's mpicc (directory bound at /work)."""
    from dedal.adapters import runtime

    work = tmp_path_factory.mktemp("mpi")
    (work / "hello.c").write_text(helpers.MPI_HELLO)
    runtime.run_in(trixie_base.rootfs_dir, ["mpicc", "-O2", "-o", "/work/hello", "/work/hello.c"],
                   binds=[runtime.Bind(work, "/work")], what="mpicc hello.c")
    return work
