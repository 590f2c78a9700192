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
internals of each other)."""
from __future__ import annotations

import json
import os
import posixpath
import shutil
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence

from dedal.adapters import squashfs
from dedal.errors import DedalError, ToolError, UserError
from dedal.model.layers import sha256_file

if TYPE_CHECKING:
    from dedal.model.layers import LayerStore
    from dedal.model.plan import Plan



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


_KINDS = {"c": "a device node", "b": "a device node", "p": "a FIFO", "s": "a socket"}


def mode_problem(path: str, mode: str) -> Optional[str]:
    """What an entry's ``ls -l`` mode string (``-rwsr-xr-x``) says it may not be."""
    if len(mode) != 10 or mode[0] not in "-dlcbps":
        return f"{path!r} has an unreadable mode {mode!r}"
    if mode[0] in _KINDS:
        return f"{path!r} is {_KINDS[mode[0]]}"
    if mode[0] != "d":
        if mode[3] in "sS":
            return f"{path!r} is setuid ({mode})"
        if mode[6] in "sS":
            return f"{path!r} is setgid ({mode})"
    elif mode[8] == "w" and mode[9] not in "tT":
        return f"directory {path!r} is world-writable without the sticky bit ({mode})"
    return None


def entry_problem(entry: Mapping[str, str], prefix: str, install_root: str) -> Optional[str]:
    """Why one entry of a layer may not go into an image or a build stage (None: it may)."""
    path = entry["path"]
    if "\n" in path or "\r" in path:
        return f"the name {path!r} holds a line break"
    parts = path.split("/")
    if ".." in parts or "." in parts or "" in parts or not (path == prefix or path.startswith(prefix + "/")):
        return f"path {path!r} is outside its prefix {prefix}/"
    mode = entry.get("mode", "")
    problem = mode_problem(path, mode)
    if problem:
        return problem
    if path == prefix and mode[:1] != "d":
        return f"the prefix {prefix!r} is not a directory"
    if mode[:1] == "l":
        return symlink_problem(path, entry.get("target", ""), install_root)
    return None


def symlink_problem(path: str, target: str, install_root: str, shown: str = "") -> Optional[str]:
    """Why a symlink at ``path`` (relative to the install root) may not point at ``target``:
    an absolute target outside the install root, a relative one that climbs out of it.
    ``shown``: the symlink's name in the message (default ``path``)."""
    shown = shown or path
    if not target:
        return f"symlink {shown!r} has no target"
    root = posixpath.normpath(install_root)
    if target.startswith("/"):
        if not inside(posixpath.normpath(target), root):
            return f"symlink {shown} -> {target} points outside the install root {install_root}"
    else:
        resolved = posixpath.normpath(posixpath.join(root, posixpath.dirname(path), target))
        if not inside(resolved, root):
            return f"symlink {shown} -> {target} escapes the install root {install_root}"
    return None

AUDIT_RULES = 3  # bump when entry_problem or prefix_problem changes: remembered audits are then redone


def prefix_problem(prefix: str) -> Optional[str]:
    """Why a manifest's ``prefix`` may not name a layer's directory under the install root
    (None: it may): one plain directory name, no ``..``, no separator, no line break."""
    if not isinstance(prefix, str) or not prefix or prefix in (".", "..") or "/" in prefix \
            or any(c in prefix for c in "\n\r\x00"):
        return f"its manifest names prefix {prefix!r}, not one directory name under the install root"
    return None


def root_problem(install_root: str) -> Optional[str]:
    """Why a manifest's install root is not one (an absolute path without ``..``)."""
    if not isinstance(install_root, str) or not install_root.startswith("/") \
            or ".." in install_root.split("/") or any(c in install_root for c in "\n\r\x00"):
        return f"its manifest names install root {install_root!r}, not an absolute path"
    return None


def listing_problem(entries: Sequence[Mapping[str, str]], prefix: str, install_root: str) -> Optional[str]:
    """The first entry of a layer's listing that may not be unpacked, or a path listed twice
    (a symlink and a directory of one name: unsquashfs would write through the symlink)."""
    if not entries:
        return "the squashfs holds nothing"
    seen = set()
    for e in entries:
        if e.get("unparsed"):
            return f"an entry's name holds a line break (listing line {e['unparsed'][:80]!r})"
        problem = entry_problem(e, prefix, install_root)
        if problem:
            return problem
        if e["path"] in seen:
            return f"path {e['path']!r} is listed twice"
        seen.add(e["path"])
    return None


def tree_entries(top: Path) -> List[Dict[str, str]]:
    """The entries of an unpacked layer as the filesystem has them (lstat, readlink), in the
    form :func:`squashfs.entries` gives: what was written, whatever a listing showed."""
    result: List[Dict[str, str]] = []
    for dirpath, dirs, files in os.walk(top):
        for name in dirs + files:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, top)
            result.append({"path": rel, "mode": stat.filemode(st.st_mode), "size": str(st.st_size),
                           "target": os.readlink(full) if stat.S_ISLNK(st.st_mode) else ""})
    return result


def audit_layers(plan: Plan, hashes: Sequence[str], store: LayerStore, say: Callable[[str], None],
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
        raise UserError(f"{where}: corrupt: {sqfs} has {size} bytes, its manifest says {man.size}; "
                        "remove the layer and run `dedal build` again")
    digest = sha256_file(sqfs)
    if digest != man.sha256:
        raise UserError(f"{where}: corrupt: sha256 of {sqfs} is {digest[:16]}..., its manifest says "
                        f"{man.sha256[:16]}...; remove the layer and run `dedal build` again")
    files = _check_listing(sqfs, digest, node.prefix_name, install_root, where, memo)
    return LayerInfo(hash=h, key=key, name=node.name, version=node.version, prefix=node.prefix_name,
                     sha256=digest, size=size, files=files, built_at=man.built_at)


def check_packed(sqfs: Path, prefix: str, install_root: str, where: str) -> int:
    """The entry audit of a squashfs before it enters a layer store (a package just built,
    a layer pulled from a remote layer cache): UserError ``WHERE: refused: <problem>``,
    one line, for the first problem. Returns the number of entries."""
    return _check_listing(Path(sqfs), "", prefix, install_root, where, None)


def _check_listing(sqfs: Path, digest: str, prefix: str, install_root: str, where: str,
                   memo: Optional[Path]) -> int:
    """The entries of ``sqfs`` against the rules (remembered under ``memo`` by ``digest``,
    its sha256, where both are given); the number of entries, or UserError."""
    problem = prefix_problem(prefix) or root_problem(install_root)
    if problem:
        raise UserError(f"{where}: refused: {problem}")
    passed = {"rules": AUDIT_RULES, "sha256": digest, "prefix": prefix,
              "install_root": posixpath.normpath(install_root)}
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
            memo_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = memo_file.with_name(f".{memo_file.name}.{os.getpid()}.{threading.get_ident()}")
            tmp.write_text(json.dumps({**passed, "files": len(entries)}) + "\n")
            os.replace(tmp, memo_file)
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
    return _check_listing(store.sqfs(key), man.sha256, man.prefix, man.install_root,
                          f"layer {key} ({man.name}@{man.version})", memo)


# ------------------------------------------------------------------ a whole image's root

# Where a base operating system keeps its programs: the only places a pulled image may
# have setuid or setgid files (Debian's su, mount, passwd, unix_chkpwd, ssh-keysign...).
SYSTEM_PROGRAM_DIRS = ("bin", "sbin", "lib", "usr/bin", "usr/sbin", "usr/lib", "usr/libexec")
# The device nodes debootstrap leaves in /dev (major,minor): the ones that give no access
# to any hardware or memory. Apptainer mounts its own /dev over them; dedal verify unpacks
# them onto the host, where /dev/mem or a disk's block device would be real.
HARMLESS_DEVICES = {"dev/null": "1,3", "dev/zero": "1,5", "dev/full": "1,7", "dev/random": "1,8",
                    "dev/urandom": "1,9", "dev/tty": "5,0", "dev/console": "5,1", "dev/ptmx": "5,2"}
INSTALL_ROOT_LABEL = "dedal.install_root"


def _climbs_out(path: str, target: str) -> bool:
    """Whether the relative ``target`` of a symlink at ``path`` (relative to the image's
    root) climbs above the root: a name such a link resolves to outside an unpacked copy."""
    depth = path.count("/")  # the symlink's directory's depth
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part and part != ".":
            depth += 1
    return False


def image_entry_problem(entry: Mapping[str, str], install_root: Optional[str]) -> Optional[str]:
    """Why one entry of a whole image's root file system (a pulled image) may not be
    stored (None: it may).

    Under the image's install root (its label ``dedal.install_root``: the layers) the
    layers' own rules hold (:func:`mode_problem`, :func:`symlink_problem`). The rest is the
    base operating system's, audited as :func:`mode_problem` audits a layer with the two
    things a base legitimately has (what debootstrap makes, which assemble takes as it is):
    setuid and setgid programs in :data:`SYSTEM_PROGRAM_DIRS`, and the
    :data:`HARMLESS_DEVICES` in /dev. Its symlinks resolve inside the image when it runs,
    absolute ones too; a relative one may not climb above the root. No entry is named
    ``.`` or ``..`` or holds a line break."""
    path = entry["path"]
    shown = "/" + path
    if "\n" in path or "\r" in path:
        return f"the name {shown!r} holds a line break"
    if {"", ".", ".."} & set(path.split("/")):
        return f"path {shown!r} is outside the image's root"
    mode = entry.get("mode", "")
    target = entry.get("target", "")
    root = install_root.strip("/") if install_root else ""
    if root and path.startswith(root + "/"):
        problem = mode_problem(shown, mode)
        if problem or mode[:1] != "l":
            return problem
        return symlink_problem(path[len(root) + 1:], target, install_root or "", shown)
    if mode[:1] == "c" and HARMLESS_DEVICES.get(path) == entry.get("size"):
        return None
    if len(mode) == 10 and mode[0] == "-" and path.startswith(tuple(d + "/" for d in SYSTEM_PROGRAM_DIRS)):
        return None  # a program of the system: setuid/setgid is all mode_problem refuses of a regular file
    problem = mode_problem(shown, mode)
    if problem:
        if mode[:1] == "-":
            problem += f", outside the system's program directories (/{', /'.join(SYSTEM_PROGRAM_DIRS)})"
        elif mode[:1] == "c":
            problem += " other than /dev's harmless ones (null, zero, full, random, urandom, tty, console, ptmx)"
        return problem
    if mode[:1] == "l":
        if not target:
            return f"symlink {shown!r} has no target"
        if not target.startswith("/") and _climbs_out(path, target):
            return f"symlink {shown} -> {target} climbs out of the image's root"
    return None


def image_listing_problem(entries: Sequence[Mapping[str, str]], install_root: Optional[str]) -> Optional[str]:
    """The first entry of a whole image's listing that may not be stored (see
    :func:`image_entry_problem`), or a path listed twice."""
    if install_root is not None and (root_problem(install_root) or not install_root.strip("/")):
        return f"its labels name install root {install_root!r}, not an absolute directory"
    if not entries:
        return "its root file system holds nothing"
    seen = set()
    for e in entries:
        if e.get("unparsed"):
            return f"an entry's name holds a line break (listing line {e['unparsed'][:80]!r})"
        problem = image_entry_problem(e, install_root)
        if problem:
            return problem
        if e["path"] in seen:
            return f"path {'/' + e['path']!r} is listed twice"
        seen.add(e["path"])
    return None


def check_image_root(image: Path, offset: int, install_root: Optional[str], where: str) -> int:
    """The entry audit of an image's root file system (the squashfs at ``offset`` in
    ``image``) before the image is stored (``dedal pull``): UserError ``WHERE: refused:
    <problem>``, one line, for the first problem; the number of entries otherwise."""
    try:
        entries = squashfs.entries(Path(image), offset=offset)
    except ToolError as exc:  # the tool's reason; not its command line, whose file is a temporary one
        raise UserError(f"{where}: unreadable root file system ({exc.what} exited with code {exc.returncode}: "
                        f"{exc.detail})") from None
    problem = image_listing_problem(entries, install_root)
    if problem:
        raise UserError(f"{where}: refused: {problem}")
    return len(entries)


def unpack_layer(sqfs: Path, prefix: str, root: Path, scratch: Path, install_root: str, where: str,
                 log: Optional[Path] = None, processors: Optional[int] = None) -> None:
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
        squashfs.extract(sqfs, fresh, merge=False, processors=processors, log=log)
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
