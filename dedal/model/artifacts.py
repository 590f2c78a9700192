"""How an artifact is written so that it exists whole or not at all, and how its bytes
and inputs are named by digest: the one helper for every stage.

An artifact is written under a temporary name beside its final one (same directory, so
same file system: the rename is atomic) and renamed over it. The temporary name has one
form everywhere::

    .<final name>.tmp~<owner tag>~<random><suffix>

The owner tag (:func:`dedal.model.owner.owner_tag`: host, boot id, PID namespace, pid,
start time) says whose it is, so that :func:`reap_temporaries` removes what a killed
writer (kill -9, a node lost) left and nothing of a writer that is alive, on another
host, or that this host cannot judge. A SIGTERM'd or failing writer removes its own
(:func:`write_atomic`, :func:`atomic_path`).

Two dedal processes that would write the same artifacts (two build-image runs of one
environment, a verification into the same report directory) take turns through
:func:`exclusive`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import socket
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, List, Optional, Union

from dedal.model.owner import GONE, UNKNOWN, owner_tag, tag_state

TMP_MARK = ".tmp~"
_NAME_MAX = 80  # of the final name in a temporary's name: the owner tag (~130) must fit in 255


def temp_path(final: Union[str, os.PathLike], suffix: str = "") -> Path:
    """A new temporary name for ``final``, beside it, naming this process as its owner."""
    final = Path(final)
    return final.with_name(f".{final.name[:_NAME_MAX]}{TMP_MARK}{owner_tag()}~{secrets.token_hex(4)}{suffix}")


def _owner_prefix(name: str) -> Optional[str]:
    """The part of a temporary's name before its owner tag; None for other names."""
    at = name.find(TMP_MARK)
    return name[: at + len(TMP_MARK)] if name.startswith(".") and at > 0 else None


def is_temporary(name: str) -> bool:
    """Whether ``name`` is a :func:`temp_path` name that records its owner."""
    prefix = _owner_prefix(name)
    return prefix is not None and name[len(prefix) :].count("~") >= 4


def temp_state(name: str) -> str:
    """ALIVE, GONE or UNKNOWN: the state of the writer a temporary's name records
    (UNKNOWN for other names, and where this host cannot tell)."""
    prefix = _owner_prefix(name)
    return tag_state(name, prefix) if prefix is not None else UNKNOWN


def remove_path(path: Path) -> None:
    """Remove a file, link or directory tree; nothing when absent."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def reap_temporaries(directory: Union[str, os.PathLike], of: Optional[str] = None) -> List[str]:
    """Remove the temporaries in ``directory`` (of the final name ``of`` only, if given)
    whose writer is gone; those of live writers, of other hosts or PID namespaces, and
    names without an owner stay. Returns the names removed."""
    directory = Path(directory)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    wanted = f".{of[:_NAME_MAX]}{TMP_MARK}" if of is not None else None
    removed: List[str] = []
    for name in names:
        if wanted is not None and not name.startswith(wanted):
            continue
        if temp_state(name) == GONE:
            path = directory / name
            if os.path.lexists(path):  # another reaper may have been first
                remove_path(path)
                removed.append(name)
    return removed


def _commit(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` over ``final``; a directory replaces whatever ``final`` was."""
    if tmp.is_dir() and not tmp.is_symlink() and os.path.lexists(final):
        remove_path(final)
    os.replace(tmp, final)


@contextlib.contextmanager
def atomic_path(final: Union[str, os.PathLike], suffix: str = "") -> Iterator[Path]:
    """A temporary name for ``final`` that the caller fills (a file or a directory);
    renamed over ``final`` when the block ends without error (if the caller made it),
    removed when it raises."""
    final = Path(final)
    tmp = temp_path(final, suffix)
    try:
        yield tmp
        if os.path.lexists(tmp):
            _commit(tmp, final)
    finally:
        if os.path.lexists(tmp):
            remove_path(tmp)


def write_atomic(
    path: Union[str, os.PathLike],
    data: Union[bytes, str],
    mode: Optional[int] = None,
    fsync: bool = False,
    mkdir: bool = True,
) -> Path:
    """Write ``data`` (str as UTF-8) as ``path``, whole or not at all. ``mode``: the file's
    permissions (default: 0o666 less the umask, as ``open`` makes them); ``fsync``: on
    disk before the rename, for what must survive a crash of the machine."""
    path = Path(path)
    if mkdir:
        path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(raw)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
    return path


def sha256_file(path: Union[str, os.PathLike], start: int = 0, size: Optional[int] = None, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, or of its ``size`` bytes from ``start`` (a SIF partition)."""
    with open(path, "rb") as fh:
        return sha256_stream(fh, start, size, chunk)


def sha256_stream(fh: BinaryIO, start: int = 0, size: Optional[int] = None, chunk: int = 1 << 20) -> str:
    """:func:`sha256_file` of a file the caller opened (with its own checks)."""
    h = hashlib.sha256()
    fh.seek(start)
    left = size
    while left is None or left > 0:
        block = fh.read(chunk if left is None else min(chunk, left))
        if not block:
            break
        h.update(block)
        if left is not None:
            left -= len(block)
    return h.hexdigest()


def inputs_digest(inputs: object, length: Optional[int] = None) -> str:
    """Hex sha256 of what a stage's output is made from, as one JSON value (``json.dumps``
    with sorted keys: a dict's order does not matter), cut to ``length`` characters if
    given. A stage whose recorded digest differs must run again."""
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    return digest[:length] if length else digest


@contextlib.contextmanager
def exclusive(
    guarded: Union[str, os.PathLike], what: str, say: Callable[[str], None] = lambda _m: None
) -> Iterator[None]:
    """``guarded`` (an environment's work directory, a report directory, a base) held by one
    dedal process at a time: the one way two of them take turns at one thing (``what``). An
    flock on ``.<name>.lock`` beside it (beside, not inside: a report directory is replaced
    whole); a second process waits, saying once for whom. The kernel drops the lock when its
    holder ends, however it ends (kill -9 too), so none is ever left stale. Where the file
    system has no flock (Lustre mounted noflock) nothing is held, as before there was a lock."""
    path = Path(guarded).resolve()  # "." has a name too
    lock = path.parent / f".{path.name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as fh:
        held = True
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read(200).strip() or "another dedal"
            say(f"waiting: {holder} is working on {what} (lock {lock})")
            fcntl.flock(fh, fcntl.LOCK_EX)  # a signal interrupts the wait (Ctrl-C, scancel)
        except OSError:
            held = False
        if held:  # who holds it, for the next one's message
            fh.seek(0)
            fh.truncate()
            fh.write(f"dedal pid {os.getpid()} on {socket.gethostname()}\n")
            fh.flush()
        yield
