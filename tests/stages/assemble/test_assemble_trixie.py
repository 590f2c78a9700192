"""`dedal assemble` on the real debian-trixie base (Open MPI 5, PMIx 5, UCX): the image
is a bootable root filesystem; programs from the view and an MPI program compiled with
the image's own mpicc run inside the SIF (`dedal exec`: the SIF's partition mounted,
bubblewrap where Apptainer is absent)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dedal.model import sif
from dedal.adapters import siftool, squashfs
from tests.fixtures.images import SDE, TINY_RUNTIME
from tests.fixtures import base as helpers

UCX = ["--mca", "pml", "ucx", "--mca", "pml_ucx_tls", "any", "--mca", "pml_ucx_devices", "any"]


def exec_in(env, image: str, *cmd: str, cwd: Path = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return env.dedal("exec", image, "--", *cmd, cwd=cwd, timeout=timeout)


def test_layout_and_labels(trixie_env, trixie_image, trixie_base_image):
    out = Path(trixie_image["image"])
    assert out == trixie_env.images / "tinympi" / "latest.sif"
    assert trixie_image["method"].startswith(("overlay", "extract"))
    rows = siftool.list_objects(out)
    assert [r["type"] for r in rows][-1] == "FS (Squashfs/*System/amd64)" and rows[-1]["group"] == "1"
    assert [r["type"] for r in rows][:3] == ["Def.FILE", "JSON.Generic", "JSON.Labels"]
    labels = trixie_image["labels"]
    assert labels["dedal.base.id"] == trixie_base_image.id
    from dedal.model.artifacts import sha256_file

    assert labels["dedal.base.sha256"] == sha256_file(trixie_base_image.squashfs)  # the base's content
    assert labels["dedal.version.openmpi"].startswith("5.") and labels["dedal.version.openmpi.source"].startswith(
        "base"
    )
    assert labels["dedal.version.pmix"].startswith("5.") and labels["dedal.version.ucx"].startswith("1.")
    assert "Debian" in labels["dedal.base.os"]
    info = sif.read_sif(out)
    part = sif.primary_partition(info)
    assert sif.squashfs_superblock(out, part.offset)["compression"] == "zstd"
    # the whole base is there, plus the software and Apptainer's files
    raw = trixie_env.root / "part.sqfs"
    with open(out, "rb") as src:
        src.seek(part.offset)
        raw.write_bytes(src.read(part.size))
    paths = {e["path"] for e in squashfs.entries(raw)}
    raw.unlink()
    for p in (
        "usr/bin/mpirun",
        "etc/os-release",
        "opt/view",
        ".singularity.d/labels.json",
        ".singularity.d/env/91-environment.sh",
        ".singularity.d/actions/exec",
        "opt/dedal/env/spack.lock",
        "opt/esd/software/.spack-db/index.json",
        "var/tmp",
        "home",
        "root",
    ):
        assert p in paths, p
    assert not [p for p in paths if p.startswith("tmp/")], "nothing left in /tmp"
    inspect = json.loads(trixie_env.dedal("inspect", str(out), "--json").stdout)
    assert sorted(layer["name"] for layer in inspect["layers"]) == sorted(TINY_RUNTIME)
    assert inspect["labels"] == labels


def test_view_program_runs_with_libraries_from_the_layers(trixie_env, trixie_image):
    image = trixie_image["image"]
    r = exec_in(trixie_env, image, "dedal-app")  # found through PATH=/opt/view/bin from 91-environment.sh
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "dedal-app 1.0 ok 4"
    r = exec_in(trixie_env, image, "sh", "-c", "command -v dedal-app; ldd /opt/view/bin/dedal-app")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "/opt/view/bin/dedal-app"
    assert "not found" not in r.stdout
    standin = [line for line in lines if "libstandin_" in line]
    assert len(standin) == 3 and all("=> /opt/esd/software/" in line for line in standin)
    r = exec_in(trixie_env, image, "sh", "-c", "echo $PATH; cat /etc/os-release | head -1")
    assert r.stdout.splitlines()[0].startswith("/opt/view/bin:") and "Debian" in r.stdout


def test_mpirun_of_a_program_built_with_the_images_open_mpi(trixie_env, trixie_image, tmp_path):
    image = trixie_image["image"]
    (tmp_path / "hello.c").write_text(helpers.MPI_HELLO)
    r = exec_in(trixie_env, image, "mpicc", "-O2", "-o", "hello", "hello.c", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = exec_in(trixie_env, image, "mpirun", "-np", "2", *UCX, "./hello", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    hellos = sorted(line for line in r.stdout.splitlines() if line.startswith("hello"))
    assert [h.split()[1] for h in hellos] == ["0/2", "1/2"]
    assert all("sum=1" in h and "Open MPI v5." in h for h in hellos)


def test_runscript_default(trixie_env, trixie_image):
    r = trixie_env.dedal("exec", trixie_image["image"], "--", "/.singularity.d/actions/run", "dedal-app")
    assert r.returncode == 0 and r.stdout.strip() == "dedal-app 1.0 ok 4", r.stderr


def test_the_images_own_test_passes_where_it_runs(trixie_env, trixie_image):
    """What `apptainer test` runs (/.singularity.d/actions/test, then the image's test), here
    through `dedal exec` (bubblewrap where Apptainer is absent): the checks find the image whole."""
    r = exec_in(trixie_env, trixie_image["image"], "/.singularity.d/actions/test")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "ok    the 1 top-level package(s) and the view /opt/view are there"
    assert re.fullmatch(r"ok    the libraries of the [1-9]\d* programs and libraries of the view are found", lines[1])
    version = trixie_image["labels"]["dedal.version.openmpi"]
    assert lines[2:] == [
        f"ok    Open MPI v{version} runs",
        "ok    Open MPI has its UCX messaging layer (pml ucx)",
        "skip  MPI start: no dedal_init in the view (package dedal-benchmarks)",
        "ok    the environment file's test passes",
        "tinympi:latest: all 5 checks passed",
    ]


def test_reproducible_on_the_real_base(trixie_env, trixie_image, tmp_path):
    again = trixie_env.assemble_json("-o", str(tmp_path / "again.sif"), env={"SOURCE_DATE_EPOCH": SDE})
    assert again["sha256"] == trixie_image["sha256"]
    assert again["size"] == trixie_image["size"]


def test_failure_unmounts_and_leaves_nothing(trixie_env, tmp_path):
    broken = tmp_path / "broken-spack"
    (broken / "bin").mkdir(parents=True)
    (broken / "bin" / "spack").write_text("#!/bin/sh\nexit 4\n")
    (broken / "bin" / "spack").chmod(0o755)
    out = tmp_path / "out" / "x.sif"
    r = trixie_env.dedal("assemble", str(trixie_env.env_file), "-o", str(out), env={"DEDAL_SPACK_ROOT": str(broken)})
    assert r.returncode == 1 and "spack reindex" in r.stderr, r.stderr
    assert not out.parent.exists() or list(out.parent.iterdir()) == []
    assert list(trixie_env.stage.iterdir()) == []
    assert helpers.mounts_under(str(trixie_env.stage)) == []


def test_without_an_overlay_the_same_image(trixie_env, trixie_image, tmp_path, monkeypatch):
    """Where no overlay can be mounted the base's squashfs is extracted instead: same bytes
    (nothing in the tree depends on how the base got there, e.g. no rewritten __pycache__)."""
    from dedal.adapters import overlay
    from dedal.stages.assemble import assemble
    from dedal.model.image_options import ImageOptions
    from dedal.model.target import resolve
    from dedal.stages.workspace import prepare

    monkeypatch.setattr(overlay, "available", lambda: False)
    settings = trixie_env.settings()
    target = resolve(str(trixie_env.env_file), settings)
    plan, _path, lock = prepare(target)
    result = assemble(
        plan,
        ImageOptions.of(target.env, source_date_epoch=int(SDE)),
        settings,
        lock=lock,
        output=tmp_path / "x.sif",
        force=True,
    )
    assert result.method == "extract, base reused"
    assert result.sha256 == trixie_image["sha256"]
    assert list(trixie_env.stage.iterdir()) == []


def test_base_reused_compressed_same_content_as_packing_the_whole_tree(trixie_env, trixie_image, tmp_path, monkeypatch):
    """The base's untouched top-level entries come from a squashfs of the base made once
    (kept in the cache); the image has exactly the content of one mksquashfs of its tree."""
    from dedal.stages import assemble as asm
    from dedal.stages.assemble import stage
    from dedal.model.image_options import ImageOptions
    from dedal.model.target import resolve
    from dedal.stages.workspace import prepare
    from tests.fixtures.images import partition_file

    assert trixie_image["method"].endswith("base reused")
    settings = trixie_env.settings()
    parts = list((Path(settings.cache_dir) / "assemble" / "base-parts").glob("*.sqfs"))
    assert len(parts) == 1, parts
    listing = {e["path"] for e in squashfs.entries(parts[0])}
    assert "usr/bin/mpirun" in listing and not {p.split("/")[0] for p in listing} & {"opt", "etc", ".singularity.d"}

    monkeypatch.setattr(stage, "base_part", lambda *a, **k: None)
    target = resolve(str(trixie_env.env_file), settings)
    plan, _path, lock = prepare(target)
    whole = asm.assemble(
        plan,
        ImageOptions.of(target.env, source_date_epoch=int(SDE)),
        settings,
        lock=lock,
        output=tmp_path / "whole.sif",
        force=True,
    )
    assert "base reused" not in whole.method and whole.sha256 != trixie_image["sha256"]
    a = partition_file(Path(trixie_image["image"]), tmp_path / "reused.sqfs")
    b = partition_file(Path(whole.image), tmp_path / "whole.sqfs")
    assert squashfs.diff(a, b) == ""
    # and the comparison itself sees a difference where there is one
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "extra").write_text("x")
    squashfs.append(b, [tmp_path / "x" / "extra"], tmp_path / "more.sqfs")
    assert "extra" in squashfs.diff(a, tmp_path / "more.sqfs")


@pytest.mark.apptainer
def test_apptainer_runs_inspects_signs_and_verifies_the_image(trixie_image, apptainer, tmp_path):
    """What a user does with the image and the real Apptainer (skipped without one)."""
    image = tmp_path / "image.sif"
    shutil.copyfile(trixie_image["image"], image)
    assert apptainer("exec", str(image), "dedal-app").stdout.strip() == "dedal-app 1.0 ok 4"
    assert apptainer("run", str(image), "dedal-app").stdout.strip() == "dedal-app 1.0 ok 4"
    labels = json.loads(apptainer("inspect", "--labels", "--json", str(image)).stdout)
    assert labels["data"]["attributes"]["labels"] == trixie_image["labels"]
    apptainer(
        "key",
        "newpair",
        "--name",
        "dedal test",
        "--email",
        "test@example.org",
        "--comment",
        "test",
        "--password",
        "",
        "--push=false",
    )
    # run-help and test, as a scientist meets them
    helptext = apptainer("run-help", str(image)).stdout
    assert helptext.startswith("tinympi:latest") and "\n  dedal-app@1.0\n" in helptext
    assert "srun --mpi=pmix apptainer exec IMAGE.sif PROGRAM" in helptext
    r = apptainer("test", str(image))
    assert r.stdout.splitlines()[-1] == "tinympi:latest: all 5 checks passed", r.stdout + r.stderr
    # a library lost from the image (a sandbox of it, one of the layer's libraries removed): the test says which
    sandbox = tmp_path / "sandbox"
    part = sif.primary_partition(sif.read_sif(image))
    squashfs.extract(image, sandbox, offset=part.offset, merge=False)
    gone = sorted(sandbox.glob("opt/esd/software/libdedal-*/lib/libstandin_*.so*"))
    assert gone, "the tiny environment's libraries"
    gone[0].unlink()
    r = apptainer("test", str(sandbox), check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL  libraries not found" in r.stdout and f"{gone[0].name} needed by /opt/view/bin/dedal-app" in r.stdout
    # dedal-app cannot start either: the environment file's test fails too
    assert r.stdout.splitlines()[-2:] == [
        "FAIL  the environment file's test exits 1",
        "tinympi:latest: 2 of 5 checks failed",
    ]
    apptainer("sign", str(image))
    r = apptainer("verify", str(image))
    assert "Verified signature" in r.stdout + r.stderr
    # dedal reads the signed image as before (the signature is one more SIF object)
    assert (
        sif.primary_partition(sif.read_sif(image)).size
        == sif.primary_partition(sif.read_sif(trixie_image["image"])).size
    )


def test_elf_closure_is_checked_and_no_runtime_base_by_default(trixie_image):
    """Every assembly on a base checks the ELF closure (the tiny layers' programs and
    libraries, and the base's libraries they load); without runtime_base the image is made
    on the build base and says nothing of another."""
    closure = trixie_image["elf_closure"]
    assert closure["missing"] == {} and closure["unreadable"] == {} and closure["host_driver"] == {}
    assert closure["elf_files"] >= 3 and closure["checked"] > closure["elf_files"]  # + libc & co of the base
    assert trixie_image["runtime_base"] == "" and trixie_image["runtime_base_id"] == ""
    assert not [k for k in trixie_image["labels"] if k.startswith("dedal.runtime_base")]
