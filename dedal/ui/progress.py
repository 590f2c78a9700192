"""Live progress of long work: per-package status, counts, elapsed time.

On a terminal a rich Live panel; elsewhere (CI logs, pipes) one plain line per event,
so logs stay readable. ``quiet`` (e.g. with --json) prints nothing.
"""
from __future__ import annotations

import sys
import time
from typing import Dict, List, Optional

from rich.live import Live
from rich.table import Table
from rich.text import Text

from dedal.ui.console import err, human_seconds


class BuildProgress:
    def __init__(self, total: int, title: str = "build", quiet: bool = False, live: Optional[bool] = None) -> None:
        self.total = total
        self.title = title
        self.quiet = quiet
        self.start = time.monotonic()
        self.done = 0
        self.failed = 0
        self.skipped = 0
        self.running: Dict[str, float] = {}
        self.lines: List[str] = []
        use_live = sys.stderr.isatty() if live is None else live
        self._live = Live(self._render(), console=err, refresh_per_second=4, transient=True) if use_live and not quiet else None

    def __enter__(self) -> "BuildProgress":
        if self._live:
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live:
            self._live.__exit__(None, None, None)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def _render(self) -> Table:
        table = Table.grid(padding=(0, 1))
        remaining = self.total - self.done - self.failed - self.skipped - len(self.running)
        table.add_row(Text(f"{self.title}: {self.done}/{self.total} done, {len(self.running)} running, "
                           f"{self.failed} failed, {self.skipped} blocked, {remaining} waiting "
                           f"[{human_seconds(self.elapsed)}]", style="bold"))
        for name, since in sorted(self.running.items()):
            table.add_row(f"  building {name} ({human_seconds(time.monotonic() - since)})")
        for line in self.lines[-6:]:
            table.add_row(line)
        return table

    def _emit(self, line: str) -> None:
        if self.quiet:
            return
        if self._live:
            self.lines.append(line)
            self._live.update(self._render())
            err.print(line)
        else:
            err.print(f"[{human_seconds(self.elapsed):>7}] {line}")

    def started(self, name: str, where: str = "") -> None:
        self.running[name] = time.monotonic()
        self._emit(f"start   {name}{' on ' + where if where else ''}")

    def finished(self, name: str, status: str, seconds: float = 0.0, detail: str = "") -> None:
        self.running.pop(name, None)
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
        if self._live:
            self._live.update(self._render())
