"""What is mounted at or below a directory, as the kernel lists it (/proc/self/mountinfo).

Read before a directory of dedal's own is removed: files removed through a mount would reach
outside it, and a mount left behind keeps its directory (and, for a stage in /dev/shm, the
node's memory). A FUSE mount whose daemon died is listed here although ``os.path.ismount``
cannot stat it ("Transport endpoint is not connected").
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import List, NamedTuple, Union


class Mount(NamedTuple):
    point: str
    fstype: str  # "squashfs", "overlay", "fuse.squashfuse", "fuse.fuse-overlayfs" ...


def mounted_under(path: Union[str, Path]) -> List[Mount]:
    """The mounts at or below ``path``, deepest first (octal escapes of their points decoded);
    none where /proc cannot be read."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    top = os.path.realpath(path)
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) > 4 and " - " in line:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            fstype = line.split(" - ", 1)[1].split()[0]
            if point == top or point.startswith(top + "/"):
                found.append(Mount(point, fstype))
    return sorted(found, key=lambda m: -len(m.point))
