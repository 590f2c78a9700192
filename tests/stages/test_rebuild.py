"""`dedal rebuild IMAGE`: the tiny environment's image rebuilt from what it carries, in a work
directory of its own, is identical; a doctored image is not, and the diff says where."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from dedal.model import sif
from tests.fixtures.images import build_env, require_root


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    require_root()
    tmp = tmp_path_factory.mktemp("rebuild")
    built = build_env(
        tmp / "orig", "tiny", "host", {"labels": {"maintainer": "dedal tests"}, "description": "rebuild test"}
    )
    result = built.assemble_json("-o", str(tmp / "orig.sif"))
    return built, tmp / "orig.sif", result


def _rebuild(built, image: Path, tmp: Path, *args: str):
    env = {
        "DEDAL_DATA_DIR": str(tmp / "data"),
        "DEDAL_CACHE_DIR": str(tmp / "cache"),
        "DEDAL_STAGE_DIR": str(tmp / "stage"),
    }  # the mirror and Spack: the original's (inputs)
    (tmp / "stage").mkdir(parents=True, exist_ok=True)
    return built.dedal("rebuild", str(image), "--workdir", str(tmp / "work"), *args, env=env, cwd=tmp)


def test_rebuild_is_identical(original, tmp_path):
    built, image, result = original
    r = _rebuild(built, image, tmp_path, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(r.stdout)
    assert data["identical"] is True and data["diff"]["sha256"]["b"] == result["sha256"]
    assert Path(data["rebuilt"]).parent.parent == tmp_path / "work" / "images"
    assert data["stages"]["build"]["detail"].startswith("5 built")  # layers of its own, none reused
    assert (tmp_path / "work" / "env" / "env.yaml").is_file()


def test_a_doctored_image_is_reported(original, tmp_path):
    built, image, _result = original
    doctored = tmp_path / "doctored.sif"
    shutil.copyfile(image, doctored)
    labels = sif.read_sif(doctored).by_name("labels.json")
    with open(doctored, "r+b") as fh:
        fh.seek(labels.offset)
        raw = fh.read(labels.size)
        assert b'"dedal tests"' in raw
        fh.seek(labels.offset)
        fh.write(raw.replace(b'"dedal tests"', b'"dedal TESTS"'))
    r = _rebuild(built, doctored, tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("differ: ")
    assert "label maintainer: changed: 'dedal TESTS' -> 'dedal tests'" in lines
    assert not any(line.startswith("file ") for line in lines)  # the root file systems are the same


def test_bad_input(original, tmp_path):
    built, _image, _result = original
    text = tmp_path / "x.sif"
    text.write_text("not an image\n")
    r = _rebuild(built, text, tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "not a SIF image" in r.stderr
    assert not (tmp_path / "work" / "layers").exists()


def test_inputs_must_be_the_images(tmp_path):
    """Another base definition or another Spack commit here: refused before anything is built."""
    import git

    from dedal.errors import UserError
    from dedal.model.base import load_definition
    from dedal.stages.rebuild import check_inputs

    class S:
        spack_root = ""

    env_dir = tmp_path / "env"
    env_dir.mkdir()
    trixie = load_definition("debian-trixie")
    (env_dir / "base.yaml").write_text(trixie.text)
    commit = "e8f8cf8543b31ff6ba81a5ab0e515bc9a4856384"
    assert check_inputs(env_dir, {"dedal.spack.commit": commit}, S()) == {"spack_ref": commit}
    (env_dir / "base.yaml").write_text(trixie.text + "# edited\n")
    with pytest.raises(UserError, match="debian-trixie: its definition here .* is not the one the image was built"):
        check_inputs(env_dir, {}, S())
    (env_dir / "base.yaml").unlink()
    spack = tmp_path / "spack"
    spack.mkdir()
    repo = git.Repo.init(spack)
    (spack / "f").write_text("x")
    repo.index.add(["f"])
    here = repo.index.commit("c").hexsha
    S.spack_root = str(spack)
    assert check_inputs(env_dir, {"dedal.spack.commit": here}, S()) == {}
    with pytest.raises(UserError, match=f"built with Spack {commit[:12]}, spack_root .* is at {here[:12]}"):
        check_inputs(env_dir, {"dedal.spack.commit": commit}, S())


# ----------------------------------------------------------------------------- hostile images (issue 39, item 2)
# An image being rebuilt is input: nothing of it is followed onto the host, a corrupt one is
# one line (exit 2) and leaves no env/ (nor the work directory dedal made for it).

LABELS = {"dedal.source_date_epoch": "1700000000", "dedal.spack.commit": "e8f8cf8543b31ff6ba81a5ab0e515bc9a4856384"}
ENV_YAML = "spack:\n  specs: [zlib]\ndedal:\n  name: x\n  base_image: host\n"


def _sif(tmp: Path, name: str, shape) -> Path:
    """A SIF whose root file system ``shape(root)`` made (real mksquashfs, dedal's SIF writer)."""
    from dedal.adapters import squashfs

    root = tmp / f"{name}-root"
    (root / "opt" / "dedal").mkdir(parents=True)
    shape(root)
    part = tmp / f"{name}.sqfs"
    squashfs.pack([root], part)
    out = tmp / f"{name}.sif"
    sif.write_sif(
        out,
        part,
        definition="Bootstrap: dedal\n",
        labels=LABELS,
        metadata={"data": {"attributes": {"labels": LABELS}}},
        created=1700000000,
    )
    return out


def _carried(root: Path, **extra: str) -> Path:
    env = root / "opt" / "dedal" / "env"
    env.mkdir(parents=True, exist_ok=True)
    (env / "env.yaml").write_text(extra.pop("env_yaml", ENV_YAML))
    (env / "spack.lock").write_text("{}\n")
    for rel, text in extra.items():
        (env / rel).write_text(text)
    return env


@pytest.fixture
def host_secrets(tmp_path):
    """A host directory and file an image's symlinks point at."""
    require_root()
    secret = tmp_path / "host"
    secret.mkdir()
    (secret / "env.yaml").write_text("TOPSECRET_KEY_ON_THE_HOST: 1\nspack: {specs: [zlib]}\n")
    (secret / "spack.lock").write_text("{}\n")
    (secret / "private.key").write_text("-----BEGIN PRIVATE KEY-----\n")
    return secret


def _refused(run_dedal, image: Path, tmp_path: Path, *expect: str) -> str:
    work = tmp_path / "work"
    r = run_dedal("rebuild", str(image), "--workdir", str(work), timeout=120)
    lines = [line for line in r.stderr.strip().splitlines() if not line.startswith("[")]  # progress lines
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("dedal: error: "), r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    for text in expect:
        assert text in lines[0], lines[0]
    assert not work.exists(), sorted(str(p) for p in work.rglob("*"))  # no env/, no partial copy
    return lines[0]


@pytest.mark.reliability
def test_an_env_dir_that_is_a_symlink_to_the_host_is_not_followed(run_dedal, tmp_path, host_secrets):
    image = _sif(tmp_path, "env-link", lambda root: os.symlink(host_secrets, root / "opt" / "dedal" / "env"))
    line = _refused(run_dedal, image, tmp_path, "/opt/dedal/env is a symlink", str(host_secrets), "not a directory")
    assert "TOPSECRET" not in line


@pytest.mark.reliability
def test_an_env_yaml_that_is_a_symlink_to_a_host_file_is_not_read(run_dedal, tmp_path, host_secrets):
    def shape(root: Path) -> None:
        env = _carried(root)
        (env / "env.yaml").unlink()
        os.symlink(host_secrets / "env.yaml", env / "env.yaml")

    line = _refused(run_dedal, _sif(tmp_path, "yaml-link", shape), tmp_path, "env.yaml is a symlink")
    assert "TOPSECRET" not in line


@pytest.mark.reliability
def test_a_fifo_or_a_relative_symlink_in_the_env_dir_is_refused(run_dedal, tmp_path):
    require_root()
    fifo = _sif(tmp_path, "fifo", lambda root: os.mkfifo(_carried(root) / "pipe"))
    _refused(run_dedal, fifo, tmp_path, "pipe is a FIFO, not a regular file or directory")
    up = _sif(tmp_path, "up", lambda root: os.symlink("../../../etc", _carried(root) / "repos"))
    _refused(run_dedal, up, tmp_path, "repos is a symlink (-> ../../../etc)")


@pytest.mark.reliability
def test_an_env_yaml_naming_host_paths_is_refused(run_dedal, tmp_path):
    require_root()
    include = _sif(
        tmp_path,
        "include",
        lambda root: _carried(
            root, env_yaml="spack:\n  specs: [zlib]\n  include: [/etc/shadow]\ndedal: {name: x, base_image: host}\n"
        ),
    )
    _refused(run_dedal, include, tmp_path, "spack.include names '/etc/shadow'")
    base = _sif(
        tmp_path,
        "base",
        lambda root: _carried(
            root, env_yaml="spack:\n  specs: [zlib]\ndedal: {name: x, base_image: /root/evil.yaml}\n"
        ),
    )
    _refused(run_dedal, base, tmp_path, "dedal.base_image is the path '/root/evil.yaml'")


@pytest.mark.reliability
@pytest.mark.parametrize("scrambled,says", [(1.0, "cannot be mounted"), (0.5, "cannot read opt/dedal/env/")])
def test_a_corrupt_partition_is_one_line_and_leaves_nothing(run_dedal, tmp_path, scrambled, says):
    """Everything after the superblock scrambled: the mount fails; the file data only (the
    tables at the end intact): the mount works and reading fails (EIO). Was `internal
    error` (exit 70, a shutil.Error list) and a partial env/."""
    require_root()
    image = _sif(
        tmp_path, "corrupt", lambda root: _carried(root, **{f"f{i}.txt": os.urandom(50000).hex() for i in range(8)})
    )
    part = sif.primary_partition(sif.read_sif(image))
    with open(image, "r+b") as fh:
        fh.seek(part.offset + 96)
        fh.write(os.urandom(int((part.size - 96) * scrambled)))
    _refused(run_dedal, image, tmp_path, says, "the image is corrupt")
