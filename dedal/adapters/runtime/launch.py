"""Running a command in a root: the backend chosen by name, then to completion
(:func:`run_in`), on the terminal (:func:`run_interactive`) or alongside (:func:`start_in`).

:data:`BACKENDS` is the one table of the runtimes: name -> module with the
:class:`.common.Backend` interface, in the order ``auto`` tries them (Apptainer if on
PATH and able to run containers, else bwrap, else ch-run; :func:`choose_runtime` says
which and why). The host's own root (``None``) always runs with bwrap, the only backend
that runs it in a private mount namespace.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import subprocess
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from dedal.adapters import proc
from dedal.adapters.runtime import apptainer, bwrap, charliecloud
from dedal.adapters.runtime.common import Backend, Bind, Prepared, Request, RootArg, check_bind_sources, root_kind
from dedal.errors import ToolMissing, UserError
from dedal.model.config import RUNTIMES

#: the backends by name, in the order ``auto`` tries them
BACKENDS: Dict[str, Backend] = {  # type: ignore[dict-item]
    "apptainer": apptainer,
    "bwrap": bwrap,
    "charliecloud": charliecloud,
}
log = logging.getLogger("dedal.runtime")


@functools.lru_cache(maxsize=None)
def apptainer_probe(path: str) -> Tuple[str, str]:
    """``(version, problem)`` of the Apptainer at ``path``; ``problem`` says why it cannot
    run containers here ("" when it can): it must answer ``--version``, and without root
    it needs user namespaces (dedal's builds of Apptainer are not setuid)."""
    version = apptainer.version(path)
    if not version:
        return "", f"`{path} --version` failed"
    if os.geteuid() != 0:
        try:
            if int(Path("/proc/sys/user/max_user_namespaces").read_text()) == 0:
                return version, "user namespaces are disabled (/proc/sys/user/max_user_namespaces is 0)"
        except (OSError, ValueError):
            pass
    return version, ""


def choose_runtime(runtime: str = "auto") -> Tuple[str, str]:
    """``(backend, why)``: the backend ``runtime`` stands for and the reason, in words, for
    ``auto``: Apptainer where it is on PATH and works, else bwrap, else ch-run."""
    if runtime not in RUNTIMES:
        raise UserError(f"runtime: expected one of {', '.join(RUNTIMES)}, got {runtime!r}")
    if runtime != "auto":
        return runtime, f"runtime {runtime} was asked for"
    passed: List[str] = []
    for name, backend in BACKENDS.items():
        try:
            path = proc.which(backend.TOOL)
        except ToolMissing:
            passed.append(f"{backend.TOOL} is not on PATH")
            continue
        if name == "apptainer":
            version, problem = apptainer_probe(path)
            if problem:
                passed.append(f"apptainer at {path} cannot run containers: {problem}")
                continue
            found = f"apptainer {version} at {path}"
        else:
            found = f"{backend.TOOL} at {path}"
        why = "; ".join([f"auto: {found}", *passed])
        log.info("runtime %s", why)
        return name, why
    raise ToolMissing(
        "bwrap", "no container runtime found: install bubblewrap, Charliecloud or Apptainer (" + "; ".join(passed) + ")"
    )


def resolve_runtime(runtime: str = "auto") -> str:
    """The backend ``runtime`` stands for: apptainer, bwrap or charliecloud."""
    return choose_runtime(runtime)[0]


def shares_per_node(runtime: str = "auto") -> bool:
    """Whether ``runtime`` puts the ranks of an srun step on one node into one container
    (``prepared(..., per_node=True)``): Apptainer with ``--sharens``."""
    return resolve_runtime(runtime) == "apptainer" and apptainer.has_sharens(proc.which(apptainer.TOOL))


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
    per_node: bool = False,
) -> Iterator[Prepared]:
    """Mount the root if needed and yield the full command line for the chosen backend;
    unmount (and remove mount points made in a writable root) afterwards. ``per_node``: the
    command is one rank of an srun step, and the ranks on a node are to share one container:
    Apptainer's ``--sharens`` (bwrap and ch-run already share the one mount of the image)."""
    if not cmd:
        raise UserError("no command given to run in the image")
    cmd = [os.fspath(c) for c in cmd]
    check_bind_sources(binds)
    kind = root_kind(root)
    backend = resolve_runtime(runtime)
    if kind == "host" and backend != "bwrap":
        backend = "bwrap"  # only bwrap runs the host root in a private mount namespace
    if kind == "instance" and backend != "apptainer":
        raise UserError(f"{root}: an Apptainer instance runs with runtime apptainer, not {backend}")
    if writable and kind in ("squashfs", "sif"):
        raise UserError(f"{root}: a {kind} image is read-only; writable runs need a directory root")
    request = Request(
        tuple(cmd),
        tuple(binds),
        env,
        os.fspath(cwd) if cwd is not None else None,
        writable=writable,
        nv=nv,
        per_node=per_node,
    )
    with BACKENDS[backend].prepare(root, kind, request) as prep:
        yield prep


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
    with prepared(
        root,
        cmd,
        binds=binds,
        env=env,
        cwd=cwd,
        runtime=runtime,  # type: ignore[arg-type]
        writable=writable,
        nv=nv,
    ) as prep:
        return proc.run(
            prep.argv,
            what=what or f"{Path(str(cmd[0])).name} in {root or 'host'}",
            log=log,
            env=prep.env,
            timeout=timeout,
            check=check,
            input=input,
            shown=cmd,
        )


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
    returns its exit code (:func:`dedal.adapters.proc.call`: an interactive shell needs the
    terminal itself)."""
    with prepared(root, cmd, binds=binds, env=env, cwd=cwd, runtime=runtime, nv=nv) as prep:  # type: ignore[arg-type]
        return proc.call(prep.argv, env=prep.env)


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
        proc.stop(self.popen, grace, group=True)
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
        prep = stack.enter_context(
            prepared(
                root,
                cmd,
                binds=binds,
                env=env,
                cwd=cwd,  # type: ignore[arg-type]
                runtime=runtime,
                nv=nv,
            )
        )
        popen = proc.start(prep.argv, log=log, env=prep.env)
    except BaseException:
        stack.close()
        raise
    return Running(popen, stack, prep.argv)


def rpm_packages(root: Path, *, log: Optional[Path] = None) -> Dict[str, str]:
    """``{package: version-release}`` of an RPM-based root (rpm -qa inside it, always with bwrap)."""
    out = run_in(
        root, ["rpm", "-qa", "--qf", "%{NAME}\\t%{VERSION}-%{RELEASE}\\n"], what="rpm -qa", runtime="bwrap"
    ).stdout
    result: Dict[str, str] = {}
    for line in out.splitlines():
        if "\t" in line:
            name, version = line.split("\t", 1)
            result[name] = version
    return result
