"""What every container runtime shares: binds, roots, the environment inside, the interface.

Each backend module (:mod:`.bwrap`, :mod:`.charliecloud`, :mod:`.apptainer`) builds its own
command line from the same pieces, kept here so that the backends agree:

* ``Bind(src, dst)``: a host path seen inside; ``dst`` may name a path the root lacks
  (e.g. the fixed install root ``/opt/esd/software``), see :func:`resolve_in_image`;
* the root: a directory, a squashfs file or a SIF (by content, :func:`root_kind`), or
  ``None`` for the host's own root; :func:`mounted` gives a squashfs/SIF as a directory
  (mounted read-only with squashfuse, a SIF at the offset of its primary system partition,
  unmounted afterwards);
* the environment inside, the same with every backend: a clean environment (``PATH``,
  ``HOME``, ``LANG``, ``TERM``, ``USER``, :func:`base_env`), then the image's own
  ``/.singularity.d/env/*.sh`` sourced in order as Apptainer does
  (:func:`image_env_scripts`, :func:`wrap_with_image_env`), then the caller's ``env``
  (last word), plus ``OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1`` when
  running as root;
* :class:`Prepared`, what a backend yields: the full command line, the environment of the
  runtime process itself, mount points it made in a writable root;
* :class:`Request`, one command as every backend takes it (the command, binds, env, cwd,
  writable, nv, per node);
* :class:`Backend`, the one interface the backend modules provide.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import ContextManager, Dict, Iterator, List, Mapping, Optional, Protocol, Sequence, Tuple, Union

from dedal.adapters import squashfs
from dedal.errors import DedalError, UserError, signals_held
from dedal.model import sif
from dedal.model.image import STD_PATH
from dedal.model.mounts import mounted_under

ENV_DIR = "/.singularity.d/env"
HINTS = {
    "bwrap": "install bubblewrap (apt-get install bubblewrap)",
    "ch-run": "install Charliecloud (apt-get install charliecloud-runtime)",
    "apptainer": "install Apptainer (https://apptainer.org/docs/admin/main/installation.html)",
    "squashfuse": "install squashfuse (apt-get install squashfuse fuse3)",
}


@dataclass(frozen=True)
class Instance:
    """A running Apptainer instance of ``image`` (``apptainer instance start``), on every node of
    an allocation: a root that commands join (``apptainer exec instance://NAME``), so that they
    share its one mount of the image; its binds and GPU access are the instance's. ``nodes``:
    the nodes of the allocation that have it (empty: this machine), where the steps that join
    it must run."""

    name: str
    image: Path
    nodes: Tuple[str, ...] = ()

    @property
    def ref(self) -> str:
        return f"instance://{self.name}"


RootArg = Union[None, str, os.PathLike, Instance]


@dataclass(frozen=True)
class Bind:
    """Host ``src`` seen at ``dst`` inside (``dst`` defaults to ``src``)."""

    src: Union[str, os.PathLike]
    dst: Optional[str] = None
    readonly: bool = False

    @property
    def target(self) -> str:
        return norm(self.dst if self.dst is not None else os.fspath(self.src))


def norm(path: str) -> str:
    """``path`` as an absolute, normalized container path."""
    p = os.path.normpath("/" + str(path))
    return "/" + p.lstrip("/")


def check_bind_sources(binds: Sequence[Bind]) -> None:
    """Every bind's host side must exist (checked once, before any backend runs)."""
    for b in binds:
        if not os.path.exists(b.src):
            raise UserError(f"bind source {b.src} does not exist")


@dataclass
class Prepared:
    """A backend's full command line for one command in one root."""

    argv: List[str]
    env: Dict[str, str]  # environment of the runtime process itself
    created: List[Path] = field(default_factory=list)  # mount points made in a writable root
    #: where ``argv`` names an image mounted on this host: (mount directory, image file,
    #: offset of its squashfs); a process on another node mounts it there itself
    mount: Optional[Tuple[str, str, int]] = None


@dataclass(frozen=True)
class Request:
    """One command to run in a root, as :func:`~.launch.prepared` hands it to a backend:
    ``cmd`` with ``binds``, ``env`` (the caller's, over :func:`base_env`), ``cwd``,
    ``writable`` (a directory root changed in place), ``nv`` (GPU passthrough) and
    ``per_node`` (the ranks of an srun step on one node share one container, where the
    runtime can). One value, so that the backends' ``prepare`` and ``command`` take the
    same thing instead of the same seven arguments each."""

    cmd: Sequence[str]
    binds: Sequence[Bind] = ()
    env: Optional[Mapping[str, str]] = None
    cwd: Optional[str] = None
    writable: bool = False
    nv: bool = False
    per_node: bool = False


class Backend(Protocol):
    """What each backend module (bwrap, charliecloud, apptainer) provides, by the same names.

    ``TOOL``: the program it runs (looked for on PATH by ``auto``); ``prepare``: how that
    runtime gets at a root of ``kind`` (mounting a squashfs/SIF where it cannot open it
    itself) around its ``command(root, request, ...)``, which builds the command line (the
    image env scripts sourced first: every backend gives the same environment inside);
    what it mounted or created is undone when the block ends."""

    TOOL: str

    def prepare(self, root: RootArg, kind: str, request: Request) -> ContextManager[Prepared]: ...


# ---------------------------------------------------------------------------- roots


def root_kind(root: RootArg) -> str:
    """``host``, ``dir``, ``squashfs``, ``sif`` (by content, not by name) or ``instance``."""
    if root is None:
        return "host"
    if isinstance(root, Instance):
        return "instance"
    p = Path(root)
    if p.is_dir():
        return "dir"
    if not p.exists():
        raise UserError(f"{p}: no such image or directory")
    with open(p, "rb") as fh:
        head = fh.read(48)
    if head[:4] == b"hsqs":
        return "squashfs"
    if head[32:42] == b"SIF_MAGIC\x00":
        return "sif"
    raise UserError(f"{p}: not an image (expected a directory, a squashfs file or a SIF)")


def mount_source(root: RootArg) -> Optional[Tuple[Path, int]]:
    """The file and the offset of the squashfs to mount for ``root`` (a SIF's primary
    partition, a squashfs file at 0); None for a directory or the host."""
    kind = root_kind(root)
    if kind in ("host", "dir", "instance"):
        return None
    if kind == "sif":
        info = sif.read_sif(root)  # type: ignore[arg-type]
        part = sif.primary_partition(info)
        if part.fstype != "Squashfs":
            raise UserError(f"{root}: primary partition is {part.fstype}, only squashfs can be mounted")
        return Path(root), part.offset  # type: ignore[arg-type]
    return Path(root), 0  # type: ignore[arg-type]


def note_mount(prep: Prepared, root: RootArg, rootdir: Optional[Path]) -> Prepared:
    """Record in ``prep`` that its command line names ``root`` mounted at ``rootdir``."""
    source = mount_source(root)
    if source is not None and rootdir is not None:
        prep.mount = (os.fspath(rootdir), os.fspath(source[0]), source[1])
    return prep


def cannot_mount() -> bool:
    """Whether this process can have no squashfs mounted: a user who is not root and may not
    open /dev/fuse (no kernel mount, no squashfuse). Apptainer then unpacks (``--unsquash``),
    and so does :func:`mounted`."""
    return os.geteuid() != 0 and not os.access("/dev/fuse", os.R_OK | os.W_OK)


@contextlib.contextmanager
def mounted(root: RootArg) -> Iterator[Optional[Path]]:
    """The root as a directory for the duration of the block (squashfs/SIF mounted read-only
    with squashfuse in a temporary directory, unmounted afterwards; where nothing can be
    mounted, :func:`cannot_mount`, unpacked there without its device nodes and removed
    afterwards); ``None`` for the host."""
    source = mount_source(root)
    if source is None:
        yield None if root is None else Path(root)
        return
    offset = source[1]
    made: List[Path] = []
    try:
        with signals_held():  # made and known to the removal below in one step (as apptainer's private dirs)
            made.append(Path(tempfile.mkdtemp(prefix="dedal-root-")))
        mnt = made[0]
        if cannot_mount():
            squashfs.extract(source[0], mnt / "root", offset=offset, devices=False, merge=False)
            yield mnt / "root"
            return
        method = squashfs.mount(Path(root), mnt, offset=offset)  # type: ignore[arg-type]
        try:
            yield mnt
        finally:
            _unmount(mnt, method)
    finally:
        with signals_held():  # whole, not broken off by a stop signal halfway
            for mnt in made:
                _remove_mount_dir(mnt)


def _remove_mount_dir(mnt: Path) -> None:
    """Remove :func:`mounted`'s directory. A stop signal that came while the mount was being
    made (squashfuse or mount had made it, their caller had not yet heard) leaves it mounted
    where nothing knows its method: /proc/self/mountinfo tells, and it is detached lazily. A
    mount that stays (not one of ours) keeps its directory: nothing is removed through it."""
    for point, fstype in mounted_under(mnt):
        try:
            squashfs.unmount(Path(point), "kernel" if fstype == "squashfs" else "fuse", lazy=True)
        except DedalError:
            pass
    if not mounted_under(mnt):
        shutil.rmtree(mnt, ignore_errors=True)


def _unmount(mnt: Path, method: str = "fuse") -> None:
    """Unmount :func:`mounted`'s image; its directory goes in :func:`_remove_mount_dir`."""
    for attempt in range(20):  # a process that just exited may keep the mount busy briefly
        try:
            squashfs.unmount(mnt, method)
            break
        except Exception:
            if attempt == 19:  # still busy (a stray daemon of the command): detach it lazily
                squashfs.unmount(mnt, method, lazy=True)
                break
            time.sleep(0.1)


def in_root(rootdir: Path, cpath: str) -> Path:
    """The host path of container path ``cpath`` in the directory root ``rootdir``."""
    return rootdir / cpath.lstrip("/")


def resolve_in_image(rootdir: Path, cpath: str, depth: int = 0) -> Tuple[str, str]:
    """Follow symlinks of the image (relative to its root) along ``cpath``.

    Returns (deepest existing container path, remaining missing part or "")."""
    if depth > 40:
        raise UserError(f"too many levels of symbolic links in the image resolving {cpath}")
    parts = [p for p in PurePosixPath(cpath).parts if p != "/"]
    cur = "/"
    for i, part in enumerate(parts):
        nxt = norm(f"{cur}/{part}")
        host = in_root(rootdir, nxt)
        if host.is_symlink():
            target = os.readlink(host)
            base = target if target.startswith("/") else f"{cur}/{target}"
            rest = "/".join(parts[i + 1 :])
            return resolve_in_image(rootdir, norm(f"{base}/{rest}" if rest else base), depth + 1)
        if not host.exists():
            return cur, "/".join(parts[i:])
        cur = nxt
    return cur, ""


def host_path(rootdir: Path, cpath: str) -> Optional[Path]:
    """Where the image's ``cpath`` lies on this host, its symlinks resolved inside the image (an
    absolute link such as Spack's ``/opt/view -> /opt/._view/HASH`` points into the image, not
    at the host); None where it is not in the image."""
    try:
        existing, missing = resolve_in_image(rootdir, cpath)
    except UserError:  # a loop of links
        return None
    return None if missing else in_root(rootdir, existing)


def make_mount_points(rootdir: Path, dests: Sequence[Tuple[str, bool]]) -> List[Path]:
    """In a writable directory root: create missing mount points (dirs, or files for file
    binds); returns what was created, deepest last, for removal afterwards."""
    created: List[Path] = []
    for dst, is_file in dests:
        existing, missing = resolve_in_image(rootdir, dst)
        if not missing:
            continue
        parts = missing.split("/")
        cur = existing
        for i, part in enumerate(parts):
            cur = norm(f"{cur}/{part}")
            host = in_root(rootdir, cur)
            if i == len(parts) - 1 and is_file:
                host.touch()
            else:
                host.mkdir()
            created.append(host)
    return created


def remove_mount_points(created: List[Path]) -> None:
    for path in reversed(created):
        try:
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            elif path.is_file() and path.stat().st_size == 0:
                path.unlink()
        except OSError:
            pass  # something was written there: keep it rather than lose data


# ---------------------------------------------------------------------------- environment


def base_env(extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The clean environment every command starts from (before the image's own scripts)."""
    is_root = os.geteuid() == 0
    env = {
        "PATH": STD_PATH,
        "HOME": "/root" if is_root else "/tmp",
        "LANG": "C.UTF-8",
        "USER": os.environ.get("USER") or ("root" if is_root else str(os.geteuid())),
    }
    if os.environ.get("TERM"):
        env["TERM"] = os.environ["TERM"]
    if is_root:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    if extra:
        env.update(extra)
    return env


def image_env_scripts(rootdir: Optional[Path]) -> List[str]:
    """The image's ``/.singularity.d/env/*.sh`` (container paths, in the order Apptainer sources them)."""
    if rootdir is None:
        return []
    d = rootdir / ENV_DIR.lstrip("/")
    if not d.is_dir():
        return []
    return [f"{ENV_DIR}/{p.name}" for p in sorted(d.iterdir()) if p.name.endswith(".sh")]


def wrap_with_image_env(
    cmd: Sequence[str],
    scripts: Sequence[str],
    env: Mapping[str, str],
    first: Optional[Mapping[str, str]] = None,
    start: Optional[str] = None,
) -> List[str]:
    """``/bin/sh -c`` that exports ``first`` (the clean environment, where the runtime could
    not set it itself), changes to ``start`` if given (else to ``HOME``, else ``/``, as
    bwrap does), sources the image's env scripts, re-exports the caller's variables (which
    win, like Apptainer's ``--env``) and execs ``cmd``. Values are single-quoted: they
    arrive verbatim, never expanded."""
    lines = [f"export {k}={shlex.quote(v)}" for k, v in (first or {}).items()]
    if start is not None:
        lines.append(f'{{ cd {shlex.quote(start)} || cd "$HOME" || cd /; }} 2>/dev/null; unset OLDPWD')
    lines += [_source(s) for s in scripts]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines.append('exec "$@"')
    return ["/bin/sh", "-c", "; ".join(lines), "dedal-env", *cmd]  # one line: logs show it on the "$ " line


def _source(script: str) -> str:
    """The shell line that sources ``script`` if present; a pattern (``*.sh``) sources
    every match in order, as Apptainer's own action scripts do."""
    if "*" in script:
        return f'for _dedal_s in {script}; do [ -f "$_dedal_s" ] && . "$_dedal_s"; done; unset _dedal_s'
    return f"[ -f {shlex.quote(script)} ] && . {shlex.quote(script)}"


def with_image_env(cmd: Sequence[str], scripts: Sequence[str], env: Optional[Mapping[str, str]]) -> List[str]:
    """``cmd`` itself where the image has no env scripts, else :func:`wrap_with_image_env`."""
    return list(cmd) if not scripts else wrap_with_image_env(cmd, scripts, env or {})
