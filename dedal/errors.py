"""Errors that the CLI turns into one clear line and a non-zero exit code.

Every failure of an external tool carries the command, its exit code and the log
path, so that a user (or CI) can go straight to the evidence.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
from pathlib import Path
from typing import Iterator, Optional, Sequence


class DedalError(Exception):
    """Base class: a failure dedal explains itself."""

    exit_code = 1

    def one_line(self) -> str:
        """The message on one line: every line break joined (\\n, \\r, and those a file name
        or value from the input may hold, such as U+0085 or U+2028)."""
        return " ".join(part.strip() for part in str(self).splitlines() if part.strip())


class UserError(DedalError):
    """Bad input (file, option, configuration): exit code 2, nothing written."""

    exit_code = 2


class NoSpace(DedalError):
    """Too little free disk where dedal is about to write a large tree: said before the write
    starts, not as a tool's "No space left on device" halfway through it."""


class ToolMissing(DedalError):
    """An external program dedal needs is not installed."""

    def __init__(self, tool: str, hint: str = "") -> None:
        self.tool = tool
        self.hint = hint
        msg = f"{tool}: not found on PATH"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)


class ToolError(DedalError):
    """An external command failed.

    ``output`` is what the command printed (its part of the log), kept out of the
    message, so that an adapter can find the tool's own error lines in it; ``quote`` is
    those lines: the message then leads with them, followed by the log path."""

    def __init__(
        self,
        what: str,
        cmd: Sequence[str],
        returncode: int,
        log_path: Optional[Path] = None,
        detail: str = "",
        *,
        output: str = "",
        quote: Sequence[str] = (),
    ) -> None:
        self.what = what
        self.cmd = list(cmd)
        self.returncode = returncode
        self.log_path = Path(log_path) if log_path else None
        self.detail = detail
        self.output = output
        self.quote = list(quote)
        super().__init__(self._format())

    def _format(self) -> str:
        ran = f"command `{shlex.join(self.cmd)}` exited with code {self.returncode}"
        if self.quote:
            msg = f"{self.what}: " + " | ".join(self.quote)
            if self.log_path:
                msg += f"; log: {self.log_path}"
            return msg + f" ({ran})"
        msg = f"{self.what}: {ran}"
        if self.log_path:
            msg += f"; log: {self.log_path}"
        if self.detail:
            msg += f"; {self.detail}"
        return msg


class BuildError(DedalError):
    """A package build failed; names the package besides the tool error."""

    def __init__(self, package: str, cause: DedalError) -> None:
        self.package = package
        self.cause = cause
        super().__init__(f"building {package} failed: {cause.one_line()}")


class Interrupted(DedalError):
    """A stage stopped by SIGTERM/SIGINT/SIGHUP (scancel, Ctrl-C, a closed terminal). Not a
    failure of dedal's or of the input: the CLI says so without "error", and exits as a
    shell reports a process that signal ended (128 + its number: 130 for Ctrl-C, 143 for
    scancel), so that a script or CI job tells a stop from a failure."""

    def __init__(self, message: str, signum: int = signal.SIGTERM) -> None:
        super().__init__(message)
        self.signum = int(signum)
        self.exit_code = 128 + self.signum

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @classmethod
    def by(cls, signum: int, what: str = "") -> "Interrupted":
        """The one wording of every stop: "verify interrupted by signal SIGINT"."""
        return cls(f"{what + ' ' if what else ''}interrupted by signal {signal.Signals(signum).name}", signum)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Signals:
    """SIGTERM/SIGINT/SIGHUP become :class:`Interrupted` inside the ``with`` block, so that
    stages and temporary files are removed and children killed on the way out (Slurm's
    scancel sends SIGTERM). Only the first one: a second signal (a parent's death signal
    after scancel's, a second Ctrl-C) would otherwise break off that clean-up halfway.
    Inside :func:`signals_held` the first one waits for the held step's end. A signal that
    whoever started dedal set to be ignored stays ignored: ``nohup`` ignores SIGHUP so that
    a build outlives the login session, a shell without job control ignores SIGINT in its
    background jobs so that a Ctrl-C meant for the foreground does not reach them."""

    held = 0  # depth of signals_held() blocks in this process
    deferred: Optional[Interrupted] = None  # a stop signal that came inside one, raised at its end

    def __init__(self, what: str = "") -> None:
        self.what = what
        self.old: dict = {}
        self.received = ""

    def __enter__(self) -> "Signals":
        for sig in STOP_SIGNALS:
            try:
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self.old[sig] = signal.signal(sig, self._raise)
            except ValueError:  # not the main thread
                pass
        return self

    def _raise(self, signum: int, frame: object) -> None:
        if self.received:
            return
        self.received = signal.Signals(signum).name
        stop = Interrupted.by(signum, self.what)
        if Signals.held:  # delivered to another thread while the main thread held it
            Signals.deferred = stop
            return
        raise stop

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.old.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGTERM/SIGINT/SIGHUP wait until the block is done, then act (inside a
    :class:`Signals` block: :class:`Interrupted` where the block ends). For steps that
    must not stop halfway: making a directory and writing its owner record, removing a
    stage. The signal mask holds them off the main thread; one that another thread takes
    meanwhile reaches :class:`Signals` as Python's handlers do, in the main thread, which
    keeps it for the block's end."""
    # counted held before the mask: Python runs a handler between two bytecodes, so one that
    # arrived just before the mask call runs right after it and must keep its signal too
    Signals.held += 1
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)  # one held by the mask is handled from here
    finally:
        Signals.held -= 1
        if not Signals.held and Signals.deferred is not None:
            stop, Signals.deferred = Signals.deferred, None
            raise stop
