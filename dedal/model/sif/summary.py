"""What ``dedal inspect`` shows of a SIF (:func:`summarize`): header, objects, labels,
layers, the SBOM's summary and the root file system's squashfs superblock, read in Python.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any, Dict, List, Optional, Union

from dedal.errors import UserError
from dedal.model.sif.layout import DATA_DEFFILE, DATA_GENERIC_JSON, DATA_LABELS, DATA_PARTITION, DATA_SBOM, Descriptor
from dedal.model.sif.reader import read_json_object, read_object, read_sif


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
    (_magic, inodes, mkfs_time, block_size, _frags, comp, _blog, _flags, _ids, major, minor, _root, used) = (
        SQUASHFS_SUPERBLOCK.unpack(raw)
    )
    return {
        "compression": SQUASHFS_COMPRESSION.get(comp, f"unknown ({comp})"),
        "block_size": block_size,
        "inodes": inodes,
        "bytes_used": used,
        "mkfs_time": mkfs_time,
        "version": f"{major}.{minor}",
    }


def _layers_from(labels: Dict[str, Any], metadata: Dict[str, Any]) -> List[Any]:
    """The layer list the assembler records: ``dedal.layers`` in the labels (a list or a JSON
    string, labels being strings for Apptainer) or ``dedal.layers`` in inspect-metadata.json."""
    for source in (
        labels.get("dedal.layers"),
        (metadata.get("dedal") or {}).get("layers") if isinstance(metadata.get("dedal"), dict) else None,
        metadata.get("dedal.layers"),
    ):
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
    return {
        "valid": doc.get("bomFormat") == "CycloneDX",
        "format": doc.get("bomFormat", "?"),
        "spec_version": doc.get("specVersion", "?"),
        "components": len(comps) if isinstance(comps, list) else 0,
        "by_type": types,
        "subject": {k: subject.get(k) for k in ("name", "version") if subject.get(k)},
        "bytes": len(raw),
    }


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
        "sizes": {
            "file": info.file_size,
            "rootfs_partition": part.size if part else 0,
            "metadata_objects": sum(d.size for d in info.descriptors if d.datatype != DATA_PARTITION),
            "layers": sum(int(layer.get("size", 0) or 0) for layer in layers if isinstance(layer, dict)),
        },
        "rootfs": rootfs,
        "primary_arch": info.primary_arch,
    }
