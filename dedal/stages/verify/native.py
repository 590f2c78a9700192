"""The native side of a verification: what "native" means for this run, and the image's root
filesystem unpacked for it.

:func:`prepare_native` decides (see :class:`Native`): the host's own MPI stack and benchmark
programs where the host has them, otherwise the image's root filesystem **unpacked onto local
storage** (:func:`unpack_root`) and run without a container runtime (the same binaries and
libraries, from plain files, in a chroot that shares the host's ``/tmp``, ``/dev/shm``, PID, IPC
and network namespaces), cached per image; the roots of an image beyond ``NATIVE_KEEP`` are
pruned, but never one another verification holds. The image itself is read by
:mod:`dedal.stages.verify.image`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from dedal.adapters import runtime, squashfs
from dedal.errors import UserError
from dedal.model import artifacts, sif
from dedal.model.artifacts import sha256_file
from dedal.stages.verify.image import ImageInfo, Progress
from dedal.ui.activity import activity


@dataclass
class Native:
    """What "native" means in this run.

    ``mode``: ``host`` (the host's mpirun/srun and the benchmark programs on the host's
    PATH), ``rootfs`` (the image's root filesystem as plain files on local storage, run
    with the image's own MPI but no container runtime), or ``same-dir`` (a directory
    image is already plain files: native and container run the same tree and differ
    only in the sandbox)."""

    mode: str
    root: Optional[Path]
    description: str
    programs: Dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    cached: bool = False

    def to_json(self) -> Dict[str, Any]:
        return {
            "mode": self.mode,
            "root": str(self.root) if self.root else None,
            "description": self.description,
            "prepare_seconds": round(self.seconds, 2),
            "reused": self.cached,
        }


NATIVE_RUN = (
    "no container runtime: a chroot (bubblewrap with only a mount namespace) that shares the host's "
    "/tmp, /dev/shm and its PID, IPC and network namespaces"
)


def native_binds() -> List[runtime.Bind]:
    """What a native rootfs run shares with the host."""
    return [runtime.Bind(p, p) for p in ("/tmp", "/dev/shm") if os.path.isdir(p)]


#: unpacked roots kept per image name (the last used): each is a whole image's files
#: (1.3-2 GB for the ESD images), and every rebuild of ``NAME:latest`` is a new identity
NATIVE_KEEP = 2
_IN_USE: List[int] = []  # descriptors of the roots this process uses, share-locked until it exits


def _hold(root: Path) -> bool:
    """Share-lock ``root``'s marker for the rest of this process, so that another
    verification's pruning (:func:`_prune_native`) leaves it alone; False when the root
    was pruned before the lock was had."""
    marker = root / ".dedal-unpacked"
    try:
        fd = os.open(marker, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError:  # a file system without flock (Lustre mounted noflock): no pruning there either
        os.close(fd)
        return True
    try:
        still = os.fstat(fd).st_ino == marker.stat().st_ino
    except FileNotFoundError:
        still = False
    if not still:
        os.close(fd)
        return False
    _IN_USE.append(fd)
    return True


def _prune_native(cache: Path, name: str) -> List[Path]:
    """Remove the unpacked roots of image ``name`` beyond the ``NATIVE_KEEP`` last used, but
    those another verification holds (:func:`_hold`); the roots removed."""
    pattern = re.compile(re.escape(name) + r"-[0-9a-f]{16}")
    roots = []
    for d in cache.iterdir():
        try:
            if pattern.fullmatch(d.name):
                roots.append((os.stat(d / ".dedal-unpacked").st_mtime, d))
        except OSError:
            continue
    roots.sort(reverse=True)
    removed = []
    for _, old in roots[NATIVE_KEEP:]:
        try:
            fd = os.open(old / ".dedal-unpacked", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            gone = cache / f".{old.name}.old-{os.getpid()}"
            os.rename(old, gone)  # out of reach of a verification looking for it, then removed
            shutil.rmtree(gone, ignore_errors=True)
            removed.append(old)
        except OSError:  # held by another verification (BlockingIOError), or renamed meanwhile
            continue
        finally:
            os.close(fd)
    return removed


def unpack_root(info: ImageInfo, cache: Path, *, progress: Progress = None) -> tuple:
    """The image's root filesystem unpacked under ``cache`` (reused when present), locked
    for this process; returns (directory, reused). A new one replaces the oldest of the
    same image name beyond ``NATIVE_KEEP``."""
    final = cache / f"{info.name}-{hashlib.sha256(info.identity.encode()).hexdigest()[:16]}"
    if _hold(final):  # present (its marker is written last) and now held
        with contextlib.suppress(OSError):
            os.utime(final / ".dedal-unpacked")  # used now: the last to be pruned
        return final, True
    cache.mkdir(parents=True, exist_ok=True)
    artifacts.reap_temporaries(cache, of=final.name)  # half-unpacked roots of killed verifications
    tmp = artifacts.temp_path(final)
    try:
        if progress:
            progress(f"unpacking the image's root filesystem for the native runs into {final}")
        with activity(f"unpacking {info.path.name} for the native runs", after=3, announce=False):
            # read in place in the SIF, at its partition's offset: not copied out first (a
            # whole image's bytes more on the disk that must hold the unpacked root)
            offset = sif.primary_partition(sif.read_sif(info.path)).offset if info.kind == "sif" else 0
            # without the image's device nodes: the chroot mounts its own /dev, and a user who is
            # not root cannot create them (unsquashfs failed there, and so did dedal verify)
            squashfs.extract(info.path, tmp, devices=False, offset=offset)
        (tmp / ".dedal-unpacked").write_text(json.dumps({"image": str(info.path), "identity": info.identity}) + "\n")
        if final.exists():  # another verification unpacked it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not _hold(final):  # pruned by another verification in the moment between
        return unpack_root(info, cache, progress=progress)
    for old in _prune_native(cache, info.name):
        if progress:
            progress(f"removed the unpacked root of an older {info.name} ({old.name}): {NATIVE_KEEP} are kept")
    return final, False


def prepare_native(
    info: ImageInfo,
    *,
    mode: str,
    wanted: Sequence[str],
    cache: Path,
    native_root: Optional[Path] = None,
    host_programs: Optional[Dict[str, Optional[str]]] = None,
    host_mpi: Optional[Dict[str, Any]] = None,
    launcher: str = "mpirun",
    progress: Progress = None,
) -> Native:
    """Choose and prepare the native side (``mode``: auto, host or rootfs). ``wanted``:
    the benchmark programs the run uses; ``host_programs``: where they are on the host
    (None: absent); ``host_mpi``: the host's mpirun (None: none)."""
    host_programs = host_programs or {}
    start = time.monotonic()
    # nothing wanted (only application benchmarks): their native side is the image's own files
    have_host = bool(wanted) and all(host_programs.get(p) for p in wanted) and (launcher == "srun" or bool(host_mpi))
    if mode == "host" and not have_host:
        missing = [p for p in wanted if not host_programs.get(p)]
        what = ", ".join(missing) if missing else "mpirun"
        raise UserError(
            f"--native host: the host lacks {what} (load the host's MPI and the benchmarks, "
            "e.g. `spack load dedal-benchmarks`, or use --native rootfs)"
        )
    if mode == "host" or (mode == "auto" and have_host and native_root is None):
        mpi = (host_mpi or {}).get("version_line") or "srun"
        return Native(
            "host",
            None,
            f"the host's own MPI stack ({mpi}) and benchmark programs from the host's PATH "
            "(a separate build of the same benchmarks), no container",
            {p: str(host_programs[p]) for p in wanted},
            time.monotonic() - start,
        )
    if native_root is not None:
        root = Path(native_root)
        if not root.is_dir():
            raise UserError(f"--native-root {root}: not a directory")
        differ = []
        for name, digest in info.digests.items():
            if name not in wanted:
                continue
            host = runtime.host_path(root, info.programs[name])
            if host is None or not host.is_file() or sha256_file(host) != digest:
                differ.append(name)
        if differ:
            raise UserError(
                f"--native-root {root}: {', '.join(differ)} differ from the image's (not the same "
                "binaries, so the comparison would mean nothing)"
            )
        return Native(
            "rootfs",
            root,
            f"the image's programs and libraries from the directory {root} (checked: "
            f"the benchmark binaries are byte-identical to the image's), run with {NATIVE_RUN}",
            dict(info.programs),
            time.monotonic() - start,
        )
    if info.kind == "dir":
        return Native(
            "same-dir",
            info.path,
            f"the same root directory as the container runs ({info.path}), run "
            f"with {NATIVE_RUN}; native and container differ only in the sandbox",
            dict(info.programs),
            time.monotonic() - start,
        )
    root, reused = unpack_root(info, cache, progress=progress)
    return Native(
        "rootfs",
        root,
        f"the image's own root filesystem unpacked onto local storage ({root}): the same "
        f"binaries and libraries as plain files instead of the mounted image, run with {NATIVE_RUN}",
        dict(info.programs),
        time.monotonic() - start,
        cached=reused,
    )
