"""The container runtime: THE seam for running a command inside a root filesystem.

Builds, ``dedal exec``/``shell`` and verification all go through ``run_in`` (to
completion) or ``start_in`` (a launcher such as ``mpirun`` that runs alongside). The
root may be

* a directory (a base root filesystem, a sandbox),
* a squashfs file or a SIF (mounted read-only with squashfuse, a SIF at the offset of
  its primary system partition, and unmounted afterwards),
* ``None``: the host's own root in a private mount namespace (bwrap ``--bind / /``).

Backends (``runtime``): ``apptainer`` (``apptainer exec``), ``bwrap`` (bubblewrap, the
default where Apptainer is absent) and ``charliecloud`` (``ch-run``). ``auto`` picks
apptainer if on PATH, else bwrap, else ch-run.

Every backend gives the same environment inside: a clean environment (``PATH``,
``HOME``, ``LANG``, ``TERM``, ``USER``), then the image's own ``/.singularity.d/env/*.sh``
sourced in order as Apptainer does, then the caller's ``env`` (last word), plus
``OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1`` when running as root.
With bwrap: ``--dev /dev --proc /proc --ro-bind /sys /sys --tmpfs /tmp --tmpfs /run``,
the host's ``/etc/hosts`` and ``/etc/resolv.conf`` (a debootstrap minbase root has no
``/etc/hosts``), the host's InfiniBand and NVIDIA device nodes when present, no new PID
or IPC namespace (shared memory and CMA between ranks keep working).

``Bind(src, dst)`` may name a ``dst`` that does not exist in the root (e.g. the fixed
install root ``/opt/esd/software``). A read-only root cannot get a new mount point, so
bwrap is given a *split* view: the missing path's existing ancestors become tmpfs
directories whose entries are bound one by one from the root, and the new mount point
is created in that tmpfs. The root itself is never modified, except a writable
directory root (``writable=True``, used to build base images), where missing mount
points are created in the root and removed again afterwards.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple, Union

from dedal.adapters import proc, squashfs
from dedal.errors import ToolMissing, UserError

RUNTIMES = ("auto", "apptainer", "bwrap", "charliecloud")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ENV_DIR = "/.singularity.d/env"
HOST_FILES = ("/etc/hosts", "/etc/resolv.conf")
HOST_DEVICES = ("/dev/infiniband", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                "/dev/nvidia-modeset", "/dev/nvidia-caps", "/dev/dri")
HINTS = {
    "bwrap": "install bubblewrap (apt-get install bubblewrap)",
    "ch-run": "install Charliecloud (apt-get install charliecloud-runtime)",
    "apptainer": "install Apptainer (https://apptainer.org/docs/admin/main/installation.html)",
    "squashfuse": "install squashfuse (apt-get install squashfuse fuse3)",
}
RootArg = Union[None, str, os.PathLike]


@dataclass(frozen=True)
class Bind:
    """Host ``src`` seen at ``dst`` inside (``dst`` defaults to ``src``)."""

    src: Union[str, os.PathLike]
    dst: Optional[str] = None
    readonly: bool = False

    @property
    def target(self) -> str:
        return _norm(self.dst if self.dst is not None else os.fspath(self.src))


def _norm(path: str) -> str:
    p = os.path.normpath("/" + str(path))
    return "/" + p.lstrip("/")


# ---------------------------------------------------------------------------- choosing


def _have(tool: str) -> bool:
    try:
        proc.which(tool)
        return True
    except ToolMissing:
        return False


def resolve_runtime(runtime: str = "auto") -> str:
    """The backend ``runtime`` stands for: apptainer, bwrap or charliecloud."""
    if runtime not in RUNTIMES:
        raise UserError(f"runtime: expected one of {', '.join(RUNTIMES)}, got {runtime!r}")
    if runtime != "auto":
        return runtime
    for name, tool in (("apptainer", "apptainer"), ("bwrap", "bwrap"), ("charliecloud", "ch-run")):
        if _have(tool):
            return name
    raise ToolMissing("bwrap", "no container runtime found: install bubblewrap, Charliecloud or Apptainer")


# ---------------------------------------------------------------------------- roots


def root_kind(root: RootArg) -> str:
    """``host``, ``dir``, ``squashfs`` or ``sif`` (by content, not by name)."""
    if root is None:
        return "host"
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


@contextlib.contextmanager
def mounted(root: RootArg) -> Iterator[Optional[Path]]:
    """The root as a directory for the duration of the block (squashfs/SIF mounted read-only
    with squashfuse in a temporary directory, unmounted afterwards); ``None`` for the host."""
    kind = root_kind(root)
    if kind in ("host", "dir"):
        yield None if root is None else Path(root)
        return
    from dedal.model import sif  # local import: sif is model code, this adapter only mounts

    offset = 0
    if kind == "sif":
        info = sif.read_sif(root)  # type: ignore[arg-type]
        part = sif.primary_partition(info)
        if part.fstype != "Squashfs":
            raise UserError(f"{root}: primary partition is {part.fstype}, only squashfs can be mounted")
        offset = part.offset
    mnt = Path(tempfile.mkdtemp(prefix="dedal-root-"))
    try:
        method = squashfs.mount(Path(root), mnt, offset=offset)  # type: ignore[arg-type]
    except BaseException:
        mnt.rmdir()
        raise
    try:
        yield mnt
    finally:
        _unmount(mnt, method)


def _unmount(mnt: Path, method: str = "fuse") -> None:
    for attempt in range(20):  # a process that just exited may keep the mount busy briefly
        try:
            squashfs.unmount(mnt, method)
            break
        except Exception:
            if attempt == 19:  # still busy (a stray daemon of the command): detach it lazily
                squashfs.unmount(mnt, method, lazy=True)
                break
            time.sleep(0.1)
    try:
        mnt.rmdir()
    except OSError:
        pass


# ---------------------------------------------------------------------------- environment


def base_env(extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The clean environment every command starts from (before the image's own scripts)."""
    is_root = os.geteuid() == 0
    env = {
        "PATH": DEFAULT_PATH,
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


def wrap_with_image_env(cmd: Sequence[str], scripts: Sequence[str], env: Mapping[str, str]) -> List[str]:
    """``/bin/sh -c`` that sources the image's env scripts, re-exports the caller's variables
    (which win, like Apptainer's ``--env``) and execs ``cmd``."""
    lines = [f'[ -f {shlex.quote(s)} ] && . {shlex.quote(s)}' for s in scripts]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines.append('exec "$@"')
    return ["/bin/sh", "-c", "\n".join(lines), "dedal-env", *cmd]


# ---------------------------------------------------------------------------- bwrap view


def _in_root(rootdir: Path, cpath: str) -> Path:
    return rootdir / cpath.lstrip("/")


def _resolve(rootdir: Path, cpath: str, depth: int = 0) -> Tuple[str, str]:
    """Follow symlinks of the image (relative to its root) along ``cpath``.

    Returns (deepest existing container path, remaining missing part or "")."""
    if depth > 40:
        raise UserError(f"too many levels of symbolic links in the image resolving {cpath}")
    parts = [p for p in PurePosixPath(cpath).parts if p != "/"]
    cur = "/"
    for i, part in enumerate(parts):
        nxt = _norm(f"{cur}/{part}")
        host = _in_root(rootdir, nxt)
        if host.is_symlink():
            target = os.readlink(host)
            base = target if target.startswith("/") else f"{cur}/{target}"
            rest = "/".join(parts[i + 1:])
            return _resolve(rootdir, _norm(f"{base}/{rest}" if rest else base), depth + 1)
        if not host.exists():
            return cur, "/".join(parts[i:])
        cur = nxt
    return cur, ""


@dataclass
class _View:
    """How a bwrap sandbox sees the root: ``args`` and the container paths to bind to."""

    args: List[str] = field(default_factory=list)
    targets: Dict[str, str] = field(default_factory=dict)  # requested dst -> resolved dst
    mkdirs: List[str] = field(default_factory=list)  # missing directories above new mount points


def _split_view(rootdir: Path, dests: Sequence[str], *, writable: bool, host: bool,
                fresh: Sequence[str] = ()) -> _View:
    """bwrap arguments that show ``rootdir`` at ``/`` with every directory needed as a new
    mount point available, without writing to ``rootdir``. Destinations below ``fresh``
    mounts (the new /dev, /tmp, /run tmpfs) need nothing: bwrap creates them there."""
    view = _View()
    split: Set[str] = set()
    for dst in dests:
        if any(dst != f and dst.startswith(f + "/") for f in fresh):
            view.targets[dst] = dst
            continue
        existing, missing = _resolve(rootdir, dst)
        view.targets[dst] = _norm(f"{existing}/{missing}") if missing else existing
        if missing:
            p = PurePosixPath(existing)
            split.add(str(p))
            split.update(str(a) for a in p.parents)
            parts = missing.split("/")
            for i in range(1, len(parts)):  # bwrap would make these 0700; make them 0755
                d = _norm(f"{existing}/{'/'.join(parts[:i])}")
                if d not in view.mkdirs:
                    view.mkdirs.append(d)
    bind = "--bind" if writable else "--ro-bind"
    if not split:
        view.args += [bind, os.fspath(rootdir), "/"]
        return view
    skip_top = {"/proc", "/dev", "/sys"} if host else set()

    def emit(cpath: str) -> None:
        if cpath != "/":
            view.args += ["--dir", cpath]
        hdir = _in_root(rootdir, cpath)
        for entry in sorted(os.listdir(hdir)):
            child = _norm(f"{cpath}/{entry}")
            if child in skip_top:
                continue
            hchild = hdir / entry
            if hchild.is_symlink():
                view.args += ["--symlink", os.readlink(hchild), child]
            elif child in split:
                emit(child)
            elif hchild.is_dir() or hchild.is_file():
                view.args += [bind, os.fspath(hchild), child]
            # sockets, fifos and device nodes of the image are left out

    emit("/")
    for d in view.mkdirs:
        view.args += ["--dir", d]
    return view


@dataclass
class _Prepared:
    argv: List[str]
    env: Dict[str, str]  # environment of the runtime process itself
    created: List[Path] = field(default_factory=list)  # mount points made in a writable root


def _host_devices() -> List[str]:
    found = []
    for dev in HOST_DEVICES:
        if os.path.exists(dev):
            found.append(dev)
    try:
        found += sorted(f"/dev/{n}" for n in os.listdir("/dev")
                        if n.startswith("nvidia") and n[6:].isdigit())
    except OSError:
        pass
    return found


def _make_mount_points(rootdir: Path, dests: Sequence[Tuple[str, bool]]) -> List[Path]:
    """In a writable directory root: create missing mount points (dirs, or files for file
    binds); returns what was created, deepest last, for removal afterwards."""
    created: List[Path] = []
    for dst, is_file in dests:
        existing, missing = _resolve(rootdir, dst)
        if not missing:
            continue
        parts = missing.split("/")
        cur = existing
        for i, part in enumerate(parts):
            cur = _norm(f"{cur}/{part}")
            host = _in_root(rootdir, cur)
            if i == len(parts) - 1 and is_file:
                host.touch()
            else:
                host.mkdir()
            created.append(host)
    return created


def _remove_mount_points(created: List[Path]) -> None:
    for path in reversed(created):
        try:
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            elif path.is_file() and path.stat().st_size == 0:
                path.unlink()
        except OSError:
            pass  # something was written there: keep it rather than lose data


def bwrap_command(
    rootdir: Optional[Path],
    cmd: Sequence[str],
    *,
    binds: Sequence[Bind] = (),
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    writable: bool = False,
    host_files: bool = True,
    devices: bool = True,
) -> _Prepared:
    """The bwrap command line for ``cmd`` in ``rootdir`` (None: the host root)."""
    bwrap = proc.which("bwrap", HINTS["bwrap"])
    host = rootdir is None
    viewroot = Path("/") if host else rootdir
    assert viewroot is not None
    inner_env = base_env(env)
    scripts = image_env_scripts(rootdir)
    standard = ["/dev", "/proc", "/sys", "/tmp", "/run"]
    extra_files = [] if host or not host_files else [f for f in HOST_FILES if os.path.exists(f)]
    devs = _host_devices() if devices and not host else []
    for b in binds:
        if not os.path.exists(b.src):
            raise UserError(f"bind source {b.src} does not exist")
    user_dsts = [b.target for b in binds]
    created: List[Path] = []
    if writable and not host:
        wanted = ([(d, False) for d in standard] + [(f, True) for f in extra_files]
                  + [(b.target, Path(b.src).is_file()) for b in binds])
        created = _make_mount_points(viewroot, [(d, f) for d, f in wanted
                                                if not d.startswith(("/dev/", "/run/"))])
        view = _split_view(viewroot, standard + extra_files + devs + user_dsts, writable=True, host=False,
                           fresh=["/dev", "/run"])
    else:
        fresh = [] if host else ["/dev", "/run"] + ([] if writable else ["/tmp"])
        view = _split_view(viewroot, standard + extra_files + devs + user_dsts, writable=writable or host,
                           host=host, fresh=fresh)
    args = [bwrap, "--die-with-parent", *view.args]
    if host:  # the host as it is, in a private mount namespace: its /dev (incl. /dev/shm), /tmp, /run
        args += ["--dev-bind", "/dev", "/dev", "--proc", "/proc", "--ro-bind", "/sys", "/sys"]
    else:
        args += ["--dev", view.targets["/dev"], "--proc", view.targets["/proc"],
                 "--ro-bind", "/sys", view.targets["/sys"]]
        for dev in devs:
            args += ["--dev-bind", dev, view.targets[dev]]
        if not writable:  # apt's _apt user needs the root's own /tmp while building a base
            args += ["--perms", "1777", "--tmpfs", view.targets["/tmp"]]
        args += ["--tmpfs", view.targets["/run"]]
    for f in extra_files:
        args += ["--ro-bind", f, view.targets[f]]
    for b in binds:
        args += ["--ro-bind" if b.readonly else "--bind", os.fspath(Path(b.src).resolve()), view.targets[b.target]]
    args += ["--clearenv"]
    for k, v in inner_env.items():
        args += ["--setenv", k, v]
    if cwd:
        args += ["--chdir", cwd]
    full = list(cmd) if not scripts else wrap_with_image_env(cmd, scripts, env or {})
    args += ["--", *full]
    return _Prepared(args, {"PATH": os.environ.get("PATH", DEFAULT_PATH)}, created)


def charliecloud_command(
    image: Path,
    cmd: Sequence[str],
    *,
    binds: Sequence[Bind] = (),
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    writable: bool = False,
    scripts: Sequence[str] = (),
) -> _Prepared:
    """The ``ch-run`` command line; ``image`` is a directory or a squashfs file (not a SIF)."""
    chrun = proc.which("ch-run", HINTS["ch-run"])
    args = [chrun, "--unset-env=*", "--env-no-expand"]
    if writable:
        args.append("--write")
    for b in binds:
        src = os.fspath(Path(b.src).resolve())
        args.append(f"--bind={src}:{b.target}")
    inner_env = base_env(env)
    for k, v in inner_env.items():
        args.append(f"--set-env={k}={v}")
    if cwd:
        args.append(f"--cd={cwd}")
    full = list(cmd) if not scripts else wrap_with_image_env(cmd, scripts, env or {})
    args += [os.fspath(image), "--", *full]
    outer = dict(os.environ)
    outer.setdefault("USER", inner_env["USER"])  # ch-run refuses to start without USER
    return _Prepared(args, outer)


def apptainer_command(
    image: Path,
    cmd: Sequence[str],
    *,
    binds: Sequence[Bind] = (),
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    writable: bool = False,
    nv: bool = False,
) -> _Prepared:
    """The ``apptainer exec`` command line. Apptainer sources ``/.singularity.d/env`` itself;
    ``--cleanenv`` drops the host environment, ``--env`` sets ours on top."""
    apptainer = proc.which("apptainer", HINTS["apptainer"])
    args = [apptainer, "exec", "--cleanenv", "--no-home"]
    if writable:
        args.append("--writable")
    if nv:
        args.append("--nv")
    for b in binds:
        src = os.fspath(Path(b.src).resolve())
        args += ["--bind", f"{src}:{b.target}" + (":ro" if b.readonly else "")]
    inner_env = base_env(env)
    inner_env.pop("PATH", None)  # the image's PATH (from its env scripts) applies
    for k, v in inner_env.items():
        args += ["--env", f"{k}={v}"]
    if cwd:
        args += ["--pwd", cwd]
    args += [os.fspath(image), *cmd]
    return _Prepared(args, dict(os.environ))


# ---------------------------------------------------------------------------- running


@contextlib.contextmanager
def prepared(
    root: RootArg,
    cmd: Sequence[str],
    *,
    binds: Sequence[Bind] = (),
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[Union[str, os.PathLike]] = None,
    runtime: str = "auto",
    writable: bool = False,
    nv: bool = False,
) -> Iterator[_Prepared]:
    """Mount the root if needed and yield the full command line for the chosen backend;
    unmount (and remove mount points made in a writable root) afterwards."""
    if not cmd:
        raise UserError("no command given to run in the image")
    cmd = [os.fspath(c) for c in cmd]
    for b in binds:
        if not os.path.exists(b.src):
            raise UserError(f"bind source {b.src} does not exist")
    kind = root_kind(root)
    backend = resolve_runtime(runtime)
    if kind == "host" and backend != "bwrap":
        backend = "bwrap"  # only bwrap runs the host root in a private mount namespace
    if writable and kind in ("squashfs", "sif"):
        raise UserError(f"{root}: a {kind} image is read-only; writable runs need a directory root")
    cwd_s = os.fspath(cwd) if cwd is not None else None
    if backend == "apptainer":
        yield apptainer_command(Path(root), cmd, binds=binds, env=env, cwd=cwd_s,  # type: ignore[arg-type]
                                writable=writable, nv=nv)
        return
    if backend == "charliecloud":
        with mounted(root) as rootdir:
            assert rootdir is not None
            missing = [b.target for b in binds if _resolve(rootdir, b.target)[1]]
        if missing:
            raise UserError(f"ch-run cannot create bind mount points in a read-only image: "
                            f"{', '.join(missing)} missing in {root}; use runtime bwrap (or apptainer)")
    if backend == "charliecloud" and kind in ("dir", "squashfs"):
        scripts: List[str] = []
        if kind == "dir":
            scripts = image_env_scripts(Path(root))  # type: ignore[arg-type]
            yield charliecloud_command(Path(root), cmd, binds=binds, env=env, cwd=cwd_s,  # type: ignore[arg-type]
                                       writable=writable, scripts=scripts)
            return
        with mounted(root) as rootdir:  # to read the image's env scripts; ch-run mounts it again itself
            scripts = image_env_scripts(rootdir)
        yield charliecloud_command(Path(root), cmd, binds=binds, env=env, cwd=cwd_s, scripts=scripts)  # type: ignore[arg-type]
        return
    with mounted(root) as rootdir:
        if backend == "charliecloud":  # a SIF: ch-run cannot open it, give it the mounted partition
            assert rootdir is not None
            yield charliecloud_command(rootdir, cmd, binds=binds, env=env, cwd=cwd_s,
                                       scripts=image_env_scripts(rootdir))
            return
        prep = bwrap_command(rootdir, cmd, binds=binds, env=env, cwd=cwd_s, writable=writable)
        try:
            yield prep
        finally:
            _remove_mount_points(prep.created)


def run_in(
    root: RootArg,
    cmd: Sequence[Union[str, os.PathLike]],
    *,
    binds: Sequence[Bind] = (),
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[Union[str, os.PathLike]] = None,
    log: Optional[Path] = None,
    what: str = "",
    runtime: str = "auto",
    writable: bool = False,
    timeout: Optional[float] = None,
    check: bool = True,
    input: Optional[str] = None,
    nv: bool = False,
) -> proc.Result:
    """Run ``cmd`` inside ``root`` to completion (output to ``log`` or captured).

    A non-zero exit raises ToolError (``what``, the full command, exit code, log) unless
    ``check=False``."""
    with prepared(root, cmd, binds=binds, env=env, cwd=cwd, runtime=runtime,  # type: ignore[arg-type]
                  writable=writable, nv=nv) as prep:
        return proc.run(prep.argv, what=what or f"{Path(str(cmd[0])).name} in {root or 'host'}",
                        log=log, env=prep.env, timeout=timeout, check=check, input=input, shown=cmd)


def run_interactive(
    root: RootArg,
    cmd: Sequence[Union[str, os.PathLike]],
    *,
    binds: Sequence[Bind] = (),
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[Union[str, os.PathLike]] = None,
    runtime: str = "auto",
    nv: bool = False,
) -> int:
    """Run ``cmd`` in ``root`` with the terminal's stdin/stdout/stderr (``dedal exec``/``shell``);
    returns its exit code.

    proc.run captures output, and an interactive shell needs the terminal itself, so this is
    the one place that calls subprocess directly (still inside this adapter)."""
    with prepared(root, cmd, binds=binds, env=env, cwd=cwd, runtime=runtime, nv=nv) as prep:  # type: ignore[arg-type]
        try:
            return subprocess.call(prep.argv, env=prep.env)
        except FileNotFoundError:
            raise ToolMissing(prep.argv[0]) from None


class Running:
    """A command started in a root with ``start_in``: wait for it, or stop it; the root is
    unmounted when it is done (use as a context manager)."""

    def __init__(self, popen: subprocess.Popen, stack: contextlib.ExitStack, argv: List[str]) -> None:
        self.popen = popen
        self.argv = argv
        self._stack = stack

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> Optional[int]:
        return self.popen.poll()

    def wait(self, timeout: Optional[float] = None) -> int:
        try:
            rc = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise
        self.close()
        return rc

    def stop(self, grace: float = 5.0) -> int:
        """SIGTERM to its process group (it runs in its own session), SIGKILL after ``grace``."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        self.close()
        return self.popen.returncode

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> "Running":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_in(
    root: RootArg,
    cmd: Sequence[Union[str, os.PathLike]],
    *,
    binds: Sequence[Bind] = (),
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[Union[str, os.PathLike]] = None,
    log: Optional[Path] = None,
    runtime: str = "auto",
    nv: bool = False,
) -> Running:
    """Start ``cmd`` in ``root`` without waiting (an MPI launcher, a daemon); output to ``log``."""
    stack = contextlib.ExitStack()
    try:
        prep = stack.enter_context(prepared(root, cmd, binds=binds, env=env, cwd=cwd,  # type: ignore[arg-type]
                                            runtime=runtime, nv=nv))
        popen = proc.start(prep.argv, log=log, env=prep.env)
    except BaseException:
        stack.close()
        raise
    return Running(popen, stack, prep.argv)


# ---------------------------------------------------------------------------- apptainer builds


def apptainer_build_sandbox(definition: Path, target: Path, *, log: Optional[Path] = None,
                            fakeroot: Optional[bool] = None, timeout: Optional[float] = None) -> None:
    """``apptainer build [--fakeroot] --sandbox TARGET DEF`` (production .def base images)."""
    apptainer = proc.which("apptainer", HINTS["apptainer"])
    if fakeroot is None:
        fakeroot = os.geteuid() != 0
    cmd = [apptainer, "build", "--force"]
    if fakeroot:
        cmd.append("--fakeroot")
    cmd += ["--sandbox", os.fspath(target), os.fspath(definition)]
    proc.run(cmd, what=f"apptainer build {Path(definition).name}", log=log, timeout=timeout)


def rpm_packages(root: Path, *, log: Optional[Path] = None) -> Dict[str, str]:
    """``{package: version-release}`` of an RPM-based root (rpm -qa inside it)."""
    out = run_in(root, ["rpm", "-qa", "--qf", "%{NAME}\\t%{VERSION}-%{RELEASE}\\n"],
                 what="rpm -qa", runtime="bwrap").stdout
    result: Dict[str, str] = {}
    for line in out.splitlines():
        if "\t" in line:
            name, version = line.split("\t", 1)
            result[name] = version
    return result
