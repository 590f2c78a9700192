#!/usr/bin/env python3
"""Put the sources that recipes take from git repositories into dedal's Spack source mirror:
each entry of a ``git-sources.json`` manifest (``recipes/repo/git-sources.json``) archived
at its pinned commit, checked against the sha256 recorded there, stored where Spack looks
for it (``_source-cache/archive/<sha256[:2]>/<sha256>.tar.gz``, with the
``<package>/<package>-<version>.tar.gz`` link beside). See ``README.md`` here.

    .venv/bin/python recipes/gitsrc/archive.py [--mirror DIR] [--git-dir PACKAGE=DIR ...]
                                               [--record] [--manifest FILE] [--json] [PACKAGE ...]

The commit comes from ``--git-dir`` (a clone, bare or not, that holds it) or from a bare
clone of the entry's repository in dedal's cache (``<cache_dir>/gitsrc/``; network the first
time). ``--record`` writes the archive's sha256 and size into the manifest (a new entry, or
a commit pinned anew); without it an archive whose sha256 is not the recorded one is
refused. Exit 0: every archive in the mirror; 1: a checksum or commit that does not match,
a clone that failed; 2: bad input (one line).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from dedal.adapters import git as gitad  # noqa: E402
from dedal.errors import DedalError, UserError  # noqa: E402
from dedal.model import git_sources  # noqa: E402
from dedal.model.config import load_settings  # noqa: E402

DEFAULT_MANIFEST = ROOT / "recipes" / "repo" / git_sources.MANIFEST


class Mismatch(DedalError):
    """The archive of the pinned commit is not what the manifest records (exit 1)."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def clone_dir(cache_dir: Path, url: str) -> Path:
    """Where the bare clone of ``url`` lives in dedal's cache."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "+", url.split("://", 1)[-1]).strip("+")
    return cache_dir / "gitsrc" / f"{name}.git"


def parse_git_dirs(pairs: List[str], manifest: git_sources.GitSources) -> Dict[str, Path]:
    found: Dict[str, Path] = {}
    for pair in pairs:
        package, sep, path = pair.partition("=")
        if not sep or not package or not path:
            raise UserError(f"--git-dir {pair!r}: expected PACKAGE=DIR")
        if manifest.find(package) is None:
            raise UserError(f"--git-dir {pair!r}: {package} is not in {manifest.path}")
        if not Path(path).is_dir():
            raise UserError(f"--git-dir {pair!r}: {path} is not a directory")
        found[package] = Path(path)
    return found


def place(archive: Path, mirror: Path, entry: git_sources.GitSource) -> str:
    """Move ``archive`` (sha256 of ``entry``) to its mirror path; 'present' when an equal
    file is there already, else 'added'. The cosmetic link is (re)made either way."""
    dest = mirror / entry.storage_path
    status = "present" if dest.is_file() and sha256_of(dest) == entry.sha256 else "added"
    dest.parent.mkdir(parents=True, exist_ok=True)
    if status == "added":
        os.chmod(archive, 0o644)
        os.replace(archive, dest)
    else:
        archive.unlink()
    link = mirror / entry.cosmetic_path
    link.parent.mkdir(parents=True, exist_ok=True)
    target = os.path.relpath(dest, link.parent)
    if not (link.is_symlink() and os.readlink(link) == target):
        tmp = link.with_name(f".{link.name}.tmp-{os.getpid()}")
        tmp.unlink(missing_ok=True)
        os.symlink(target, tmp)
        os.replace(tmp, link)
    return status


def archive_one(entry: git_sources.GitSource, git_dir: Path, mirror: Path, record: bool) -> Dict[str, object]:
    """Archive ``entry``'s commit from ``git_dir`` into ``mirror``; returns what was done
    (with the entry as recorded afterwards under ``entry``)."""
    if not gitad.has_commit(git_dir, entry.commit):
        raise Mismatch(f"{entry.spec}: {git_dir} has no commit {entry.commit}")
    named = gitad.resolve(git_dir, entry.ref)
    if named is not None and named != entry.commit:
        raise Mismatch(f"{entry.spec}: {entry.ref} names {named} in {git_dir}, the manifest pins {entry.commit}")
    work = mirror / "_source-cache" / "archive"
    work.mkdir(parents=True, exist_ok=True)
    tmp = work / f".gitsrc-{entry.package}-{os.getpid()}.tar.gz"
    gitad.archive(git_dir, entry.commit, entry.prefix, tmp)
    try:
        digest, size = sha256_of(tmp), tmp.stat().st_size
        before = entry
        if (entry.sha256, entry.size) != (digest, size):
            if not record:
                raise Mismatch(
                    f"{entry.spec}: the archive of {entry.commit[:12]} has sha256 {digest} "
                    f"({size} bytes), "
                    + (
                        f"the manifest records {entry.sha256} ({entry.size} bytes)"
                        if entry.sha256
                        else "the manifest records none (run with --record)"
                    )
                )
            entry = dataclasses.replace(entry, sha256=digest, size=size)
        status = place(tmp, mirror, entry)
    finally:
        tmp.unlink(missing_ok=True)
    return {
        "spec": entry.spec,
        "repository": entry.repository,
        "ref": entry.ref,
        "commit": entry.commit,
        "sha256": entry.sha256,
        "size": entry.size,
        "path": str(mirror / entry.storage_path),
        "status": status,
        "recorded": entry != before,
        "entry": entry,
    }


def run(args: argparse.Namespace) -> int:
    manifest = git_sources.read(args.manifest)
    settings = load_settings()
    mirror = Path(args.mirror) if args.mirror else Path(settings.mirror)
    git_dirs = parse_git_dirs(args.git_dir or [], manifest)
    unknown = [p for p in args.packages if manifest.find(p) is None]
    if unknown:
        raise UserError(
            f"{unknown[0]}: not in {args.manifest} "
            f"(it lists {', '.join(sorted({s.package for s in manifest.sources}))})"
        )
    chosen = [s for s in manifest.sources if not args.packages or s.package in args.packages]
    done: List[Dict[str, object]] = []
    for entry in chosen:
        git_dir = git_dirs.get(entry.package)
        if git_dir is None:
            git_dir = gitad.mirror_clone(
                entry.repository, clone_dir(Path(settings.cache_dir), entry.repository), entry.commit
            )
        result = archive_one(entry, git_dir, mirror, args.record)
        recorded = result.pop("entry")
        if result["recorded"]:
            manifest = manifest.replaced(recorded)
            manifest.write(args.manifest)
        done.append(result)
        if not args.json:
            line = (
                f"{result['spec']}: {str(result['commit'])[:12]} of {result['repository']} -> "
                f"{result['path']} (sha256 {result['sha256']}, {result['size']} bytes, {result['status']})"
            )
            print(line + (f"; recorded in {args.manifest}" if result["recorded"] else ""))
    if args.json:
        print(json.dumps(done, indent=1))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="archive.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("packages", nargs="*", metavar="PACKAGE", help="only these entries (default: all)")
    ap.add_argument("--manifest", type=Path, default=DEFAULT_MANIFEST, help="the git-sources.json (recipes/repo's)")
    ap.add_argument("--mirror", help="the Spack source mirror (default: dedal's mirror setting)")
    ap.add_argument(
        "--git-dir",
        action="append",
        metavar="PACKAGE=DIR",
        help="a clone that holds the package's commit (default: a bare clone in dedal's cache)",
    )
    ap.add_argument("--record", action="store_true", help="write the archives' sha256 and size into the manifest")
    ap.add_argument("--json", action="store_true", help="what was done, as JSON")
    args = ap.parse_args(argv)
    try:
        return run(args)
    except DedalError as exc:
        print(f"archive.py: error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
