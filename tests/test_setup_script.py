"""setup.sh's ``quietly``: what a person sees in a terminal while a step runs (the README's
first command starts there). The function is taken out of setup.sh as it is and run under
setup.sh's own ``set -euo pipefail`` in a pseudo-terminal, with a step that writes to the log
as pip does: an indented warning block (setuptools' editable-install warning ends in a
source line, which read as an error on the status line) and, later, a plain line."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from pathlib import Path

from tests.conftest import ROOT


def _quietly() -> str:
    """The text of setup.sh's ``quietly`` function, from its first line to its closing brace."""
    lines = (ROOT / "setup.sh").read_text().splitlines()
    start = lines.index("quietly() {")
    end = lines.index("}", start)
    return "\n".join(lines[start : end + 1])


def _in_a_terminal(script: str, timeout: float = 30.0) -> tuple[int, str]:
    """Run ``bash -c script`` with its stdout on a pty; (exit status, what the terminal got)."""
    main, sub = pty.openpty()
    proc = subprocess.Popen(["bash", "-c", script], stdin=subprocess.DEVNULL, stdout=sub, stderr=sub)
    os.close(sub)
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 0.5)
        if ready:
            try:
                data = os.read(main, 4096)
            except OSError:  # the other end closed (EIO on Linux)
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(main)
    rc = proc.wait(timeout=timeout)
    return rc, b"".join(chunks).decode(errors="replace")


def _run_step(tmp_path: Path, step: str) -> tuple[int, str]:
    log = tmp_path / "setup.log"
    script = f'set -euo pipefail\nLOG={log}\n: >"$LOG"\n{_quietly()}\nquietly bash -c {step!r}\necho STEP-DONE\n'
    return _in_a_terminal(script)


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
