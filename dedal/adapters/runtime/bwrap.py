"""The bubblewrap backend (``bwrap``): the default where Apptainer is absent, and the only
one that runs the host's own root (``None``) in a private mount namespace (``--bind / /``).

The sandbox: ``--dev /dev --proc /proc --ro-bind /sys /sys --tmpfs /tmp --tmpfs /run``,
the host's ``/etc/hosts`` and ``/etc/resolv.conf`` (a debootstrap minbase root has no
``/etc/hosts``), the host's InfiniBand and NVIDIA device nodes when present, no new PID
or IPC namespace (shared memory and CMA between ranks keep working). A squashfs or SIF
root is mounted (:func:`.common.mounted`) for as long as the command runs.

GPU passthrough (``nv``): the host driver's libraries, binaries and files as Apptainer's
``--nv`` binds them (found by :mod:`.nvidia`: libraries read-only in
``/.singularity.d/libs``, binaries in ``/usr/bin``), and its ``/dev/nvidia*`` nodes. The
image's ``99-base.sh`` puts ``/.singularity.d/libs`` on ``LD_LIBRARY_PATH``; an image
without it gets ``LD_LIBRARY_PATH=/.singularity.d/libs`` set before its env scripts run.
A host without driver binds nothing (one note). The host's own root needs none of it.

A ``Bind`` may name a ``dst`` that does not exist in the root (e.g. the fixed install
root ``/opt/esd/software``). A read-only root cannot get a new mount point, so bwrap is
given a *split* view: the missing path's existing ancestors become tmpfs directories whose
entries are bound one by one from the root, and the new mount point is created in that
tmpfs. The root itself is never modified, except a writable directory root
(``writable=True``, used to build base images), where missing mount points are created in
the root and removed again afterwards.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

from dedal.adapters import proc
from dedal.adapters.runtime import nvidia
from dedal.adapters.runtime.common import (
    ENV_DIR,
    HINTS,
    Bind,
    Prepared,
    Request,
    RootArg,
    base_env,
    image_env_scripts,
    in_root,
    make_mount_points,
    mounted,
    norm,
    note_mount,
    remove_mount_points,
    resolve_in_image,
    with_image_env,
)
from dedal.model.image import STD_PATH

TOOL = "bwrap"
HOST_FILES = ("/etc/hosts", "/etc/resolv.conf")
HOST_DEVICES = ("/dev/infiniband", "/dev/dri")  # and every /dev/nvidia* (nvidia.device_nodes)


@dataclass
class _View:
    """How a bwrap sandbox sees the root: ``args`` and the container paths to bind to."""

    args: List[str] = field(default_factory=list)
    targets: Dict[str, str] = field(default_factory=dict)  # requested dst -> resolved dst
    mkdirs: List[str] = field(default_factory=list)  # missing directories above new mount points


def _split_view(rootdir: Path, dests: Sequence[str], *, writable: bool, host: bool, fresh: Sequence[str] = ()) -> _View:
    """bwrap arguments that show ``rootdir`` at ``/`` with every directory needed as a new
    mount point available, without writing to ``rootdir``. Destinations below ``fresh``
    mounts (the new /dev, /tmp, /run tmpfs) need nothing: bwrap creates them there."""
    view = _View()
    split: Set[str] = set()
    for dst in dests:
        if any(dst != f and dst.startswith(f + "/") for f in fresh):
            view.targets[dst] = dst
            continue
        existing, missing = resolve_in_image(rootdir, dst)
        view.targets[dst] = norm(f"{existing}/{missing}") if missing else existing
        if missing:
            p = PurePosixPath(existing)
            split.add(str(p))
            split.update(str(a) for a in p.parents)
            parts = missing.split("/")
            for i in range(1, len(parts)):  # bwrap would make these 0700; make them 0755
                d = norm(f"{existing}/{'/'.join(parts[:i])}")
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
        hdir = in_root(rootdir, cpath)
        for entry in sorted(os.listdir(hdir)):
            child = norm(f"{cpath}/{entry}")
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


def _host_devices(driver: Optional[nvidia.HostDriver] = None) -> Dict[str, str]:
    """Container path -> host path of the device nodes bound: InfiniBand, DRI and the
    NVIDIA nodes (``driver``'s, below its root, where one is given)."""
    found = {dev: dev for dev in HOST_DEVICES if os.path.exists(dev)}
    if driver is None:
        found.update((dev, dev) for dev in nvidia.device_nodes())
    else:
        found.update((dev, driver.host(dev)) for dev in driver.devices)
    return found


def gpu_binds(
    driver: nvidia.HostDriver, binds: Sequence[Bind], scripts: Sequence[str]
) -> Tuple[List[Bind], Dict[str, str]]:
    """The driver's binds (less any the caller binds itself) and the environment they need:
    ``LD_LIBRARY_PATH`` where the image has no ``99-base.sh`` to add the libraries' directory."""
    taken = {b.target for b in binds}
    extra = [b for b in driver.binds() if b.target not in taken]
    env = {}
    if driver.libraries and f"{ENV_DIR}/99-base.sh" not in scripts:
        env["LD_LIBRARY_PATH"] = nvidia.LIBS_DIR
    return extra, env


def command(
    rootdir: Optional[Path],
    request: Request,
    *,
    scripts: Sequence[str] = (),
    host_files: bool = True,
    devices: bool = True,
    driver: Optional[nvidia.HostDriver] = None,
) -> Prepared:
    """The bwrap command line for ``cmd`` in ``rootdir`` (None: the host root), sourcing the
    image env ``scripts`` first. The host's NVIDIA device nodes are bound whenever present
    (``devices``); ``nv`` adds the driver's libraries, binaries and files (``driver``: the one
    found on this host unless given). In a writable root, missing mount points are created
    now (``created``: for the caller to remove afterwards)."""
    bwrap = proc.which("bwrap", HINTS["bwrap"])
    binds, writable, nv = list(request.binds), request.writable, request.nv
    host = rootdir is None
    viewroot = Path("/") if host else rootdir
    assert viewroot is not None
    gpu_env: Dict[str, str] = {}
    if nv and not host:
        driver = driver or nvidia.host_driver()
        extra, gpu_env = gpu_binds(driver, binds, scripts)
        binds = [*binds, *extra]
    inner_env = base_env({**gpu_env, **(request.env or {})})
    standard = ["/dev", "/proc", "/sys", "/tmp", "/run"]
    extra_files = [] if host or not host_files else [f for f in HOST_FILES if os.path.exists(f)]
    dev_src = _host_devices(driver if nv else None) if devices and not host else {}
    devs = list(dev_src)
    user_dsts = [b.target for b in binds]
    created: List[Path] = []
    if writable and not host:
        wanted = (
            [(d, False) for d in standard]
            + [(f, True) for f in extra_files]
            + [(b.target, Path(b.src).is_file()) for b in binds]
        )
        created = make_mount_points(viewroot, [(d, f) for d, f in wanted if not d.startswith(("/dev/", "/run/"))])
        view = _split_view(
            viewroot, standard + extra_files + devs + user_dsts, writable=True, host=False, fresh=["/dev", "/run"]
        )
    else:
        fresh = [] if host else ["/dev", "/run"] + ([] if writable else ["/tmp"])
        view = _split_view(
            viewroot, standard + extra_files + devs + user_dsts, writable=writable or host, host=host, fresh=fresh
        )
    args = [bwrap, "--die-with-parent", *view.args]
    if host:  # the host as it is, in a private mount namespace: its /dev (incl. /dev/shm), /tmp, /run
        args += ["--dev-bind", "/dev", "/dev", "--proc", "/proc", "--ro-bind", "/sys", "/sys"]
    else:
        args += [
            "--dev",
            view.targets["/dev"],
            "--proc",
            view.targets["/proc"],
            "--ro-bind",
            "/sys",
            view.targets["/sys"],
        ]
        for dev in devs:
            args += ["--dev-bind", dev_src[dev], view.targets[dev]]
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
    if request.cwd:
        args += ["--chdir", request.cwd]
    args += ["--", *with_image_env(request.cmd, scripts, request.env)]
    return Prepared(args, {"PATH": os.environ.get("PATH", STD_PATH)}, created)


@contextlib.contextmanager
def prepare(root: RootArg, kind: str, request: Request) -> Iterator[Prepared]:
    """bwrap sees a directory: a squashfs/SIF stays mounted while the command runs; mount
    points made in a writable root are removed afterwards."""
    with mounted(root) as rootdir:
        prep = note_mount(command(rootdir, request, scripts=image_env_scripts(rootdir)), root, rootdir)
        try:
            yield prep
        finally:
            remove_mount_points(prep.created)
