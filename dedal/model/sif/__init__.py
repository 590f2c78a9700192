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

This package is its public face; the parts:

* ``layout``: the structures (header, descriptors) and the codes their fields hold
  (data types, file systems, partitions, architectures), :class:`Descriptor`, :class:`SifInfo`;
* ``reader``: :func:`read_sif`, the primary partition, small objects read whole, checked;
* ``writer``: :func:`write_sif` (deterministic), :func:`partition_offset`, the image date
  (:func:`source_date_epoch`, :func:`sif_time`);
* ``summary``: :func:`summarize` (what ``dedal inspect`` shows), the SBOM's summary, the
  squashfs superblock of the root file system.
"""

from __future__ import annotations

from dedal.model.sif.layout import (
    ARCHS,
    ARCH_CODES,
    DATATYPE_NAMES,
    DATA_CRYPTO_MESSAGE,
    DATA_DEFFILE,
    DATA_ENVVAR,
    DATA_GENERIC,
    DATA_GENERIC_JSON,
    DATA_LABELS,
    DATA_OCI_BLOB,
    DATA_OCI_ROOT_INDEX,
    DATA_PARTITION,
    DATA_SBOM,
    DATA_SIGNATURE,
    DEFAULT_GROUP,
    DESCRIPTOR,
    DESCRIPTORS_OFFSET,
    DESCRIPTOR_CAPACITY,
    Descriptor,
    FS_ENCRYPTED_SQUASHFS,
    FS_EXT3,
    FS_IMMUOBJ,
    FS_NAMES,
    FS_RAW,
    FS_SQUASH,
    GO_ZERO_TIME,
    GROUP_MASK,
    HEADER,
    LAUNCH_SCRIPT,
    MAGIC,
    PARTITION_ALIGNMENT,
    PARTITION_EXTRA,
    PART_DATA,
    PART_NAMES,
    PART_OVERLAY,
    PART_PRIMSYS,
    PART_SYSTEM,
    SBOM_CYCLONEDX_JSON,
    SBOM_EXTRA,
    SBOM_FORMATS,
    SifInfo,
    VERSION,
    host_arch,
)
from dedal.model.sif.reader import (
    OBJECT_LIMIT,
    check_arch,
    primary_partition,
    read_json_object,
    read_object,
    read_sif,
)
from dedal.model.sif.writer import (
    partition_offset,
    sif_time,
    source_date_epoch,
    write_sif,
)
from dedal.model.sif.summary import (
    SQUASHFS_COMPRESSION,
    SQUASHFS_SUPERBLOCK,
    sbom_summary,
    squashfs_superblock,
    summarize,
)

__all__ = [
    "ARCHS",
    "ARCH_CODES",
    "DATATYPE_NAMES",
    "DATA_CRYPTO_MESSAGE",
    "DATA_DEFFILE",
    "DATA_ENVVAR",
    "DATA_GENERIC",
    "DATA_GENERIC_JSON",
    "DATA_LABELS",
    "DATA_OCI_BLOB",
    "DATA_OCI_ROOT_INDEX",
    "DATA_PARTITION",
    "DATA_SBOM",
    "DATA_SIGNATURE",
    "DEFAULT_GROUP",
    "DESCRIPTOR",
    "DESCRIPTORS_OFFSET",
    "DESCRIPTOR_CAPACITY",
    "Descriptor",
    "FS_ENCRYPTED_SQUASHFS",
    "FS_EXT3",
    "FS_IMMUOBJ",
    "FS_NAMES",
    "FS_RAW",
    "FS_SQUASH",
    "GO_ZERO_TIME",
    "GROUP_MASK",
    "HEADER",
    "LAUNCH_SCRIPT",
    "MAGIC",
    "PARTITION_ALIGNMENT",
    "PARTITION_EXTRA",
    "PART_DATA",
    "PART_NAMES",
    "PART_OVERLAY",
    "PART_PRIMSYS",
    "PART_SYSTEM",
    "SBOM_CYCLONEDX_JSON",
    "SBOM_EXTRA",
    "SBOM_FORMATS",
    "SifInfo",
    "VERSION",
    "host_arch",
    "OBJECT_LIMIT",
    "check_arch",
    "primary_partition",
    "read_json_object",
    "read_object",
    "read_sif",
    "partition_offset",
    "sif_time",
    "source_date_epoch",
    "write_sif",
    "SQUASHFS_COMPRESSION",
    "SQUASHFS_SUPERBLOCK",
    "sbom_summary",
    "squashfs_superblock",
    "summarize",
]
