"""The fetch stage against local git repositories (bare clones standing in for the Spack
and spack-envs remotes), the Spack stand-in and local mirrors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import git
import pytest
import yaml

from dedal.adapters import git as gitad
from dedal.errors import ToolError
from tests.conftest import SPACK_DATA
from tests.fixtures.tiny import TINY_PACKAGES
from tests.standin import install_standin

pytestmark = pytest.mark.usefixtures("as_root")


def make_remote(tmp_path: Path, name: str, files: dict) -> tuple:
    """A bare repository with two commits; returns (url, first commit, second commit)."""
    work = tmp_path / f"{name}-work"
    repo = git.Repo.init(work)
    commits = []
    for round_ in range(2):
        for rel, content in files.items():
            path = work / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, Path):
                shutil.copy2(content, path)
            else:
                path.write_text(content + ("" if round_ == 0 else "\n# second commit\n"))
        repo.git.add(A=True)
        repo.index.commit(f"commit {round_}")
        commits.append(repo.head.commit.hexsha)
    bare = tmp_path / f"{name}.git"
    git.Repo.clone_from(work, bare, bare=True)
    return str(bare), commits[0], commits[1]


def spack_remote(tmp_path: Path) -> tuple:
    standin = install_standin(tmp_path / "standin-src")
    return make_remote(
        tmp_path,
        "spack",
        {"bin/spack": standin / "bin" / "spack", "standin.json": (standin / "standin.json").read_text()},
    )


def tiny_env_file(directory: Path, with_lock: bool) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    env_file = directory / "env.yaml"
    env_file.write_text(
        yaml.safe_dump(
            {
                "spack": {"specs": ["dedal-app"], "concretizer": {"unify": True}},
                "dedal": {"name": "tiny", "base_image": "host", "install_root": "/opt/esd/software"},
            }
        )
    )
    if with_lock:
        shutil.copyfile(SPACK_DATA / "tiny-dedal.spack.lock", directory / "spack.lock")
    return env_file


def test_git_checkout_pins_updates_and_works_without_the_remote(tmp_path):
    url, first, second = make_remote(tmp_path, "repo", {"README": "hello"})
    dest = tmp_path / "checkout"
    assert gitad.checkout(url, first, dest) == first
    assert gitad.head_commit(dest) == first
    shutil.move(url, url + ".gone")  # offline: an existing checkout at the ref needs no remote
    assert gitad.checkout(url, first, dest) == first
    shutil.move(url + ".gone", url)
    assert gitad.checkout(url, second, dest) == second  # another ref: fetched and switched
    assert gitad.checkout(url, "master" if "master" in git.Repo(url).heads else "main", tmp_path / "b") == second
    with pytest.raises(ToolError, match="not a commit, tag or branch"):
        gitad.checkout(url, "no-such-ref", tmp_path / "c")
    assert not (tmp_path / "c").exists() and not list(tmp_path.glob(".c.tmp~*"))
    with pytest.raises(ToolError, match="not a commit, tag or branch"):  # an existing checkout: fetched, then refused
        gitad.checkout(url, "no-such-ref", dest)
    assert gitad.head_commit(dest) == second  # left where it was


def test_fetch_clones_spack_concretizes_fills_mirror_and_plans(run_dedal, tmp_path):
    url, first, _second = spack_remote(tmp_path)
    env_file = tiny_env_file(tmp_path / "env", with_lock=False)
    env = {"DEDAL_DATA_DIR": str(tmp_path / "data"), "DEDAL_SPACK_URL": url, "DEDAL_SPACK_REF": first}
    res = run_dedal("fetch", str(env_file), "--json", env=env)
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    assert result["spack_commit"] == first and result["concretized"] is True
    lock = json.loads(Path(result["lock"]).read_text())
    assert lock == json.loads((SPACK_DATA / "tiny-dedal.spack.lock").read_text())  # the stand-in replays it
    mirror = tmp_path / "data" / "mirror"
    assert sorted(p.name for p in mirror.iterdir() if p.is_dir() and not p.name.startswith("_")) == TINY_PACKAGES
    plan = json.loads(Path(result["plan"]).read_text())
    assert len(plan["to_build"]) == 5 and plan["base_image"] == "host"
    # a rerun concretizes nothing and fetches nothing
    again = json.loads(run_dedal("fetch", str(env_file), "--json", env=env).stdout)
    assert again["concretized"] is False and again["fetched"] == 0


def test_fetch_concretizes_again_when_a_local_recipe_changes(run_dedal, tmp_path):
    """The lock stands for the manifest and the recipes of its local repositories: a new
    patch or version in a recipe must not build the old concretization."""
    spack = install_standin(tmp_path / "spack")
    env_file = tiny_env_file(tmp_path / "env", with_lock=False)
    recipe = tmp_path / "recipes" / "packages" / "libdedal" / "package.py"
    recipe.parent.mkdir(parents=True)
    (tmp_path / "recipes" / "repo.yaml").write_text("repo:\n  namespace: local\n")
    recipe.write_text("# version 1\n")
    data = yaml.safe_load(env_file.read_text())
    data["spack"]["repos"] = [str(tmp_path / "recipes")]
    env_file.write_text(yaml.safe_dump(data))
    env = {"DEDAL_DATA_DIR": str(tmp_path / "data"), "DEDAL_SPACK_ROOT": str(spack)}

    def fetch() -> dict:
        res = run_dedal("fetch", str(env_file), "--json", env=env)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    assert fetch()["concretized"] is True
    assert fetch()["concretized"] is False
    recipe.write_text("# version 1\npatch('fix.patch')\n")
    assert fetch()["concretized"] is True
    assert fetch()["concretized"] is False


def test_fetch_respects_a_given_lock(run_dedal, tmp_path):
    spack = install_standin(tmp_path / "spack")
    env_file = tiny_env_file(tmp_path / "env", with_lock=True)
    given = json.loads((env_file.parent / "spack.lock").read_text())
    given["spack"]["commit"] = "given-by-the-user"  # still a valid lock, visibly ours
    (env_file.parent / "spack.lock").write_text(json.dumps(given))
    env = {"DEDAL_DATA_DIR": str(tmp_path / "data"), "DEDAL_SPACK_ROOT": str(spack)}
    result = json.loads(run_dedal("fetch", str(env_file), "--json", env=env).stdout)
    assert result["concretized"] is False
    assert json.loads(Path(result["lock"]).read_text())["spack"]["commit"] == "given-by-the-user"


def test_fetch_offline_names_the_missing_sources(run_dedal, tmp_path):
    spack = install_standin(tmp_path / "spack", unreachable=["libdedal"])
    env_file = tiny_env_file(tmp_path / "env", with_lock=True)
    env = {"DEDAL_DATA_DIR": str(tmp_path / "data"), "DEDAL_SPACK_ROOT": str(spack)}
    res = run_dedal("fetch", str(env_file), env=env)
    assert res.returncode == 1
    err = res.stderr
    assert "libdedal@1.0" in err and "DEDAL_SPACK_ROOT" in err and "mirror" in err and "Traceback" not in err
    assert not (tmp_path / "data" / "work" / "tiny" / "plan.json").exists()


def test_fetch_lock_only_concretizes_and_plans_without_touching_the_mirror(run_dedal, tmp_path):
    """--lock-only: does the environment concretize (offline)? The sources a full fetch
    would miss (libdedal unreachable) do not matter, and the mirror stays empty."""
    spack = install_standin(tmp_path / "spack", unreachable=["libdedal"])
    env_file = tiny_env_file(tmp_path / "env", with_lock=False)
    env = {"DEDAL_DATA_DIR": str(tmp_path / "data"), "DEDAL_SPACK_ROOT": str(spack)}
    res = run_dedal("fetch", str(env_file), "--lock-only", "--json", env=env)
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    assert result["concretized"] is True and result["mirrored"] is False and result["sources"] == 0
    assert json.loads(Path(result["lock"]).read_text()) == json.loads(
        (SPACK_DATA / "tiny-dedal.spack.lock").read_text()
    )
    assert len(json.loads(Path(result["plan"]).read_text())["to_build"]) == 5
    mirror = tmp_path / "data" / "mirror"
    assert not mirror.exists() or not any(mirror.iterdir())
    text = run_dedal("fetch", str(env_file), "--lock-only", env=env)
    assert text.returncode == 0 and "(unchanged)" in text.stdout and "mirror not filled" in text.stdout
    # the full fetch still names the source it cannot get
    full = run_dedal("fetch", str(env_file), env=env)
    assert full.returncode == 1 and "libdedal@1.0" in full.stderr


def test_fetch_without_spack_says_how_to_provide_one(run_dedal, tmp_path):
    env_file = tiny_env_file(tmp_path / "env", with_lock=True)
    env = {"DEDAL_DATA_DIR": str(tmp_path / "data"), "DEDAL_SPACK_URL": str(tmp_path / "nowhere.git")}
    res = run_dedal("fetch", str(env_file), env=env)
    assert res.returncode == 2
    assert "cannot obtain Spack" in res.stderr and "DEDAL_SPACK_ROOT" in res.stderr


def test_fetch_environment_from_a_spack_envs_repository(run_dedal, tmp_path):
    spack = install_standin(tmp_path / "spack")
    content = yaml.safe_dump({"spack": {"specs": ["dedal-app"]}, "dedal": {"name": "tiny", "base_image": "host"}})
    url, first, second = make_remote(tmp_path, "envs", {"spack-envs/tiny/env.yaml": content})
    env = {"DEDAL_DATA_DIR": str(tmp_path / "data"), "DEDAL_SPACK_ROOT": str(spack)}
    res = run_dedal("fetch", "spack-envs/tiny/env.yaml", "--envs-url", url, "--envs-ref", first, "--json", env=env)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["env"] == "tiny"


def test_current_says_why_fetch_concretizes_again(tmp_path):
    from dedal.stages.fetch import CONCRETIZED_STAMP, current

    assert current(tmp_path, "d1") == "no spack.lock yet"
    (tmp_path / "spack.lock").write_text("{}")
    assert "no .concretized-from stamp" in current(tmp_path, "d1")
    (tmp_path / CONCRETIZED_STAMP).write_text("d0")
    assert "changed since the last concretization" in current(tmp_path, "d1")
    (tmp_path / CONCRETIZED_STAMP).write_text("d1")
    assert current(tmp_path, "d1") is None
    assert "is given" in current(tmp_path, "d1", given_lock=tmp_path / "other.lock")


def test_fetch_stages_the_work_directory_once_and_parses_the_lock_once(tmp_path, monkeypatch):
    """fetch writes spack.yaml and carries its includes, concretizes, then writes only the
    plan: before, its last step staged the directory again (the includes copied twice)."""
    from dedal.model import spack_env, spack_lock
    from dedal.model.config import load_settings
    from dedal.model.target import resolve
    from dedal.stages.fetch import run_fetch

    env_file = tiny_env_file(tmp_path / "env", with_lock=False)
    packages = tmp_path / "env" / "packages.yaml"
    packages.write_text("packages: {}\n")
    data = yaml.safe_load(env_file.read_text())
    data["spack"]["include"] = [str(packages)]
    env_file.write_text(yaml.safe_dump(data))
    settings = load_settings(
        config_file=None,
        environ={},
        overrides={"data_dir": str(tmp_path / "data"), "spack_root": str(install_standin(tmp_path / "spack"))},
    )
    seen = {"carry_includes": 0, "parse_lock": 0}
    carry, parse = spack_env.carry_includes, spack_lock.parse_lock

    def counted(name, fn):  # noqa: ANN001, ANN202
        def call(*a, **k):  # noqa: ANN002, ANN003, ANN202
            seen[name] += 1
            return fn(*a, **k)

        return call

    monkeypatch.setattr(spack_env, "carry_includes", counted("carry_includes", carry))
    monkeypatch.setattr(spack_lock, "parse_lock", counted("parse_lock", parse))
    result, prepared = run_fetch(resolve(str(env_file), settings), sources_too=False)
    assert result.concretized and seen == {"carry_includes": 1, "parse_lock": 1}
    work = Path(result.lock).parent
    staged = yaml.safe_load((work / "spack.yaml").read_text())["spack"]["include"]
    assert staged == [str(work / "includes" / "00-packages.yaml")] and Path(staged[0]).is_file()
    assert prepared.path == work / "plan.json" and prepared.path.is_file()
