"""setup.sh's ``quietly``: what a person sees in a terminal while a step runs (the README's
first command starts there). The function is taken out of setup.sh as it is and run under
setup.sh's own ``set -euo pipefail`` in a pseudo-terminal, with a step that writes to the log
as pip does: an indented warning block (setuptools' editable-install warning ends in a
source line, which read as an error on the status line) and, later, a plain line. And its
``apt_get``, with a stand-in ``apt-get`` on PATH: on a machine just booted, unattended-upgrades
holds apt's lock when the README's first command is typed."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import subprocess
import termios
import time
from pathlib import Path

from tests.conftest import ROOT, interruptible


def _function(name: str) -> str:
    """The text of one of setup.sh's functions, from its first line to its closing brace."""
    lines = (ROOT / "setup.sh").read_text().splitlines()
    start = lines.index(f"{name}() {{")
    end = lines.index("}", start)
    return "\n".join(lines[start : end + 1])


def _quietly() -> str:
    return _function("quietly")


def _in_a_terminal(script: str, timeout: float = 30.0, ctrl_c_after: float = 0.0) -> tuple[int, str]:
    """Run ``bash -c script`` in a new session on a pty, its controlling terminal, as a
    person's shell runs a command; with ``ctrl_c_after``, Ctrl-C is typed that many seconds
    after the start (the terminal sends SIGINT to its foreground process group). (exit
    status, what the terminal got)."""
    main, sub = pty.openpty()

    def foreground() -> None:  # the pty as controlling terminal, this process group in front
        interruptible()
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(["bash", "-c", script], stdin=sub, stdout=sub, stderr=sub, preexec_fn=foreground)
    os.close(sub)
    chunks = []
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        if ctrl_c_after and time.monotonic() - started >= ctrl_c_after:
            os.write(main, b"\x03")
            ctrl_c_after = 0.0
        exited = proc.poll() is not None  # before the select: what it wrote before exiting is read
        ready, _, _ = select.select([main], [], [], 0.2)
        if ready:
            try:
                data = os.read(main, 4096)
            except OSError:  # the other end closed (EIO on Linux)
                break
            if not data:
                break
            chunks.append(data)
        elif exited:
            break
    os.close(main)
    rc = proc.wait(timeout=timeout)
    return rc, b"".join(chunks).decode(errors="replace")


def _run_step(tmp_path: Path, step: str, ctrl_c_after: float = 0.0) -> tuple[int, str]:
    log = tmp_path / "setup.log"
    script = f'set -euo pipefail\nLOG={log}\n: >"$LOG"\n{_quietly()}\nquietly bash -c {step!r}\necho STEP-DONE\n'
    return _in_a_terminal(script, ctrl_c_after=ctrl_c_after)


def test_the_status_line_shows_no_indented_part_of_a_warning(tmp_path: Path) -> None:
    step = (
        "printf '  /x/editable_wheel.py:354: BuildBackendWarning: Editable installation.\\n"
        "  !!\\n    with strategy, WheelFile(wheel_path) as wheel_obj:\\n'; sleep 2.5; "
        "echo 'Successfully installed dedal-0.1.0'; sleep 1.5"
    )
    rc, seen = _run_step(tmp_path, step)
    assert rc == 0 and "STEP-DONE" in seen, seen
    assert "WheelFile" not in seen and "!!" not in seen, seen
    assert "Successfully installed dedal-0.1.0" in seen, seen  # a plain line still shows
    assert "WheelFile" in (tmp_path / "setup.log").read_text()  # the log keeps everything


def test_a_step_that_writes_only_indented_lines_runs_to_its_end(tmp_path: Path) -> None:
    # grep finds no line to show: under pipefail that must not end setup halfway
    rc, seen = _run_step(tmp_path, "printf '  indented only\\n'; sleep 1.5")
    assert rc == 0 and "STEP-DONE" in seen, seen
    assert "indented only" not in seen, seen


def test_a_failed_step_shows_the_end_of_its_log(tmp_path: Path) -> None:
    rc, seen = _run_step(tmp_path, "echo 'E: Unable to locate package nope'; exit 3")
    assert rc == 1 and "STEP-DONE" not in seen, seen
    assert "setup: failed (exit 3)" in seen and "Unable to locate package nope" in seen, seen


def test_ctrl_c_stops_the_step_too(tmp_path: Path) -> None:
    """Ctrl-C in the terminal while a step runs: the step gets it as it would in front (bash
    without job control had started it with SIGINT ignored, and apt-get or pip went on
    behind the prompt), setup says so in one line and ends with 130 once the step has."""
    marker = f"{time.time_ns() % 10**6}.25"  # a sleep of its own, to look for afterwards
    step = f"trap 'echo step-got-INT; exit 130' INT; echo started; sleep {marker}; echo not-reached"
    rc, seen = _run_step(tmp_path, step, ctrl_c_after=2.0)
    log = (tmp_path / "setup.log").read_text()
    assert rc == 130 and "STEP-DONE" not in seen, seen
    assert "setup: interrupted by SIGINT during: bash -c" in seen, seen
    assert "step-got-INT" in log and "not-reached" not in log, log
    left = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True)
    assert left.returncode == 1, f"the step's sleep outlived setup: {left.stdout}"


def _fake_apt_get(tmp_path: Path, body: str) -> dict[str, str]:
    """An environment whose ``apt-get`` is a script that counts its calls in ``calls``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "apt-get"
    fake.write_text(f'#!/bin/bash\necho "$*" >> {tmp_path}/calls\nn=$(wc -l < {tmp_path}/calls)\n{body}\n')
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _apt_get(tmp_path: Path, env: dict[str, str], wait: int) -> subprocess.CompletedProcess[str]:
    script = f'set -euo pipefail\nSUDO=""\nAPT_LOCK_WAIT={wait}\nAPT_LOCK_POLL=1\n{_function("apt_get")}\napt_get install -y sl\n'
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)


LOCKED = (
    'if [ "$n" -le 2 ]; then echo "E: Could not get lock /var/lib/dpkg/lock-frontend. '
    'It is held by process 2348 (apt-get)"; exit 100; fi; echo "Setting up sl"'
)


def test_apt_get_waits_while_another_package_manager_holds_the_lock(tmp_path: Path) -> None:
    # a machine just booted runs unattended-upgrades: the first command must wait, not fail
    env = _fake_apt_get(tmp_path, LOCKED)
    done = _apt_get(tmp_path, env, wait=10)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "calls").read_text().splitlines() == ["install -y sl"] * 3
    assert done.stdout.count("Waiting for another package manager") == 2, done.stdout
    assert "Setting up sl" in done.stdout


def test_apt_get_gives_up_on_the_lock_after_its_wait(tmp_path: Path) -> None:
    env = _fake_apt_get(tmp_path, LOCKED)
    done = _apt_get(tmp_path, env, wait=0)
    assert done.returncode == 100, done.stdout + done.stderr
    assert len((tmp_path / "calls").read_text().splitlines()) == 1
    assert "Could not get lock" in done.stdout


def test_apt_get_does_not_retry_a_failure_that_is_not_the_lock(tmp_path: Path) -> None:
    env = _fake_apt_get(tmp_path, 'echo "E: Unable to locate package sl"; exit 100')
    done = _apt_get(tmp_path, env, wait=10)
    assert done.returncode == 100, done.stdout + done.stderr
    assert len((tmp_path / "calls").read_text().splitlines()) == 1
    assert "Waiting" not in done.stdout
