"""Reading a SIF: its header and descriptors (:func:`read_sif`), its primary partition and
its small objects, each checked against the file (a SIF is input: its descriptors may say
anything).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any, List, Optional, Union

from dedal.errors import UserError
from dedal.model.inputs import open_regular, too_large
from dedal.model.sif.layout import (
    ARCHS,
    DATATYPE_NAMES,
    DATA_PARTITION,
    DATA_SBOM,
    DESCRIPTOR,
    Descriptor,
    FS_NAMES,
    GROUP_MASK,
    HEADER,
    MAGIC,
    PARTITION_EXTRA,
    PART_NAMES,
    SBOM_EXTRA,
    SBOM_FORMATS,
    SifInfo,
    VERSION,
    host_arch,
)


def _cstr(raw: bytes) -> str:
    return raw.split(b"\x00", 1)[0].decode("utf-8", "replace")


def read_sif(path: Union[str, os.PathLike]) -> SifInfo:
    """Parse the header and the used descriptors of a SIF file.

    Raises UserError when the file is missing, is not a SIF, has an unsupported version,
    or is truncated (a descriptor table or an object reaching past the end of the file).
    """
    p = Path(path)
    # missing, a directory, no permission, a FIFO or a device (refused at once, never waited on): one line
    with open_regular(p) as fh:
        size = os.fstat(fh.fileno()).st_size
        head = fh.read(HEADER.size)
        if len(head) < HEADER.size or head[32:42] != MAGIC:
            raise UserError(f"{p}: not a SIF image (no SIF_MAGIC in the header)")
        (launch, _magic, version, arch, ident, created, modified, dfree, dtotal, doff, dsize, dataoff, datasize) = (
            HEADER.unpack(head)
        )
        if version != VERSION:
            raise UserError(f"{p}: unsupported SIF version {_cstr(version)!r} (dedal reads version 01)")
        if dtotal < 0 or doff < HEADER.size or dsize != dtotal * DESCRIPTOR.size:
            raise UserError(f"{p}: corrupt SIF header (descriptor table: {dtotal} at {doff}, {dsize} bytes)")
        if doff + dsize > size:
            raise UserError(
                f"{p}: truncated SIF: the descriptor table ends at byte {doff + dsize}, the file has {size} bytes"
            )
        fh.seek(doff)
        table = fh.read(dsize)
    descriptors: List[Descriptor] = []
    for i in range(dtotal):
        (dt, used, did, gid, lid, off, dsz, dpad, dcr, dmod, _uid, _gid, name, extra) = DESCRIPTOR.unpack_from(
            table, i * DESCRIPTOR.size
        )
        if not used:
            continue
        d = Descriptor(
            id=did,
            datatype=dt,
            datatype_name=DATATYPE_NAMES.get(dt, "Unknown"),
            group=gid & ~GROUP_MASK & 0xFFFFFFFF,
            link=lid & ~GROUP_MASK & 0xFFFFFFFF,
            link_is_group=bool(lid & GROUP_MASK),
            offset=off,
            size=dsz,
            size_with_padding=dpad,
            created=dcr,
            modified=dmod,
            name=_cstr(name),
        )
        if dt == DATA_PARTITION:
            fs, pt, parch = PARTITION_EXTRA.unpack_from(extra)
            d.fstype = FS_NAMES.get(fs, "Unknown")
            d.parttype = PART_NAMES.get(pt, "Unknown")
            d.arch = ARCHS.get(_cstr(parch), "unknown")
        elif dt == DATA_SBOM:
            (fmt,) = SBOM_EXTRA.unpack_from(extra)
            d.sbom_format = SBOM_FORMATS.get(fmt, "unknown")
        if off < 0 or dsz < 0 or off + dsz > size:
            raise UserError(
                f"{p}: truncated SIF: object {did} ({d.type_label}) ends at byte {off + dsz}, the file has {size} bytes"
            )
        descriptors.append(d)
    return SifInfo(
        path=str(p),
        file_size=size,
        launch_script=_cstr(launch),
        version=_cstr(version),
        primary_arch=ARCHS.get(_cstr(arch), "unknown"),
        id=str(uuid.UUID(bytes=ident)),
        created=created,
        modified=modified,
        descriptors_free=dfree,
        descriptors_total=dtotal,
        descriptors_offset=doff,
        descriptors_size=dsize,
        data_offset=dataoff,
        data_size=datasize,
        descriptors=descriptors,
    )


def primary_partition(info: SifInfo) -> Descriptor:
    """The primary system partition (the root filesystem Apptainer runs)."""
    for d in info.descriptors:
        if d.is_primary_partition:
            return d
    raise UserError(f"{info.path}: SIF has no primary system partition (not a container image)")


def check_arch(info: SifInfo, arch: Optional[str] = None) -> None:
    """UserError unless the image's primary architecture is ``arch`` (default: the host's)."""
    want = arch or host_arch()
    if info.primary_arch != want:
        raise UserError(f"{info.path}: SIF image is for {info.primary_arch}, this host is {want}")


OBJECT_LIMIT = 16 << 20  # bytes of a small object read whole (esd-neuro's SBOM, the largest here, has 72 KiB)


def read_object(path: Union[str, os.PathLike], descriptor: Descriptor, limit: int = OBJECT_LIMIT) -> bytes:
    """The bytes of one data object (meant for the small ones: definition, JSON, SBOM);
    UserError for one over ``limit`` bytes (a SIF is input: its descriptors say anything)."""
    if descriptor.size > limit:
        raise UserError(
            too_large(
                f"{path}: object {descriptor.id} ({descriptor.name or descriptor.datatype_name})",
                limit,
                descriptor.size,
            )
        )
    with open_regular(Path(path)) as fh:
        fh.seek(descriptor.offset)
        data = fh.read(descriptor.size)
    if len(data) != descriptor.size:
        raise UserError(f"{path}: truncated SIF: object {descriptor.id} is cut short")
    return data


def read_json_object(path: Union[str, os.PathLike], descriptor: Descriptor) -> Any:
    raw = read_object(path, descriptor)
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(
            f"{path}: object {descriptor.id} ({descriptor.name or descriptor.datatype_name}) is not valid JSON ({exc})"
        ) from None
