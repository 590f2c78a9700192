"""The Spack environment directories dedal generates for Spack to work in.

Spack gives values in an environment's spack.yaml priority over ``-c`` overrides
(../shared/notes/spack-offline.md §1), so every stage writes a complete spack.yaml:
the user's ``spack:`` section plus the install tree, stages, mirror and view that
stage needs. The lock is copied next to it, so Spack never re-concretizes.
"""

from __future__ import annotations

import copy
import hashlib
import os
import shutil
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Union

import yaml

from dedal.errors import UserError
from dedal.model.artifacts import write_atomic
from dedal.model.inputs import load_yaml

PROJECTION = "{name}-{version}-{hash}"


def read_spack_yaml(path: Path) -> Dict[str, Any]:
    if not Path(path).exists():
        raise UserError(f"{path}: no such Spack manifest")
    data = load_yaml(path)
    if not isinstance(data, dict) or not isinstance(data.get("spack"), dict):
        raise UserError(f"{path}: not a Spack manifest (no 'spack:' section)")
    return data


def minimal_manifest(root_specs: Dict[str, str]) -> Dict[str, Any]:
    """A manifest for a bare lock: its roots' abstract specs (builtin recipes only)."""
    specs = sorted({s for s in root_specs.values() if s})
    return {"spack": {"specs": specs, "concretizer": {"unify": True}, "view": False}}


def stage_manifest(
    user: Dict[str, Any],
    *,
    install_root: str,
    stage: Path,
    mirror: Optional[Path] = None,
    view: Union[bool, str] = False,
    build_jobs: int = 0,
) -> Dict[str, Any]:
    """The user's manifest with what one stage needs; nothing of the user's is lost
    except settings that would break a fixed, unpadded install root."""
    data = copy.deepcopy(user)
    spack = data["spack"]
    for key in list(spack):  # drop any "mirrors::"-style variants; ours replaces them
        if key.rstrip(":") == "mirrors" or key.rstrip(":") == "view":
            del spack[key]
    config = spack.setdefault("config", {})
    if not isinstance(config, dict):
        raise UserError("spack.config must be a mapping")
    config["install_tree"] = {"root": str(install_root), "projections": {"all": PROJECTION}}
    config["build_stage"] = [str(stage / "spack-stage")]
    config["source_cache"] = str(stage / "source-cache")
    config["checksum"] = True
    if build_jobs:
        config["build_jobs"] = int(build_jobs)
    if mirror is not None:
        # file://localhost/<path>, not file:///<path>: Spack 0.23 on Python 3.13 (Debian
        # trixie) turns the latter into "file:path" (urlunsplit no longer adds "//"
        # for an empty host) and finds nothing in the mirror. The path as given (made
        # absolute), not resolved: the sandbox binds the mirror at that path, so a mirror
        # setting that is a symbolic link must name the same place as the bind
        spack["mirrors:"] = {"dedal": f"file://localhost{Path(os.path.abspath(mirror))}"}
    spack["view"] = view if isinstance(view, bool) else {"default": {"root": str(view), "link": "all"}}
    return data


def carry_includes(manifest: Dict[str, Any], work: Path) -> Dict[str, Any]:
    """Copy the files a manifest includes into ``work/includes`` and point at the copies:
    build nodes and later stages see the work directory (shared storage), not the
    machine where the environment file was written."""
    data = copy.deepcopy(manifest)
    entries = data["spack"].get("include")
    if not isinstance(entries, list):
        return data
    dest_dir = work / "includes"
    carried = []
    for i, entry in enumerate(entries):
        src = Path(entry) if isinstance(entry, str) and entry.startswith("/") else None
        if src is None or not src.exists() or dest_dir in src.parents:
            carried.append(entry)
            continue
        dest = dest_dir / f"{i:02d}-{src.name}"
        dest_dir.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(src, dest)
        else:
            shutil.copyfile(src, dest)
        carried.append(str(dest))
    data["spack"]["include"] = carried
    return data


def local_inputs(manifest: Mapping[str, Any]) -> List[Path]:
    """The package repositories and included files a manifest names by absolute path:
    sandboxes bind them at the same paths, and what they hold decides the concretization."""
    spack = manifest.get("spack", {}) if isinstance(manifest, Mapping) else {}
    found: List[Path] = []
    for key in ("repos", "include"):
        for entry in spack.get(key) or []:
            if isinstance(entry, str) and entry.startswith("/") and Path(entry).exists():
                found.append(Path(entry))
    return found


def inputs_digest(manifest_file: Path, manifest: Mapping[str, Any]) -> str:
    """sha256 over the manifest and every file of its local repositories and includes: a
    changed recipe (a new patch, a version) asks for a new concretization. Each input counts
    by what it holds, not where it lies: its path in the manifest and its files' paths are
    taken relative to it, so the same recipes in another checkout (a second clone, a CI
    runner's build directory per concurrent job) reuse the lock, which names none of their paths."""
    tops = local_inputs(manifest)
    text = Path(manifest_file).read_text(encoding="utf-8", errors="surrogateescape")
    for i, top in sorted(enumerate(tops), key=lambda it: -len(str(it[1]))):  # /a/repo2 before /a/repo
        text = text.replace(str(top), f"<local input {i}>")
    h = hashlib.sha256(text.encode("utf-8", "surrogateescape"))
    for i, top in enumerate(tops):
        files = (
            [top]
            if top.is_file()
            else sorted(p for p in top.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        )
        for f in files:
            where = f"{i}:" + ("" if f == top else f.relative_to(top).as_posix())
            h.update(where.encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def stage_env_dir(work: Path, manifest: Dict[str, Any], lock: Optional[Path]) -> Dict[str, Any]:
    """``manifest`` written into ``work`` as its spack.yaml, the files it includes carried
    beside it (:func:`carry_includes`), ``lock`` (if any) copied as its spack.lock: an
    environment's work directory as fetch and ``prepare`` write it. The manifest as written."""
    carried = carry_includes(manifest, work)
    write_env_dir(work, carried, lock)
    return carried


def write_env_dir(envdir: Path, manifest: Dict[str, Any], lock: Optional[Path]) -> Path:
    write_atomic(envdir / "spack.yaml", yaml.safe_dump(manifest, sort_keys=False))
    if lock is not None:
        shutil.copyfile(lock, envdir / "spack.lock")
    return envdir
