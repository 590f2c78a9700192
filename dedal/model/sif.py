"""SIF (Singularity Image Format) files: a pure-Python reader and a reproducible writer.

The on-disk layout follows sylabs/sif v2 (``pkg/sif/sif.go``, ``descriptor.go``,
``create.go``), which is the code ``apptainer build`` and ``apptainer sif`` use:

* a 128-byte global header, little endian::

      launch script  32 bytes  "#!/usr/bin/env run-singularity\\n", NUL padded
      magic          10 bytes  "SIF_MAGIC\\0"
      version         3 bytes  "01\\0"
      arch            3 bytes  "02\\0" (amd64), see ARCHS
      id             16 bytes  UUID
      created, modified, descriptors free, descriptors total,
      descriptors offset, descriptors size, data offset, data size   8 x int64

* the descriptor table at offset 4096: 48 descriptors of 585 bytes each::

      datatype int32, used bool, id uint32, group uint32 (| 0xf0000000),
      link uint32 (| 0xf0000000 when it names a group), offset int64, size int64,
      size with padding int64, created int64, modified int64, uid int64, gid int64,
      name 128 bytes, extra 384 bytes (partition: fstype int32, parttype int32, arch 3 bytes;
      SBOM: format int32)

* the data section right after the table (4096 + 48 * 585 = 32176); objects follow
  each other, partitions aligned to 4096 bytes.

The writer reproduces what ``apptainer build`` writes (definition file, JSON metadata,
labels, primary system partition: squashfs, group 1) and is deterministic: the image
ID is derived from the content and the times come from ``SOURCE_DATE_EPOCH`` (else the
"zero" time the sif library itself uses for deterministic images), so the same inputs
give the same bytes. siftool cannot set times, which is why dedal writes the header
itself; tests cross-check every file with ``siftool list/info/dump``.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import struct
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from dedal.errors import UserError, open_regular, too_large
from dedal.model.artifacts import sha256_file, temp_path

LAUNCH_SCRIPT = "#!/usr/bin/env run-singularity\n"
MAGIC = b"SIF_MAGIC\x00"
VERSION = b"01\x00"

HEADER = struct.Struct("<32s10s3s3s16sqqqqqqqq")  # 128 bytes
DESCRIPTOR = struct.Struct("<i?IIIqqqqqqq128s384s")  # 585 bytes
PARTITION_EXTRA = struct.Struct("<ii3s")
SBOM_EXTRA = struct.Struct("<i")
GROUP_MASK = 0xF0000000
DESCRIPTORS_OFFSET = 4096
DESCRIPTOR_CAPACITY = 48
PARTITION_ALIGNMENT = 4096
DEFAULT_GROUP = 1
GO_ZERO_TIME = -62135596800  # time.Time{}.Unix(): what the sif library writes for deterministic images

# data types (sif.DataType) and their names as siftool prints them
DATA_DEFFILE = 0x4001
DATA_ENVVAR = 0x4002
DATA_LABELS = 0x4003
DATA_PARTITION = 0x4004
DATA_SIGNATURE = 0x4005
DATA_GENERIC_JSON = 0x4006
DATA_GENERIC = 0x4007
DATA_CRYPTO_MESSAGE = 0x4008
DATA_SBOM = 0x4009
DATA_OCI_ROOT_INDEX = 0x400A
DATA_OCI_BLOB = 0x400B
DATATYPE_NAMES = {
    DATA_DEFFILE: "Def.FILE",
    DATA_ENVVAR: "Env.Vars",
    DATA_LABELS: "JSON.Labels",
    DATA_PARTITION: "FS",
    DATA_SIGNATURE: "Signature",
    DATA_GENERIC_JSON: "JSON.Generic",
    DATA_GENERIC: "Generic/Raw",
    DATA_CRYPTO_MESSAGE: "Cryptographic Message",
    DATA_SBOM: "SBOM",
    DATA_OCI_ROOT_INDEX: "OCI.RootIndex",
    DATA_OCI_BLOB: "OCI.Blob",
}
FS_SQUASH, FS_EXT3, FS_IMMUOBJ, FS_RAW, FS_ENCRYPTED_SQUASHFS = 1, 2, 3, 4, 5
FS_NAMES = {1: "Squashfs", 2: "Ext3", 3: "Archive", 4: "Raw", 5: "Encrypted squashfs"}
PART_SYSTEM, PART_PRIMSYS, PART_DATA, PART_OVERLAY = 1, 2, 3, 4
PART_NAMES = {1: "System", 2: "*System", 3: "Data", 4: "Overlay"}
SBOM_CYCLONEDX_JSON = 1
SBOM_FORMATS = {1: "cyclonedx-json", 2: "cyclonedx-xml", 3: "github-json", 4: "spdx-json",
                5: "spdx-rdf", 6: "spdx-tag-value", 7: "spdx-yaml", 8: "syft-json"}
# SIF architecture codes (header and partition descriptors) <-> Go architecture names
ARCHS = {"00": "unknown", "01": "386", "02": "amd64", "03": "arm", "04": "arm64", "05": "ppc64",
         "06": "ppc64le", "07": "mips", "08": "mipsle", "09": "mips64", "10": "mips64le",
         "11": "s390x", "12": "riscv64", "13": "loong64"}
ARCH_CODES = {v: k for k, v in ARCHS.items() if v != "unknown"}
_MACHINE_TO_GOARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64",
                      "i386": "386", "i686": "386", "ppc64le": "ppc64le", "ppc64": "ppc64",
                      "s390x": "s390x", "riscv64": "riscv64", "loongarch64": "loong64", "armv7l": "arm"}


def host_arch() -> str:
    """The host CPU architecture as SIF names it (Go names: amd64, arm64, ...)."""
    m = platform.machine().lower()
    return _MACHINE_TO_GOARCH.get(m, m)


@dataclass
class Descriptor:
    id: int
    datatype: int
    datatype_name: str
    group: int  # 0: no group
    link: int  # 0: none
    link_is_group: bool
    offset: int
    size: int
    size_with_padding: int
    created: int
    modified: int
    name: str
    fstype: Optional[str] = None  # partitions only
    parttype: Optional[str] = None
    arch: Optional[str] = None
    sbom_format: Optional[str] = None  # SBOM objects only

    @property
    def is_primary_partition(self) -> bool:
        return self.datatype == DATA_PARTITION and self.parttype == PART_NAMES[PART_PRIMSYS]

    @property
    def type_label(self) -> str:
        """The TYPE column of ``siftool list`` (e.g. ``FS (Squashfs/*System/amd64)``)."""
        if self.datatype == DATA_PARTITION:
            return f"{self.datatype_name} ({self.fstype}/{self.parttype}/{self.arch})"
        if self.datatype == DATA_SBOM:
            return f"{self.datatype_name} ({self.sbom_format})"
        return self.datatype_name

    def to_json(self) -> Dict[str, Any]:
        data = asdict(self)
        data["type"] = self.type_label
        return {k: v for k, v in data.items() if v is not None}


@dataclass
class SifInfo:
    path: str
    file_size: int
    launch_script: str
    version: str
    primary_arch: str
    id: str
    created: int
    modified: int
    descriptors_free: int
    descriptors_total: int
    descriptors_offset: int
    descriptors_size: int
    data_offset: int
    data_size: int
    descriptors: List[Descriptor] = field(default_factory=list)

    def to_json(self) -> Dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "descriptors"}
        data["descriptors"] = [d.to_json() for d in self.descriptors]
        return data

    def by_type(self, datatype: int) -> List[Descriptor]:
        return [d for d in self.descriptors if d.datatype == datatype]

    def by_name(self, name: str) -> Optional[Descriptor]:
        for d in self.descriptors:
            if d.name == name:
                return d
        return None


def _cstr(raw: bytes) -> str:
    return raw.split(b"\x00", 1)[0].decode("utf-8", "replace")


def read_sif(path: Union[str, os.PathLike]) -> SifInfo:
    """Parse the header and the used descriptors of a SIF file.

    Raises UserError when the file is missing, is not a SIF, has an unsupported version,
    or is truncated (a descriptor table or an object reaching past the end of the file).
    """
    p = Path(path)
    try:
        with open_regular(p) as fh:  # a FIFO, a device: refused at once, never waited on
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(HEADER.size)
            if len(head) < HEADER.size or head[32:42] != MAGIC:
                raise UserError(f"{p}: not a SIF image (no SIF_MAGIC in the header)")
            (launch, _magic, version, arch, ident, created, modified, dfree, dtotal,
             doff, dsize, dataoff, datasize) = HEADER.unpack(head)
            if version != VERSION:
                raise UserError(f"{p}: unsupported SIF version {_cstr(version)!r} (dedal reads version 01)")
            if dtotal < 0 or doff < HEADER.size or dsize != dtotal * DESCRIPTOR.size:
                raise UserError(f"{p}: corrupt SIF header (descriptor table: {dtotal} at {doff}, {dsize} bytes)")
            if doff + dsize > size:
                raise UserError(f"{p}: truncated SIF: the descriptor table ends at byte {doff + dsize}, "
                                f"the file has {size} bytes")
            fh.seek(doff)
            table = fh.read(dsize)
    except IsADirectoryError:
        raise UserError(f"{p}: is a directory, not a SIF image") from None
    except FileNotFoundError:
        raise UserError(f"{p}: no such file") from None
    except PermissionError:
        raise UserError(f"{p}: permission denied") from None
    descriptors: List[Descriptor] = []
    for i in range(dtotal):
        (dt, used, did, gid, lid, off, dsz, dpad, dcr, dmod, _uid, _gid, name, extra) = \
            DESCRIPTOR.unpack_from(table, i * DESCRIPTOR.size)
        if not used:
            continue
        d = Descriptor(
            id=did, datatype=dt, datatype_name=DATATYPE_NAMES.get(dt, "Unknown"),
            group=gid & ~GROUP_MASK & 0xFFFFFFFF, link=lid & ~GROUP_MASK & 0xFFFFFFFF,
            link_is_group=bool(lid & GROUP_MASK), offset=off, size=dsz, size_with_padding=dpad,
            created=dcr, modified=dmod, name=_cstr(name),
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
            raise UserError(f"{p}: truncated SIF: object {did} ({d.type_label}) ends at byte {off + dsz}, "
                            f"the file has {size} bytes")
        descriptors.append(d)
    return SifInfo(
        path=str(p), file_size=size, launch_script=_cstr(launch), version=_cstr(version),
        primary_arch=ARCHS.get(_cstr(arch), "unknown"), id=str(uuid.UUID(bytes=ident)),
        created=created, modified=modified, descriptors_free=dfree, descriptors_total=dtotal,
        descriptors_offset=doff, descriptors_size=dsize, data_offset=dataoff, data_size=datasize,
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
        raise UserError(too_large(f"{path}: object {descriptor.id} ({descriptor.name or descriptor.datatype_name})",
                                  limit, descriptor.size))
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
        raise UserError(f"{path}: object {descriptor.id} ({descriptor.name or descriptor.datatype_name}) "
                        f"is not valid JSON ({exc})") from None


# ---------------------------------------------------------------------------- writer


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
    start_at = partition_offset(definition=definition, labels=labels, metadata=metadata, sbom=sbom,
                                extra_json=extra_json) if in_place else 0
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
        objects.append(_Object(DATA_SBOM, bytes(sbom), name="sbom.cdx.json",
                               extra=SBOM_EXTRA.pack(SBOM_CYCLONEDX_JSON)))
    code = ARCH_CODES[arch].encode() + b"\x00"
    objects.append(_Object(DATA_PARTITION, path=sq, alignment=PARTITION_ALIGNMENT,
                           extra=PARTITION_EXTRA.pack(FS_SQUASH, PART_PRIMSYS, code), skip=start_at))
    if len(objects) > DESCRIPTOR_CAPACITY:
        raise UserError(f"too many SIF objects ({len(objects)} > {DESCRIPTOR_CAPACITY})")

    if image_id is None:
        h = hashlib.sha256()
        for o in objects:
            h.update(struct.pack("<iq", o.datatype, o.size) + o.name.encode() + o.extra)
            h.update(hashlib.sha256(o.data).digest() if o.data is not None else bytes.fromhex(sha256_file(o.path, start=o.skip, chunk=8 << 20)))  # type: ignore[arg-type]
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
                    table, i * DESCRIPTOR.size, o.datatype, True, i + 1, DEFAULT_GROUP | GROUP_MASK, 0,
                    start, n, start - end + n, t, t, 0, 0,
                    o.name.encode("utf-8")[:128], o.extra,
                )
                end = start + n
            fh.seek(0)
            fh.write(HEADER.pack(
                LAUNCH_SCRIPT.encode(), MAGIC, VERSION, code, ident.bytes, t, t,
                DESCRIPTOR_CAPACITY - len(objects), DESCRIPTOR_CAPACITY, DESCRIPTORS_OFFSET,
                DESCRIPTOR_CAPACITY * DESCRIPTOR.size, data_offset, end - data_offset,
            ))
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


def partition_offset(*, definition: str, labels: Dict[str, Any], metadata: Dict[str, Any],
                     sbom: Optional[bytes] = None, extra_json: Sequence[Tuple[str, Any]] = ()) -> int:
    """Where ``write_sif`` puts the primary partition for these objects (for ``in_place``)."""
    end = DESCRIPTORS_OFFSET + DESCRIPTOR_CAPACITY * DESCRIPTOR.size + len(definition.encode("utf-8"))
    for _name, obj in [("inspect-metadata.json", metadata), *extra_json]:
        end += len(_json_bytes(obj))
    end += len(_json_bytes(labels)) + (len(sbom) if sbom is not None else 0)
    return _aligned(end, PARTITION_ALIGNMENT)


# ---------------------------------------------------------------------------- squashfs superblock

SQUASHFS_SUPERBLOCK = struct.Struct("<IIIIIHHHHHHQQ")  # magic .. bytes_used (the first 56 bytes)
SQUASHFS_COMPRESSION = {1: "gzip", 2: "lzma", 3: "lzo", 4: "xz", 5: "lz4", 6: "zstd"}


def squashfs_superblock(path: Union[str, os.PathLike], offset: int = 0) -> Dict[str, Any]:
    """Facts from a squashfs superblock at ``offset`` (e.g. a SIF partition), read in Python:
    compression, block size, inode count, bytes used, mkfs time, version."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        raw = fh.read(SQUASHFS_SUPERBLOCK.size)
    if len(raw) < SQUASHFS_SUPERBLOCK.size or raw[:4] != b"hsqs":
        raise UserError(f"{path}: no squashfs superblock at offset {offset}")
    (_magic, inodes, mkfs_time, block_size, _frags, comp, _blog, _flags, _ids, major, minor,
     _root, used) = SQUASHFS_SUPERBLOCK.unpack(raw)
    return {"compression": SQUASHFS_COMPRESSION.get(comp, f"unknown ({comp})"), "block_size": block_size,
            "inodes": inodes, "bytes_used": used, "mkfs_time": mkfs_time, "version": f"{major}.{minor}"}


# ---------------------------------------------------------------------------- image summary


def _layers_from(labels: Dict[str, Any], metadata: Dict[str, Any]) -> List[Any]:
    """The layer list the assembler records: ``dedal.layers`` in the labels (a list or a JSON
    string, labels being strings for Apptainer) or ``dedal.layers`` in inspect-metadata.json."""
    for source in (labels.get("dedal.layers"), (metadata.get("dedal") or {}).get("layers")
                   if isinstance(metadata.get("dedal"), dict) else None, metadata.get("dedal.layers")):
        if isinstance(source, str):
            try:
                source = json.loads(source)
            except json.JSONDecodeError:
                continue
        if isinstance(source, list):
            return source
    return []


def sbom_summary(raw: bytes) -> Dict[str, Any]:
    """Component count and identity of a CycloneDX JSON SBOM."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return {"valid": False, "error": f"not JSON ({exc})", "bytes": len(raw)}
    if not isinstance(doc, dict):
        return {"valid": False, "error": "not a JSON object", "bytes": len(raw)}
    comps = doc.get("components") or []
    types: Dict[str, int] = {}
    for c in comps if isinstance(comps, list) else []:
        t = c.get("type", "?") if isinstance(c, dict) else "?"
        types[t] = types.get(t, 0) + 1
    subject = (doc.get("metadata") or {}).get("component") or {}
    return {"valid": doc.get("bomFormat") == "CycloneDX", "format": doc.get("bomFormat", "?"),
            "spec_version": doc.get("specVersion", "?"), "components": len(comps) if isinstance(comps, list) else 0,
            "by_type": types, "subject": {k: subject.get(k) for k in ("name", "version") if subject.get(k)},
            "bytes": len(raw)}


def summarize(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """What ``dedal inspect`` shows: header, objects, labels, layers, SBOM summary, sizes."""
    info = read_sif(path)
    labels: Dict[str, Any] = {}
    metadata: Dict[str, Any] = {}
    definition = ""
    sbom: Optional[Dict[str, Any]] = None
    for d in info.descriptors:
        if d.datatype == DATA_LABELS and not labels:
            obj = read_json_object(path, d)
            labels = obj if isinstance(obj, dict) else {}
        elif d.datatype == DATA_GENERIC_JSON and d.name == "inspect-metadata.json":
            obj = read_json_object(path, d)
            metadata = obj if isinstance(obj, dict) else {}
        elif d.datatype == DATA_DEFFILE and not definition:
            definition = read_object(path, d).decode("utf-8", "replace")
        elif d.datatype == DATA_SBOM and sbom is None:
            sbom = sbom_summary(read_object(path, d))
            sbom["format_declared"] = d.sbom_format
    if not labels:  # Apptainer keeps labels inside inspect-metadata.json too
        attrs = metadata.get("attributes") if isinstance(metadata.get("attributes"), dict) else {}
        labels = attrs.get("labels") or metadata.get("labels") or {}
    part: Optional[Descriptor] = None
    for d in info.descriptors:
        if d.is_primary_partition:
            part = d
    rootfs: Dict[str, Any] = {}
    if part is not None and part.fstype == "Squashfs":
        rootfs = squashfs_superblock(path, part.offset)
    layers = _layers_from(labels, metadata)
    return {
        "path": info.path,
        "header": {k: v for k, v in info.to_json().items() if k not in ("descriptors", "path")},
        "objects": [d.to_json() for d in info.descriptors],
        "labels": labels,
        "layers": layers,
        "sbom": sbom,
        "definition": definition,
        "sizes": {"file": info.file_size, "rootfs_partition": part.size if part else 0,
                  "metadata_objects": sum(d.size for d in info.descriptors if d.datatype != DATA_PARTITION),
                  "layers": sum(int(layer.get("size", 0) or 0) for layer in layers if isinstance(layer, dict))},
        "rootfs": rootfs,
        "primary_arch": info.primary_arch,
    }
