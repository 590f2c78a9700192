"""Line handling shared by the parsers: normalisation, numbers, evidence collection."""

from __future__ import annotations

import re
from typing import Iterable, List, Optional, Union

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# "[1725158980.057833] [host:154756:0]" (UCX), "[host:1234] " (Open MPI), "  7: " (srun -l)
_SRUN_LABEL = re.compile(r"^\s{0,3}\d{1,6}: ")
# prefixes a launcher or a log collector puts before each line of a program's output:
# mpirun --tag-output ("[1,0]<stdout>:", "[1,mpirank:0,algo-1]<stderr>:"), a CI's or log
# service's time stamp ("2019-12-01T22:04:48.1127607Z ")
_LINE_PREFIXES = (
    re.compile(r"^\[\d+,[^\]<>]*\d+[^\]<>]*\]<(?:stdout|stderr)>:"),
    re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z "),
)


def clean_lines(text: Union[str, bytes]) -> List[str]:
    """Split ``text`` into lines the parsers can trust.

    - bytes are decoded as UTF-8 with replacement (logs are not always clean);
    - CRLF / CR line ends, ANSI colour codes, NUL bytes and trailing blanks are removed;
    - lines starting with ``#@ `` (provenance notes of the test data) are dropped;
    - when most lines carry an ``srun -l`` task label (``0: ``), an ``mpirun --tag-output`` label
      (``[1,0]<stdout>:``) or a time stamp (``2019-12-01T22:04:48.1127607Z ``), these are removed.
    Tabs are kept (``srun --mpi=list`` indents with them); parsers split on any blank.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    out = []
    for raw in text.split("\n"):
        line = _ANSI.sub("", raw).rstrip()
        if line.startswith("#@ ") or line == "#@":
            continue
        out.append(line)
    while out and not out[-1]:
        out.pop()
    labelled = sum(1 for ln in out if _SRUN_LABEL.match(ln))
    if labelled and labelled * 2 >= sum(1 for ln in out if ln.strip()):
        out = [strip_srun_label(ln) for ln in out]  # `srun -l` output: every line starts with "<task>: "
    for prefix in _LINE_PREFIXES:  # the same for mpirun --tag-output and time-stamped logs
        tagged = sum(1 for ln in out if prefix.match(ln))
        if tagged and tagged * 2 >= sum(1 for ln in out if ln.strip()):
            out = [prefix.sub("", ln, count=1) for ln in out]
    return out


def strip_srun_label(line: str) -> str:
    """``srun -l`` prefixes every line with ``<task>: ``; drop it."""
    return _SRUN_LABEL.sub("", line, count=1)


_NUM = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")


def is_number(tok: str) -> bool:
    return bool(_NUM.match(tok))


def to_number(tok: str) -> Optional[Union[int, float]]:
    """``"12"`` -> 12, ``"1.5"`` -> 1.5, ``"0e+00"`` -> 0.0, anything else -> None."""
    if not _NUM.match(tok):
        return None
    if re.match(r"^[-+]?\d+$", tok):
        return int(tok)
    return float(tok)


def first_lines(lines: Iterable[str], pattern: "re.Pattern[str]", limit: int = 5) -> List[str]:
    """The first ``limit`` lines matching ``pattern`` (evidence for a finding)."""
    found = []
    for line in lines:
        if pattern.search(line):
            found.append(line.strip())
            if len(found) >= limit:
                break
    return found


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


_RANK_LINE = re.compile(r"^#@ dedal-rank: host=(\S*) boot_id=(\S*) cpus=(\d*)(?: node=\S*)?(?: step=\S*)?\s*$")


def rank_machines(text: Union[str, bytes]) -> List[dict]:
    """The ``#@ dedal-rank:`` lines that dedal's rank script writes for every rank of an
    ``srun`` step: ``{host, boot_id, cpus}`` each (the kernel's boot id tells machines
    apart where node names do not: nodes in network namespaces of one host)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    out = []
    for line in text.splitlines():
        m = _RANK_LINE.match(strip_srun_label(line.rstrip("\r")))
        if m:
            out.append({"host": m.group(1), "boot_id": m.group(2), "cpus": int(m.group(3)) if m.group(3) else None})
    return out


_CONTAINER_LINE = re.compile(r"^#@ dedal-container: host=(\S*) mntns=(\S*) imagedev=(\S*)\s*$")


def rank_containers(text: Union[str, bytes]) -> List[dict]:
    """The ``#@ dedal-container:`` lines each rank of an ``srun`` step writes from inside its
    container: ``{host, mntns, imagedev}`` (its mount namespace, and the device of the mount
    of the image it reads): how many containers and image mounts the ranks of a node had."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    out = []
    for line in text.splitlines():
        m = _CONTAINER_LINE.match(strip_srun_label(line.rstrip("\r")))
        if m:
            out.append({"host": m.group(1), "mntns": m.group(2), "imagedev": m.group(3)})
    return out
