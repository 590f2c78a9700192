"""The progress display: plain timestamped lines off a terminal (as before), a live view on one."""

from __future__ import annotations

import io
import re
import sys

import pytest
from rich.console import Console

from dedal.adapters import proc, squashfs
from dedal.ui import progress as pg


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _console(terminal: bool) -> Console:
    return Console(file=io.StringIO(), force_terminal=terminal, width=120, highlight=False, color_system=None)


def test_plain_lines_off_a_terminal():
    console = _console(False)
    with pg.BuildProgress(3, title="build tiny", console=console) as p:
        assert p._live is None
        p.started("libdedal@1.0/suuk3yz")
        p.finished("libdedal@1.0/suuk3yz", "built", 2.5)
        p.finished("dedal-app@1.0/jqiwi5f", "failed", 1.0, "spack install: [e] error")
        p.note("stopped after a failure")
    lines = console.file.getvalue().splitlines()
    stamp = r"\[ *\d+\.\d s\] "
    assert re.fullmatch(stamp + r"start   libdedal@1\.0/suuk3yz", lines[0])
    assert re.fullmatch(stamp + r"built   libdedal@1\.0/suuk3yz \[1/3\] 2\.5 s", lines[1])
    # brackets in an error are text, not markup
    assert re.fullmatch(stamp + r"failed  dedal-app@1\.0/jqiwi5f \[2/3\] 1\.0 s: spack install: \[e\] error", lines[2])
    assert re.fullmatch(stamp + "stopped after a failure", lines[3]) and len(lines) == 4


@pytest.mark.parametrize(
    "ci, term, live",
    [
        ("", "xterm", True),
        ("true", "xterm", False),
        ("1", "xterm", False),
        ("false", "xterm", True),
        ("", "dumb", False),
    ],
)
def test_live_only_on_a_terminal_outside_ci(monkeypatch, ci, term, live):
    monkeypatch.setenv("CI", ci)
    monkeypatch.setenv("TERM", term)
    assert pg.live_terminal(_Tty()) is live
    assert pg.live_terminal(io.StringIO()) is False


def test_quiet_prints_nothing():
    console = _console(True)
    with pg.BuildProgress(2, console=console, quiet=True, live=True) as p:
        p.started("a")
        p.finished("a", "built", 1.0)
    assert console.file.getvalue() == ""


def test_live_view_shows_jobs_by_state_with_times_and_eta():
    console = _console(True)
    p = pg.BuildProgress(5, title="build tiny", console=console, live=True)
    p.estimates = {"libdedal@1.0/suuk3yz": 40.0}
    p.eta = lambda: 95.0
    with p:
        p.started("libdedal@1.0/suuk3yz", "node2")
        p.started("dedal-tool@1.0/rwfh5of")
        p.finished("gcc-runtime@12.2.0/bwhvedy", "built", 3.0)
        view = _console(True)
        view.print(p._render())
    text = view.file.getvalue()
    assert "build tiny: 1/5 done, 2 running, 2 queued, 0 failed, 0 blocked" in text
    assert "ETA 1m35s" in text
    assert re.search(r"running libdedal@1\.0/suuk3yz  \d+\.\d s / ~40\.0 s  on node2", text)
    assert re.search(r"running dedal-tool@1\.0/rwfh5of  \d+\.\d s *\n", text)
    # the event lines also went to the terminal, without timestamps
    out = console.file.getvalue()
    assert "start   libdedal@1.0/suuk3yz on node2" in out and "built   gcc-runtime@12.2.0/bwhvedy [1/5] 3.0 s" in out


def test_an_eta_that_fails_is_left_out():
    p = pg.BuildProgress(2, console=_console(True), live=False)
    p.eta = lambda: 1 / 0
    assert p.eta_s() is None


def test_byte_counts_render_on_a_terminal_and_are_silent_elsewhere():
    console = _console(True)
    with pg.Transfers(live=True, console=console) as t:
        assert pg.Transfers.showing()
        with pg.meter("upload 0123456789ab", 4_000_000) as m:
            m.update(1_000_000)
            m.advance(1_000_000)
            view = _console(True)
            view.print(t.renderable())
        assert t._progress is None, "the bars' display stops when no count is open"
    text = view.file.getvalue()
    assert "upload 0123456789ab" in text and "2.0/4.0 MB" in text
    plain = _console(False)
    with pg.Transfers(console=plain):
        assert not pg.Transfers.showing()
        with pg.meter("upload x", 10) as m:
            m.advance(5)
    assert plain.file.getvalue() == "" and not pg.Transfers.showing()


def test_watch_sees_a_running_command():
    seen = []
    res = proc.run([sys.executable, "-c", "import time; time.sleep(0.8); print('done')"], watch=seen.append)
    assert res.stdout.strip() == "done" and len(seen) >= 2 and all(isinstance(pid, int) for pid in seen)


def test_mksquashfs_reports_the_bytes_it_read(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"x" * 3_000_000)
    (src / "b").write_bytes(bytes(range(256)) * 4000)
    assert squashfs.input_bytes([src]) == 3_000_000 + 1_024_000
    seen = []
    monkeypatch.setattr(pg.Meter, "update", lambda self, done: seen.append(done))
    monkeypatch.setattr(proc, "WATCH_S", 0.001)  # sample often: mksquashfs of 4 MB is quick
    with pg.Transfers(live=True, console=_console(True)):
        squashfs.pack([src], tmp_path / "out.sqfs", processors=1)
    assert seen and max(seen) <= squashfs.input_bytes([src])
    assert sorted(e["path"] for e in squashfs.entries(tmp_path / "out.sqfs") if e["path"] in ("a", "b")) == ["a", "b"]
