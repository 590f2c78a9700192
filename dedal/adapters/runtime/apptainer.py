"""The Apptainer backend (``apptainer exec``), and Apptainer's builds of base images.

Apptainer opens every kind of root itself (a directory, a squashfs file, a SIF), so nothing
is mounted here. What it does differently from bwrap by default is undone, so that a
command sees the same sandbox with every backend:

* the environment: Apptainer's ``--env`` shell-expands values (``a b $c`` arrives as
  ``a b ``), is applied only where the image has ``99-base.sh``, and refuses ``HOME``.
  So nothing goes through ``--env``: ``--cleanenv`` drops the host's environment and a
  ``/bin/sh`` wrapper inside exports :func:`.common.base_env` (single-quoted: verbatim),
  sources the image's ``/.singularity.d/env/*.sh`` again (Apptainer sourced them before
  the wrapper, over its own PATH) and exports the caller's ``env`` last. Apptainer's own
  additions (``APPTAINER_*``, ``LD_LIBRARY_PATH`` for ``--nv``'s libraries) stay.
  ``APPTAINERENV_*`` of the host (which pass ``--cleanenv``) are left out;
* ``HOME``: ``--no-home`` (the host's home is not mounted), the value exported by the
  wrapper, as with bwrap (``/root`` for root, ``/tmp`` otherwise);
* ``/tmp``: private, as bwrap's tmpfs: ``--no-mount tmp`` and a fresh directory (mode
  1777) bound there, removed afterwards; a bind onto a path below it gets its mount point
  made in that directory. A caller's bind of ``/tmp`` itself replaces the private one. A
  writable root keeps its own ``/tmp`` (as with bwrap: apt's ``_apt`` user needs it while
  building a base);
* ``/dev/shm`` is the host's (Apptainer's rule: ranks started by ``srun``, one container
  each, share memory through it), except where a bind names a path below it that the host
  lacks: Apptainer cannot create that mount point in the host's ``/dev``, so such a run
  gets a private ``/dev/shm`` too (a fresh directory in the temporary directory: Apptainer
  refuses to bind a ``/dev`` path anywhere but onto itself), as bwrap always has;
* a writable directory root (``--writable``) cannot get new mount points from Apptainer:
  missing ones (binds, ``/etc/hosts``, ``/etc/resolv.conf``, ``/etc/localtime``,
  ``/etc/passwd``, ``/etc/group``, ``/proc``, ``/sys``, ``/dev``) are made in the root
  first and removed afterwards, as bwrap does;
* the working directory: ``cwd``, else (``--pwd /`` and ``--no-mount cwd``, then the
  wrapper) the host's working directory where the image has it, else ``HOME``, else
  ``/``: bwrap's rule, without Apptainer's warning when it falls back;
* GPUs: ``--nv`` (the host's driver libraries and device nodes);
* one container per node for the ranks of an ``srun`` step (``sharens``): Apptainer >= 1.3's
  ``--sharens``, whose first process on a node sets the container up (mounts the image once)
  and whose others join it; the processes that share one are those with the same parent (the
  step's ``slurmstepd`` on that node, which starts every rank: the rank script hands over to
  the runtime with ``exec``). Without it every rank mounts the image anew and decompresses the MPI stack's
  libraries and plugins again (MPI_Init 1.4x native at 2 ranks per node here, and one user
  namespace per rank, which sites' namespace limits run out of);
* as root without ``CAP_SYS_RESOURCE`` (containers, some CI runners) Apptainer refuses to
  start unless told to drop it: ``--drop-caps CAP_SYS_RESOURCE`` (and
  ``APPTAINER_DROP_CAPS`` for ``apptainer build``, :func:`process_env`); a non-root user who cannot open ``/dev/fuse`` gets ``--unsquash``
  for a SIF or squashfs root;
* device nodes: as root Apptainer shows the host's ``/dev`` itself (bwrap makes a new one), so
  a node made inside lands on the host. NVIDIA's ``libcuda.so`` makes ``/dev/nvidiactl`` when
  loaded by root, and CMake's CUDA detection loads it while Arbor builds: the esd-gpu build
  left that node on a host without NVIDIA driver, where it made GPU checks believe in one.
  Root runs drop ``CAP_MKNOD`` (:func:`dropped_caps`), except ``--nv`` runs, where the
  driver may still have to make ``/dev/nvidia-uvm`` as the host's ``nvidia-modprobe`` would.
  (``--contain``'s minimal ``/dev`` would do it too, but then no bind can reach a stage under
  the host's ``/dev/shm``: Apptainer makes no mount point there.)
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Union

from dedal.adapters import proc
from dedal.adapters.runtime.common import (
    ENV_DIR,
    HINTS,
    Bind,
    Instance,
    Prepared,
    Request,
    RootArg,
    base_env,
    cannot_mount,
    make_mount_points,
    norm,
    remove_mount_points,
    wrap_with_image_env,
)
from dedal.errors import UserError, signals_held

TOOL = "apptainer"
SHM = "/dev/shm"
#: what Apptainer binds over these in every container: in a writable root they must exist
WRITABLE_FILES = ("/etc/hosts", "/etc/resolv.conf", "/etc/localtime", "/etc/passwd", "/etc/group")
WRITABLE_DIRS = ("/proc", "/sys", "/dev")
CAP_SYS_RESOURCE = 24  # bit in /proc/self/status CapPrm
ALL_IMAGE_SCRIPTS = f"{ENV_DIR}/*.sh"


def lacks_capability(bit: int, status: str = "/proc/self/status") -> bool:
    """Whether this process's permitted capability set lacks ``bit`` (False where unknown)."""
    try:
        with open(status) as fh:
            for line in fh:
                if line.startswith("CapPrm:"):
                    return not (int(line.split()[1], 16) >> bit) & 1
    except (OSError, ValueError, IndexError):
        pass
    return False


def process_env(environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The environment of the ``apptainer`` process itself: the caller's, less the
    ``APPTAINERENV_*``/``SINGULARITYENV_*`` variables (Apptainer would set them inside
    despite ``--cleanenv``), plus ``APPTAINER_DROP_CAPS=CAP_SYS_RESOURCE`` when running as
    root without that capability (unless the caller set APPTAINER_DROP_CAPS)."""
    env = {
        k: v
        for k, v in (os.environ if environ is None else environ).items()
        if not k.startswith(("APPTAINERENV_", "SINGULARITYENV_"))
    }
    if must_drop_sys_resource(env):
        env["APPTAINER_DROP_CAPS"] = "CAP_SYS_RESOURCE"
    return env


def must_drop_sys_resource(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Root without CAP_SYS_RESOURCE, and APPTAINER_DROP_CAPS not set by the caller."""
    env = os.environ if environ is None else environ
    return os.geteuid() == 0 and "APPTAINER_DROP_CAPS" not in env and lacks_capability(CAP_SYS_RESOURCE)


def dropped_caps(nv: bool, environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """The capabilities a root run's ``--drop-caps`` names (none for other users, who hold
    none): those of ``APPTAINER_DROP_CAPS`` (the flag replaces the variable, so they are named
    again), ``CAP_SYS_RESOURCE`` where this process lacks it (Apptainer refuses to start
    otherwise), and ``CAP_MKNOD`` unless the run is for the GPU (see the module notes)."""
    if os.geteuid() != 0:
        return []
    env = os.environ if environ is None else environ
    caps = [c.strip() for c in env.get("APPTAINER_DROP_CAPS", "").split(",") if c.strip()]
    named = {c.upper() if c.upper().startswith("CAP_") else "CAP_" + c.upper() for c in caps}
    if lacks_capability(CAP_SYS_RESOURCE) and "CAP_SYS_RESOURCE" not in named:
        caps.append("CAP_SYS_RESOURCE")
    if not nv and "CAP_MKNOD" not in named:
        caps.append("CAP_MKNOD")
    return caps


def drop_caps_args(nv: bool) -> List[str]:
    """``--drop-caps CAPS`` of :func:`dropped_caps`, or nothing: on the command line, so that it
    holds where srun starts Apptainer with another environment."""
    caps = dropped_caps(nv)
    return ["--drop-caps", ",".join(caps)] if caps else []


#: the first release with --sharens (APPTAINER_SHARENS)
SHARENS_SINCE = (1, 3)


@functools.lru_cache(maxsize=None)
def version(path: str) -> str:
    """``apptainer --version`` of the Apptainer at ``path`` ("1.5.3"; "" where it does not answer)."""
    res = proc.run([path, "--version"], what="apptainer --version", check=False, timeout=30)
    if res.returncode != 0:
        return ""
    return res.stdout.strip().replace("apptainer version ", "")


def has_sharens(path: str) -> bool:
    """Whether the Apptainer at ``path`` has ``--sharens`` (1.3 and later)."""
    found = re.match(r"(\d+)\.(\d+)", version(path))
    return found is not None and (int(found.group(1)), int(found.group(2))) >= SHARENS_SINCE


def command(
    image: Union[Path, str],
    request: Request,
    *,
    private: Optional[Mapping[str, Path]] = None,
    unsquash: bool = False,
) -> Prepared:
    """The ``apptainer exec`` command line (see the module notes). ``private``: container
    path -> host directory bound there first (the private ``/tmp``, maybe ``/dev/shm``); no
    image env scripts are given: the wrapper sources every ``/.singularity.d/env/*.sh`` the
    image has, as Apptainer does. ``request.per_node`` (read-only roots): the processes with
    the same parent share one container, where this Apptainer can (:func:`has_sharens`;
    else one container each)."""
    apptainer = proc.which("apptainer", HINTS["apptainer"])
    args = [apptainer, "exec", "--cleanenv", "--no-home", "--no-mount", "tmp,cwd"]
    if request.per_node and not request.writable and has_sharens(apptainer):
        args.append("--sharens")
    args += drop_caps_args(request.nv)
    if request.writable:
        args.append("--writable")
    if request.nv:
        args.append("--nv")
    if unsquash:
        args.append("--unsquash")
    for dst, src in (private or {}).items():
        args += ["--bind", f"{src}:{dst}"]
    for b in request.binds:
        src = os.fspath(Path(b.src).resolve())
        args += ["--bind", f"{src}:{b.target}" + (":ro" if b.readonly else "")]
    args += ["--pwd", request.cwd or "/"]
    env = request.env or {}
    start = None if request.cwd else os.getcwd()
    args += [
        os.fspath(image),
        *wrap_with_image_env(request.cmd, [ALL_IMAGE_SCRIPTS], env, first=base_env(env), start=start),
    ]
    return Prepared(args, process_env())


def _private_targets(binds: Sequence[Bind], writable: bool) -> List[str]:
    """The container paths that get a private directory (see the module notes)."""
    targets = {b.target for b in binds}
    private = []
    if not writable and "/tmp" not in targets:
        private.append("/tmp")
    if SHM not in targets and any(t.startswith(SHM + "/") and not os.path.exists(t) for t in targets):
        private.append(SHM)
    return private


@contextlib.contextmanager
def _private_dirs(targets: Sequence[str], binds: Sequence[Bind]) -> Iterator[Dict[str, Path]]:
    """A fresh host directory (mode 1777) for each of ``targets``, with the mount points of
    ``binds`` below them made inside; removed when the block ends."""
    made: Dict[str, Path] = {}
    try:
        for dst in targets:
            with signals_held():  # made and known to the removal below in one step (as mpirun's session)
                d = made[dst] = Path(tempfile.mkdtemp(prefix="dedal-" + dst.strip("/").replace("/", "-") + "-"))
            d.chmod(0o1777)
            make_mount_points(
                d,
                [(norm(b.target[len(dst) :]), Path(b.src).is_file()) for b in binds if b.target.startswith(dst + "/")],
            )
        yield made
    finally:
        with signals_held():  # whole, not broken off by a stop signal halfway
            for d in made.values():
                shutil.rmtree(d, ignore_errors=True)


def _check_dev_binds(binds: Sequence[Bind]) -> None:
    """Apptainer binds a host path under /dev only onto itself (it skips any other, with a
    warning): refused up front instead."""
    for b in binds:
        src = os.path.abspath(os.fspath(b.src))
        if src.startswith("/dev/") and b.target.startswith("/dev/") and src != b.target:
            raise UserError(
                f"apptainer binds a path under /dev only onto itself, not {src} onto {b.target}; use runtime bwrap"
            )


def _needs_unsquash(kind: str) -> bool:
    """A non-root user who cannot open /dev/fuse cannot have a SIF or squashfs mounted."""
    return kind in ("sif", "squashfs") and cannot_mount()


@contextlib.contextmanager
def prepare(root: RootArg, kind: str, request: Request) -> Iterator[Prepared]:
    """Apptainer is given the root as it is, with the private directories it needs; in a
    writable directory root the missing mount points are made first (and removed
    afterwards). ``request.per_node``: the ranks of an srun step share one container per
    node (``--sharens``). An :class:`Instance` is joined (its binds are the instance's)."""
    if isinstance(root, Instance):
        yield command(root.ref, replace(request, binds=(), writable=False, per_node=False))
        return
    image = Path(root)  # type: ignore[arg-type]
    binds, writable = request.binds, request.writable
    _check_dev_binds(binds)
    with _private_dirs(_private_targets(binds, writable), binds) as private:
        below = tuple(p + "/" for p in private)
        created: List[Path] = []
        if writable and kind == "dir":
            wanted = [(b.target, Path(b.src).is_file()) for b in binds if not b.target.startswith(below)]
            wanted += [(f, True) for f in WRITABLE_FILES if os.path.exists(f)] + [(d, False) for d in WRITABLE_DIRS]
            created = make_mount_points(image, wanted)
        try:
            prep = command(image, request, private=private, unsquash=_needs_unsquash(kind))
            prep.created = created
            yield prep
        finally:
            remove_mount_points(created)


def instance_start_command(image: Path, name: str, *, binds: Sequence[Bind] = (), nv: bool = False) -> List[str]:
    """``apptainer instance start`` of ``image`` as ``name``, with the sandbox :func:`command`
    gives a command (no home, the caller's binds, GPU access); the commands that join it
    (``exec instance://NAME``) get their environment from :func:`command`'s wrapper."""
    apptainer = proc.which("apptainer", HINTS["apptainer"])
    args = [apptainer, "instance", "start", "--no-home", "--no-mount", "tmp,cwd"]
    args += drop_caps_args(nv)
    if nv:
        args.append("--nv")
    for b in binds:
        src = os.fspath(Path(b.src).resolve())
        args += ["--bind", f"{src}:{b.target}" + (":ro" if b.readonly else "")]
    return args + [os.fspath(image), name]


def instance_stop_command(name: str) -> List[str]:
    """``apptainer instance stop --force NAME`` (SIGKILL to what still runs in it)."""
    return [proc.which("apptainer", HINTS["apptainer"]), "instance", "stop", "--force", name]


def apptainer_build_sandbox(
    definition: Path,
    target: Path,
    *,
    log: Optional[Path] = None,
    fakeroot: Optional[bool] = None,
    timeout: Optional[float] = None,
) -> None:
    """``apptainer build [--fakeroot] --sandbox TARGET DEF`` (production .def base images)."""
    apptainer = proc.which("apptainer", HINTS["apptainer"])
    if fakeroot is None:
        fakeroot = os.geteuid() != 0
    cmd = [apptainer, "build", "--force"]
    if fakeroot:
        cmd.append("--fakeroot")
    cmd += ["--sandbox", os.fspath(target), os.fspath(definition)]
    proc.run(cmd, what=f"apptainer build {Path(definition).name}", log=log, timeout=timeout, env=process_env())
