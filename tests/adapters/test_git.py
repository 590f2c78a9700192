"""dedal.adapters.git: the archives of pinned commits (the same bytes from every clone,
gzip'ed as `gzip -n` does), commits and refs resolved, and bare clones for them; against
repositories made here (no network)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tarfile
from pathlib import Path

import git
import pytest

from dedal.adapters import git as gitad
from dedal.errors import ToolError, UserError


@pytest.fixture
def repo(tmp_path) -> git.Repo:
    """A repository with two commits, the first tagged v1.0 (annotated)."""
    r = git.Repo.init(tmp_path / "src")
    with r.config_writer() as cw:
        cw.set_value("user", "name", "t")
        cw.set_value("user", "email", "t@example.org")
    (tmp_path / "src" / "configure").write_text("#!/bin/sh\necho configured\n")
    (tmp_path / "src" / "configure").chmod(0o755)
    (tmp_path / "src" / "README").write_text("one\n")
    r.index.add(["configure", "README"])
    r.index.commit("first")
    r.create_tag("v1.0", message="release 1.0")
    (tmp_path / "src" / "README").write_text("two\n")
    r.index.add(["README"])
    r.index.commit("second")
    return r


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_archive_is_git_archive_through_gzip_n(repo, tmp_path):
    first = repo.commit("v1.0").hexsha
    out = tmp_path / "a.tar.gz"
    gitad.archive(Path(repo.working_dir), first, "pkg-1.0/", out)
    reference = subprocess.run(
        f"git archive --format=tar --prefix=pkg-1.0/ {first} | gzip -cn",
        shell=True,
        cwd=repo.working_dir,
        check=True,
        capture_output=True,
    ).stdout
    assert out.read_bytes() == reference
    head = out.read_bytes()[:10]
    assert head[:2] == b"\x1f\x8b" and head[3] & 0x08 == 0 and head[4:8] == b"\0\0\0\0"  # no name, no time
    with tarfile.open(out) as tar:
        names = tar.getnames()
        assert tar.extractfile("pkg-1.0/README").read() == b"one\n"
        assert tar.getmember("pkg-1.0/configure").mode & 0o111
    assert set(names) == {"pkg-1.0", "pkg-1.0/README", "pkg-1.0/configure"}
    assert list(tmp_path.glob(".a.tar.gz.tmp~*")) == []


def test_the_same_bytes_from_a_bare_clone_without_config(repo, tmp_path):
    """A mirror's copy of a repository may be bare and lack its config file."""
    first = repo.commit("v1.0").hexsha
    gitad.archive(Path(repo.working_dir), first, "p/", tmp_path / "one.tar.gz")
    bare = tmp_path / "bare"
    git.Repo.clone_from(repo.working_dir, bare, bare=True)
    (bare / "config").unlink()
    assert gitad.resolve(bare, "v1.0") == first and gitad.has_commit(bare, first)
    gitad.archive(bare, first, "p/", tmp_path / "two.tar.gz")
    assert sha(tmp_path / "one.tar.gz") == sha(tmp_path / "two.tar.gz")


def test_resolve_and_has_commit(repo):
    path = Path(repo.working_dir)
    first, second = repo.commit("v1.0").hexsha, repo.head.commit.hexsha
    assert gitad.resolve(path, "v1.0") == first  # an annotated tag: its commit
    assert gitad.resolve(path, first[:7]) == first  # an abbreviation
    assert gitad.resolve(path, "HEAD") == second
    assert gitad.resolve(path, "v9") is None and gitad.resolve(path, "0" * 40) is None
    assert gitad.has_commit(path, first) and not gitad.has_commit(path, first[:7])
    assert not gitad.has_commit(path.parent / "nowhere", first)


def test_archive_of_an_unknown_commit_fails_and_leaves_nothing(repo, tmp_path):
    with pytest.raises(ToolError) as err:
        gitad.archive(Path(repo.working_dir), "0" * 40, "p/", tmp_path / "x.tar.gz")
    assert "archiving 000000000000" in err.value.one_line()
    assert list(tmp_path.glob("*x.tar.gz*")) == []
    with pytest.raises(UserError, match="not a git repository"):
        gitad.archive(tmp_path / "nowhere", "0" * 40, "p/", tmp_path / "x.tar.gz")


def test_mirror_clone_clones_once_and_fetches_what_it_lacks(repo, tmp_path):
    url = Path(repo.working_dir).as_uri()
    first = repo.commit("v1.0").hexsha
    dest = tmp_path / "cache" / "src.git"
    assert gitad.mirror_clone(url, dest, first) == dest
    assert (dest / "HEAD").is_file() and not (dest / ".git").exists()  # bare
    shutil.rmtree(Path(repo.working_dir) / ".git" / "refs" / "tags")  # the origin changes ...
    assert gitad.mirror_clone("file:///nowhere", dest, first) == dest  # ... present: no contact at all
    (Path(repo.working_dir) / "NEW").write_text("3\n")
    repo.index.add(["NEW"])
    third = repo.index.commit("third").hexsha
    assert gitad.mirror_clone(url, dest, third) == dest and gitad.has_commit(dest, third)
    with pytest.raises(ToolError, match="has no commit"):
        gitad.mirror_clone(url, dest, "1" * 40)
    with pytest.raises(ToolError, match="cloning file:///nowhere"):
        gitad.mirror_clone("file:///nowhere", tmp_path / "other.git", first)
    assert not list((tmp_path).glob("other.git*"))


def test_a_repository_another_user_owns_is_read(repo, tmp_path) -> None:
    """A site's shared Spack checkout, a CI runner's clone: git calls them of "dubious
    ownership" and refuses to read them; dedal ended in an internal error (ValueError: SHA is
    empty). Reading their commit, origin and changed paths works."""
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root to give the repository to another user")
    src = Path(repo.working_tree_dir)
    head = repo.head.commit.hexsha
    first = repo.commit("v1.0").hexsha
    repo.close()
    for d, _dirs, files in os.walk(src):
        for name in [d, *(os.path.join(d, f) for f in files)]:
            os.lchown(name, 65534, 65534)
    with pytest.raises(ValueError, match="dubious ownership"):
        git.Repo(src).head.commit  # noqa: B018 -- git itself refuses: what the test stands on
    assert gitad.head_commit(src) == head
    assert gitad.origin(src / "README")[1] == head and gitad.commit_time(src, first) is not None
    assert gitad.toplevel(src) == src and gitad.changed_paths(src, first) == ["README"]
