"""The layer audit: one rule for every layer that enters a layer store or is unpacked
anywhere, whatever its source: a package just built (here or on a Slurm node,
:func:`check_packed` before it is stored), a layer pulled from a remote layer cache
(:func:`check_packed` before it is stored), the dependencies a build job materializes and
the layers an assembly composes (:func:`audit_layer`), a store's layers as they are
(:func:`audit_store`, ``dedal layers verify``), and the root file system of an image
pulled from a registry, before it is stored (:func:`check_image_root`: the layers' rules
under its install root, the base operating system's setuid programs and harmless /dev
nodes allowed elsewhere).

Its manifest names the package, the install root and the key, and a prefix that is one
directory name; the squashfs matches the manifest's size and sha256; every entry is
inside ``<prefix>/``, once; no device nodes, FIFOs or sockets, no setuid or setgid file,
no world-writable directory without the sticky bit; symlinks point into the install root
(absolute ones, as Spack makes, or relative ones that do not climb out of it). Anything
else is refused with a UserError naming the layer and the entry. :func:`unpack_layer`
unpacks an audited layer so that nothing already in the destination can redirect it (see
there). :func:`parallel` is the thread pool the audit and the extraction of the layers
share. Stages share it from here (``stages/building`` and ``stages/assemble`` import no
internals of each other). The rules themselves are pure functions of a listing, in
:mod:`dedal.model.layer_rules` (re-exported here); this module reads the listings and files."""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

from dedal.adapters import squashfs
from dedal.errors import DedalError, ToolError, UserError
from dedal.model.artifacts import sha256_file, write_atomic
from dedal.model.layer_rules import (
    AUDIT_RULES,
    HARMLESS_DEVICES,
    INSTALL_ROOT_LABEL,
    SYSTEM_PROGRAM_DIRS,
    LayerInfo,
    entry_problem,
    image_entry_problem,
    image_listing_problem,
    inside,
    listing_problem,
    mode_problem,
    prefix_problem,
    root_problem,
    symlink_problem,
)

__all__ = [
    # the rules (dedal.model.layer_rules)
    "AUDIT_RULES",
    "HARMLESS_DEVICES",
    "INSTALL_ROOT_LABEL",
    "SYSTEM_PROGRAM_DIRS",
    "LayerInfo",
    "entry_problem",
    "image_entry_problem",
    "image_listing_problem",
    "inside",
    "listing_problem",
    "mode_problem",
    "prefix_problem",
    "root_problem",
    "symlink_problem",
    # the audit of files
    "tree_entries",
    "audit_layers",
    "audit_layer",
    "check_packed",
    "audit_store",
    "audit_stored",
    "check_image_root",
    "unpack_layer",
    "parallel",
]

if TYPE_CHECKING:
    from dedal.model.layers import LayerStore
    from dedal.model.plan import Plan


def tree_entries(top: Path) -> List[Dict[str, str]]:
    """The entries of an unpacked layer as the filesystem has them (lstat, readlink), in the
    form :func:`squashfs.entries` gives: what was written, whatever a listing showed."""
    result: List[Dict[str, str]] = []
    for dirpath, dirs, files in os.walk(top):
        for name in dirs + files:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, top)
            result.append(
                {
                    "path": rel,
                    "mode": stat.filemode(st.st_mode),
                    "size": str(st.st_size),
                    "target": os.readlink(full) if stat.S_ISLNK(st.st_mode) else "",
                }
            )
    return result


def audit_layers(
    plan: Plan, hashes: Sequence[str], store: LayerStore, say: Callable[[str], None], memo: Optional[Path] = None
) -> List[LayerInfo]:
    """Check every layer of ``hashes`` (externals have none); UserError for the first
    problem, after listing every missing layer at once.

    The sha256 is always recomputed; the entry listing of a squashfs whose sha256 already
    passed these rules for the same prefix and install root is remembered under ``memo``
    (content-addressed: the same bytes cannot give another answer)."""
    built = [h for h in hashes if not plan.nodes[h].external]
    missing = [h for h in built if not plan.nodes[h].key or not store.has(plan.nodes[h].key)]
    if missing:
        names = ", ".join(f"{plan.nodes[h].label} ({plan.nodes[h].key})" for h in missing)
        raise UserError(
            f"{len(missing)} layer(s) missing from the layer store {store.root}: {names}; "
            f"run `dedal build` for {plan.env_name} first"
        )
    # hashing and listing run in parallel (threads: hashlib and the unsquashfs processes do
    # the work); the first problem in layer order is the one reported
    infos = parallel(lambda h: audit_layer(plan.nodes[h], store, plan.install_root, memo), built)
    say(f"audited {len(infos)} layer(s): sha256, paths and symlinks ok")
    return infos


def audit_layer(node: Any, store: LayerStore, install_root: str, memo: Optional[Path] = None) -> LayerInfo:
    """Check one layer (of plan node ``node``) against its manifest and the entry rules;
    UserError for the first problem. See :func:`audit_layers` for ``memo``."""
    h = node.hash
    key = node.key
    man = store.manifest(key)
    sqfs = store.sqfs(key)
    where = f"layer {key} ({node.label})"
    if man.key != key or man.hash != h:
        raise UserError(f"{where}: its manifest names {man.key} / {man.hash}, not this package")
    if man.prefix != node.prefix_name:
        raise UserError(f"{where}: its manifest names prefix {man.prefix!r}, expected {node.prefix_name!r}")
    if posixpath.normpath(man.install_root) != posixpath.normpath(install_root):
        raise UserError(f"{where}: built for install root {man.install_root}, the image uses {install_root}")
    size = sqfs.stat().st_size
    if man.size and size != man.size:
        raise UserError(
            f"{where}: corrupt: {sqfs} has {size} bytes, its manifest says {man.size}; "
            "remove the layer and run `dedal build` again"
        )
    digest = sha256_file(sqfs)
    if digest != man.sha256:
        raise UserError(
            f"{where}: corrupt: sha256 of {sqfs} is {digest[:16]}..., its manifest says "
            f"{man.sha256[:16]}...; remove the layer and run `dedal build` again"
        )
    files = _check_listing(sqfs, digest, node.prefix_name, install_root, where, memo)
    return LayerInfo(
        hash=h,
        key=key,
        name=node.name,
        version=node.version,
        prefix=node.prefix_name,
        sha256=digest,
        size=size,
        files=files,
        built_at=man.built_at,
    )


def check_packed(sqfs: Path, prefix: str, install_root: str, where: str) -> int:
    """The entry audit of a squashfs before it enters a layer store (a package just built,
    a layer pulled from a remote layer cache): UserError ``WHERE: refused: <problem>``,
    one line, for the first problem. Returns the number of entries."""
    return _check_listing(Path(sqfs), "", prefix, install_root, where, None)


def _check_listing(sqfs: Path, digest: str, prefix: str, install_root: str, where: str, memo: Optional[Path]) -> int:
    """The entries of ``sqfs`` against the rules (remembered under ``memo`` by ``digest``,
    its sha256, where both are given); the number of entries, or UserError."""
    problem = prefix_problem(prefix) or root_problem(install_root)
    if problem:
        raise UserError(f"{where}: refused: {problem}")
    passed = {
        "rules": AUDIT_RULES,
        "sha256": digest,
        "prefix": prefix,
        "install_root": posixpath.normpath(install_root),
    }
    memo_file = memo / f"{digest}.json" if memo is not None and digest else None
    if memo_file is not None:
        try:
            known = json.loads(memo_file.read_text())
            if {k: known.get(k) for k in passed} == passed and isinstance(known.get("files"), int):
                return int(known["files"])
        except (OSError, ValueError):
            pass
    try:
        entries = squashfs.entries(sqfs)
    except DedalError as exc:
        raise UserError(f"{where}: unreadable squashfs ({exc.one_line()})") from None
    problem = listing_problem(entries, prefix, install_root)
    if problem:
        raise UserError(f"{where}: refused: {problem}")
    if memo_file is not None:
        try:
            write_atomic(memo_file, json.dumps({**passed, "files": len(entries)}) + "\n")
        except OSError:
            pass  # not remembered: listed again next time
    return len(entries)


def audit_store(store: LayerStore, memo: Optional[Path] = None) -> Any:
    """``store.verify()`` (sha256 against the manifests, orphans, temporaries) and the entry
    audit of every layer it found whole, against its own manifest's prefix and install
    root: a layer that would be refused where it is used (stored by a dedal that did not
    audit what it pulled, copied in by hand) is listed in ``refused``, not ``ok``."""
    check = store.verify()
    for key in list(check.ok):
        try:
            audit_stored(store, key, memo)
        except UserError as exc:
            check.ok.remove(key)
            check.refused.append(exc.one_line())
    return check


def audit_stored(store: LayerStore, key: str, memo: Optional[Path] = None) -> int:
    """The entry audit of the store's layer ``key`` against its own manifest (prefix,
    install root; the sha256 the memo is keyed by is the manifest's: callers that have not
    checked it run :meth:`LayerStore.verify` first). UserError naming the layer."""
    man = store.manifest(key)
    return _check_listing(
        store.sqfs(key), man.sha256, man.prefix, man.install_root, f"layer {key} ({man.name}@{man.version})", memo
    )


# ------------------------------------------------------------------ a whole image's root


def check_image_root(image: Path, offset: int, install_root: Optional[str], where: str) -> int:
    """The entry audit of an image's root file system (the squashfs at ``offset`` in
    ``image``) before the image is stored (``dedal pull``): UserError ``WHERE: refused:
    <problem>``, one line, for the first problem; the number of entries otherwise."""
    try:
        entries = squashfs.entries(Path(image), offset=offset)
    except ToolError as exc:  # the tool's reason; not its command line, whose file is a temporary one
        raise UserError(
            f"{where}: unreadable root file system ({exc.what} exited with code {exc.returncode}: {exc.detail})"
        ) from None
    problem = image_listing_problem(entries, install_root)
    if problem:
        raise UserError(f"{where}: refused: {problem}")
    return len(entries)


def unpack_layer(
    sqfs: Path,
    prefix: str,
    root: Path,
    scratch: Path,
    install_root: str,
    where: str,
    log: Optional[Path] = None,
    processors: Optional[int] = None,
) -> None:
    """Unpack one audited layer (its single top directory ``prefix``) into ``root``, so that
    nothing already under ``root`` can redirect it.

    ``unsquashfs -f`` into a shared directory follows a symlink an earlier layer left there
    (a ``<prefix> -> /tmp/elsewhere`` put the next package's files outside the stage, as
    root). Here unsquashfs writes into a fresh directory of its own under ``scratch`` (same
    filesystem as ``root``), so it meets no path it did not create; the unpacked tree is
    audited again as the filesystem has it (lstat and readlink: whatever the listing showed);
    then the prefix directory is renamed into ``root``, where nothing of that name may exist
    yet. No entry of an earlier layer can lie on a later layer's path."""
    fresh = Path(scratch) / f".unpack-{prefix}-{os.getpid()}-{threading.get_ident()}"
    try:
        # not weighed one by one against the free disk: a listing more per layer, hundreds per build job
        squashfs.extract(sqfs, fresh, merge=False, processors=processors, log=log, room=False)
        problem = listing_problem(tree_entries(fresh), prefix, install_root)
        if problem:
            raise UserError(f"{where}: refused after unpacking: {problem}")
        dest = Path(root) / prefix
        if os.path.lexists(dest):
            raise UserError(f"{where}: refused: {dest} exists already (two layers of one prefix?)")
        os.rename(fresh / prefix, dest)
    finally:
        if os.path.lexists(fresh):
            shutil.rmtree(fresh)


def _workers() -> int:
    # process start-up is part of every call: more threads than cores still pay off
    return max(4, min(8, 2 * (os.cpu_count() or 2)))


def parallel(fn: Callable[[Any], Any], items: Sequence[Any]) -> List[Any]:
    """``[fn(x) for x in items]`` on a thread pool; the first failure (in item order) is raised
    after every started call has finished."""
    if len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=_workers()) as pool:
        futures = [pool.submit(fn, x) for x in items]
        outcomes = []
        for f in futures:
            try:
                outcomes.append((f.result(), None))
            except BaseException as exc:  # noqa: BLE001 - re-raised below, in order
                outcomes.append((None, exc))
    for _value, exc in outcomes:
        if exc is not None:
            raise exc
    return [v for v, _e in outcomes]
