"""The image's `apptainer run-help` text and its `apptainer test` script (dedal.stages.assemble.usage).

The test script is run here with the host's own ``sh`` and dynamic loader, on a view and an
install root under tmp_path made of real ELF files (gcc): what it finds is what the loader
finds, not what the test expects it to print."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Dict, Optional

import pytest

from dedal.model.plan import make_plan
from dedal.model.spack_lock import load_lock
from dedal.stages import assemble as asm
from dedal.stages.assemble import metadata, usage
from tests.conftest import SPACK_DATA
from tests.stages.assemble.test_closure import make_lib
from tests.stages.assemble.test_golden import CREATED, Base, layer_infos

STACK = {"openmpi": "5.0.7", "pmix": "5.0.7", "ucx": "1.18.1"}
TEXT = {"capture_output": True, "text": True, "timeout": 60}


def contents_of(install_root: str = "/opt/esd/software", view: str = "/opt/view", **versions: str) -> metadata.Contents:
    lock = load_lock(SPACK_DATA / "tiny-dedal.spack.lock")
    plan = make_plan(
        lock,
        env_name="tiny",
        install_root=install_root,
        base_image="debian-trixie",
        base_id="debian-trixie:0",
        view=view,
        tag="v1",
    )
    roots, hashes = asm.select_packages(plan)
    return metadata.Contents(
        plan,
        layer_infos(plan, hashes),
        roots,
        build_base=Base(),
        versions=versions,
        version_sources={k: "base" for k in versions},
    )


def labels_of(contents: metadata.Contents) -> Dict[str, str]:
    return metadata.make_labels(contents, CREATED, "the tiny test environment", {})


def test_help_says_what_the_image_is_and_how_to_run_it():
    contents = contents_of(**STACK)
    text = usage.help_text(contents, labels_of(contents))
    lines = text.splitlines()
    assert lines[0] == "tiny:v1: the tiny test environment"
    assert "Debian GNU/Linux 13 (trixie)" in text and "dated 2023-11-14T22:13:20Z" in text
    assert "  dedal-app@1.0" in lines  # the one top-level package, and how many in all
    assert "Top-level packages (1, with 3 Spack-built packages in all; the view /opt/view is on PATH):" in lines
    assert "Stack: Open MPI 5.0.7, PMIx 5.0.7, UCX 1.18.1" in lines
    run = lines.index("Run it")
    assert lines[run + 5 : run + 9] == [
        "  srun --mpi=pmix apptainer exec IMAGE.sif PROGRAM",
        "      MPI under Slurm: srun starts the ranks, Slurm's PMIx connects them",
        "  srun --mpi=pmix apptainer exec --sharens IMAGE.sif setsid PROGRAM",
        "      the same, the ranks of a node in one container (Apptainer >= 1.3): a faster start",
    ]
    assert "apptainer test IMAGE.sif" in text and "/opt/dedal/sbom.cdx.json" in text
    assert "--nv" not in text and "the same as exec; without a program, a shell" in text


def test_help_of_a_gpu_image_with_its_own_text_and_runscript():
    contents = contents_of(cuda="12.4.1", nccl="2.22.3", **STACK)
    text = usage.help_text(contents, labels_of(contents), user_help="Arbor and NEURON.\n", own_runscript=True)
    assert text.startswith("Arbor and NEURON.\n\ntiny:v1: ")
    assert "CUDA 12.4.1, NCCL 2.22.3" in text and "apptainer exec --nv IMAGE.sif PROGRAM" in text
    assert "the image's own runscript" in text


def test_help_names_the_base_the_image_is_made_on():
    contents = contents_of(**STACK)
    labels = dict(labels_of(contents))
    assert "on debian-trixie (Debian GNU/Linux 13 (trixie))," in usage.help_text(contents, labels)
    labels.update({"dedal.runtime_base.image": "debian-trixie-cuda-runtime", "dedal.runtime_base.os": "Debian 13 CUDA"})
    assert "on debian-trixie-cuda-runtime (Debian 13 CUDA)," in usage.help_text(contents, labels)


def test_help_of_an_image_without_mpi_leaves_slurm_out():
    contents = contents_of()
    text = usage.help_text(contents, labels_of(contents))
    assert "srun" not in text and "Stack:" not in text


@pytest.fixture
def tree(tmp_path) -> Path:
    """An install root with the environment's top-level prefix and a view with a real
    program and a real library, each finding what it needs."""
    contents = contents_of(str(tmp_path / "sw"), str(tmp_path / "view"))
    for h in contents.roots:
        (tmp_path / "sw" / contents.plan.nodes[h].prefix_name).mkdir(parents=True)
    (tmp_path / "view/bin").mkdir(parents=True)
    shutil.copy2("/usr/bin/true", tmp_path / "view/bin/true")
    (tmp_path / "view/bin/script").write_text("#!/bin/sh\n")  # not ELF: passed over
    make_lib(tmp_path / "src", tmp_path / "view/lib", "libok.so.1", soname="libok.so.1")
    return tmp_path


def run_test(
    tmp_path: Path, *, env: Optional[Dict[str, str]] = None, env_test: str = "", **kwargs: object
) -> subprocess.CompletedProcess:
    contents = contents_of(str(tmp_path / "sw"), str(tmp_path / "view"), **kwargs.pop("versions", {}))  # type: ignore[arg-type]
    script = tmp_path / "test.sh"
    script.write_text(usage.test_script(contents, env_test=env_test, **kwargs))  # type: ignore[arg-type]
    base = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "HOME": str(tmp_path / "no-home")}
    return subprocess.run(
        ["/bin/sh", str(script)], env={**base, **(env or {})}, capture_output=True, text=True, timeout=60
    )


def test_the_self_test_passes_where_everything_is_found(tree):
    r = run_test(tree)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        f"ok    the 1 top-level package(s) and the view {tree}/view are there",
        "ok    the libraries of the 2 programs and libraries of the view are found",
        "tiny:v1: all 2 checks passed",
    ]
    assert r.stderr == ""


def test_the_self_test_names_each_library_not_found_and_leaves_the_driver_to_nv(tree):
    stubs = tree / "stubs"  # linked against, then gone: as a library lacking where the image runs
    lib = functools.partial(make_lib, tree / "src")
    gone = lib(stubs, "libgone.so.2", soname="libgone.so.2")
    cuda = lib(stubs, "libcuda.so.1", soname="libcuda.so.1")
    lib(tree / "view/lib", "libneeds.so", str(gone), soname="libneeds.so")
    lib(tree / "view/lib/python3.11/site-packages/arbor", "_arbor.cpython-311-x86_64-linux-gnu.so", str(gone))
    lib(tree / "view/lib", "libgpu.so", str(cuda), soname="libgpu.so")
    shutil.rmtree(stubs)
    r = run_test(tree)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        f"ok    the 1 top-level package(s) and the view {tree}/view are there",
        "FAIL  libraries not found (2):",
        f"      libgone.so.2 needed by {tree}/view/lib/libneeds.so",
        f"      libgone.so.2 needed by {tree}/view/lib/python3.11/site-packages/arbor/_arbor.cpython-311-x86_64-linux-gnu.so",
        "note  the host's NVIDIA driver is not bound (libcuda.so.1 ): on a GPU node, run with --nv",
        "tiny:v1: 1 of 2 checks failed",
    ]


def test_the_self_test_finds_a_missing_package_and_a_foreign_library_path(tree):
    contents = contents_of(str(tree / "sw"), str(tree / "view"))
    shutil.rmtree(tree / "sw" / contents.plan.nodes[contents.roots[0]].prefix_name)
    r = run_test(
        tree, env={"LD_LIBRARY_PATH": f"/elsewhere/lib:{tree}/own/lib"}, image_library_path=[f"{tree}/own/lib"]
    )
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert lines[0] == f"FAIL  missing from the image: {tree}/sw/{contents.plan.nodes[contents.roots[0]].prefix_name}"
    assert (
        "note  LD_LIBRARY_PATH set outside the image: libraries there may replace the image's: /elsewhere/lib" in lines
    )
    assert lines[-1] == "tiny:v1: 1 of 2 checks failed"


def test_the_self_test_notes_the_users_own_python_packages(tree):
    """pip install --user in $HOME (which Apptainer binds) comes before the interpreter's own
    site-packages: a note names it, and PYTHONNOUSERSITE=1 (which leaves it out) silences it."""
    home = tree / "home"
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}
    found = subprocess.run(["python3", "-c", "import site; print(site.getusersitepackages())"], env=env, **TEXT)
    user_site = found.stdout.strip()
    assert user_site.startswith(str(home)), found
    assert "python3 imports" not in run_test(tree, env={"HOME": str(home)}).stdout  # none there yet
    Path(user_site).mkdir(parents=True)
    r = run_test(tree, env={"HOME": str(home)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[2] == (
        f"note  python3 imports from {user_site} (pip install --user) before its own site-packages; "
        "PYTHONNOUSERSITE=1 leaves it out"
    )
    assert "python3 imports" not in run_test(tree, env={"HOME": str(home), "PYTHONNOUSERSITE": "1"}).stdout


def fake_tool(bindir: Path, name: str, body: str) -> None:
    bindir.mkdir(parents=True, exist_ok=True)
    (bindir / name).write_text("#!/bin/sh\n" + body)
    (bindir / name).chmod(0o755)


def test_the_self_test_runs_open_mpi_and_starts_it_in_one_process(tree):
    fake_tool(
        tree / "tools",
        "ompi_info",
        'if [ "${1:-}" = --version ]; then echo "Open MPI v5.0.7"; echo; exit 0; fi\n'
        'echo "                 MCA pml: ucx (MCA v2.1.0, API v2.1.0, Component v5.0.7)"\n',
    )
    fake_tool(tree / "view/bin", usage.MPI_START_PROGRAM, 'echo "# init"; echo "nprocs: 1, min: 5 ms, max: 5 ms"\n')
    path = {"PATH": f"{tree}/tools:{os.environ['PATH']}"}
    r = run_test(tree, env=path, versions=STACK)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[2:] == [
        "ok    Open MPI v5.0.7 runs",
        "ok    Open MPI has its UCX messaging layer (pml ucx)",
        "ok    MPI starts in one process (nprocs: 1, min: 5 ms, max: 5 ms)",
        "tiny:v1: all 5 checks passed",
    ]
    fake_tool(tree / "view/bin", usage.MPI_START_PROGRAM, 'echo "PMIx_Init failed" >&2; exit 7\n')
    fake_tool(tree / "tools", "ompi_info", 'echo "Open MPI v5.0.7"\n')  # no pml ucx
    r = run_test(tree, env=path, versions=STACK)
    assert r.returncode == 1
    assert r.stdout.splitlines()[3:] == [
        "note  Open MPI has no pml ucx: messages take ob1 and its BTLs",
        "FAIL  MPI_Init in one process failed (exit 7): PMIx_Init failed ",
        "tiny:v1: 1 of 4 checks failed",
    ]
    r = run_test(tree, env={"PATH": "/usr/bin:/bin"}, versions=STACK)  # the image says Open MPI: it must be there
    assert "FAIL  the image records Open MPI, but ompi_info is not on PATH" in r.stdout.splitlines()


def test_the_environment_files_test_runs_last_with_the_arguments(tree):
    fake_tool(tree / "opt", "env-test", 'echo "env test $*"; exit "${1:-0}"\n')
    r = run_test(tree, env_test=str(tree / "opt/env-test"), versions={"cuda": "12.4.1"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[2:] == [
        "note  no NVIDIA GPU seen: on a GPU node, run with --nv",
        "env test ",
        "ok    the environment file's test passes",
        "tiny:v1: all 3 checks passed",
    ]
    script = tree / "test.sh"
    r = subprocess.run(["/bin/sh", str(script), "3"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stdout.splitlines()[-3:] == [
        "env test 3",
        "FAIL  the environment file's test exits 3",
        "tiny:v1: 1 of 3 checks failed",
    ]
