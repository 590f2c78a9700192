"""Errors that the CLI turns into one clear line and a non-zero exit code.

Every failure of an external tool carries the command, its exit code and the log
path, so that a user (or CI) can go straight to the evidence.
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional, Sequence


class DedalError(Exception):
    """Base class: a failure dedal explains itself."""

    exit_code = 1

    def one_line(self) -> str:
        return str(self).replace("\n", " ").strip()


class UserError(DedalError):
    """Bad input (file, option, configuration): exit code 2, nothing written."""

    exit_code = 2


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
    """An external command failed."""

    def __init__(
        self,
        what: str,
        cmd: Sequence[str],
        returncode: int,
        log_path: Optional[Path] = None,
        detail: str = "",
    ) -> None:
        self.what = what
        self.cmd = list(cmd)
        self.returncode = returncode
        self.log_path = Path(log_path) if log_path else None
        self.detail = detail
        super().__init__(self._format())

    def _format(self) -> str:
        msg = f"{self.what}: command `{shlex.join(self.cmd)}` exited with code {self.returncode}"
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
