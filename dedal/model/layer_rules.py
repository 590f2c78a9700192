"""The layer audit's rules, as pure functions of a listing: which entries a layer may hold
(one prefix, no device nodes, FIFOs, sockets, setuid or setgid files, no world-writable
directory without the sticky bit, symlinks that stay inside the install root), what a
manifest's prefix and install root may be, and the same rules for a whole image's root file
system (a pulled image: the base operating system's setuid programs and harmless /dev nodes
allowed outside the install root).

No file is read here: :mod:`dedal.stages.layer_audit` lists a squashfs or walks a tree
(through :mod:`dedal.adapters.squashfs`) and judges what it finds with these rules, for
every stage that stores, unpacks or composes layers.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Sequence


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
        return {
            "key": self.key,
            "name": self.name,
            "version": self.version,
            "hash": self.hash,
            "sha256": self.sha256,
            "size": self.size,
        }


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
    if (
        not isinstance(prefix, str)
        or not prefix
        or prefix in (".", "..")
        or "/" in prefix
        or any(c in prefix for c in "\n\r\x00")
    ):
        return f"its manifest names prefix {prefix!r}, not one directory name under the install root"
    return None


def root_problem(install_root: str) -> Optional[str]:
    """Why a manifest's install root is not one (an absolute path without ``..``)."""
    if (
        not isinstance(install_root, str)
        or not install_root.startswith("/")
        or ".." in install_root.split("/")
        or any(c in install_root for c in "\n\r\x00")
    ):
        return f"its manifest names install root {install_root!r}, not an absolute path"
    return None


def listing_problem(entries: Sequence[Mapping[str, str]], prefix: str, install_root: str) -> Optional[str]:
    """The first entry of a layer's listing that may not be unpacked, or a path listed twice
    (a symlink and a directory of one name: unsquashfs would write through the symlink)."""
    return _first_problem(entries, "the squashfs holds nothing", lambda e: entry_problem(e, prefix, install_root))


def _first_problem(
    entries: Sequence[Mapping[str, str]],
    empty: str,
    problem_of: Callable[[Mapping[str, str]], Optional[str]],
    lead: str = "",
) -> Optional[str]:
    """The walk a layer's and an image's listing share: nothing listed, a line that is no
    entry, an entry's own problem, a path listed twice (``lead`` goes before a path shown)."""
    if not entries:
        return empty
    seen = set()
    for e in entries:
        if e.get("unparsed"):
            return f"an entry's name holds a line break (listing line {e['unparsed'][:80]!r})"
        problem = problem_of(e)
        if problem:
            return problem
        if e["path"] in seen:
            return f"path {lead + e['path']!r} is listed twice"
        seen.add(e["path"])
    return None


# Where a base operating system keeps its programs: the only places a pulled image may
# have setuid or setgid files (Debian's su, mount, passwd, unix_chkpwd, ssh-keysign...).
SYSTEM_PROGRAM_DIRS = ("bin", "sbin", "lib", "usr/bin", "usr/sbin", "usr/lib", "usr/libexec")
# The device nodes debootstrap leaves in /dev (major,minor): the ones that give no access
# to any hardware or memory. Apptainer mounts its own /dev over them; dedal verify unpacks
# them onto the host, where /dev/mem or a disk's block device would be real.
HARMLESS_DEVICES = {
    "dev/null": "1,3",
    "dev/zero": "1,5",
    "dev/full": "1,7",
    "dev/random": "1,8",
    "dev/urandom": "1,9",
    "dev/tty": "5,0",
    "dev/console": "5,1",
    "dev/ptmx": "5,2",
}
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
        return symlink_problem(path[len(root) + 1 :], target, install_root or "", shown)
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
    return _first_problem(
        entries, "its root file system holds nothing", lambda e: image_entry_problem(e, install_root), lead="/"
    )
