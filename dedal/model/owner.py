"""Which dedal process owns something (a stage, the jobs of a Slurm build), and whether
that process is gone.

A pid alone says little: pids are reused, and mean nothing on another host, after a
reboot or in another PID namespace. So an owner is recorded as host, boot id, PID
namespace, pid and the pid's start time, and judged only where those make sense.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Optional

ALIVE, GONE, UNKNOWN = "alive", "gone", "unknown"


def process_start(pid: int) -> Optional[int]:
    """When process ``pid`` started (clock ticks after boot, field 22 of /proc/PID/stat),
    None when there is no such process or it has exited: a zombie keeps its /proc entry
    until reaped, and a PID 1 that reaps late (some container and VM inits) kept a
    SIGKILLed node build's stage looking owned."""
    try:
        fields = Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


@dataclass(frozen=True)
class Owner:
    host: str
    boot: str
    pidns: str
    pid: int
    start: Optional[int]

    @classmethod
    def me(cls) -> "Owner":
        pid = os.getpid()
        return cls(socket.gethostname(), boot_id(), pid_namespace(), pid, process_start(pid))

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping) -> "Owner":
        """Raises KeyError, TypeError or ValueError for a record that is not one."""
        start = data["start"]
        return cls(
            str(data["host"]),
            str(data["boot"]),
            str(data.get("pidns", "")),
            int(data["pid"]),
            None if start is None else int(start),
        )

    def state(self) -> str:
        """ALIVE or GONE where this host can tell (same host; same PID namespace unless
        rebooted since), else UNKNOWN."""
        if self.host != socket.gethostname():
            return UNKNOWN
        if self.boot != boot_id():  # recorded before a reboot: its process is gone
            return GONE
        if self.pidns != pid_namespace():  # its pid means nothing here
            return UNKNOWN
        return ALIVE if process_start(self.pid) == self.start else GONE


def owner_tag() -> str:
    """This process as part of a file name (``host~boot id~pid namespace~pid~start``), so
    that a temporary file says whose it is: :func:`tag_state` judges it later."""
    me = Owner.me()
    ns = "".join(c for c in me.pidns if c.isdigit())
    return f"{me.host}~{me.boot}~{ns}~{me.pid}~{me.start}"


def tag_state(name: str, prefix: str = "") -> str:
    """ALIVE, GONE or UNKNOWN for the owner a file name records: the :func:`owner_tag`
    right after ``prefix`` (UNKNOWN for names without one, and where this host cannot tell)."""
    if not name.startswith(prefix):
        return UNKNOWN
    parts = name[len(prefix) :].split("~")
    if len(parts) < 5:
        return UNKNOWN
    host, boot, ns, pid, start = parts[:5]
    start = re.match(r"(None|\d*)", start).group(1)  # type: ignore[union-attr]  # a suffix may follow
    try:
        owner = Owner(host, boot, f"pid:[{ns}]" if ns else "", int(pid), None if start == "None" else int(start))
    except ValueError:
        return UNKNOWN
    return owner.state()
