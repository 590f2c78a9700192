"""Stages left by killed processes (SIGKILL: the OOM killer, Slurm's KillWait, a job's
cgroup) are removed by the next stage on the host, and nothing else is: real processes,
really killed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Tuple

import pytest

from dedal.model import owner as owner_module
from dedal.errors import Interrupted, Signals, signals_held
from dedal.stages import stage_dir
from dedal.stages.stage_dir import STAGE_OWNER, Stage, remove_stage, stale_stages
from dedal.model.owner import boot_id as _boot_id, pid_namespace as _pid_namespace, process_start as _process_start
from tests.conftest import ROOT

HOLD = (
    "import sys, time; from pathlib import Path; from dedal.stages.stage_dir import Stage; "
    "print(Stage(Path(sys.argv[1]), 'build').__enter__(), flush=True); time.sleep(300)"
)


def stage_in_child(parent: Path) -> Tuple[subprocess.Popen, Path]:
    """A process that made a stage under ``parent`` and holds it."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(parent)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None
    path = Path(proc.stdout.readline().strip())
    assert path.parent == parent and (path / STAGE_OWNER).is_file()
    return proc, path


def owned(parent: Path, name: str, **owner) -> Path:
    d = parent / name
    d.mkdir()
    (d / STAGE_OWNER).write_text(json.dumps(owner))
    return d


def test_stage_of_a_killed_process_is_removed_by_the_next_one(tmp_path: Path) -> None:
    killed, dead = stage_in_child(tmp_path)
    alive, live = stage_in_child(tmp_path)
    try:
        (dead / "root").mkdir()
        (dead / "root" / "big").write_bytes(b"x" * 4096)
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        assert dead.is_dir()  # SIGKILL: nothing removed it
        here = {"host": socket.gethostname(), "boot": _boot_id(), "pidns": _pid_namespace()}
        me = os.getpid()
        reused = owned(tmp_path, "dedal-build-reused", pid=me, start=(_process_start(me) or 0) + 1, **here)
        rebooted = owned(
            tmp_path, "dedal-build-rebooted", host=here["host"], boot="another-boot", pid=me, start=_process_start(me)
        )
        # not judged: another host's (a shared stage_dir), another PID namespace's (a container),
        # no owner record, an unreadable one, not dedal's
        other_host = owned(
            tmp_path, "dedal-build-elsewhere", host=here["host"] + "-other", boot=here["boot"], pid=999999, start=1
        )
        other_ns = owned(
            tmp_path,
            "dedal-build-container",
            host=here["host"],
            boot=here["boot"],
            pidns="pid:[1]",
            pid=999999,
            start=1,
        )
        unowned = tmp_path / "dedal-build-unowned"
        unowned.mkdir()
        broken = tmp_path / "dedal-build-broken"
        broken.mkdir()
        (broken / STAGE_OWNER).write_text("{not json")
        foreign = owned(tmp_path, "someone-else", pid=999999, start=1, **here)
        assert stale_stages(tmp_path) == sorted([dead, reused, rebooted])
        stage = Stage(tmp_path, "build")
        with stage as mine:
            assert sorted(stage.reaped) == sorted([dead, reused, rebooted])
            assert not dead.exists() and not reused.exists() and not rebooted.exists()
            assert live.is_dir() and mine.is_dir()
            assert all(p.is_dir() for p in (other_host, other_ns, unowned, broken, foreign))
            assert stale_stages(tmp_path) == []  # a live process's stage, and this one, are not stale
        assert not mine.exists()
    finally:
        alive.kill()
        alive.wait(timeout=30)
    # its holder gone, the second child's stage is stale too
    assert stale_stages(tmp_path) == [live]


def test_stage_of_a_killed_process_not_yet_reaped_is_stale(tmp_path: Path) -> None:
    """A SIGKILLed node build stays a zombie until its parent reaps it; reparented to a PID 1
    that reaps late (this CI machine's init), it kept its stage looking owned and the next
    job left it in place. A zombie is gone."""
    killed, dead = stage_in_child(tmp_path)
    try:
        killed.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 30
        # exited and not reaped: WNOWAIT leaves it a zombie
        while os.waitid(os.P_PID, killed.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            assert time.monotonic() < deadline, "the child did not die"
            time.sleep(0.05)
        assert Path(f"/proc/{killed.pid}").exists()
        assert _process_start(killed.pid) is None
        assert stale_stages(tmp_path) == [dead]
    finally:
        killed.wait(timeout=30)


def test_a_second_signal_does_not_break_off_the_clean_up(tmp_path: Path) -> None:
    """The first SIGTERM raises Interrupted; one that arrives while the stage is being
    removed (a parent's death signal after scancel's, a second Ctrl-C) is ignored."""
    before = signal.getsignal(signal.SIGTERM)
    guard = Signals("test")
    cleaned = []
    with pytest.raises(Interrupted, match="interrupted by signal SIGTERM"):
        with guard:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            finally:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)
                cleaned.append(True)
    assert cleaned == [True] and guard.received == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_signal_while_the_stage_is_made_leaves_no_stage(tmp_path: Path, monkeypatch) -> None:
    """scancel's SIGTERM can arrive while a job is still making its stage (it came 2 s after
    the job started on a loaded CI machine): the stage is removed all the same, never left
    without its owner record for no one to remove."""
    real = owner_module.process_start

    def signalled_meanwhile(pid: int):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        return real(pid)

    monkeypatch.setattr(owner_module, "process_start", signalled_meanwhile)
    with pytest.raises(Interrupted, match="SIGTERM"):
        with Signals(), Stage(tmp_path, "build"):
            pytest.fail("the stage was entered despite the signal")
    assert list(tmp_path.iterdir()) == []


def test_a_signal_while_the_stage_is_removed_waits_for_the_removal(tmp_path: Path, monkeypatch) -> None:
    """scancel signals every process of a job at once: Spack can die of it first, the job's
    work then ends normally with a failed package, and dedal's own SIGTERM arrives while
    the stage is being removed (seen on the test cluster under load: the stage stayed whole,
    owner record and all). The removal finishes; Interrupted comes after it."""
    real = shutil.rmtree
    signalled = []

    def signalled_meanwhile(path, *args, **kwargs):
        if not signalled:
            signalled.append(path)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
        return real(path, *args, **kwargs)

    with pytest.raises(Interrupted, match="interrupted by signal SIGTERM"):
        with Signals(), Stage(tmp_path, "build") as stage:
            for name in ("root/a", "env", "source-cache"):
                (stage / name).mkdir(parents=True)
            monkeypatch.setattr(shutil, "rmtree", signalled_meanwhile)
    monkeypatch.undo()
    assert signalled and list(tmp_path.iterdir()) == []


def test_a_signal_just_before_the_removal_is_held_removes_the_stage_all_the_same(tmp_path: Path, monkeypatch) -> None:
    """Python runs a signal's handler between two bytecodes of the main thread, so a SIGTERM
    that arrives as the stage's removal begins can raise Interrupted before the hold is in
    place (here: while the hold is being set up). The stage is removed all the same."""
    real = stage_dir.signals_held

    def signalled_first():
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs at the next bytecode, before the mask
        return real()

    with pytest.raises(Interrupted, match="interrupted by signal SIGTERM"):
        with Signals(), Stage(tmp_path, "build") as stage:
            (stage / "root" / "a").mkdir(parents=True)
            monkeypatch.setattr(stage_dir, "signals_held", signalled_first)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_a_held_signal_that_another_thread_takes_waits_too() -> None:
    """The signal mask holds a stop signal off the main thread only; the kernel may give a
    process's signal to any other thread, and Python then runs the handler in the main
    thread all the same. That one waits for the held step's end too."""
    done = []
    go = threading.Event()

    def take_it() -> None:  # started before the block: a thread started inside inherits the mask
        go.wait(30)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    other = threading.Thread(target=take_it)
    other.start()
    with pytest.raises(Interrupted, match="interrupted by signal SIGTERM"):
        with Signals():
            with signals_held():
                go.set()
                other.join()
                time.sleep(0.2)  # the handler has run in this thread by now
                done.append(True)
    assert done == [True] and Signals.held == 0 and not Signals.deferred


def test_a_signal_as_the_hold_begins_waits_and_leaves_no_signal_blocked(monkeypatch) -> None:
    """A stop signal whose handler runs while the hold is being put in place (here: inside
    the mask call, before the mask is set) waits for the block's end like any other, and no
    stop signal stays blocked: that would make the process deaf to scancel and Ctrl-C."""
    real = signal.pthread_sigmask
    done = []

    def signalled_first(how, mask):
        if how == signal.SIG_BLOCK and not done:
            os.kill(os.getpid(), signal.SIGTERM)  # not blocked yet: Python's handler runs as this returns
        return real(how, mask)

    monkeypatch.setattr(signal, "pthread_sigmask", signalled_first)
    with pytest.raises(Interrupted, match="interrupted by signal SIGTERM"):
        with Signals():
            with signals_held():
                done.append(True)
    monkeypatch.undo()
    assert done == [True] and Signals.held == 0 and not Signals.deferred
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_a_stage_loses_its_owner_record_last(tmp_path: Path, monkeypatch) -> None:
    """So that a removal cut short (SIGKILL after KillWait) leaves a stage the next one
    still knows as stale, not an unowned directory that stays in /dev/shm for good."""
    here = {"host": socket.gethostname(), "pidns": _pid_namespace()}
    stale = tmp_path / "dedal-build-old"
    (stale / "root").mkdir(parents=True)
    for name in ["root/c"] + [f"f{i}" for i in range(10)]:
        (stale / name).write_text(name)
    # the record written last: a directory may list its newest entry first
    (stale / STAGE_OWNER).write_text(json.dumps(dict(boot="another-boot", pid=1, start=1, **here)))
    real = os.unlink
    left_with_record: list = []

    def watched(path, *args, **kwargs):
        if os.fspath(path).endswith(STAGE_OWNER):
            left_with_record.append(sorted(os.listdir(stale)))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", watched)
    remove_stage(stale)
    assert not stale.exists() and left_with_record == [[STAGE_OWNER]]

    # cut short after its first file: the next stage made here removes the rest
    owned(tmp_path, stale.name, boot="another-boot", pid=1, start=1, **here)
    (stale / "a").write_text("a")
    (stale / "b").write_text("b")

    def killed_after_one(path, *args, **kwargs):
        real(path, *args, **kwargs)
        raise Interrupted("killed")

    monkeypatch.setattr(os, "unlink", killed_after_one)
    with pytest.raises(Interrupted):
        remove_stage(stale)
    monkeypatch.undo()
    assert (stale / STAGE_OWNER).is_file() and stale_stages(tmp_path) == [stale]
    with Stage(tmp_path, "build") as mine:
        assert not stale.exists()
    assert not mine.exists()


def test_stale_stage_mounts_an_overlay_is_unmounted_anything_else_stays(tmp_path: Path) -> None:
    """An assembly killed outright leaves its overlay mounted in its stage: the next stage
    unmounts it and removes the stage (the overlay's lower tree untouched). A stage with
    any other mount below it stays: removing files through it would reach outside."""
    if os.geteuid() != 0:
        pytest.skip("needs root (mounts)")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep\n")
    stages = tmp_path / "stages"
    stages.mkdir()
    holders = [stage_in_child(stages) for _ in range(2)]  # both made before either dies
    for killed, _ in holders:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
    assembled, bound = (path for _, path in holders)
    for d in ("upper", "work", "merged"):
        (assembled / d).mkdir()
    subprocess.run(
        [
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={outside},upperdir={assembled / 'upper'},workdir={assembled / 'work'}",
            str(assembled / "merged"),
        ],
        check=True,
    )
    (bound / "merged").mkdir()
    subprocess.run(["mount", "--bind", str(outside), str(bound / "merged")], check=True)
    try:
        assert (assembled / "merged" / "precious").is_file()
        stage = Stage(stages, "build")
        with stage:
            assert stage.reaped == [assembled]
        assert not assembled.exists()
        assert bound.is_dir() and (bound / "merged" / "precious").read_text() == "keep\n"
    finally:
        for point in (assembled / "merged", bound / "merged"):
            subprocess.run(["umount", str(point)], capture_output=True)
    assert (outside / "precious").read_text() == "keep\n"
    assert stale_stages(stages) == [bound]  # unmounted, it goes too
