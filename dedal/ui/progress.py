"""Live progress of long work: build jobs by state, byte counts of packing and transfers.

On a terminal a rich live display: the build's packages by state (running ones with their
time and estimate, the counts, an ETA from the plan's or the schedule's estimates) and a
bar per byte count (mksquashfs reading its input, a registry upload or download).
Elsewhere (CI logs, pipes, ``CI=true``) one plain timestamped line per event, so logs
stay readable; byte counts print nothing there (the callers' own lines say what moves).
``quiet`` (e.g. with --json) prints nothing.

Byte counts: a command opens :class:`Transfers` around its work; adapters ask
:func:`meter` for a counter, which is a no-op when no display is open, so that no stage
has to pass a display down.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Callable, Dict, IO, Iterator, List, Optional

from rich.console import Console, Group
from rich.errors import LiveError
from rich.live import Live
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text

from dedal.ui.console import err, human_seconds


def live_terminal(stream: Optional[IO] = None) -> bool:
    """Whether live displays suit ``stream`` (default stderr): a terminal, not a CI job
    (``CI`` set to anything but false/0/no: GitLab, GitHub, Jenkins set it) and not a
    dumb terminal."""
    stream = stream if stream is not None else sys.stderr
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    ci = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
    return tty and not ci and os.environ.get("TERM", "") != "dumb"


class BuildProgress:
    """Progress of a build: ``started``/``finished`` per package, ``note`` for other events.

    ``estimates`` (package label -> seconds) put each running package's estimate next to
    its time; ``eta`` (set by the executor: a function of nothing returning seconds or
    None) gives the ETA the header shows."""

    def __init__(
        self,
        total: int,
        title: str = "build",
        quiet: bool = False,
        live: Optional[bool] = None,
        console: Optional[Console] = None,
    ) -> None:
        self.total = total
        self.title = title
        self.quiet = quiet
        self.console = console or err
        self.start = time.monotonic()
        self.done = 0
        self.failed = 0
        self.skipped = 0
        self.running: Dict[str, float] = {}
        self.where: Dict[str, str] = {}
        self.estimates: Dict[str, float] = {}
        self.eta: Optional[Callable[[], Optional[float]]] = None
        self.lines: List[str] = []
        use_live = live_terminal(self.console.file) if live is None else live
        self._live = (
            Live(
                self._render(), console=self.console, refresh_per_second=4, transient=True, get_renderable=self._render
            )
            if use_live and not quiet
            else None
        )
        self._active = False

    def __enter__(self) -> "BuildProgress":
        if self._live:
            try:
                self._live.__enter__()
                self._active = True
            except LiveError:  # another live display is on: plain lines then
                self._live = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live and self._active:
            self._live.__exit__(None, None, None)
            self._active = False

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def eta_s(self) -> Optional[float]:
        if self.eta is None:
            return None
        try:
            value = self.eta()
        except Exception:  # noqa: BLE001 - an estimate must never stop a build
            return None
        return None if value is None else max(0.0, float(value))

    def _render(self) -> Table:
        table = Table.grid(padding=(0, 1))
        waiting = self.total - self.done - self.failed - self.skipped - len(self.running)
        head = (
            f"{self.title}: {self.done}/{self.total} done, {len(self.running)} running, {max(0, waiting)} queued, "
            f"{self.failed} failed, {self.skipped} blocked  [{human_seconds(self.elapsed)}"
        )
        eta = self.eta_s()
        head += f", ETA {human_seconds(eta)}]" if eta is not None and (self.running or waiting > 0) else "]"
        table.add_row(Text(head, style="bold"))
        now = time.monotonic()
        for name, since in sorted(self.running.items(), key=lambda kv: kv[1]):
            took = human_seconds(now - since)
            est = self.estimates.get(name)
            row = Text("  running ", style="cyan")
            row.append(f"{name}  {took}" + (f" / ~{human_seconds(est)}" if est else ""))
            if self.where.get(name):
                row.append(f"  on {self.where[name]}", style="dim")
            table.add_row(row)
        for line in self.lines[-6:]:
            table.add_row(Text(line, style="dim"))
        return table

    def _emit(self, line: str) -> None:
        if self.quiet:
            return
        if self._live and self._active:
            self.lines.append(line)
            self._live.console.print(line, markup=False, highlight=False)
        else:
            self.console.print(
                f"[{human_seconds(self.elapsed):>7}] {line}", markup=False, highlight=False, soft_wrap=True
            )

    def started(self, name: str, where: str = "") -> None:
        self.running[name] = time.monotonic()
        if where:
            self.where[name] = where
        self._emit(f"start   {name}{' on ' + where if where else ''}")

    def finished(self, name: str, status: str, seconds: float = 0.0, detail: str = "") -> None:
        self.running.pop(name, None)
        self.where.pop(name, None)
        if status in ("built", "present", "ok"):
            self.done += 1
        elif status == "failed":
            self.failed += 1
        else:
            self.skipped += 1
        counter = f"[{self.done + self.failed + self.skipped}/{self.total}]"
        msg = f"{status:7} {name} {counter}" + (f" {human_seconds(seconds)}" if seconds else "")
        if detail:
            msg += f": {detail}"
        self._emit(msg)

    def note(self, line: str) -> None:
        self._emit(line)

    def refresh(self) -> None:
        if self._live and self._active:
            self._live.refresh()


class Meter:
    """One byte count on the display: ``update`` to a total so far, or ``advance`` by some."""

    def __init__(self, progress: Optional[Progress] = None, task: Optional[TaskID] = None) -> None:
        self._progress = progress
        self._task = task

    def update(self, done: int) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=done)

    def advance(self, n: int) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, n)


class Transfers:
    """Byte counts of a command (packing, uploads, downloads) as bars on a terminal.

    The bars' display runs only while a count is open, so that it never overlaps a
    build's live display; where another live display is on, counts are not shown."""

    _open: List["Transfers"] = []

    def __init__(self, quiet: bool = False, live: Optional[bool] = None, console: Optional[Console] = None) -> None:
        self.console = console or err
        self.enabled = not quiet and (live_terminal(self.console.file) if live is None else live)
        self._progress: Optional[Progress] = None
        self._count = 0

    @classmethod
    def showing(cls) -> bool:
        """Whether a count opened now would be shown (the innermost display is live)."""
        return bool(cls._open) and cls._open[-1].enabled

    def __enter__(self) -> "Transfers":
        Transfers._open.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        Transfers._open.remove(self)
        self._stop()

    def _stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    @contextlib.contextmanager
    def meter(self, description: str, total: Optional[int]) -> Iterator[Meter]:
        if not self.enabled:
            yield Meter()
            return
        if self._progress is None:
            progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            try:
                progress.start()
            except LiveError:
                yield Meter()
                return
            self._progress = progress
        task = self._progress.add_task(description, total=total)
        self._count += 1
        try:
            yield Meter(self._progress, task)
        finally:
            self._count -= 1
            if self._progress is not None:
                self._progress.remove_task(task)
                if not self._count:
                    self._stop()

    def renderable(self) -> Group:
        """What the display shows now (for tests)."""
        return Group(*([self._progress] if self._progress is not None else []))


@contextlib.contextmanager
def meter(description: str, total: Optional[int]) -> Iterator[Meter]:
    """A byte count on the innermost open :class:`Transfers` display, or one that shows
    nothing when there is none."""
    if not Transfers._open:
        yield Meter()
        return
    with Transfers._open[-1].meter(description, total) as m:
        yield m
