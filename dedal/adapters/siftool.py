"""siftool (sylabs/sif, the library ``apptainer sif`` is built on): create, list, inspect, dump.

dedal writes its SIFs itself (``dedal.model.sif.write_sif``) because siftool cannot set the
header and descriptor times, which reproducible images need. siftool is the independent
check of that writer (tests compare ``siftool list/header/info/dump`` with
``dedal.model.sif.read_sif``), and ``create`` builds a SIF of the same Apptainer layout with
siftool alone (``siftool new`` + ``siftool add`` per object + the launch script).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

from dedal.adapters import proc
from dedal.errors import ToolMissing
from dedal.model.artifacts import atomic_path

HINT = "run ./setup.sh (go install github.com/sylabs/sif/v2/cmd/siftool@v2.24.2)"
LAUNCH_SCRIPT = b"#!/usr/bin/env run-singularity\n"
_ARCH_NUM = {
    "386": 1,
    "amd64": 2,
    "arm": 3,
    "arm64": 4,
    "ppc64": 5,
    "ppc64le": 6,
    "mips": 7,
    "mipsle": 8,
    "mips64": 9,
    "mips64le": 10,
    "s390x": 11,
    "riscv64": 12,
}


def executable() -> str:
    """siftool on PATH, else where ./setup.sh puts it (``$DEDAL_CACHE_DIR`` or ~/.cache/dedal/bin)."""
    try:
        return proc.which("siftool", HINT)
    except ToolMissing:
        cache = Path(os.environ.get("DEDAL_CACHE_DIR") or Path.home() / ".cache" / "dedal")
        cand = cache / "bin" / "siftool"
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
        raise


def available() -> bool:
    try:
        executable()
        return True
    except ToolMissing:
        return False


def _run(*args: str, log: Optional[Path] = None) -> str:
    return proc.run([executable(), *args], what=f"siftool {args[0]}", log=log).stdout


_LIST_ROW = re.compile(
    r"^(?P<id>\d+)\s+\|(?P<group>\S+)\s+\|(?P<link>\S+(?: \(G\))?)\s+\|(?P<start>\d+)-(?P<end>\d+)\s+\|(?P<type>.+)$"
)


def list_objects(sif: Path) -> List[Dict[str, str]]:
    """Rows of ``siftool list``: id, group, link, start, end, type (e.g. ``FS (Squashfs/*System/amd64)``)."""
    rows = []
    for line in _run("list", os.fspath(sif)).splitlines():
        m = _LIST_ROW.match(line.strip())
        if m:
            rows.append({k: v.strip() for k, v in m.groupdict().items()})
    return rows


def _fields(text: str) -> Dict[str, str]:
    result = {}
    for line in text.splitlines():
        if ":" in line:
            key, value = line.split(":", 1)
            result[key.strip()] = value.strip()
    return result


def header(sif: Path) -> Dict[str, str]:
    """``siftool header`` as a dict (Launch Script, Version, Primary Architecture, ID, ...)."""
    return _fields(_run("header", os.fspath(sif)))


def info(sif: Path, object_id: int) -> Dict[str, str]:
    """``siftool info ID`` as a dict (Data Type, Offset, Size, Name, Partition Type, ...)."""
    return _fields(_run("info", str(object_id), os.fspath(sif)))


def dump(sif: Path, object_id: int) -> bytes:
    """The bytes of one object, as ``siftool dump`` writes them."""
    with tempfile.TemporaryFile() as tmp:
        proc.run([executable(), "dump", str(object_id), os.fspath(sif)], what="siftool dump", stdout=tmp)
        tmp.seek(0)
        return tmp.read()


def create(
    out: Path,
    squashfs: Path,
    *,
    definition: Path,
    metadata: Path,
    labels: Optional[Path] = None,
    sbom: Optional[Path] = None,
    arch: str = "amd64",
    log: Optional[Path] = None,
) -> None:
    """Build a SIF with siftool alone, in the order ``apptainer build`` uses (not reproducible:
    siftool stamps the current time and a random ID). Written to a temporary name, then renamed."""
    with atomic_path(Path(out)) as tmp:

        def add(path: Path, datatype: int, *options: str) -> None:
            """``siftool add`` of one object of ``datatype`` to the new SIF, in the one object group."""
            _run(
                "add", os.fspath(tmp), os.fspath(path), "--datatype", str(datatype), "--groupid", "1", *options, log=log
            )

        _run("new", os.fspath(tmp), log=log)
        add(definition, 1)
        add(metadata, 6, "--filename", "inspect-metadata.json")
        if labels is not None:
            add(labels, 3, "--filename", "labels.json")
        if sbom is not None:
            add(sbom, 9, "--sbomformat", "cyclonedx-json", "--filename", "sbom.cdx.json")
        add(squashfs, 4, "--parttype", "2", "--partfs", "1", "--partarch", str(_ARCH_NUM[arch]))
        with open(tmp, "r+b") as fh:  # siftool has no option for the launch script
            fh.write(LAUNCH_SCRIPT)
