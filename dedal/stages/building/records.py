"""Spack's build records of one package, kept beside its layer instead of inside it.

Spack leaves in every prefix's ``.spack/`` what happened during the build: the build
log (``spack-build-out.txt.gz``), the build environment (``spack-build-env.txt``,
``spack-build-env-mods.txt``), the phase times (``install_times.json``), the build host
(``install_environment.json``) and files the recipe archives (``archived-files/``, e.g.
config.log). They name the stage directory, the user, the host and the wall clock, so a
layer holding them is different bytes on every build. They move to
``<layer store>/<key>.records/`` (:meth:`dedal.model.layers.LayerStore.records_dir`),
where ``dedal layers`` users find them, and the layer keeps only what describes the
installed files.

``install_manifest.json`` stays (``spack verify`` reads it) and is made to describe the
layer as its squashfs shows it: the moved records left out, every owner root and every
time 0 (mksquashfs ``-all-root -all-time 0``), its keys sorted (Spack writes them in the
order the file system lists them).
"""

from __future__ import annotations

import json
import posixpath
import shutil
from pathlib import Path
from typing import List

# names under <prefix>/.spack that record the build rather than describe the install
RECORDS = (
    "spack-build-out.txt.gz",
    "spack-build-out.txt",
    "spack-build-env.txt",
    "spack-build-env-mods.txt",
    "install_times.json",
    "install_environment.json",
    "archived-files",
)
MANIFEST = "install_manifest.json"


def split_records(prefix: Path, dest: Path, spack_prefix: str) -> List[str]:
    """Move the build records of ``prefix`` into ``dest`` (created when there is one)
    and normalise its install manifest, whose paths are under ``spack_prefix`` (where
    Spack saw the prefix: the install root inside the build's sandbox); returns the
    names moved, in RECORDS order."""
    meta = Path(prefix) / ".spack"
    moved: List[str] = []
    for name in RECORDS:
        src = meta / name
        if not (src.exists() or src.is_symlink()):
            continue
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        shutil.move(str(src), str(target))
        moved.append(name)
    normalize_manifest(meta / MANIFEST, [posixpath.join(spack_prefix, ".spack", name) for name in moved])
    return moved


def normalize_manifest(path: Path, removed: List[str]) -> None:
    """Rewrite Spack's install manifest (see the module documentation); nothing when absent."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return
    except ValueError:
        return  # not Spack's format: left as Spack wrote it
    if not isinstance(data, dict):
        return
    gone = tuple(removed)
    out = {}
    for key in sorted(data):
        if key in gone or key.startswith(tuple(r + "/" for r in gone)):
            continue
        entry = data[key]
        if isinstance(entry, dict):
            entry = dict(entry)
            for owner in ("owner", "group"):
                if owner in entry:
                    entry[owner] = 0
            if "time" in entry:
                entry["time"] = 0
        out[key] = entry
    mode = path.stat().st_mode & 0o7777
    path.unlink()  # a new inode: the prefix may share it with nothing, but never write through a link
    path.write_text(json.dumps(out, separators=(",", ":"), sort_keys=True))
    path.chmod(mode)
