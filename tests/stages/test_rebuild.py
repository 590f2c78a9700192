"""`dedal rebuild IMAGE`: the tiny environment's image rebuilt from what it carries, in a work
directory of its own, is identical; a doctored image is not, and the diff says where."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dedal.model import sif
from tests.fixtures.images import build_env, require_root


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    require_root()
    tmp = tmp_path_factory.mktemp("rebuild")
    built = build_env(tmp / "orig", "tiny", "host", {"labels": {"maintainer": "dedal tests"},
                                                     "description": "rebuild test"})
    result = built.assemble_json("-o", str(tmp / "orig.sif"))
    return built, tmp / "orig.sif", result


def _rebuild(built, image: Path, tmp: Path, *args: str):
    env = {"DEDAL_DATA_DIR": str(tmp / "data"), "DEDAL_CACHE_DIR": str(tmp / "cache"),
           "DEDAL_STAGE_DIR": str(tmp / "stage")}  # the mirror and Spack: the original's (inputs)
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
