"""git, through GitPython: pinned checkouts of Spack and of spack-envs repositories, and the
paths that changed between two commits (`dedal ci generate --changed-since`)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

import git

from dedal.errors import ToolError, UserError
from dedal.model.artifacts import atomic_path, reap_temporaries


def _error(what: str, exc: git.GitCommandError, log: Path = None) -> ToolError:
    cmd = exc.command if isinstance(exc.command, list) else str(exc.command).split()
    detail = (exc.stderr or "").strip().replace("\n", " ")[:300]
    return ToolError(what, [str(c) for c in cmd], exc.status if isinstance(exc.status, int) else 1, log, detail)


def _read(path: Path, search_parent_directories: bool = False) -> git.Repo:
    """A repository dedal only reads (its commit, origin, changed paths), trusted although
    another user owns it, as ``safe.directory`` would: a site's shared Spack checkout, the
    clone a CI runner made as its own user. git refused those ("dubious ownership") and
    dedal ended in an internal error. Reading them trusts them no further than running
    that Spack's code, or that repository's environment files, already does."""
    repo = git.Repo(path, search_parent_directories=search_parent_directories)
    where = repo.working_tree_dir or repo.git_dir
    repo.git.update_environment(GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="safe.directory", GIT_CONFIG_VALUE_0=where)
    return repo


def head_commit(path: Path) -> str:
    return _read(path).head.commit.hexsha


def origin(path: Path) -> Tuple[Optional[str], Optional[str]]:
    """(URL of the ``origin`` remote, HEAD commit) of the repository that holds ``path``;
    None for what is unknown (no repository, no origin, no commit yet)."""
    try:
        repo = _read(path, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return None, None
    try:
        url: Optional[str] = repo.remotes.origin.url if "origin" in [r.name for r in repo.remotes] else None
    except (git.GitCommandError, ValueError):
        url = None
    try:
        commit: Optional[str] = repo.head.commit.hexsha
    except (ValueError, git.GitCommandError):
        commit = None
    return url, commit


def commit_time(path: Path, commit: str) -> Optional[int]:
    """The committer time (seconds since 1970) of ``commit`` in the repository at ``path``;
    None where ``path`` is no git repository or lacks that commit."""
    try:
        return int(_read(path).commit(commit).committed_date)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError, git.BadName, ValueError, git.GitCommandError):
        return None


def _commit_of(repo: git.Repo, ref: str, url: str) -> git.Commit:
    """The commit ``ref`` names after a fetch from ``url``: the remote's branch of that name
    first (a local branch of a clone is not moved by a fetch), else a tag or commit."""
    try:
        if f"origin/{ref}" in [r.name for r in repo.remotes.origin.refs]:
            return repo.commit(f"origin/{ref}")
        return repo.commit(ref)
    except (git.BadName, ValueError):
        raise ToolError(
            f"checking out {ref}", ["git", "checkout", ref], 1, None, f"{ref!r} is not a commit, tag or branch of {url}"
        ) from None


def checkout(url: str, ref: str, dest: Path) -> str:
    """Make ``dest`` a checkout of ``url`` at ``ref`` (commit, tag or branch); return the
    commit. An existing checkout at that commit is left alone (no network needed); one at
    another commit is fetched and switched. A fresh clone goes to a temporary directory
    first, so an interrupted clone never looks like a checkout."""
    dest = Path(dest)
    if (dest / ".git").exists():
        repo = git.Repo(dest)
        try:
            if repo.commit(ref).hexsha == repo.head.commit.hexsha:
                return repo.head.commit.hexsha
        except (git.BadName, ValueError, git.GitCommandError):
            pass  # ref not known locally: fetch it
        try:
            repo.remotes.origin.set_url(url)
            repo.remotes.origin.fetch(tags=True)
            repo.git.checkout("--detach", _commit_of(repo, ref, url).hexsha)
        except git.GitCommandError as exc:
            raise _error(f"updating {dest} from {url}", exc) from None
        return repo.head.commit.hexsha
    dest.parent.mkdir(parents=True, exist_ok=True)
    reap_temporaries(dest.parent, of=dest.name)  # half clones of killed runs
    with atomic_path(dest) as tmp:
        try:
            repo = git.Repo.clone_from(url, tmp, no_checkout=True)
            commit = _commit_of(repo, ref, url)
            repo.git.checkout("--detach", commit.hexsha)
        except git.GitCommandError as exc:
            raise _error(f"cloning {url}", exc) from None
    return commit.hexsha


def toplevel(path: Path) -> Path:
    """The root of the git working tree that holds ``path``; UserError outside one."""
    try:
        repo = _read(path, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise UserError(f"{path}: not inside a git repository") from None
    if repo.working_tree_dir is None:
        raise UserError(f"{path}: a bare git repository has no working tree")
    return Path(repo.working_tree_dir)


def changed_paths(path: Path, since: str, until: str = "HEAD") -> Optional[List[str]]:
    """Paths (relative to the repository root, '/'-separated, sorted) that differ between
    the commits ``since`` and ``until`` of the repository holding ``path``; a rename counts
    as its old and its new path. None when ``since`` is no commit of this clone: empty,
    all zeros (GitLab's CI_COMMIT_BEFORE_SHA of a new branch) or outside a shallow clone."""
    repo = _read(toplevel(path))
    if not since or set(since) == {"0"}:
        return None
    try:
        old = repo.commit(since)
    except (git.BadName, ValueError, git.GitCommandError):
        return None
    try:
        new = repo.commit(until)
        out = repo.git.diff("--name-only", "--no-renames", "-z", old.hexsha, new.hexsha)
    except (git.BadName, ValueError):
        raise UserError(f"{until!r} is not a commit of {repo.working_tree_dir}") from None
    except git.GitCommandError as exc:
        raise _error(f"comparing {since} with {until}", exc) from None
    return sorted(p for p in out.split("\0") if p)


def _plain(git_dir: Path) -> "git.Git":
    """git commands on the repository at ``git_dir`` (bare or not, a mirror's copy without
    a config file too), named explicitly rather than searched for from a directory."""
    path = Path(git_dir)
    if not path.is_dir():
        raise UserError(f"{git_dir}: not a git repository (no such directory)")
    inner = path / ".git"
    g = git.Git(str(path))
    g.update_environment(GIT_DIR=str(inner if inner.is_dir() else path))
    return g


def resolve(git_dir: Path, ref: str) -> Optional[str]:
    """The commit ``ref`` (a tag, branch, full or abbreviated commit) names in the
    repository at ``git_dir``; None where it names none there (or there is no repository)."""
    if not Path(git_dir).is_dir():
        return None
    try:
        return _plain(git_dir).rev_parse("--verify", "--quiet", f"{ref}^{{commit}}").strip() or None
    except git.GitCommandError:
        return None


def has_commit(git_dir: Path, commit: str) -> bool:
    """Whether the repository at ``git_dir`` holds ``commit`` (40 hex digits)."""
    return resolve(git_dir, commit) == commit


def mirror_clone(url: str, dest: Path, commit: str) -> Path:
    """A bare clone of ``url`` at ``dest`` that holds ``commit``: made the first time
    (through a temporary name), fetched when it lacks the commit, left alone otherwise
    (no network needed then)."""
    dest = Path(dest)
    if dest.exists():
        if has_commit(dest, commit):
            return dest
        try:
            _plain(dest).fetch(url, "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")
        except git.GitCommandError as exc:
            raise _error(f"fetching {url} into {dest}", exc) from None
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
        reap_temporaries(dest.parent, of=dest.name)
        with atomic_path(dest) as tmp:
            try:
                git.Repo.clone_from(url, tmp, bare=True)
            except git.GitCommandError as exc:
                raise _error(f"cloning {url}", exc) from None
    if not has_commit(dest, commit):
        raise ToolError(
            f"finding commit {commit[:12]}", ["git", "cat-file", "-e", commit], 1, None, f"{url} has no commit {commit}"
        )
    return dest


def archive(git_dir: Path, commit: str, prefix: str, dest: Path) -> None:
    """``git archive`` of ``commit`` with every path under ``prefix``, gzip'ed by GNU gzip
    without name or time (``gzip -n``, as GitHub's archive URLs serve them): the same
    bytes from every clone. Written to a temporary name beside ``dest``, then renamed."""
    with atomic_path(Path(dest)) as tmp:
        try:
            # tar.<format>.command: git pipes its tar stream through the command
            _plain(git_dir)(c="tar.tar.gz.command=gzip -cn").archive(
                "--format=tar.gz", f"--prefix={prefix}", "-o", str(tmp), commit
            )
        except git.GitCommandError as exc:
            raise _error(f"archiving {commit[:12]} of {git_dir}", exc) from None
