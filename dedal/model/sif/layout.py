"""The SIF layout: the structures of a SIF file and the codes its fields hold.

The layout follows sylabs/sif v2 (``pkg/sif/sif.go``, ``descriptor.go``, ``create.go``);
:mod:`dedal.model.sif` describes it byte by byte. :class:`Descriptor` and :class:`SifInfo`
are what :mod:`.reader` reads back.
"""

from __future__ import annotations

import platform
import struct
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional


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
SBOM_FORMATS = {
    1: "cyclonedx-json",
    2: "cyclonedx-xml",
    3: "github-json",
    4: "spdx-json",
    5: "spdx-rdf",
    6: "spdx-tag-value",
    7: "spdx-yaml",
    8: "syft-json",
}
# SIF architecture codes (header and partition descriptors) <-> Go architecture names
ARCHS = {
    "00": "unknown",
    "01": "386",
    "02": "amd64",
    "03": "arm",
    "04": "arm64",
    "05": "ppc64",
    "06": "ppc64le",
    "07": "mips",
    "08": "mipsle",
    "09": "mips64",
    "10": "mips64le",
    "11": "s390x",
    "12": "riscv64",
    "13": "loong64",
}
ARCH_CODES = {v: k for k, v in ARCHS.items() if v != "unknown"}
_MACHINE_TO_GOARCH = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "i386": "386",
    "i686": "386",
    "ppc64le": "ppc64le",
    "ppc64": "ppc64",
    "s390x": "s390x",
    "riscv64": "riscv64",
    "loongarch64": "loong64",
    "armv7l": "arm",
}


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
