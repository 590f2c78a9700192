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
finds them) cannot be bound one by one onto files the image lacks, so they are linked (or,
across file systems, copied) into a fresh host directory under their ld cache names, which
is bound at ``/.singularity.d/libs`` (every image dedal assembles has it, and its
``99-base.sh`` puts it on ``LD_LIBRARY_PATH``) and removed afterwards. The driver's
binaries and files are bound where the image has a file to bind onto, and left out (named
in one note) where it has none. A host without driver binds nothing (one note). ch-run
binds are writable: a hard-linked library is the host's own file, so nothing in the
container should write there. The staged directory is on this node: ranks that ``srun``
starts with ch-run on other nodes do not see it (bwrap's binds name the driver's own paths,
the same on every node of a homogeneous cluster).
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, List, Mapping, Optional, Sequence

from dedal.adapters import proc
from dedal.adapters.runtime import nvidia
from dedal.adapters.runtime.common import (HINTS, Bind, Prepared, RootArg, base_env, image_env_scripts, mounted,
                                           note_mount, resolve_in_image, with_image_env, wrap_with_image_env)
from dedal.errors import UserError

TOOL = "ch-run"
log = logging.getLogger("dedal.runtime")


def command(
    image: Path,
    cmd: Sequence[str],
    *,
    binds: Sequence[Bind] = (),
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    writable: bool = False,
    nv: bool = False,
    scripts: Sequence[str] = (),
) -> Prepared:
    """The ``ch-run`` command line; ``image`` is a directory or a squashfs file (not a SIF).
    ``nv`` changes nothing here: :func:`prepare` adds the driver's binds (:func:`gpu_binds`)."""
    chrun = proc.which("ch-run", HINTS["ch-run"])
    args = [chrun, "--unset-env=*", "--env-no-expand"]
    if writable:
        args.append("--write")
    elif "/tmp" not in {b.target for b in binds}:
        args.append("--private-tmp")  # ch-run shares the host's /tmp unless told otherwise
    for b in binds:
        src = os.fspath(Path(b.src).resolve())
        args.append(f"--bind={src}:{b.target}")
    inner_env = base_env(env)
    for k, v in inner_env.items():
        args.append(f"--set-env={k}={v}")
    if cwd:
        args.append(f"--cd={cwd}")
    # without cwd, bwrap's rule (the caller's directory where the image has it, else HOME): ch-run starts in /
    args += [os.fspath(image), "--", *(with_image_env(cmd, scripts, env) if cwd
                                       else wrap_with_image_env(cmd, scripts, env or {}, start=os.getcwd()))]
    outer = dict(os.environ)
    outer.setdefault("USER", inner_env["USER"])  # ch-run refuses to start without USER
    return Prepared(args, outer)


def stage_libraries(driver: nvidia.HostDriver, dest: Path) -> None:
    """The driver's libraries in ``dest`` under their ld cache names: hard links where the
    file system allows, else copies (ch-run binds the directory, not each file)."""
    for src, name in driver.libraries:
        real = Path(driver.host(src)).resolve()
        try:
            os.link(real, dest / name)
        except OSError:
            shutil.copy2(real, dest / name)


@contextlib.contextmanager
def gpu_binds(driver: nvidia.HostDriver, rootdir: Path, binds: Sequence[Bind]) -> Iterator[List[Bind]]:
    """The binds that pass ``driver`` into the image at ``rootdir``: its libraries staged in a
    temporary directory bound at /.singularity.d/libs (removed when the block ends), its
    binaries and files where the image has a place for them (the others named in a note)."""
    taken = {b.target for b in binds}
    out: List[Bind] = []
    stage: Optional[Path] = None
    try:
        if driver.libraries and nvidia.LIBS_DIR not in taken:
            stage = Path(tempfile.mkdtemp(prefix="dedal-nvlibs-"))
            stage.chmod(0o755)
            stage_libraries(driver, stage)
            out.append(Bind(stage, nvidia.LIBS_DIR, readonly=True))
        left = []
        for b in driver.binds():
            if b.target.startswith(nvidia.LIBS_DIR + "/") or b.target in taken:
                continue
            if resolve_in_image(rootdir, b.target)[1]:
                left.append(b.target)
            else:
                out.append(b)
        if left:
            log.warning("note: ch-run cannot create mount points in a read-only image: the NVIDIA driver's %s not "
                        "bound (the image lacks them; runtime bwrap or apptainer binds them)", ", ".join(left))
        yield out
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)


@contextlib.contextmanager
def prepare(root: RootArg, kind: str, cmd: Sequence[str], *, binds: Sequence[Bind],
            env: Optional[Mapping[str, str]], cwd: Optional[str], writable: bool, nv: bool) -> Iterator[Prepared]:
    """Refuse binds onto missing paths; then a directory or squashfs as it is (a squashfs
    mounted briefly to read its env scripts: ch-run mounts it again itself), a SIF mounted.
    ``nv``: the host driver's binds added (see the module notes)."""
    with contextlib.ExitStack() as stack:
        if nv:
            driver = nvidia.host_driver()
            if driver.found:
                with mounted(root) as rootdir:
                    assert rootdir is not None
                    if driver.libraries and resolve_in_image(rootdir, nvidia.LIBS_DIR)[1]:
                        raise UserError(f"ch-run cannot bind the NVIDIA driver's libraries: {root} has no "
                                        f"{nvidia.LIBS_DIR} (images dedal assembles have it); use runtime bwrap "
                                        "(or apptainer)")
                    extra = stack.enter_context(gpu_binds(driver, rootdir, binds))
                binds = [*binds, *extra]
        with _prepare(root, kind, cmd, binds=binds, env=env, cwd=cwd, writable=writable, nv=nv) as prep:
            yield prep


@contextlib.contextmanager
def _prepare(root: RootArg, kind: str, cmd: Sequence[str], *, binds: Sequence[Bind],
             env: Optional[Mapping[str, str]], cwd: Optional[str], writable: bool, nv: bool) -> Iterator[Prepared]:
    with mounted(root) as rootdir:
        assert rootdir is not None
        missing = [b.target for b in binds if resolve_in_image(rootdir, b.target)[1]]
    if missing:
        raise UserError(f"ch-run cannot create bind mount points in a read-only image: "
                        f"{', '.join(missing)} missing in {root}; use runtime bwrap (or apptainer)")
    if kind == "sif":  # ch-run cannot open it: give it the mounted partition
        with mounted(root) as rootdir:
            assert rootdir is not None
            yield note_mount(command(rootdir, cmd, binds=binds, env=env, cwd=cwd, writable=writable, nv=nv,
                                     scripts=image_env_scripts(rootdir)), root, rootdir)
        return
    scripts: List[str]
    if kind == "dir":
        scripts = image_env_scripts(Path(root))  # type: ignore[arg-type]
    else:
        with mounted(root) as rootdir:  # to read the image's env scripts; ch-run mounts it again itself
            scripts = image_env_scripts(rootdir)
    yield command(Path(root), cmd, binds=binds, env=env, cwd=cwd, writable=writable, nv=nv,  # type: ignore[arg-type]
                  scripts=scripts)
