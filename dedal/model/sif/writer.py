"""Writing a SIF the way ``apptainer build`` does, deterministically (:func:`write_sif`):
the image ID is derived from the content and the times come from ``SOURCE_DATE_EPOCH``
(else the sif library's "zero" time), so the same inputs give the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from dedal.errors import UserError
from dedal.model.artifacts import sha256_file, temp_path
from dedal.model.sif.layout import (
    ARCH_CODES,
    DATA_DEFFILE,
    DATA_GENERIC_JSON,
    DATA_LABELS,
    DATA_PARTITION,
    DATA_SBOM,
    DEFAULT_GROUP,
    DESCRIPTOR,
    DESCRIPTORS_OFFSET,
    DESCRIPTOR_CAPACITY,
    FS_SQUASH,
    GO_ZERO_TIME,
    GROUP_MASK,
    HEADER,
    LAUNCH_SCRIPT,
    MAGIC,
    PARTITION_ALIGNMENT,
    PARTITION_EXTRA,
    PART_PRIMSYS,
    SBOM_CYCLONEDX_JSON,
    SBOM_EXTRA,
    SifInfo,
    VERSION,
    host_arch,
)
from dedal.model.sif.reader import read_sif


@dataclass
class _Object:
    datatype: int
    data: Optional[bytes] = None  # small objects
    path: Optional[Path] = None  # large ones (the squashfs), copied from a file
    name: str = ""
    extra: bytes = b""
    alignment: int = 0
    skip: int = 0  # in place: the object starts this far into ``path``

    @property
    def size(self) -> int:
        return len(self.data) if self.data is not None else self.path.stat().st_size - self.skip  # type: ignore[union-attr]


def _aligned(offset: int, alignment: int) -> int:
    if alignment <= 0 or offset % alignment == 0:
        return offset
    return offset + alignment - offset % alignment


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, indent=2, sort_keys=True).encode("utf-8") + b"\n"


def sif_time(created: Optional[int] = None) -> int:
    """Header/descriptor time: ``created``, else ``SOURCE_DATE_EPOCH``, else the sif library's
    deterministic zero time (which siftool shows as no time at all)."""
    if created is not None:
        return int(created)
    sde = source_date_epoch()
    return GO_ZERO_TIME if sde is None else sde


def source_date_epoch() -> Optional[int]:
    """``SOURCE_DATE_EPOCH`` (reproducible builds' fixed time), None when unset."""
    sde = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not sde:
        return None
    try:
        return int(sde)
    except ValueError:
        raise UserError(f"SOURCE_DATE_EPOCH: expected seconds since 1970, got {sde!r}") from None


def _copy_into(dst, src: Path) -> int:
    total = 0
    with open(src, "rb") as sf:
        while True:
            chunk = sf.read(8 << 20)
            if not chunk:
                break
            dst.write(chunk)
            total += len(chunk)
    return total


def write_sif(
    out: Union[str, os.PathLike],
    squashfs: Union[str, os.PathLike],
    *,
    definition: str,
    labels: Dict[str, Any],
    metadata: Dict[str, Any],
    sbom: Optional[bytes] = None,
    arch: Optional[str] = None,
    created: Optional[int] = None,
    image_id: Optional[str] = None,
    extra_json: Sequence[Tuple[str, Any]] = (),
    in_place: bool = False,
) -> SifInfo:
    """Write ``out`` with the layout ``apptainer build`` produces, all objects in group 1:

    1. Def.FILE (``definition``), 2. JSON.Generic ``inspect-metadata.json`` (``metadata``)
    and any ``extra_json`` (name, object) in name order, 3. JSON.Labels ``labels.json``,
    4. SBOM (CycloneDX JSON) ``sbom.cdx.json`` when given, 5. the primary system partition
    (squashfs, ``arch`` default the host's) aligned to 4096 bytes.

    Written to a temporary name (:func:`dedal.model.artifacts.temp_path`) then renamed. Deterministic: same inputs, same bytes.

    ``in_place``: ``squashfs`` is a file that already holds the squashfs at the offset
    ``partition_offset`` gives for these objects (``mksquashfs -offset``); the header and
    the small objects are written into its first bytes and it is renamed to ``out``,
    without copying the partition.
    """
    out = Path(out)
    sq = Path(squashfs)
    if not sq.is_file():
        raise UserError(f"{sq}: squashfs image not found")
    start_at = (
        partition_offset(definition=definition, labels=labels, metadata=metadata, sbom=sbom, extra_json=extra_json)
        if in_place
        else 0
    )
    with open(sq, "rb") as fh:
        fh.seek(start_at)
        if fh.read(4) != b"hsqs":
            raise UserError(f"{sq}: not a squashfs image (no hsqs magic at offset {start_at})")
    arch = arch or host_arch()
    if arch not in ARCH_CODES:
        raise UserError(f"unknown SIF architecture {arch!r} (known: {', '.join(sorted(ARCH_CODES))})")
    t = sif_time(created)

    objects: List[_Object] = [_Object(DATA_DEFFILE, definition.encode("utf-8"))]
    jsons = sorted([("inspect-metadata.json", metadata), *extra_json], key=lambda kv: kv[0])
    for name, obj in jsons:
        objects.append(_Object(DATA_GENERIC_JSON, _json_bytes(obj), name=name))
    objects.append(_Object(DATA_LABELS, _json_bytes(labels), name="labels.json"))
    if sbom is not None:
        objects.append(
            _Object(DATA_SBOM, bytes(sbom), name="sbom.cdx.json", extra=SBOM_EXTRA.pack(SBOM_CYCLONEDX_JSON))
        )
    code = ARCH_CODES[arch].encode() + b"\x00"
    objects.append(
        _Object(
            DATA_PARTITION,
            path=sq,
            alignment=PARTITION_ALIGNMENT,
            extra=PARTITION_EXTRA.pack(FS_SQUASH, PART_PRIMSYS, code),
            skip=start_at,
        )
    )
    if len(objects) > DESCRIPTOR_CAPACITY:
        raise UserError(f"too many SIF objects ({len(objects)} > {DESCRIPTOR_CAPACITY})")

    if image_id is None:
        h = hashlib.sha256()
        for o in objects:
            h.update(struct.pack("<iq", o.datatype, o.size) + o.name.encode() + o.extra)
            h.update(
                hashlib.sha256(o.data).digest()
                if o.data is not None
                else bytes.fromhex(sha256_file(o.path, start=o.skip, chunk=8 << 20))
            )  # type: ignore[arg-type]
        h.update(struct.pack("<q", t))
        ident = uuid.UUID(bytes=h.digest()[:16], version=4)
    else:
        ident = uuid.UUID(image_id)

    data_offset = DESCRIPTORS_OFFSET + DESCRIPTOR_CAPACITY * DESCRIPTOR.size
    tmp = sq if in_place else temp_path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    table = bytearray(DESCRIPTOR_CAPACITY * DESCRIPTOR.size)
    try:
        with open(tmp, "r+b" if in_place else "wb") as fh:
            end = data_offset
            fh.seek(data_offset)
            for i, o in enumerate(objects):
                start = _aligned(end, o.alignment)
                if start > end:
                    fh.write(b"\x00" * (start - end))
                if o.data is not None:
                    fh.write(o.data)
                    n = len(o.data)
                elif in_place:  # already there (partition_offset computed the same layout)
                    assert start == start_at, (start, start_at)
                    n = o.size
                    fh.seek(start + n)
                else:
                    n = _copy_into(fh, o.path)  # type: ignore[arg-type]
                DESCRIPTOR.pack_into(
                    table,
                    i * DESCRIPTOR.size,
                    o.datatype,
                    True,
                    i + 1,
                    DEFAULT_GROUP | GROUP_MASK,
                    0,
                    start,
                    n,
                    start - end + n,
                    t,
                    t,
                    0,
                    0,
                    o.name.encode("utf-8")[:128],
                    o.extra,
                )
                end = start + n
            fh.seek(0)
            fh.write(
                HEADER.pack(
                    LAUNCH_SCRIPT.encode(),
                    MAGIC,
                    VERSION,
                    code,
                    ident.bytes,
                    t,
                    t,
                    DESCRIPTOR_CAPACITY - len(objects),
                    DESCRIPTOR_CAPACITY,
                    DESCRIPTORS_OFFSET,
                    DESCRIPTOR_CAPACITY * DESCRIPTOR.size,
                    data_offset,
                    end - data_offset,
                )
            )
            fh.write(b"\x00" * (DESCRIPTORS_OFFSET - HEADER.size))
            fh.write(table)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o755)  # a SIF is executable (launch script), like apptainer build's output
        os.replace(tmp, out)
    except BaseException:
        try:
            if not in_place:  # the caller's file stays the caller's
                tmp.unlink()
        except FileNotFoundError:
            pass
        raise
    return read_sif(out)


def partition_offset(
    *,
    definition: str,
    labels: Dict[str, Any],
    metadata: Dict[str, Any],
    sbom: Optional[bytes] = None,
    extra_json: Sequence[Tuple[str, Any]] = (),
) -> int:
    """Where ``write_sif`` puts the primary partition for these objects (for ``in_place``)."""
    end = DESCRIPTORS_OFFSET + DESCRIPTOR_CAPACITY * DESCRIPTOR.size + len(definition.encode("utf-8"))
    for _name, obj in [("inspect-metadata.json", metadata), *extra_json]:
        end += len(_json_bytes(obj))
    end += len(_json_bytes(labels)) + (len(sbom) if sbom is not None else 0)
    return _aligned(end, PARTITION_ALIGNMENT)
