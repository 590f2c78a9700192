"""The single place where dedal starts processes; adapters call it, nothing else does.

Output goes to a log file when one is given (the evidence a ToolError points at),
otherwise it is captured and the tail is put into the error.

No child gets dedal's secrets (:data:`SECRET_VARS`: the signing key's passphrase, the
registry password) in its environment, whether it inherits dedal's or is given one made
from it (``{**os.environ, ...}``): a Spack build, mksquashfs, sbatch's job, a container
started by Apptainer would otherwise all hold them, and Spack records a build's
environment in the prefix. The one tool that needs a secret gets it on its standard input
(``apptainer sign``, :mod:`dedal.adapters.signing`); the registry is spoken to in-process.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import math
import os
import select
import shlex
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Dict, List, Mapping, Optional, Sequence, Union

from dedal.errors import ToolError, ToolMissing

Cmd = Sequence[Union[str, os.PathLike]]
OUTPUT_KEPT = 4 << 20  # bytes of a failed command's logged output that its ToolError carries


SECRET_VARS = ("DEDAL_SIGN_PASSPHRASE", "DEDAL_REGISTRY_PASSWORD")


def child_env(env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The environment a child gets: ``env`` (default this process's) without
    :data:`SECRET_VARS`."""
    given = dict(os.environ if env is None else env)
    for name in SECRET_VARS:
        given.pop(name, None)
    return given


@dataclass
class Result:
    cmd: list
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def which(tool: str, hint: str = "") -> str:
    path = shutil.which(tool)
    if not path:
        raise ToolMissing(tool, hint)
    return path


def output_tail(text: str, lines: int = 5) -> str:
    """The last lines of a command's output (without dedal's own "$ command" headers)."""
    rows = [r.strip() for r in text.strip().splitlines() if r.strip() and not r.startswith("$ ")]
    return " | ".join(r if len(r) <= 300 else r[:297] + "..." for r in rows[-lines:])


def run(
    cmd: Cmd,
    *,
    what: str = "",
    log: Optional[Path] = None,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[Path] = None,
    timeout: Optional[float] = None,
    check: bool = True,
    input: Optional[str] = None,
    stdout: Optional[IO] = None,
    shown: Optional[Cmd] = None,
    watch: Optional[Callable[[int], None]] = None,
) -> Result:
    """Run a command to completion.

    ``watch`` is called with the child's pid about four times a second while it runs
    (progress displays read /proc/PID from it).

    ``shown`` is the command as errors name it, when ``cmd`` wraps it (a sandbox
    launcher's long command line stays in the log, the error names what ran inside).

    With ``log``, stdout and stderr are appended to that file (after a header line
    with the command) and Result.stdout is empty; otherwise both are captured.
    ``stdout`` may be an open binary file for large outputs (e.g. a tar stream).
    """
    argv = [os.fspath(c) for c in cmd]
    named = [os.fspath(c) for c in shown] if shown else argv
    label = what or argv[0]
    start = time.monotonic()
    offset = 0
    try:
        if log is not None:
            log = Path(log)
            log.parent.mkdir(parents=True, exist_ok=True)
            offset = log.stat().st_size if log.exists() else 0
            with open(log, "a", encoding="utf-8", errors="replace") as fh:
                fh.write(f"$ {shlex.join(argv)}\n")
                fh.flush()
                proc = _run(
                    argv,
                    watch,
                    stdout=stdout or fh,
                    stderr=fh,
                    env=child_env(env),
                    cwd=cwd,
                    timeout=timeout,
                    input=input,
                    text=stdout is None,
                )
            out, err = "", ""
        else:
            proc = _run(
                argv,
                watch,
                stdout=stdout or subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=child_env(env),
                cwd=cwd,
                timeout=timeout,
                input=input,
                text=stdout is None,
            )
            out = proc.stdout if stdout is None else ""
            err = proc.stderr if stdout is None else proc.stderr.decode("utf-8", "replace")
    except FileNotFoundError:
        raise ToolMissing(argv[0]) from None
    except subprocess.TimeoutExpired:
        raise ToolError(label, named, 124, log, f"timed out after {timeout:.0f} s") from None
    elapsed = time.monotonic() - start
    if check and proc.returncode != 0:
        if log is None:
            text = "\n".join(t for t in (out, err) if t)
        else:
            with open(log, "rb") as fh:  # this command's part, its last MiBs (where errors are)
                fh.seek(max(offset, fh.seek(0, os.SEEK_END) - OUTPUT_KEPT))
                text = fh.read().decode("utf-8", "replace")
        raise ToolError(label, named, proc.returncode, log, output_tail(text if log else err or out), output=text)
    return Result(argv, proc.returncode, out or "", err or "", elapsed)


WATCH_S = 0.25
STOP_GRACE_S = 5.0  # how long a child may take to end on SIGTERM before it gets SIGKILL


def stop(p: subprocess.Popen, grace: Optional[float] = None, *, group: bool = False) -> Optional[int]:
    """End a child: SIGTERM, up to ``grace`` seconds (default STOP_GRACE_S) to exit, then
    SIGKILL; its exit code.

    SIGTERM first because launchers clean up on it and not on SIGKILL: ``srun`` ends its
    job step (and releases an allocation it made), ``mpirun`` stops its ranks. ``group``:
    signal the child's whole process group (a child started in its own session by
    :func:`start`); never for a child of :func:`run`, which shares dedal's group. A
    second interrupt during the grace still kills the child before it propagates."""
    if p.poll() is not None:
        return p.returncode
    kill = (lambda sig: os.killpg(p.pid, sig)) if group else p.send_signal
    try:
        with contextlib.suppress(ProcessLookupError):
            kill(signal.SIGTERM)
        p.wait(STOP_GRACE_S if grace is None else grace)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                kill(signal.SIGKILL)
            p.wait()
    return p.returncode


def marked(name: str, value: str) -> List[int]:
    """The pids of the processes started with ``name=value`` in their environment (as
    /proc/PID/environ keeps it: what a process was started with), this one excepted; ones
    this process may not read are not seen. For what a stopped launcher leaves behind: an
    environment is inherited down a process tree, through a sandbox and past a daemon that
    a killed parent orphaned, where parentage is lost."""
    return [
        int(e.name)
        for e in os.scandir("/proc")
        if e.name.isdigit() and int(e.name) != os.getpid() and _started_with(int(e.name), name, value)
    ]


def _started_with(pid: int, name: str, value: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return f"{name}={value}".encode() in fh.read().split(b"\0")
    except OSError:  # gone meanwhile, or not ours to read
        return False


def kill_marked(name: str, value: str, wait: float = STOP_GRACE_S) -> List[int]:
    """SIGKILL every process :func:`marked` finds, again until none is left (what they
    start meanwhile too) or ``wait`` seconds have passed; the pids it killed. A process is
    held by a pidfd (Linux 5.3) and checked again before the signal, so that a pid reused
    between the look and the kill is not hit."""
    killed: List[int] = []
    deadline = time.monotonic() + wait
    while True:
        pids = marked(name, value)
        if not pids or time.monotonic() >= deadline:
            return killed
        for pid in pids:
            if _kill_if_marked(pid, name, value) and pid not in killed:
                killed.append(pid)
        time.sleep(0.02)


def _kill_if_marked(pid: int, name: str, value: str) -> bool:
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno != errno.ENOSYS:  # gone already
            return False
        try:  # Python or kernel without pidfds: the plain kill
            os.kill(pid, signal.SIGKILL)
            return True
        except ProcessLookupError:
            return False
    try:
        if not _started_with(pid, name, value):  # the pid is another process's by now
            return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _wait_exact(p: subprocess.Popen, timeout: Optional[float]) -> int:
    """``p.wait(timeout)``, woken by the child's exit itself. Popen's wait with a timeout
    sleeps between polls, the sleeps doubling up to 50 ms: a run's measured time, the
    verification's whole-job wall time among them, came out rounded up to the next poll,
    3 to 46 ms too long by where the exit fell (``benchmarks/run_timing/``): steps of 50 ms
    on a 15 % threshold of a 0.3 s job. A pidfd (Linux 5.3) is readable the moment the child
    exits (0.3 ms there); without one, Popen's wait."""
    if timeout is None:
        return p.wait()
    try:
        fd = os.pidfd_open(p.pid)
    except (AttributeError, OSError):  # Python < 3.9, a kernel without pidfd, a child already reaped
        return p.wait(timeout)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if not poller.poll(max(0, math.ceil(timeout * 1000))):  # signals: retried (PEP 475) or raised by a handler
            raise subprocess.TimeoutExpired(p.args, timeout)
    finally:
        os.close(fd)
    return p.wait()


def _run(
    argv: list,
    watch: Optional[Callable[[int], None]],
    *,
    timeout: Optional[float],
    input: Optional[str],
    **popen: object,
) -> subprocess.CompletedProcess:
    """``subprocess.run``, calling ``watch(pid)`` every WATCH_S while the child runs (when
    given), and stopping the child with :func:`stop` when this process is interrupted
    (``subprocess.run`` would SIGKILL it, which leaves an ``srun`` job step running)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    # without input, /dev/null: a child that inherits the user's terminal but runs in a
    # session of its own (a sandbox, a build job) fails on it, as Spack's log writer does
    # (tcgetpgrp: "Inappropriate ioctl for device"); none of dedal's tools reads the terminal
    with subprocess.Popen(argv, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL, **popen) as p:  # type: ignore[call-overload]
        try:
            while True:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                step = left if watch is None else (WATCH_S if left is None else min(WATCH_S, left))
                try:
                    if p.stdin is None and p.stdout is None and p.stderr is None:  # output to files: no pipe to drain
                        _wait_exact(p, step)
                        out, err = None, None
                    else:
                        out, err = p.communicate(input, timeout=step)  # input is sent once, output never lost
                    break
                except subprocess.TimeoutExpired:
                    if deadline is not None and time.monotonic() >= deadline:
                        p.kill()
                        p.communicate()
                        raise subprocess.TimeoutExpired(argv, timeout or 0.0) from None
                    watch(p.pid)  # type: ignore[misc]  # (step is None without watch: no expiry here)
        except subprocess.TimeoutExpired:
            raise
        except BaseException:  # Interrupted (SIGTERM, scancel), KeyboardInterrupt, an error in watch
            stop(p)
            raise
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def call(cmd: Cmd, *, env: Optional[Mapping[str, str]] = None, cwd: Optional[Path] = None) -> int:
    """Run a command attached to this process's terminal (stdin, stdout and stderr its own),
    to its end; its exit code. For what the user talks to or reads as it comes: an
    interactive shell (``dedal shell``), the ranks of ``dedal run``. Ctrl-C is the child's
    to handle while it runs (the terminal sends it to both: a shell goes on, ``srun`` cancels
    its step on the second), as ``os.system`` does; stopped otherwise (SIGTERM, an error),
    the child is stopped as :func:`stop` does."""
    argv = [os.fspath(c) for c in cmd]
    try:
        p = subprocess.Popen(argv, env=child_env(env), cwd=cwd)
    except FileNotFoundError:
        raise ToolMissing(argv[0]) from None
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        return p.wait()
    except BaseException:
        stop(p)
        raise
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _terminated_with(parent: int) -> Callable[[], None]:
    """``preexec_fn``: SIGTERM to the child when ``parent`` dies (Linux's parent-death
    signal), even by SIGKILL, which leaves the parent no chance to stop its children."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork: no dlopen in the child

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def start(
    cmd: Cmd,
    *,
    log: Optional[Path] = None,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[Path] = None,
    new_session: bool = True,
    die_with_parent: bool = False,
) -> subprocess.Popen:
    """Start a long-running process (daemon, benchmark rank launcher) and return it, its
    stdin /dev/null (it never reads the terminal; in a session of its own it could not).
    ``die_with_parent``: the process gets SIGTERM when this one dies (from the thread
    that calls this; Linux), so that a worker never outlives a killed dedal."""
    argv = [os.fspath(c) for c in cmd]
    if log is not None:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
    out = open(log, "ab") if log is not None else subprocess.DEVNULL
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=child_env(env),
            cwd=cwd,
            start_new_session=new_session,
            preexec_fn=_terminated_with(os.getpid()) if die_with_parent else None,
        )
    except FileNotFoundError:
        raise ToolMissing(argv[0]) from None
    finally:
        if log is not None:
            out.close()
