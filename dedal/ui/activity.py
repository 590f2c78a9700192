"""One long step on the display: what it does, for how long, and its latest line.

``with activity("concretizing in debian-trixie", log=path):`` around a step that can be
quiet for minutes (debootstrap, apt, Spack's concretizer and mirror, a registry that
does not answer). On a terminal, a spinner line redrawn in place a few times a second
(and gone when the step ends; the callers' own lines say what came of it)::

    ⠹ concretizing in debian-trixie  1m12s  (last: ==> Installing zlib ...)

Elsewhere (CI logs, pipes, ``CI=true``: :func:`dedal.ui.progress.live_terminal`) plain
lines: ``WHAT ...`` when it starts (unless the caller has said so itself:
``announce=False``), ``still WHAT (1m00s)  (<latest line>)`` at most every ``every``
seconds, and ``WHAT: done after 4m16s`` at the end when a line was printed. With
``after`` nothing is shown before the step has lasted that long (a request that is
usually answered at once). Under ``--json`` (:func:`set_quiet`, set by the CLI) nothing
is shown; the display is on stderr, never on stdout.

The latest line is what :meth:`Activity.step` said last, else the last line of ``log``
(a tool's output as ``proc.run`` appends it, from where the file ended when the step
began: debootstrap's ``I: Retrieving libc6``, apt's ``Unpacking ...``, Spack's ``==>``
lines). A thread of the display reads it, so no caller has to poll.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Callable, Optional, Type, Union

from rich.console import Console, Group, RenderableType
from rich.errors import LiveError
from rich.live import Live
from rich.text import Text

from dedal.errors import Interrupted
from dedal.ui.console import err, human_seconds
from dedal.ui.progress import live_terminal

EVERY_S = 30.0  # plain lines: at most one "still ..." line per this many seconds
REFRESH_PER_S = 4  # terminal: redraws per second
TAIL_BYTES = 8192  # how much of the log's end is read for its last line
DETAIL_CHARS = 160  # a plain line's latest-line part is cut to this
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

_quiet = False


def set_quiet(quiet: bool) -> None:
    """No activity is shown from now on (``--json``); the CLI sets it per command."""
    global _quiet
    _quiet = bool(quiet)


def last_line(path: Union[str, os.PathLike], offset: int = 0) -> str:
    """The last non-empty line of ``path`` after byte ``offset`` (a progress bar's ``\\r``
    ends a line too; terminal colours and dedal's ``$ command`` headers left out); ""
    when there is none or the file cannot be read."""
    try:
        with open(path, "rb") as fh:
            end = fh.seek(0, os.SEEK_END)
            start = max(offset, end - TAIL_BYTES)
            if end <= start:
                return ""
            fh.seek(start)
            data = fh.read(end - start)
    except OSError:
        return ""
    lines = re.split(r"[\r\n]", _ANSI.sub("", data.decode("utf-8", "replace")))
    if start > offset:  # read from the middle of a line (of dedal's long `$ bwrap ...` header, say)
        lines = lines[1:]
    for line in reversed(lines):
        line = " ".join(line.split())
        if line and not line.startswith("$ "):
            return line
    return ""


def elapsed_text(seconds: float) -> str:
    """``7 s``, ``1m12s``: whole seconds, as a line redrawn every second shows them."""
    return f"{int(seconds)} s" if seconds < 60 else human_seconds(seconds)


class Activity:
    """A step shown while it runs (see the module). ``clock`` and ``background=False``
    (no thread: the caller calls :meth:`tick`) are for tests."""

    def __init__(
        self,
        what: str,
        *,
        log: Optional[Union[str, os.PathLike]] = None,
        after: float = 0.0,
        announce: bool = True,
        every: float = EVERY_S,
        quiet: Optional[bool] = None,
        live: Optional[bool] = None,
        console: Optional[Console] = None,
        clock: Callable[[], float] = time.monotonic,
        background: bool = True,
    ) -> None:
        self.what = what
        self.log = Path(log) if log is not None else None
        self.after = max(0.0, float(after))
        self.announce = announce
        self.every = float(every)
        self.console = console or err
        self.quiet = _quiet if quiet is None else bool(quiet)
        self.live = not self.quiet and (live_terminal(self.console.file) if live is None else bool(live))
        self.clock = clock
        self.background = background
        self.started = 0.0
        self.lines = 0  # plain lines printed
        self._offset = 0
        self._step = ""
        self._printed: Optional[float] = None  # when the last plain line was printed
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._live: Optional[Live] = None

    # ---------------------------------------------------------------- state

    @property
    def elapsed(self) -> float:
        return self.clock() - self.started

    def step(self, text: str) -> None:
        """What the step does now (shown instead of the log's last line)."""
        self._step = " ".join(str(text).split())

    def detail(self) -> str:
        """The latest line: the last :meth:`step`, else the log's last line since the start."""
        if self._step:
            return self._step
        if self.log is not None:
            line = last_line(self.log, self._offset)
            return f"last: {line}" if line else ""
        return ""

    # ---------------------------------------------------------------- display

    def render(self) -> RenderableType:
        """The terminal's line: spinner, what, time, latest line (nothing before ``after``)."""
        took = self.elapsed
        if took < self.after:
            return Group()
        line = Text(
            f"{SPINNER[int(took * REFRESH_PER_S) % len(SPINNER)]} {self.what}  {elapsed_text(took)}",
            no_wrap=True,
            overflow="ellipsis",
        )
        detail = self.detail()
        if detail:
            line.append(f"  ({detail})", style="dim")
        return line

    def _say(self, line: str) -> None:
        self.lines += 1
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def _with_detail(self, head: str) -> str:
        detail = self.detail()
        if len(detail) > DETAIL_CHARS:
            detail = detail[: DETAIL_CHARS - 3] + "..."
        return f"{head}  ({detail})" if detail else head

    def tick(self) -> None:
        """Plain lines that are due (the thread calls it every second)."""
        if self.quiet or self.live:
            return
        with self._lock:
            now = self.clock()
            took = now - self.started
            if self._printed is None:
                if self.announce and took >= self.after:
                    self._say(self._with_detail(f"{self.what} ..."))
                elif took >= max(self.after, self.every):
                    self._say(self._with_detail(f"still {self.what} ({elapsed_text(took)})"))
                else:
                    return
                self._printed = now
            elif now - self._printed >= self.every:
                self._say(self._with_detail(f"still {self.what} ({elapsed_text(took)})"))
                self._printed = now

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.tick()

    # ---------------------------------------------------------------- context

    def __enter__(self) -> "Activity":
        self.started = self.clock()
        if self.log is not None:
            try:
                self._offset = self.log.stat().st_size
            except OSError:
                self._offset = 0
        if self.quiet:
            return self
        if self.live:
            # stdout is left alone (a command's result, JSON); stderr lines print above the spinner
            live = Live(
                console=self.console,
                refresh_per_second=REFRESH_PER_S,
                transient=True,
                get_renderable=self.render,
                redirect_stdout=False,
            )
            try:
                live.start()
                self._live = live
            except LiveError:  # an older rich, with another live display on: plain lines then
                self.live = False
        if not self.live:
            self.tick()
            if self.background:
                self._thread = threading.Thread(target=self._run, name=f"activity: {self.what}", daemon=True)
                self._thread.start()
        return self

    def __exit__(
        self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._live is not None:
            self._live.stop()
            self._live = None
        with self._lock:
            if self._printed is not None:
                how = (
                    "done"
                    if exc_type is None
                    else "interrupted"
                    if issubclass(exc_type, (KeyboardInterrupt, Interrupted))
                    else "failed"
                )
                self._say(f"{self.what}: {how} after {elapsed_text(self.elapsed)}")
                self._printed = None


def activity(what: str, **options: object) -> Activity:
    """``with activity("debootstrap trixie", log=log): ...``: see :class:`Activity`."""
    return Activity(what, **options)  # type: ignore[arg-type]
