"""dedal.adapters.proc: a child of ``proc.run`` whose caller is interrupted (SIGTERM to
dedal inside a ``Signals`` block, as scancel or a CI timeout sends it) gets SIGTERM first,
so that a launcher such as ``srun`` can end its job step, and SIGKILL only after the grace.

Real processes: a shell that traps SIGTERM, interrupted by a real signal to this process."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import pytest

from dedal.adapters import proc
from dedal.errors import Interrupted, Signals, ToolError

pytestmark = pytest.mark.reliability
WAIT_S = 60.0  # upper bound for the child to start on a loaded machine


def _signal_when(ready: Path, sig: int = signal.SIGTERM) -> threading.Thread:
    """SIGTERM to this process once ``ready`` exists (the child is running its loop)."""

    def go() -> None:
        deadline = time.monotonic() + WAIT_S
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), sig)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def _no_pidfd(pid: int) -> int:
    """``os.pidfd_open`` of a kernel older than 5.3."""
    raise OSError(38, "Function not implemented")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("watch", [None, lambda pid: None], ids=["plain", "watched"])
@pytest.mark.parametrize("logged", [False, True], ids=["captured", "logged"])
def test_interrupted_run_terminates_its_child_first(
    tmp_path: Path, watch: Optional[Callable[[int], None]], logged: bool
) -> None:
    ready, cleaned = tmp_path / "ready", tmp_path / "cleaned"
    script = (
        f"trap 'echo cleaned-up > {cleaned}; exit 7' TERM; echo $$ > {ready}.tmp; mv {ready}.tmp {ready}; "
        "while :; do sleep 0.1; done"
    )
    t = _signal_when(ready)
    with pytest.raises(Interrupted, match="test interrupted by signal SIGTERM"):
        with Signals("test"):
            proc.run(
                ["sh", "-c", script],
                what="trapper",
                timeout=WAIT_S * 2,
                watch=watch,
                log=tmp_path / "log" if logged else None,
            )
    t.join()
    assert cleaned.read_text() == "cleaned-up\n"  # its TERM trap ran: SIGTERM, not SIGKILL
    assert _gone(int(ready.read_text()))


def test_child_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proc, "STOP_GRACE_S", 1.0)
    ready, termed = tmp_path / "ready", tmp_path / "termed"
    script = (
        f"trap 'echo got-term >> {termed}' TERM; echo $$ > {ready}.tmp; mv {ready}.tmp {ready}; "
        "while :; do sleep 0.1; done"
    )
    t = _signal_when(ready)
    with pytest.raises(Interrupted):
        with Signals("test"):
            proc.run(["sh", "-c", script], what="stubborn", log=tmp_path / "log")
    t.join()
    assert termed.read_text() == "got-term\n"  # asked once, then killed, not left running
    assert _gone(int(ready.read_text()))


def test_timeout_still_kills_and_raises_124(tmp_path: Path) -> None:
    with pytest.raises(ToolError) as info:
        proc.run(["sh", "-c", "sleep 30"], what="sleeper", timeout=0.5, log=tmp_path / "log")
    assert info.value.returncode == 124 and "timed out after" in info.value.one_line()


@pytest.mark.parametrize("watch", [None, lambda pid: None], ids=["plain", "watched"])
def test_a_logged_run_with_a_timeout_is_woken_by_its_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, watch: Optional[Callable[[int], None]]
) -> None:
    """How verification runs every benchmark (a log, a timeout): Popen's wait with a timeout
    sleeps between polls, up to 50 ms, and the run's seconds came out rounded up to the next
    poll (the job wall time of a 0.3 s init job in ~50 ms steps). Now no sleep while the child
    runs: its exit wakes the wait."""
    slept: list = []
    real_sleep = time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: (slept.append(s), real_sleep(s))[1])
    res = proc.run(["sleep", "0.3"], what="sleeper", log=tmp_path / "log", timeout=WAIT_S, watch=watch)
    assert res.returncode == 0 and res.seconds >= 0.3
    assert slept == []


def test_a_logged_run_without_pidfd_still_waits_and_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "pidfd_open", _no_pidfd)
    assert proc.run(["sh", "-c", "exit 0"], log=tmp_path / "log", timeout=WAIT_S).returncode == 0
    with pytest.raises(ToolError) as info:
        proc.run(["sleep", "30"], what="sleeper", timeout=0.5, log=tmp_path / "log")
    assert info.value.returncode == 124


@pytest.mark.parametrize("watch", [None, lambda pid: None], ids=["plain", "watched"])
def test_run_output_and_input_unchanged(watch: Optional[Callable[[int], None]]) -> None:
    res = proc.run(["sh", "-c", "cat; echo err >&2; exit 3"], input="hello\n", check=False, watch=watch)
    assert (res.returncode, res.stdout, res.stderr) == (3, "hello\n", "err\n")


def test_stop_of_a_finished_child_returns_its_code() -> None:
    p = proc.start(["sh", "-c", "exit 5"])
    p.wait()
    assert proc.stop(p, group=True) == 5


CHILD_STDIN = """
import sys
from pathlib import Path
from dedal.adapters import proc
out = Path(sys.argv[1])
print("terminal", sys.stdin.isatty())
print("run", proc.run(["readlink", "/proc/self/fd/0"]).stdout.strip())
proc.run(["sh", "-c", "readlink /proc/self/fd/0"], log=out / "run.log")
print("logged", (out / "run.log").read_text().splitlines()[-1])
p = proc.start(["sh", "-c", "readlink /proc/self/fd/0"], log=out / "start.log")
p.wait()
print("start", (out / "start.log").read_text().strip())
"""


def test_children_never_inherit_the_terminal(tmp_path: Path) -> None:
    """A dedal whose stdin is a terminal (a person typing the README's command) gives every
    child /dev/null instead: a child in a session of its own (a build job, a sandboxed
    Spack) that inherited the terminal failed on it (Spack's log writer: tcgetpgrp ENOTTY).
    The dedal here really has a pseudo-terminal as stdin."""
    import subprocess
    import sys

    primary, secondary = os.openpty()
    try:
        res = subprocess.run(
            [sys.executable, "-c", CHILD_STDIN, str(tmp_path)],
            stdin=secondary,
            capture_output=True,
            text=True,
            timeout=WAIT_S,
        )
    finally:
        os.close(primary)
        os.close(secondary)
    assert res.returncode == 0, res.stderr
    seen = dict(line.split(" ", 1) for line in res.stdout.splitlines())
    assert seen == {"terminal": "True", "run": "/dev/null", "logged": "/dev/null", "start": "/dev/null"}, seen


# ------------------------------------------------------------------ dedal's secrets stay in dedal (issue 39)

SECRET = "s3cret-passphrase-39"


@pytest.fixture
def secrets_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in proc.SECRET_VARS:
        monkeypatch.setenv(name, SECRET)
    monkeypatch.setenv("DEDAL_NOT_SECRET_39", "kept")


def test_no_child_sees_the_passphrase_or_the_registry_password(secrets_set: None, tmp_path: Path) -> None:
    """Inherited (env=None) or given as dedal's environment plus more (what the adapters
    pass: ``{**os.environ, ...}``): run, start and call give no child the secrets, and every
    other variable as before."""
    shown = [proc.run(["env"]).stdout, proc.run(["env"], env={**os.environ, "X": "1"}).stdout]
    proc.run(["env"], log=tmp_path / "run.log")
    shown.append((tmp_path / "run.log").read_text())
    p = proc.start(["env"], log=tmp_path / "start.log", env={**os.environ})
    p.wait()
    shown.append((tmp_path / "start.log").read_text())
    assert proc.call(["sh", "-c", f"env > {tmp_path / 'call.out'}"]) == 0
    shown.append((tmp_path / "call.out").read_text())
    for text in shown:
        assert "DEDAL_NOT_SECRET_39=kept" in text and "PATH=" in text
        assert SECRET not in text and not any(f"{name}=" in text for name in proc.SECRET_VARS), text


def test_spack_run_on_the_host_does_not_see_them(secrets_set: None, tmp_path: Path) -> None:
    """The Spack adapter's host runner hands Spack dedal's environment with its own added:
    a stand-in ``bin/spack`` that prints its environment finds no secret in it."""
    from dedal.adapters.spack import Spack

    root = tmp_path / "spack"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "spack").write_text("#!/bin/sh\nexec env\n")
    (root / "bin" / "spack").chmod(0o755)
    out = Spack(root, tmp_path / "cache")._run(["--version"]).stdout
    assert "SPACK_DISABLE_LOCAL_CONFIG=1" in out and "DEDAL_NOT_SECRET_39=kept" in out
    assert SECRET not in out


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed and not yet reaped by its parent, does not)."""
    from dedal.model.owner import process_start

    return process_start(pid) is not None


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "no-pidfd"])
def test_kill_marked_ends_an_orphaned_tree_by_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pidfd: bool
) -> None:
    """What mpirun killed in its sandbox leaves: a shell in a session of its own (no parent
    of ours to kill it with) and what it started, all with the run's mark in their
    environment. They are killed, and a process with another value of the mark is not."""
    if not pidfd:
        monkeypatch.setattr(os, "pidfd_open", _no_pidfd)
    name, value = "DEDAL_TEST_MARK", str(tmp_path)
    started = tmp_path / "pids"
    tree = subprocess.Popen(
        ["sh", "-c", f'sleep 300 & a=$!; sleep 300 & echo "$a $!" > {started}.part; mv {started}.part {started}; wait'],
        env={**os.environ, name: value},
        start_new_session=True,
    )
    other = subprocess.Popen(["sleep", "300"], env={**os.environ, name: value + "-another"})
    try:
        deadline = time.monotonic() + WAIT_S
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        sleeps = [int(p) for p in started.read_text().split()]
        assert sorted(proc.marked(name, value)) == sorted([tree.pid, *sleeps])

        killed = proc.kill_marked(name, value)
        tree.wait(WAIT_S)
        assert sorted(killed) == sorted([tree.pid, *sleeps])
        assert tree.returncode == -signal.SIGKILL
        assert not any(_running(p) for p in sleeps) and proc.marked(name, value) == []
        assert _running(other.pid)  # another run's mark is left alone
    finally:
        for p in (tree, other):
            p.kill()
            p.wait()
