"""The GPU verification kit (benchmarks/gpu/): the bundle's slimming on small trees, and the
whole kit rehearsed on the real Debian base without a GPU (make_bundle.py, then kit.sh with the
kit's own bubblewrap): dedal verify runs on the slimmed root, whose ELF closure is complete."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

KIT = ROOT / "benchmarks" / "gpu"


def _module():
    spec = importlib.util.spec_from_file_location("make_bundle", KIT / "make_bundle.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


@pytest.fixture(scope="module")
def mb():
    return _module()


def test_symlink_chains_are_kept_link_by_link_and_large_files_left_out(mb, tmp_path: Path) -> None:
    """mpirun -> /etc/alternatives/mpirun -> mpirun.openmpi -> prterun: every link of the chain,
    each where it is; a file over the limit (NCCL's 241 MB) is named, not kept."""
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    (root / "etc/alternatives").mkdir(parents=True)
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/bin/prterun").write_text("#!/bin/sh\n")
    (root / "usr/bin/mpirun.openmpi").symlink_to("prterun")
    (root / "etc/alternatives/mpirun").symlink_to("/usr/bin/mpirun.openmpi")
    (root / "usr/bin/mpirun").symlink_to("/etc/alternatives/mpirun")
    (root / "bin").symlink_to("usr/bin")
    (root / "usr/lib/libnccl.so.2.22.3").write_bytes(b"\0" * 4096)
    (root / "usr/lib/libnccl.so.2").symlink_to("libnccl.so.2.22.3")
    slim = mb.Slim(root, keep_over=1024)
    assert slim.add("/bin/mpirun") == "/usr/bin/prterun"
    assert list(slim.paths) == [
        "/bin",
        "/usr/bin/mpirun",
        "/etc/alternatives/mpirun",
        "/usr/bin/mpirun.openmpi",
        "/usr/bin/prterun",
    ]
    assert slim.add("/usr/lib/libnccl.so.2") is None
    assert "/usr/lib/libnccl.so.2" in slim.paths  # the name stays: kit.sh puts the host's library behind it
    assert slim.left_out == {"/usr/lib/libnccl.so.2.22.3": 4096}


def test_a_kept_tree_leaves_out_build_files_and_other_vendors_components(mb, tmp_path: Path) -> None:
    root = tmp_path / "root"
    comp = root / "usr/lib/openmpi"
    (comp / "include").mkdir(parents=True)
    for name in (
        "mca_pml_ucx.so",
        "mca_accelerator_cuda.so",
        "mca_accelerator_rocm.so",
        "mca_accelerator_ze.so",
        "libmpi.a",
        "include/mpi.h",
    ):
        (comp / name).write_text("x")
    files = mb.Slim(root, keep_over=1 << 20).add_tree("/usr/lib/openmpi")
    assert sorted(files) == ["/usr/lib/openmpi/mca_accelerator_cuda.so", "/usr/lib/openmpi/mca_pml_ucx.so"]


def test_the_images_own_test_stays_out_of_the_slimmed_root(mb, tmp_path: Path) -> None:
    """`apptainer test` checks the whole image; dedal verify would run it on the slimmed root."""
    root = tmp_path / "root"
    (root / ".singularity.d/actions").mkdir(parents=True)
    for name in ("test", "runscript", "actions/test"):
        (root / ".singularity.d" / name).write_text("#!/bin/sh\n")
    slim = mb.Slim(root, keep_over=1 << 20)
    slim.add_tree("/.singularity.d")
    assert slim.drop("/.singularity.d/test", "/opt/dedal/env-test") == ["/.singularity.d/test"]
    assert "/.singularity.d/test" not in slim.paths and "/.singularity.d/actions/test" in slim.paths


def test_spacks_srun_stub_gives_way_to_prterun(mb, tmp_path: Path) -> None:
    from dedal.errors import UserError
    from dedal.stages.verify.image import ImageInfo

    root = tmp_path / "root"
    bindir = root / "opt/esd/software/openmpi-5.0.7-abc/bin"
    bindir.mkdir(parents=True)
    (bindir / "prterun").write_text("")
    info = ImageInfo(
        path=tmp_path / "i.sif",
        kind="sif",
        name="esd-gpu",
        mpirun_stub="/opt/esd/software/openmpi-5.0.7-abc/bin/mpirun",
    )
    path, script = mb.launcher_fix(info, root)
    assert path == info.mpirun_stub and script.startswith("#!/bin/sh\n")
    assert 'exec /opt/esd/software/openmpi-5.0.7-abc/bin/prterun --personality ompi "$@"' in script
    assert "PRTE_ALLOW_RUN_AS_ROOT=" in script
    assert mb.launcher_fix(ImageInfo(path=info.path, kind="sif", name="x"), root) is None
    (bindir / "prterun").unlink()
    with pytest.raises(UserError, match="no prterun"):
        mb.launcher_fix(info, root)


@pytest.mark.slow
def test_the_kit_rehearsed_on_the_base_without_a_gpu(base_sif, tmp_path: Path) -> None:
    """The bundle of the plain Debian base (Open MPI 5, UCX; no dedal-benchmarks: built into the
    bundle with its mpicc), then kit.sh with the kit's own bubblewrap: dedal verify passes on the
    slimmed root, and $OUT holds what the device tool brings back (at most 8 files)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (bubblewrap chroots of the root as the device machine runs them)")
    kit = tmp_path / "kit"
    res = subprocess.run(
        [
            sys.executable,
            str(KIT / "make_bundle.py"),
            str(base_sif),
            "-o",
            str(kit),
            "--cache",
            str(tmp_path / "cache"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    manifest = json.loads((kit / "manifest.json").read_text())
    assert manifest["built"] == ["dedal_init", "dedal_latency", "dedal_bw", "dedal_allreduce", "dedal_cuda_floor"]
    assert manifest["missing_libraries"] == {} and manifest["carried_bytes"] < manifest["budget_bytes"]
    assert {p.name for p in (kit / "runtime").iterdir()} == {"bwrap", "bwrap.bin", "lib"}
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "KIT": str(kit),
        "KIT_OWN_RUNTIME": "1",
        "BUDGET": "240",
        "KIT_WORK": str(tmp_path / "work"),
        "KIT_PYTHON": sys.executable,
    }
    env["PATH"] = ":".join(p for p in env["PATH"].split(":") if not (Path(p) / "apptainer").exists())
    res = subprocess.run(["bash", str(KIT / "kit.sh")], env=env, capture_output=True, text=True, timeout=400)
    log = (out / "kit.log").read_text()
    assert "runtime: the kit's bubblewrap" in log and "dedal verify: exit 0" in log, log[-3000:]
    assert {"kit.log", "host.txt", "verify.json", "report.md", "raw.tar.xz"} <= {p.name for p in out.iterdir()}
    assert len(list(out.iterdir())) <= 8
    report = json.loads((out / "verify.json").read_text())
    checks = {c["name"]: c["verdict"] for c in report["checks"]}
    assert checks["dedal_latency intra-node"] in ("good", "suboptimal"), checks
    assert "dedal_latency (/opt/dedal-verify/kit/bin/dedal_latency)" in report["meta"]["benchmarks"]
    shutil.rmtree(tmp_path / "work", ignore_errors=True)
