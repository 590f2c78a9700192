"""`dedal base ...`, `dedal exec` and `dedal shell` through the installed console script."""

from __future__ import annotations

import json
import os
import shutil


from tests.fixtures import base as helpers


def test_base_build_cli(run_dedal, trixie_base):
    """Builds from scratch when the shared cache is empty (the trixie_base fixture did), else cached."""
    r = run_dedal("base", "build", "--json", timeout=900)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["id"] == trixie_base.id and data["cached"] is True
    assert data["versions"]["openmpi"].startswith("5.0.7") and data["versions"]["pmix"].startswith("5.0.7")
    assert data["versions"]["prrte"] == "3.0.8" and data["versions"]["ucx"].startswith("1.18")
    assert data["versions"]["gcc"].startswith("14.")
    r = run_dedal("base", "build")
    assert r.returncode == 0 and f"{trixie_base.id}: cached" in r.stdout and "Open MPI" not in r.stderr


def test_built_base_contents(trixie_base):
    assert trixie_base.rootfs_dir.is_dir() and trixie_base.squashfs.is_file()
    assert trixie_base.os_release["VERSION_CODENAME"] == "trixie" and trixie_base.os_id == "debian13"
    assert trixie_base.packages["openmpi-bin"].startswith("5.0.7")
    assert trixie_base.packages["libpmix-dev"].startswith("5.0.7")
    for tool in (
        "usr/bin/gcc",
        "usr/bin/gfortran",
        "usr/bin/mpicc",
        "usr/bin/mpirun",
        "usr/bin/prte",
        "usr/bin/ucx_info",
        "usr/bin/python3",
        "usr/bin/make",
        "usr/bin/git",
        "usr/bin/patch",
    ):
        assert os.path.lexists(trixie_base.rootfs_dir / tool), tool  # mpicc: via /etc/alternatives
    assert not list((trixie_base.rootfs_dir / "var/lib/apt/lists").glob("*_Packages"))
    assert not (trixie_base.rootfs_dir / "etc/hosts").exists()  # minbase: the runtime binds the host's
    cache = trixie_base.path.parent
    assert not [p for p in cache.iterdir() if p.name.startswith(".build-")]
    from dedal.model import sif

    assert sif.squashfs_superblock(trixie_base.squashfs)["compression"] == "zstd"


def test_base_list_and_show(run_dedal, trixie_base):
    r = run_dedal("base", "list", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout) if not row.get("stale")}
    assert rows["debian-trixie"]["built"] is True and rows["debian-trixie"]["id"] == trixie_base.id
    assert rows["rocky9-build"]["kind"] == "apptainer"
    text = run_dedal("base", "list").stdout
    assert "debian-trixie" in text and "built" in text
    # the Apptainer .def bases: buildable where apptainer is on PATH
    assert ("needs apptainer" in text) == (shutil.which("apptainer") is None)
    shown = json.loads(run_dedal("base", "show", "debian-trixie", "--json").stdout)
    assert shown["built"] and shown["base"]["versions"]["prrte"] == "3.0.8"
    text = run_dedal("base", "show", "debian-trixie").stdout
    assert "openmpi:" in text and "trixie --variant=minbase" in text
    r = run_dedal("base", "show", "nope")
    assert r.returncode == 2 and "unknown base image 'nope'" in r.stderr and "debian-trixie" in r.stderr


def test_exec_in_base_by_name_and_sif(run_dedal, trixie_base, base_sif, tmp_path):
    r = run_dedal("exec", "debian-trixie", "--", "cat", "/etc/debian_version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("13.")
    (tmp_path / "note.txt").write_text("in cwd\n")
    r = run_dedal("exec", "-e", "X=1", str(base_sif), "--", "sh", "-c", "cat note.txt; echo X=$X; pwd")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["in cwd", "X=1", str(tmp_path)]
    r = run_dedal(
        "exec", "--bind", f"{tmp_path}:/opt/esd/software:ro", str(base_sif), "--", "cat", "/opt/esd/software/note.txt"
    )
    assert r.returncode == 0 and r.stdout == "in cwd\n"
    r = run_dedal("exec", str(base_sif), "--", "sh", "-c", "echo err >&2; exit 5")
    assert r.returncode == 5 and r.stderr.strip() == "err"  # the command's own exit code and stderr
    assert helpers.fuse_mounts() == []


def test_exec_mpirun_in_sif(run_dedal, base_sif, mpi_hello):
    r = run_dedal(
        "exec",
        "-B",
        f"{mpi_hello}:/work",
        str(base_sif),
        "--",
        "mpirun",
        "-np",
        "2",
        "--mca",
        "pml",
        "ucx",
        "--mca",
        "pml_ucx_tls",
        "any",
        "--mca",
        "pml_ucx_devices",
        "any",
        "/work/hello",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("hello ") == 2


def test_shell_reads_stdin(run_dedal, base_sif):
    r = run_dedal("shell", str(base_sif), input="cat /etc/debian_version\necho $LANG $BASH_VERSION\nexit 3\n")
    assert r.returncode == 3, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("13.") and lines[1].startswith("C.UTF-8 5.")  # bash, when the image has it


def test_exec_errors(run_dedal, trixie_base, tmp_path):
    r = run_dedal("exec", "debian-trixie")
    assert r.returncode == 2 and "no command given" in r.stderr
    r = run_dedal("exec", "--bind", "/nonexistent-dir:/x", "debian-trixie", "--", "true")
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = run_dedal("exec", "--env", "1BAD=x", "debian-trixie", "--", "true")
    assert r.returncode == 2 and "valid variable name" in r.stderr
    r = run_dedal("exec", str(tmp_path / "missing.sif"), "--", "true")
    assert r.returncode == 2 and "no such image" in r.stderr
    junk = tmp_path / "junk.sif"
    junk.write_bytes(b"\0" * 200)
    r = run_dedal("exec", str(junk), "--", "true")
    assert r.returncode == 2 and "not an image" in r.stderr
    r = run_dedal("exec", "debian-trixie", "--", "/no/such/program")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    for r in (run_dedal("exec", "--runtime", "charliecloud", "debian-trixie", "--", "true"),):
        assert "Traceback" not in r.stderr
    assert os.path.exists(trixie_base.rootfs_dir)
