"""The Apptainer backend (``apptainer exec``), and Apptainer's builds of base images.

Apptainer opens every kind of root itself (a directory, a squashfs file, a SIF), so nothing
is mounted here; it sources the image's ``/.singularity.d/env`` scripts itself.
``--cleanenv`` drops the host environment and ``--env`` sets ours on top; the image's PATH
(from its env scripts) applies instead of :func:`.common.base_env`'s.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence

from dedal.adapters import proc
from dedal.adapters.runtime.common import HINTS, Bind, Prepared, RootArg, base_env

TOOL = "apptainer"


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
    """The ``apptainer exec`` command line. Apptainer sources ``/.singularity.d/env`` itself
    (``scripts`` is not used); ``--cleanenv`` drops the host environment, ``--env`` sets ours
    on top."""
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
    return Prepared(args, dict(os.environ))


@contextlib.contextmanager
def prepare(root: RootArg, kind: str, cmd: Sequence[str], *, binds: Sequence[Bind],
            env: Optional[Mapping[str, str]], cwd: Optional[str], writable: bool, nv: bool) -> Iterator[Prepared]:
    """Apptainer is given the root as it is."""
    yield command(Path(root), cmd, binds=binds, env=env, cwd=cwd, writable=writable, nv=nv)  # type: ignore[arg-type]


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
