"""squashfs-tools and squashfuse: packing, listing, extracting and mounting images.

Packing is reproducible by default (fixed times, all files owned by root) and fast
(zstd level 3), see ../shared/notes/real-components.md section 1.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Dict, Iterable, List, Optional

from dedal.adapters import proc
from dedal.errors import NoSpace, ToolError
from dedal.ui.console import human_size
from dedal.ui.progress import Transfers, meter

HINT = "install squashfs-tools (apt-get install squashfs-tools)"


def _threads(processors: Optional[int]) -> str:
    return str(processors or os.cpu_count() or 1)


_VERSION: Dict[str, str] = {}


def version() -> str:
    """mksquashfs's version line: part of cache keys for what it packed."""
    if "mksquashfs" not in _VERSION:
        proc.which("mksquashfs", HINT)
        out = proc.run(["mksquashfs", "-version"], what="mksquashfs -version", check=False).stdout
        _VERSION["mksquashfs"] = (out.strip().splitlines() or ["unknown"])[0]
    return _VERSION["mksquashfs"]


def input_bytes(sources: Iterable[Path]) -> int:
    """Bytes of the regular files under ``sources``: what mksquashfs will read."""
    total = 0
    for src in sources:
        for top, _dirs, files in os.walk(src):
            for name in files:
                try:
                    st = os.lstat(os.path.join(top, name))
                except OSError:
                    continue
                if st.st_mode & 0o170000 == 0o100000:
                    total += st.st_size
    return total


def _read_bytes(pid: int) -> int:
    """Bytes process ``pid`` (all its threads) has read so far (``rchar`` of /proc/PID/io)."""
    try:
        with open(f"/proc/{pid}/io") as fh:
            for line in fh:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _run_metered(cmd: List[str], sources: List[Path], *, what: str, log: Optional[Path], env: Dict[str, str]) -> None:
    """Run mksquashfs; on a live display, a bar of the input bytes it has read."""
    if not Transfers.showing():
        proc.run(cmd, what=what, log=log, env=env)
        return
    total = input_bytes(sources)
    with meter(what, total) as m:
        proc.run(cmd, what=what, log=log, env=env, watch=lambda pid: m.update(min(total, _read_bytes(pid))))


def pack(
    sources: Iterable[Path],
    out: Path,
    *,
    keep_as_directory: bool = False,
    exclude: Iterable[str] = (),
    level: int = 3,
    processors: Optional[int] = None,
    log: Optional[Path] = None,
    what: str = "mksquashfs",
    offset: int = 0,
) -> None:
    """Pack directories into ``out`` (replaced if present).

    With one source and ``keep_as_directory`` the image root holds that directory by
    name (a layer keeps its prefix directory); otherwise the source's contents.
    ``exclude`` takes paths relative to the source(s), as mksquashfs ``-e``.
    ``offset``: the image starts that many bytes into ``out`` (zeros before it), e.g.
    at a SIF partition's place, so that the SIF need not copy it.
    """
    proc.which("mksquashfs", HINT)
    sources = [Path(s) for s in sources]
    cmd: List[str] = [
        "mksquashfs",
        *[os.fspath(s) for s in sources],
        os.fspath(out),
        "-noappend",
        "-all-root",
        "-comp",
        "zstd",
        "-Xcompression-level",
        str(level),
        "-mkfs-time",
        "0",
        "-all-time",
        "0",
        "-processors",
        _threads(processors),
        "-no-progress",
        "-quiet",
    ]
    if keep_as_directory:
        cmd.append("-keep-as-directory")
    if offset:
        cmd += ["-offset", str(int(offset))]
    excludes = list(exclude)
    if excludes:
        cmd += ["-wildcards", "-e", *excludes]
    # mksquashfs refuses SOURCE_DATE_EPOCH together with -mkfs-time/-all-time ("can't be used
    # at the same time"); the fixed times above already make the image reproducible
    env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
    _run_metered(cmd, sources, what=what, log=log, env=env)


def append(
    image: Path,
    sources: Iterable[Path],
    out: Path,
    *,
    offset: int = 0,
    root_mode: int = 0o755,
    processors: Optional[int] = None,
    log: Optional[Path] = None,
    what: str = "mksquashfs (append)",
) -> None:
    """``out`` = a copy of the squashfs ``image`` (at ``offset``, zeros before it) with
    ``sources`` added to its root directory by name: the copied part is not compressed
    again. Names already in ``image``'s root would come out renamed (``NAME_1``), so
    callers pass only names the image lacks. Compressor and block size are the image's;
    times and owners are fixed as in :func:`pack`."""
    proc.which("mksquashfs", HINT)
    out = Path(out)
    sources = [Path(s) for s in sources]
    with open(image, "rb") as src, open(out, "wb") as dst:
        if offset:
            dst.truncate(int(offset))
            dst.seek(int(offset))
        left = os.fstat(src.fileno()).st_size
        while left > 0:  # in the kernel, no copy through Python
            n = os.sendfile(dst.fileno(), src.fileno(), None, min(left, 1 << 30))
            if n <= 0:
                raise OSError(f"copying {image} to {out}: short copy")
            left -= n
    cmd: List[str] = [
        "mksquashfs",
        *[os.fspath(s) for s in sources],
        os.fspath(out),
        "-all-root",
        "-mkfs-time",
        "0",
        "-all-time",
        "0",
        "-root-mode",
        f"{root_mode & 0o7777:o}",
        "-processors",
        _threads(processors),
        "-no-recovery",
        "-no-progress",
        "-quiet",
    ]
    if offset:
        cmd += ["-offset", str(int(offset))]
    env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
    _run_metered(cmd, sources, what=what, log=log, env=env)


def diff(old: Path, new: Path) -> str:
    """What differs between two images' contents (entries, targets, owners, modes, times,
    file bytes; not their layout): empty when equal. squashfs-tools-ng's sqfsdiff."""
    proc.which("sqfsdiff", "install squashfs-tools-ng (apt-get install squashfs-tools-ng)")
    cmd = ["sqfsdiff", "--timestamps", "--old", os.fspath(old), "--new", os.fspath(new)]
    res = proc.run(cmd, what="sqfsdiff", check=False)
    if res.returncode not in (0, 1):
        raise ToolError("sqfsdiff", cmd, res.returncode, None, (res.stderr or res.stdout).strip()[-500:])
    return res.stdout if res.returncode == 1 else ""


def extract(
    image: Path,
    dest: Path,
    *,
    paths: Iterable[str] = (),
    processors: Optional[int] = None,
    log: Optional[Path] = None,
    merge: bool = True,
    devices: bool = True,
    offset: int = 0,
    room: bool = True,
) -> None:
    """Extract ``image`` (or only ``paths`` of it) into ``dest``, merging with what is there
    (``-f``: note that unsquashfs then follows symlinks found there), or with ``merge=False``
    into ``dest`` that must not exist yet (unsquashfs creates it and meets nothing else);
    ``devices=False``: without the image's device nodes (unsquashfs' ``-ex LIST ;``), which a
    user who is not root cannot create (unsquashfs exits 2) and a root run elsewhere mounts its
    own ``/dev`` over; ``offset``: where the squashfs starts in the file (a SIF's partition).
    A whole image is first weighed against the free disk (:func:`check_room`); ``room=False``
    leaves that out where a caller unpacks many small images at once (layers, each listed by
    its audit already, whose sum is what would have to fit), as it costs a listing of each."""
    proc.which("unsquashfs", HINT)
    weigh = room and not paths
    listing = entries(image, offset=offset) if weigh or not devices else []
    left_out = [] if devices else [e["path"] for e in listing if e["mode"][:1] in ("b", "c")]
    Path(dest).parent.mkdir(parents=True, exist_ok=True)  # unsquashfs creates dest, not its parents
    if weigh:
        check_room(image, Path(dest), unpacked_bytes(listing))
    cmd = [
        "unsquashfs",
        *(["-f"] if merge else []),
        "-no-progress",
        "-quiet",
        "-n",
        "-p",
        _threads(processors),
        *(["-o", str(int(offset))] if offset else []),
        *(["-ex", *left_out, ";"] if left_out else []),
        "-d",
        os.fspath(dest),
        os.fspath(image),
        *paths,
    ]
    proc.run(cmd, what="unsquashfs", log=log)


BLOCK = 4096  # the block of the usual file systems (ext4, xfs, tmpfs): a file takes whole ones


def unpacked_bytes(listing: Iterable[Dict[str, str]]) -> int:
    """About what unpacking ``listing`` (:func:`entries`) takes on disk: each regular file's
    size rounded up to whole blocks, a block for each directory; links and device nodes live
    in their inodes. A hard-linked file counts at each of its names: more, never less."""
    total = 0
    for e in listing:
        kind = e.get("mode", "")[:1]
        if kind == "-":
            total += -(-int(e["size"] or 0) // BLOCK) * BLOCK
        elif kind == "d":
            total += BLOCK
    return total


def check_room(image: Path, dest: Path, needed: int) -> None:
    """Refuse to unpack ``image`` into ``dest`` where its file system has less free than
    ``needed``: the unpack of a large image (the native runs' root, an assembly's tree) would
    otherwise stop halfway with unsquashfs' "No space left on device", after minutes. Quotas
    that the file system does not show in its free space (Lustre's, GPFS's) are not seen."""
    place = Path(dest)
    while not place.exists() and place != place.parent:
        place = place.parent
    free = shutil.disk_usage(place).free
    if needed > free:
        raise NoSpace(
            f"unpacking {image} needs about {human_size(needed)} in {place}, which has "
            f"{human_size(free)} free: free some space there, or set DEDAL_CACHE_DIR, DEDAL_DATA_DIR "
            "or TMPDIR (whichever holds it) to a larger file system"
        )


def read_text(image: Path, member: str) -> Optional[str]:
    """One file of an image as text (``unsquashfs -cat``), without unpacking the image;
    None where the image has no such regular file."""
    proc.which("unsquashfs", HINT)
    res = proc.run(["unsquashfs", "-cat", os.fspath(image), member], what="unsquashfs -cat", check=False)
    return res.stdout if res.returncode == 0 else None


_LS = re.compile(r"^(?P<mode>\S{10})\s+(?P<owner>\S+)\s+(?P<size>\d+|\d+,\s*\d+)\s+\S+\s+\S+\s+(?P<path>.*)$")


def entries(image: Path, *, offset: int = 0) -> List[Dict[str, str]]:
    """Every entry of an image: path (relative, without the squashfs-root prefix), mode string,
    size (``major,minor`` for a device) and, for symlinks, the target. Used to audit layers
    and pulled images before they are trusted; ``offset``: where the squashfs starts in the
    file (a SIF's partition).

    A line that does not parse (a name holding a line break continues on the next line) is
    returned as ``{"unparsed": line}``, for the audit to refuse: skipping it would let a
    name hide the rest of its entry."""
    proc.which("unsquashfs", HINT)
    at = ["-o", str(int(offset))] if offset else []
    out = proc.run(["unsquashfs", *at, "-lls", "-n", "-d", "", os.fspath(image)], what="unsquashfs -lls").stdout
    result: List[Dict[str, str]] = []
    for line in out.splitlines():
        m = _LS.match(line)
        if not m:
            if line.strip():
                result.append({"path": "", "mode": "", "size": "", "target": "", "unparsed": line})
            continue
        path = m.group("path")
        target = ""
        if m.group("mode").startswith("l") and " -> " in path:
            path, target = path.split(" -> ", 1)
        path = path.lstrip("/")
        if not path:
            continue
        result.append(
            {"path": path, "mode": m.group("mode"), "size": re.sub(r"\s+", "", m.group("size")), "target": target}
        )
    return result


def superblock(image: Path) -> Dict[str, str]:
    """Selected superblock facts (compression, inode count, size) from ``unsquashfs -s``."""
    proc.which("unsquashfs", HINT)
    out = proc.run(["unsquashfs", "-s", os.fspath(image)], what="unsquashfs -s").stdout
    info: Dict[str, str] = {}
    for line in out.splitlines():
        if line.startswith("Compression "):
            info["compression"] = line.split()[1]
        elif line.startswith("Number of inodes"):
            info["inodes"] = line.split()[-1]
        elif line.startswith("Filesystem size"):
            m = re.search(r"(\d+) bytes", line)
            if m:
                info["bytes"] = m.group(1)
    return info


def mount(image: Path, mountpoint: Path, *, offset: int = 0, kernel: Optional[bool] = None) -> str:
    """Mount read-only; returns the method, which ``unmount`` needs.

    As root the kernel's squashfs through a loop device (``kernel``), as Apptainer does
    in its setuid mode: much faster to read than FUSE (shared libraries at program
    start-up, MPI_Init). Otherwise, or when the kernel mount fails, squashfuse
    (``fuse``, unprivileged where /dev/fuse allows), as Apptainer does without setuid."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    if kernel is None:
        kernel = os.geteuid() == 0
    if kernel:
        opts = "loop,ro" + (f",offset={offset}" if offset else "")
        res = proc.run(
            ["mount", "-t", "squashfs", "-o", opts, os.fspath(image), os.fspath(mountpoint)],
            what="mount -t squashfs",
            check=False,
        )
        if res.returncode == 0:
            return "kernel"
    proc.which("squashfuse", "install squashfuse (apt-get install squashfuse fuse3)")
    cmd = ["squashfuse"]
    if offset:
        cmd += ["-o", f"offset={offset}"]
    proc.run([*cmd, os.fspath(image), os.fspath(mountpoint)], what="squashfuse")
    return "fuse"


def unmount(mountpoint: Path, method: str = "fuse", lazy: bool = False) -> None:
    if method == "kernel":
        proc.run(["umount", *(["-l"] if lazy else []), os.fspath(mountpoint)], what="umount")
    else:
        proc.run(["fusermount3", "-u", *(["-z"] if lazy else []), os.fspath(mountpoint)], what="fusermount3 -u")
