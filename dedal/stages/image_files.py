"""Reading the files of an image's root file system (a mounted partition) without following
anything out of it: the no-follow discipline of `dedal diff` and `dedal rebuild`.

An image is input like any other: ``/opt/dedal/env`` may be an absolute symlink to a host
directory, ``env.yaml`` a symlink to a host file, a "file" a FIFO or a device, a
partition corrupt. So every path is opened component by component, each relative to the
directory before it (``openat``) with ``O_NOFOLLOW``: a symlink anywhere on the way is
refused, never followed; only directories and regular files are read; what is copied out
is bounded in bytes and entries; a read error of the partition (a corrupt image) is a
UserError naming the entry. :func:`copy_out` writes under a temporary name and renames,
so the copy exists whole or not at all. :func:`raw_names` lists a directory as the file
system has it, entries named ``.`` or ``..`` included, which ``os.scandir`` hides.
"""

from __future__ import annotations

import ctypes
import os
import stat
import struct
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from dedal.errors import UserError
from dedal.model.artifacts import atomic_path

MAX_COPY_BYTES = 256 << 20  # what `copy_out` copies at most (an image's /opt/dedal/env is kilobytes)
MAX_COPY_ENTRIES = 100_000
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class Missing(UserError):
    """A path the image does not have."""


def kind(mode: int) -> str:
    return {
        stat.S_IFDIR: "a directory",
        stat.S_IFREG: "a regular file",
        stat.S_IFLNK: "a symlink",
        stat.S_IFCHR: "a character device",
        stat.S_IFBLK: "a block device",
        stat.S_IFIFO: "a FIFO",
        stat.S_IFSOCK: "a socket",
    }.get(stat.S_IFMT(mode), "of an unknown type")


def shown(name: str, backslash: bool = True) -> str:
    """A name for one line of text: every character that is not printable (line breaks,
    terminal escapes, bytes that are no UTF-8) escaped as Python writes them, and the
    backslash too (unless ``backslash`` is False: a line already made of shown names);
    the rest as it is."""
    out = []
    for ch in name:
        if ch == "\\" and backslash:
            out.append("\\\\")
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(repr(ch)[1:-1])
    return "".join(out)


def _corrupt(where: str, rel: str, exc: OSError) -> UserError:
    return UserError(
        f"{where}: cannot read {shown(rel)!s} in its root file system ({exc.strerror or exc}); the image is corrupt"
    )


def open_dir(root: Path, rel: str, where: str) -> int:
    """A file descriptor of directory ``rel`` under ``root``, every component opened with
    O_NOFOLLOW relative to the one before; UserError where one is no directory."""
    fd = os.open(root, _DIR_FLAGS)
    done = ""
    try:
        for part in [p for p in rel.split("/") if p]:
            if part in (".", ".."):
                raise UserError(f"{where}: the path {shown(rel)} climbs ({part!r})")
            done = f"{done}/{part}"
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                raise Missing(f"{where}: {shown(done)} does not exist") from None
            except OSError as exc:
                raise _corrupt(where, done, exc) from None
            if not stat.S_ISDIR(st.st_mode):
                what = kind(st.st_mode)
                if stat.S_ISLNK(st.st_mode):
                    what += f" (-> {shown(os.readlink(part, dir_fd=fd))})"
                raise UserError(f"{where}: {done} is {what}, not a directory: nothing is followed out of the image")
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise _corrupt(where, done, exc) from None
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def copy_out(
    root: Path,
    rel: str,
    dest: Path,
    where: str,
    *,
    required: Sequence[str] = (),
    max_bytes: int = MAX_COPY_BYTES,
    max_entries: int = MAX_COPY_ENTRIES,
) -> Path:
    """Copy directory ``rel`` of the tree at ``root`` (a mounted image) to ``dest`` (which
    is replaced): directories and regular files only, nothing followed, at most
    ``max_bytes`` and ``max_entries``, the files named in ``required`` present (else
    :class:`Missing`); written under a temporary name (:func:`atomic_path`) and renamed,
    so a refusal or a read error leaves nothing. UserError (one line) for whatever is refused."""
    dest = Path(dest)
    fd = open_dir(Path(root), rel, where)
    budget = [max_bytes, max_entries]
    try:
        with atomic_path(dest) as tmp:
            _copy_dir(fd, tmp, rel.strip("/"), where, budget)
            absent = [name for name in required if not (tmp / name).is_file()]
            if absent:
                raise Missing(f"{where}: it has no {', '.join(absent)}")
    finally:
        os.close(fd)
    return dest


def _copy_dir(fd: int, dest: Path, rel: str, where: str, budget: List[int]) -> None:
    os.mkdir(dest, 0o755)
    try:
        names = sorted(os.listdir(fd))
    except OSError as exc:
        raise _corrupt(where, rel, exc) from None
    for name in names:
        path = f"{rel}/{name}"
        budget[1] -= 1
        if budget[1] < 0:
            raise UserError(f"{where}: {shown(rel)} holds more than {MAX_COPY_ENTRIES} entries")
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError as exc:
            raise _corrupt(where, path, exc) from None
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise _corrupt(where, path, exc) from None
            try:
                _copy_dir(sub, dest / name, path, where, budget)
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode):
            budget[0] -= st.st_size
            if budget[0] < 0:
                raise UserError(f"{where}: {shown(path)} is too large: the copy would pass {MAX_COPY_BYTES >> 20} MiB")
            _copy_file(fd, name, dest / name, path, where, st.st_size)
        else:
            what = kind(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                what += f" (-> {shown(os.readlink(name, dir_fd=fd))})"
            raise UserError(f"{where}: {shown(path)} is {what}, not a regular file or directory: refused")


def _copy_file(dir_fd: int, name: str, dest: Path, rel: str, where: str, size: int) -> None:
    try:
        src = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise _corrupt(where, rel, exc) from None
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):  # swapped since the stat: refused all the same
            raise UserError(f"{where}: {shown(rel)} is not a regular file: refused")
        os.set_blocking(src, True)
        with open(dest, "xb") as out:
            left = size
            while left > 0:
                try:
                    chunk = os.read(src, min(left, 1 << 20))
                except OSError as exc:
                    raise _corrupt(where, rel, exc) from None
                if not chunk:
                    break
                out.write(chunk)
                left -= len(chunk)
        os.chmod(dest, 0o644)
    finally:
        os.close(src)


# ---------------------------------------------------------------------------- raw listing

_DIRENT = struct.Struct("=QqHB")  # struct linux_dirent64: d_ino, d_off, d_reclen, d_type; then d_name
_getdents: Optional[object] = None


def _libc_getdents():  # noqa: ANN202
    global _getdents
    if _getdents is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).getdents64  # glibc >= 2.30
            fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
            fn.restype = ctypes.c_ssize_t
            _getdents = fn
        except (OSError, AttributeError):
            _getdents = False
    return _getdents or None


_DT = {1: "fifo", 2: "char device", 4: "directory", 6: "block device", 8: "file", 10: "symlink", 12: "socket"}


def raw_names(fd: int) -> Optional[List[Tuple[str, str]]]:
    """Every entry of the directory open as ``fd`` as the file system lists it: (name, type)
    with the first ``.`` and ``..`` left out but any further ones kept (a crafted squashfs
    may hold an entry named ``..``, which ``os.scandir`` never shows); None where the C
    library has no getdents64."""
    fn = _libc_getdents()
    if fn is None:
        return None
    os.lseek(fd, 0, os.SEEK_SET)
    buf = ctypes.create_string_buffer(1 << 16)
    found: List[Tuple[str, str]] = []
    dots = {".": 0, "..": 0}
    while True:
        n = fn(fd, buf, len(buf))
        if n < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        if n == 0:
            break
        raw = buf.raw[:n]
        pos = 0
        while pos < n:
            _ino, _off, reclen, dtype = _DIRENT.unpack_from(raw, pos)
            name = raw[pos + _DIRENT.size : pos + reclen].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            pos += reclen
            if name in dots and dots[name] == 0:
                dots[name] = 1
                continue
            found.append((name, _DT.get(dtype, "?")))
    os.lseek(fd, 0, os.SEEK_SET)
    return found
