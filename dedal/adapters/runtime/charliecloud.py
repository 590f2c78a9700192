"""The Charliecloud backend (``ch-run``, its own user namespace per process).

ch-run opens a directory or a squashfs file itself; a SIF it cannot open, so it is given
the SIF's primary partition mounted (:func:`.common.mounted`) for as long as the command
runs. ch-run cannot create mount points in a read-only image: a ``Bind`` onto a path the
image lacks is refused before anything runs (bwrap or Apptainer can do it). The image's
``/.singularity.d/env`` scripts are sourced by a ``/bin/sh`` wrapper inside, as with bwrap;
``/tmp`` is private (``--private-tmp``) unless the caller binds it or the root is writable.
ch-run (0.31) has no read-only binds: a ``Bind(readonly=True)`` is writable inside.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator, List, Mapping, Optional, Sequence

from dedal.adapters import proc
from dedal.adapters.runtime.common import (HINTS, Bind, Prepared, RootArg, base_env, image_env_scripts, mounted,
                                           note_mount, resolve_in_image, with_image_env, wrap_with_image_env)
from dedal.errors import UserError

TOOL = "ch-run"


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
    ``nv`` changes nothing here (no GPU passthrough for ch-run yet)."""
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


@contextlib.contextmanager
def prepare(root: RootArg, kind: str, cmd: Sequence[str], *, binds: Sequence[Bind],
            env: Optional[Mapping[str, str]], cwd: Optional[str], writable: bool, nv: bool) -> Iterator[Prepared]:
    """Refuse binds onto missing paths; then a directory or squashfs as it is (a squashfs
    mounted briefly to read its env scripts: ch-run mounts it again itself), a SIF mounted."""
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
