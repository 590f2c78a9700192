"""A long step on the display: a spinner line redrawn in place on a terminal, with the
tool's latest line from its log while the tool runs; plain, rate-limited lines elsewhere;
nothing under --json, and never anything on stdout."""

from __future__ import annotations

import io
import os
import re
import threading
from pathlib import Path
from typing import List

import pytest
from rich.console import Console

from dedal.adapters import proc
from dedal.ui import activity as act
from dedal.ui.activity import Activity, activity, last_line


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _plain(clock: Clock, **kw) -> Activity:
    console = Console(file=io.StringIO(), width=200, highlight=False, color_system=None)
    return Activity("concretizing in debian-trixie", live=False, background=False, clock=clock, console=console, **kw)


def _lines(a: Activity) -> List[str]:
    return a.console.file.getvalue().splitlines()


def _child_writing(log: Path, lines: int = 6, pause: float = 0.4) -> list:
    """A real child that prints a line into ``log`` every ``pause`` seconds, as debootstrap does."""
    script = f'for i in $(seq 1 {lines}); do echo "I: Retrieving pkg$i 1.0-$i"; sleep {pause}; done'
    return ["sh", "-c", script]


def test_last_line_of_a_log_since_the_step_began(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("from an earlier run\n")
    offset = log.stat().st_size
    assert last_line(log, offset) == ""
    with open(log, "a") as fh:
        fh.write("$ debootstrap --variant=minbase trixie /x http://deb.debian.org/debian\n")
        fh.write("I: Retrieving libc6 2.41-12\n\n")
        fh.write("\x1b[1mI: Unpacking   libc6...\x1b[0m\n")
        fh.write("Downloading 10%\rDownloading 55%\r")
    assert last_line(log, offset) == "Downloading 55%"  # a progress bar's latest state
    with open(log, "a") as fh:
        fh.write("\n$ apt-get install -y gcc\n")
    assert last_line(log, offset) == "Downloading 55%"  # dedal's command headers are not the tool's lines
    assert last_line(tmp_path / "missing.log") == ""
    with open(log, "a") as fh:  # a sandbox's command line, longer than the tail that is read
        fh.write("$ bwrap" + " --ro-bind /a /a" * 1000 + " spack concretize -f\n")
    assert last_line(log, offset) == ""
    with open(log, "a") as fh:
        fh.write("==> Concretized 1 spec\n")
    assert last_line(log, offset) == "==> Concretized 1 spec"


def test_plain_lines_are_rate_limited():
    clock = Clock()
    a = _plain(clock, every=30)
    with a:
        assert _lines(a) == ["concretizing in debian-trixie ..."]
        a.step("==> Concretizing zlib")
        for _ in range(130):
            clock.now += 1
            a.tick()
    lines = _lines(a)
    assert lines[1:] == [
        "still concretizing in debian-trixie (30 s)  (==> Concretizing zlib)",
        "still concretizing in debian-trixie (1m00s)  (==> Concretizing zlib)",
        "still concretizing in debian-trixie (1m30s)  (==> Concretizing zlib)",
        "still concretizing in debian-trixie (2m00s)  (==> Concretizing zlib)",
        "concretizing in debian-trixie: done after 2m10s",
    ]


def test_an_announced_step_and_a_short_wait_print_nothing_more():
    clock = Clock()
    said = _plain(clock, announce=False)  # the caller said what starts
    with said:
        clock.now += 29
        said.tick()
    assert _lines(said) == []
    waiting = _plain(clock, after=5)  # a request: shown only when it is not answered at once
    with waiting:
        clock.now += 4
        waiting.tick()
    assert _lines(waiting) == []
    with waiting:
        clock.now += 6
        waiting.tick()
        clock.now += 1
        waiting.tick()
    assert _lines(waiting) == ["concretizing in debian-trixie ...", "concretizing in debian-trixie: done after 7 s"]


def test_a_failed_step_says_so():
    clock = Clock()
    a = _plain(clock)
    with pytest.raises(RuntimeError):
        with a:
            clock.now += 3
            raise RuntimeError("spack concretize failed")
    assert _lines(a)[-1] == "concretizing in debian-trixie: failed after 3 s"


def test_quiet_shows_nothing(monkeypatch):
    monkeypatch.setattr(act, "_quiet", False)
    act.set_quiet(True)
    clock = Clock()
    a = _plain(clock)
    with a:
        clock.now += 100
        a.tick()
    assert _lines(a) == [] and a.quiet
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    with Activity("x", live=True, console=console) as shown:
        assert shown._live is None
    assert console.file.getvalue() == ""


def test_the_plain_lines_follow_a_real_child_through_its_log(tmp_path):
    """Off a terminal, the display's own thread prints the child's latest line (no caller polls)."""
    log = tmp_path / "debootstrap.log"
    console = Console(file=io.StringIO(), width=200, highlight=False, color_system=None)
    with activity("debootstrap trixie", log=log, live=False, every=1.0, console=console):
        proc.run(_child_writing(log, lines=5, pause=0.5), log=log, what="debootstrap")
    lines = console.file.getvalue().splitlines()
    assert lines[0] == "debootstrap trixie ..."
    still = [line for line in lines if line.startswith("still debootstrap trixie (")]
    assert still, lines
    assert all(re.search(r"\(last: I: Retrieving pkg\d 1\.0-\d\)$", line) for line in still), still
    assert len(still) <= 3, "at most one line per `every` second over the child's 2.5 s"
    assert re.fullmatch(r"debootstrap trixie: done after \d s", lines[-1])


def _pty_console(monkeypatch):
    """A console on a pseudo-terminal (taken for a terminal as dedal's stderr is) and what it shows."""
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    primary, secondary = os.openpty()
    shown = bytearray()

    def read() -> None:
        while True:
            try:
                data = os.read(primary, 65536)
            except OSError:
                return
            if not data:
                return
            shown.extend(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    console = Console(file=open(secondary, "w", closefd=True), width=100)

    def close() -> str:
        console.file.close()
        reader.join(10)
        os.close(primary)
        return shown.decode("utf-8", "replace")

    return console, close


def test_on_a_terminal_the_line_is_redrawn_while_a_child_runs(monkeypatch, tmp_path, capsys):
    console, close = _pty_console(monkeypatch)
    log = tmp_path / "debootstrap.log"
    log.write_text("I: an earlier build's line\n")
    details: List[str] = []
    with activity("debootstrap trixie", log=log, console=console) as a:
        assert a.live and a._live is not None
        print("stdout is left alone")  # a command's result (--json) never goes through the display
        proc.run(_child_writing(log), log=log, what="debootstrap", watch=lambda pid: details.append(a.detail()))
    text = close()
    assert capsys.readouterr().out == "stdout is left alone\n"
    seen = [d for i, d in enumerate(details) if d and (i == 0 or d != details[i - 1])]
    assert len(seen) >= 3 and all(re.fullmatch(r"last: I: Retrieving pkg\d 1\.0-\d", d) for d in seen), details
    assert "earlier build" not in text
    frames = [f for f in re.split(r"\r|\x1b\[2K", text) if "debootstrap trixie" in f]
    assert len(frames) >= 4, text  # redrawn in place, a few times a second
    assert any(re.search(r"debootstrap trixie {2}\d s.*\(last: I: Retrieving pkg\d", f) for f in frames), frames
    shown = {m for f in frames for m in re.findall(r"Retrieving (pkg\d)", f)}
    assert len(shown) >= 2, frames  # the latest line follows the child
    assert text.count("\n") <= 1, "one line redrawn, not a line per update (and gone at the end)"


def test_a_delayed_activity_draws_nothing_when_it_ends_first(monkeypatch):
    console, close = _pty_console(monkeypatch)
    console.print("before")
    with activity("waiting for registry.example.org", after=5.0, console=console):
        pass
    console.print("after")
    text = close()
    assert "waiting" not in text and "before" in text and "after" in text
    assert "\x1b[1A" not in text, "no line above is erased"
