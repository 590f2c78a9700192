"""Overlay mounts: a writable view of a read-only directory tree without copying it.

The assembler stacks its work (layers, view, image metadata) on top of a base root
filesystem that lives unpacked in the base cache: the kernel's overlayfs where dedal
may mount (root), else ``fuse-overlayfs`` (unprivileged, where /dev/fuse allows).
Everything written goes to ``upper``; ``lower`` is never modified (deletions become
whiteouts in ``upper``). Callers that cannot get an overlay fall back to copying.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Optional

from dedal.adapters import proc
from dedal.errors import DedalError

KERNEL = "overlayfs"
FUSE = "fuse-overlayfs"
_UNSAFE = (",", ":", "\n")


def mount(lower: Path, upper: Path, work: Path, merged: Path, *, log: Optional[Path] = None) -> Optional[str]:
    """Mount ``lower`` + ``upper`` at ``merged``; returns the method used, or None when no
    overlay can be mounted here (the reason is appended to ``log``)."""
    paths = [os.fspath(p) for p in (lower, upper, work, merged)]
    if any(c in p for p in paths for c in _UNSAFE):
        return None  # overlay option syntax cannot carry these characters
    for p in (upper, work, merged):
        Path(p).mkdir(parents=True, exist_ok=True)
    opts = f"lowerdir={paths[0]},upperdir={paths[1]},workdir={paths[2]}"
    attempts = []
    if os.geteuid() == 0 and shutil.which("mount"):
        attempts.append((KERNEL, ["mount", "-t", "overlay", "overlay", "-o", opts, paths[3]]))
    if shutil.which("fuse-overlayfs"):
        attempts.append((FUSE, ["fuse-overlayfs", "-o", opts, paths[3]]))
    for method, cmd in attempts:
        try:
            proc.run(cmd, what=f"{method} mount", log=log)
            return method
        except DedalError:
            continue  # try the next method; the log keeps why this one failed
    return None


def unmount(merged: Path, method: str, *, log: Optional[Path] = None) -> None:
    """Unmount; retried briefly while the mount is busy, then detached lazily."""
    cmd = ["umount", os.fspath(merged)] if method == KERNEL else ["fusermount3", "-u", os.fspath(merged)]
    lazy = ["umount", "-l", os.fspath(merged)] if method == KERNEL else ["fusermount3", "-u", "-z", os.fspath(merged)]
    for attempt in range(20):
        try:
            proc.run(cmd, what=f"{method} unmount", log=log)
            return
        except DedalError:
            if attempt == 19:
                proc.run(lazy, what=f"{method} lazy unmount", log=log)
                return
            time.sleep(0.1)


def available() -> bool:
    """Whether a mount can be attempted here (root with mount(8), or fuse-overlayfs)."""
    return (os.geteuid() == 0 and shutil.which("mount") is not None) or shutil.which("fuse-overlayfs") is not None
