"""The Charliecloud backend (``ch-run``, its own user namespace per process).

ch-run opens a directory or a squashfs file itself; a SIF it cannot open, so it is given
the SIF's primary partition mounted (:func:`.common.mounted`) for as long as the command
runs. ch-run cannot create mount points in a read-only image: a ``Bind`` onto a path the
image lacks is refused before anything runs (bwrap or Apptainer can do it). The image's
``/.singularity.d/env`` scripts are sourced by a ``/bin/sh`` wrapper inside, as with bwrap;
``/tmp`` is private (``--private-tmp``) unless the caller binds it or the root is writable.
ch-run (0.31) has no read-only binds: a ``Bind(readonly=True)`` is writable inside.

GPU passthrough (``nv``): ch-run shows the host's whole ``/dev`` (the ``/dev/nvidia*``
nodes included). The driver's libraries (found by :mod:`.nvidia`, as Apptainer's ``--nv``
finds them) cannot be bound one by one onto files the image lacks, so they are copied, once
per process, into a host directory under their ld cache names, which is bound at
``/.singularity.d/libs`` (every image dedal assembles has it, and its ``99-base.sh`` puts it
on ``LD_LIBRARY_PATH``) and removed when the process exits. Copies, not hard links: ch-run
(0.31) binds are writable, and the host's own driver files must stay out of reach. The
driver's binaries and files (copies too) are bound where the image has a file to bind onto, and left
out (named in one note) where it has none. A host without driver binds nothing (one note).
The copied directory is on this node: ranks that ``srun`` starts with ch-run on other nodes
do not see it (bwrap's binds name the driver's own paths, the same on every node of a
homogeneous cluster).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Dict, Iterator, List, Sequence, Set

from dedal.adapters import proc
from dedal.adapters.runtime import nvidia
from dedal.adapters.runtime.common import (
    HINTS,
    Bind,
    Prepared,
    Request,
    RootArg,
    base_env,
    image_env_scripts,
    mounted,
    note_mount,
    resolve_in_image,
    with_image_env,
    wrap_with_image_env,
)
from dedal.errors import UserError

TOOL = "ch-run"
log = logging.getLogger("dedal.runtime")


def command(image: Path, request: Request, *, scripts: Sequence[str] = ()) -> Prepared:
    """The ``ch-run`` command line; ``image`` is a directory or a squashfs file (not a SIF).
    ``nv`` changes nothing here: :func:`prepare` adds the driver's binds (:func:`gpu_binds`)."""
    chrun = proc.which("ch-run", HINTS["ch-run"])
    args = [chrun, "--unset-env=*", "--env-no-expand"]
    if request.writable:
        args.append("--write")
    elif "/tmp" not in {b.target for b in request.binds}:
        args.append("--private-tmp")  # ch-run shares the host's /tmp unless told otherwise
    for b in request.binds:
        src = os.fspath(Path(b.src).resolve())
        args.append(f"--bind={src}:{b.target}")
    inner_env = base_env(request.env)
    for k, v in inner_env.items():
        args.append(f"--set-env={k}={v}")
    if request.cwd:
        args.append(f"--cd={request.cwd}")
    # without cwd, bwrap's rule (the caller's directory where the image has it, else HOME): ch-run starts in /
    args += [
        os.fspath(image),
        "--",
        *(
            with_image_env(request.cmd, scripts, request.env)
            if request.cwd
            else wrap_with_image_env(request.cmd, scripts, request.env or {}, start=os.getcwd())
        ),
    ]
    outer = dict(os.environ)
    outer.setdefault("USER", inner_env["USER"])  # ch-run refuses to start without USER
    return Prepared(args, outer)


_STAGED: Dict[nvidia.HostDriver, Path] = {}
_NOTED: Set[str] = set()


def staged(driver: nvidia.HostDriver) -> Path:
    """A host directory with copies of the driver's files: ``libs/<ld cache name>`` and
    ``files/<n>/<name>`` for the n-th other bind of ``driver.binds()`` (a socket is not
    copied), made once per process and removed at its exit (:func:`remove_staged`). ch-run
    binds the libraries' directory, not each file, and its binds are writable (0.31): so
    these are copies, never the host's own files, which a program inside could overwrite."""
    stage = _STAGED.get(driver)
    if stage is not None and stage.is_dir():
        return stage
    stage = Path(tempfile.mkdtemp(prefix="dedal-nvlibs-"))
    try:
        stage.chmod(0o755)
        (stage / "libs").mkdir()
        for src, name in driver.libraries:
            shutil.copy2(Path(driver.host(src)).resolve(), stage / "libs" / name)
        for i, b in enumerate(driver.binds()):
            if not b.target.startswith(nvidia.LIBS_DIR + "/") and Path(b.src).is_file():
                (stage / "files" / str(i)).mkdir(parents=True)
                shutil.copy2(Path(b.src).resolve(), stage / "files" / str(i) / os.path.basename(b.target))
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    if not _STAGED:
        atexit.register(remove_staged)
    _STAGED[driver] = stage
    return stage


def remove_staged() -> None:
    """Remove the directories :func:`staged` made."""
    for stage in _STAGED.values():
        shutil.rmtree(stage, ignore_errors=True)
    _STAGED.clear()


def gpu_binds(driver: nvidia.HostDriver, rootdir: Path, binds: Sequence[Bind]) -> List[Bind]:
    """The binds that pass ``driver`` into the image at ``rootdir``: its libraries (staged,
    :func:`staged`) at /.singularity.d/libs, its binaries and files where the image
    has a place for them (the others named in one note)."""
    taken = {b.target for b in binds}
    stage = staged(driver)
    out: List[Bind] = []
    if driver.libraries and nvidia.LIBS_DIR not in taken:
        out.append(Bind(stage / "libs", nvidia.LIBS_DIR, readonly=True))
    left = []
    for i, b in enumerate(driver.binds()):
        if b.target.startswith(nvidia.LIBS_DIR + "/") or b.target in taken:
            continue
        if resolve_in_image(rootdir, b.target)[1]:
            left.append(b.target)
        else:
            copy = stage / "files" / str(i) / os.path.basename(b.target)
            out.append(Bind(copy, b.target, readonly=True) if copy.is_file() else b)
    note = (
        f"note: ch-run cannot create mount points in a read-only image: the NVIDIA driver's {', '.join(left)} "
        "not bound (the image lacks them; runtime bwrap or apptainer binds them)"
    )
    if left and note not in _NOTED:
        _NOTED.add(note)
        log.warning("%s", note)
    return out


@contextlib.contextmanager
def prepare(root: RootArg, kind: str, request: Request) -> Iterator[Prepared]:
    """Refuse binds onto missing paths; then a directory or squashfs as it is (a squashfs
    mounted briefly to read its env scripts: ch-run mounts it again itself), a SIF mounted.
    ``nv``: the host driver's binds added (see the module notes)."""
    if request.nv:
        driver = nvidia.host_driver()
        if driver.found:
            with mounted(root) as rootdir:
                assert rootdir is not None
                if driver.libraries and resolve_in_image(rootdir, nvidia.LIBS_DIR)[1]:
                    raise UserError(
                        f"ch-run cannot bind the NVIDIA driver's libraries: {root} has no "
                        f"{nvidia.LIBS_DIR} (images dedal assembles have it); use runtime bwrap "
                        "(or apptainer)"
                    )
                request = replace(request, binds=[*request.binds, *gpu_binds(driver, rootdir, request.binds)])
    with mounted(root) as rootdir:
        assert rootdir is not None
        missing = [b.target for b in request.binds if resolve_in_image(rootdir, b.target)[1]]
    if missing:
        raise UserError(
            f"ch-run cannot create bind mount points in a read-only image: "
            f"{', '.join(missing)} missing in {root}; use runtime bwrap (or apptainer)"
        )
    if kind == "sif":  # ch-run cannot open it: give it the mounted partition
        with mounted(root) as rootdir:
            assert rootdir is not None
            yield note_mount(command(rootdir, request, scripts=image_env_scripts(rootdir)), root, rootdir)
        return
    scripts: List[str]
    if kind == "dir":
        scripts = image_env_scripts(Path(root))  # type: ignore[arg-type]
    else:
        with mounted(root) as rootdir:  # to read the image's env scripts; ch-run mounts it again itself
            scripts = image_env_scripts(rootdir)
    yield command(Path(root), request, scripts=scripts)  # type: ignore[arg-type]
