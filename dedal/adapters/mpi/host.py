"""Facts of the host's own MPI installation: its ``mpirun`` and the programs on its PATH, for
the "native" side of a verification that runs on the host's stack.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Dict, Optional, Sequence

from dedal.adapters import proc
from dedal.errors import ToolMissing


def host_mpirun() -> Optional[Dict[str, str]]:
    """The host's ``mpirun`` (path and ``--version`` line), or None when there is none."""
    try:
        path = proc.which("mpirun")
    except ToolMissing:
        return None
    res = proc.run([path, "--version"], what="mpirun --version", check=False, timeout=30)
    text = (res.stdout + res.stderr).strip()
    first = text.splitlines()[0] if text else ""
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", first)
    return {
        "path": path,
        "version_line": first,
        "version": m.group(1) if m else "",
        "open_mpi": "Open MPI" in text or "OpenRTE" in text or "PRRTE" in text,
    }


def host_which(name: str) -> Optional[str]:
    """A program on the host's PATH (e.g. the benchmarks of a host installation)."""
    try:
        return proc.which(name)
    except ToolMissing:
        return None


def shell_join(cmd: Sequence[str]) -> str:
    return shlex.join([os.fspath(c) for c in cmd])
