"""A real image for the verification runner: the cached debian-trixie base (Open MPI 5.0.7,
PMIx 5.0.7, UCX 1.18) with dedal's bundled microbenchmarks compiled by the image's own
``mpicc`` into ``/opt/view/bin``, packed as squashfs and written as a SIF.

Built once per session (about 20 s on a 2-core machine, the base itself is cached outside
the repository). The assembler is not used: the image is made the way it would be by
hand, so these tests depend only on the base, the runtime and the SIF writer.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator

import pytest

from tests.base import helpers
from tests.conftest import ROOT
from tests.slurm.conftest import slurm_cluster  # noqa: F401  (the local Slurm test cluster, for test_runner_slurm)

BENCH_SRC = ROOT / "recipes" / "repo" / "packages" / "dedal-benchmarks" / "src"
MPI_BENCHMARKS = ("dedal_init", "dedal_latency", "dedal_bw", "dedal_allreduce")
ENV_SCRIPT = """# dedal verify tests: the view's programs first, like an assembled image
export PATH="/opt/view/bin:$PATH"
"""


@dataclass
class BenchImage:
    sif: Path
    root: Path           # the tree the SIF was packed from (hard links into the base)
    bindir: Path         # the compiled benchmarks (also in the image at /opt/view/bin)
    labels: Dict[str, str]


def _unlink_write(path: Path, text: str) -> None:
    """Write a new file; never write through a hard link into the cached base."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    path.write_text(text)


@pytest.fixture(scope="session")
def bench_image(tmp_path_factory) -> Iterator[BenchImage]:
    if os.geteuid() != 0:
        pytest.skip("needs root (bubblewrap over the base root filesystem, squashfuse mounts)")
    helpers.require_tools("bwrap", "mksquashfs", "unsquashfs", "squashfuse", "fusermount3")
    from dedal.model import sif
    from dedal.adapters import runtime, squashfs

    base = helpers.trixie_base()
    work = tmp_path_factory.mktemp("verify-image")
    bindir = work / "bin"
    bindir.mkdir()
    for name in MPI_BENCHMARKS:
        runtime.run_in(base.rootfs_dir, ["mpicc", "-O2", "-std=c11", "-Wall", "-Werror", "-I/src", "-o",
                                         f"/out/{name}", f"/src/{name}.c"],
                       binds=[runtime.Bind(BENCH_SRC, "/src", readonly=True), runtime.Bind(bindir, "/out")],
                       what=f"mpicc {name}.c", runtime="bwrap")
    tree = work / "root"
    cp = subprocess.run(["cp", "-al", str(base.rootfs_dir), str(tree)], capture_output=True, text=True)
    if cp.returncode != 0:  # another file system: a real copy
        shutil.rmtree(tree, ignore_errors=True)
        shutil.copytree(base.rootfs_dir, tree, symlinks=True)
    view = tree / "opt" / "view" / "bin"
    if view.exists():
        shutil.rmtree(view)
    view.mkdir(parents=True)
    for name in MPI_BENCHMARKS:
        shutil.copy2(bindir / name, view / name)
    _unlink_write(tree / ".singularity.d" / "env" / "90-environment.sh", ENV_SCRIPT)
    versions = base.versions if hasattr(base, "versions") else {}
    labels = {"dedal.env": "verifytest", "dedal.tag": "t1", "dedal.view": "/opt/view",
              "dedal.target": "x86_64_v2",
              "dedal.version.openmpi": str(versions.get("openmpi", "")),
              "dedal.version.ucx": str(versions.get("ucx", "")),
              "dedal.version.pmix": str(versions.get("pmix", ""))}
    sqfs = work / "root.sqfs"
    squashfs.pack([tree], sqfs)
    out = work / "verifytest.sif"
    sif.write_sif(out, sqfs, definition="Bootstrap: dedal-test\nFrom: debian-trixie\n", labels=labels,
                  metadata={"type": "container"})
    sqfs.unlink()
    yield BenchImage(out, tree, bindir, labels)
    shutil.rmtree(work, ignore_errors=True)  # about 1 GB of hard links and a 350 MB SIF


@pytest.fixture(scope="session")
def native_cache(tmp_path_factory) -> Iterator[Path]:
    """One cache directory for the unpacked native root (about 1 GB), shared by the tests of
    a session and removed after them."""
    cache = tmp_path_factory.mktemp("verify-cache")
    yield cache
    shutil.rmtree(cache, ignore_errors=True)
