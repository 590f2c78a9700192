"""The layer audit: every layer is checked before a byte of an image is written.

Its manifest names the package, the install root and the key; the squashfs matches the
manifest's size and sha256; every entry is inside ``<prefix>/``; no device nodes;
symlinks point into the install root (absolute ones, as Spack makes, or relative ones that
do not climb out of it). Anything else is refused with a UserError. :func:`parallel` is the
thread pool the audit and the extraction of the layers share."""
from __future__ import annotations

import json
import os
import posixpath
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from dedal.adapters import squashfs
from dedal.errors import DedalError, UserError
from dedal.model.layers import sha256_file


@dataclass
class LayerInfo:
    hash: str
    key: str
    name: str
    version: str
    prefix: str
    sha256: str
    size: int
    files: int = 0
    built_at: str = ""

    def label(self) -> Dict[str, Any]:
        return {"key": self.key, "name": self.name, "version": self.version, "hash": self.hash,
                "sha256": self.sha256, "size": self.size}


def inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def entry_problem(entry: Mapping[str, str], prefix: str, install_root: str) -> Optional[str]:
    """Why one entry of a layer may not go into an image (None: it may)."""
    path = entry["path"]
    parts = path.split("/")
    if ".." in parts or not (path == prefix or path.startswith(prefix + "/")):
        return f"path {path!r} is outside its prefix {prefix}/"
    mode = entry.get("mode", "")
    if mode[:1] in ("c", "b"):
        return f"{path!r} is a device node"
    if mode[:1] == "l":
        target = entry.get("target", "")
        root = posixpath.normpath(install_root)
        if target.startswith("/"):
            if not inside(posixpath.normpath(target), root):
                return f"symlink {path} -> {target} points outside the install root {install_root}"
        else:
            resolved = posixpath.normpath(posixpath.join(root, posixpath.dirname(path), target))
            if not inside(resolved, root):
                return f"symlink {path} -> {target} escapes the install root {install_root}"
    return None

AUDIT_RULES = 1  # bump when entry_problem changes: remembered audits are then redone


def audit_layers(plan: Any, hashes: Sequence[str], store: Any, say: Callable[[str], None],
                 memo: Optional[Path] = None) -> List[LayerInfo]:
    """Check every layer of ``hashes`` (externals have none); UserError for the first
    problem, after listing every missing layer at once.

    The sha256 is always recomputed; the entry listing of a squashfs whose sha256 already
    passed these rules for the same prefix and install root is remembered under ``memo``
    (content-addressed: the same bytes cannot give another answer)."""
    built = [h for h in hashes if not plan.nodes[h].external]
    missing = [h for h in built if not plan.nodes[h].key or not store.has(plan.nodes[h].key)]
    if missing:
        names = ", ".join(f"{plan.nodes[h].label} ({plan.nodes[h].key})" for h in missing)
        raise UserError(f"{len(missing)} layer(s) missing from the layer store {store.root}: {names}; "
                        f"run `dedal build` for {plan.env_name} first")
    def audit_one(h: str) -> LayerInfo:
        node = plan.nodes[h]
        key = node.key
        man = store.manifest(key)
        sqfs = store.sqfs(key)
        where = f"layer {key} ({node.label})"
        if man.key != key or man.hash != h:
            raise UserError(f"{where}: its manifest names {man.key} / {man.hash}, not this package")
        if man.prefix != node.prefix_name:
            raise UserError(f"{where}: its manifest names prefix {man.prefix!r}, expected {node.prefix_name!r}")
        if posixpath.normpath(man.install_root) != posixpath.normpath(plan.install_root):
            raise UserError(f"{where}: built for install root {man.install_root}, the image uses {plan.install_root}")
        size = sqfs.stat().st_size
        if man.size and size != man.size:
            raise UserError(f"{where}: corrupt: {sqfs} has {size} bytes, its manifest says {man.size}; "
                            "remove the layer and run `dedal build` again")
        digest = sha256_file(sqfs)
        if digest != man.sha256:
            raise UserError(f"{where}: corrupt: sha256 of {sqfs} is {digest[:16]}..., its manifest says "
                            f"{man.sha256[:16]}...; remove the layer and run `dedal build` again")
        passed = {"rules": AUDIT_RULES, "sha256": digest, "prefix": node.prefix_name,
                  "install_root": posixpath.normpath(plan.install_root)}
        memo_file = memo / f"{digest}.json" if memo is not None else None
        if memo_file is not None:
            try:
                known = json.loads(memo_file.read_text())
                if {k: known.get(k) for k in passed} == passed and isinstance(known.get("files"), int):
                    return LayerInfo(hash=h, key=key, name=node.name, version=node.version,
                                     prefix=node.prefix_name, sha256=digest, size=size, files=known["files"],
                                     built_at=man.built_at)
            except (OSError, ValueError):
                pass
        try:
            entries = squashfs.entries(sqfs)
        except DedalError as exc:
            raise UserError(f"{where}: unreadable squashfs ({exc.one_line()})") from None
        if not entries:
            raise UserError(f"{where}: the squashfs holds nothing")
        for e in entries:
            problem = entry_problem(e, node.prefix_name, plan.install_root)
            if problem:
                raise UserError(f"{where}: refused: {problem}")
        if memo_file is not None:
            try:
                memo_file.parent.mkdir(parents=True, exist_ok=True)
                tmp = memo_file.with_name(f".{memo_file.name}.{os.getpid()}.{threading.get_ident()}")
                tmp.write_text(json.dumps({**passed, "files": len(entries)}) + "\n")
                os.replace(tmp, memo_file)
            except OSError:
                pass  # not remembered: listed again next time
        return LayerInfo(hash=h, key=key, name=node.name, version=node.version, prefix=node.prefix_name,
                         sha256=digest, size=size, files=len(entries), built_at=man.built_at)

    # hashing and listing run in parallel (threads: hashlib and the unsquashfs processes do
    # the work); the first problem in layer order is the one reported
    infos = parallel(audit_one, built)
    say(f"audited {len(infos)} layer(s): sha256, paths and symlinks ok")
    return infos


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
