"""Attachments: the files published next to an image (verification report, SBOMs,
anything else) as OCI 1.1 artifacts whose ``subject`` is the image manifest.

Files are classified and grouped here (one verification report artifact with
verify.json, report.md and plots; one artifact per SBOM; the other files of an attached
directory as one archive; one per other file named on its own), pushed,
and found again: through the registry's referrers API, or, where the registry has none
(no ``OCI-Subject`` header in the answer), through the ``sha256-<hex>`` index of the
referrers tag schema that dedal maintains and ``oras discover`` reads too. Both the
push (``push``) and the listing and inspection (``remote``) use it.
"""

from __future__ import annotations

import gzip
import json
import mimetypes
import os
import tarfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Sequence, Tuple, Union

from dedal.adapters import registry as reg
from dedal.adapters.registry import Progress, RegistryClient
from dedal.errors import UserError
from dedal.model.inputs import read_input
from dedal.model import verify_report
from dedal.model.oci import (
    ANN_CREATED,
    ANN_SKIPPED,
    ANN_TITLE,
    ANN_VERDICT,
    ARTIFACT_CYCLONEDX,
    ARTIFACT_FILE,
    ARTIFACT_INTOTO,
    ARTIFACT_LOGS,
    ARTIFACT_SPDX,
    ARTIFACT_VERIFY,
    EMPTY_JSON,
    EMPTY_JSON_DIGEST,
    OCI_INDEX,
    OCI_MANIFEST,
    artifact_manifest,
    canonical_json,
    fallback_tag,
    rfc3339,
    sha256_digest,
)


def verdict_of(report: Any) -> str:
    """The verdict of a verify.json's data (:func:`dedal.model.verify_report.verdict_in`):
    ``verdict`` (string), else ``passed``/``ok`` (bool), else ``status``; "unknown" when there is none."""
    return verify_report.verdict_in(report)


@dataclass
class AttachmentFile:
    path: Path
    title: str
    media_type: str


@dataclass
class AttachmentGroup:
    artifact_type: str
    files: List[AttachmentFile] = field(default_factory=list)
    annotations: Dict[str, str] = field(default_factory=dict)


ATTACHED_JSON_LIMIT = 64 << 20  # bytes of an attached JSON file read to classify it or take its verdict


def _read_json(path: Path) -> Any:
    """An attached JSON file's data, to classify it; None where it is not JSON, no regular
    file or over ATTACHED_JSON_LIMIT (then it is attached as a plain file)."""
    try:
        return json.loads(read_input(path, ATTACHED_JSON_LIMIT))
    except (ValueError, UserError):
        return None


def logs_archive(top: Path, files: Sequence[Path], out: Path) -> Path:
    """``files`` (under ``top``) as a gzipped tar at ``out``, by their paths relative to
    ``top``, sorted, owned by root, dated like the newest of them: the same files give
    the same bytes and the same artifact."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with (
        open(out, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for path in sorted(files, key=lambda q: q.relative_to(top).as_posix()):
            info = tar.gettarinfo(str(path), arcname=path.relative_to(top).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(path, "rb") as fh:
                tar.addfile(info, fh)
    newest = max(p.stat().st_mtime for p in files)
    os.utime(out, (newest, newest))  # its created annotation: the logs' date, so a republish adds no referrer
    return out


def classify_attachment(path: Path) -> Tuple[str, str]:
    """(group artifact type, layer media type) of one attached file."""
    name = path.name.lower()
    if name.endswith("-logs.tar.gz"):
        return ARTIFACT_LOGS, ARTIFACT_LOGS
    if name == "verify.json" or name.endswith(".verify.json"):
        return ARTIFACT_VERIFY, ARTIFACT_VERIFY
    if name.endswith(".intoto.json"):
        return ARTIFACT_INTOTO, ARTIFACT_INTOTO
    if name.endswith(".json"):
        data = _read_json(path)
        if name.endswith(".cdx.json") or (isinstance(data, dict) and data.get("bomFormat") == "CycloneDX"):
            return ARTIFACT_CYCLONEDX, ARTIFACT_CYCLONEDX
        if name.endswith(".spdx.json") or (isinstance(data, dict) and "spdxVersion" in data):
            return ARTIFACT_SPDX, ARTIFACT_SPDX
    if name.endswith(".md"):
        return ARTIFACT_VERIFY, "text/markdown"
    if name.endswith((".png", ".svg")):
        return ARTIFACT_VERIFY, mimetypes.guess_type(name)[0] or "application/octet-stream"
    return ARTIFACT_FILE, mimetypes.guess_type(name)[0] or "application/octet-stream"


def group_attachments(paths: Iterable[Union[str, os.PathLike]], scratch: Path) -> List[AttachmentGroup]:
    """Files (directories are expanded) grouped into artifacts: one verification report
    (verify.json, report.md, plots), one per SBOM, one per other file named on its own,
    and the other files of each directory (raw benchmark outputs, logs) as one archive,
    ``<directory>-logs.tar.gz``, made in ``scratch``: a report directory is three or four
    referrers, not one per log."""
    files: List[Tuple[Path, str]] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.is_file() and not q.name.startswith("."))
            if not found:
                raise UserError(f"--attach {p}: the directory holds no files")
            loose = [q for q in found if classify_attachment(q)[0] == ARTIFACT_FILE]
            files += [(q, q.relative_to(p).as_posix()) for q in found if q not in loose]
            if loose:
                name = f"{p.resolve().name or 'attached'}-logs.tar.gz"
                files.append((logs_archive(p, loose, Path(scratch) / name), name))
        elif p.is_file():
            files.append((p, p.name))
        else:
            raise UserError(f"--attach {p}: no such file or directory")
    groups: Dict[str, AttachmentGroup] = {}
    for path, title in files:
        artifact_type, media_type = classify_attachment(path)
        key = artifact_type if artifact_type == ARTIFACT_VERIFY else f"{artifact_type}:{title}"
        group = groups.setdefault(key, AttachmentGroup(artifact_type))
        if any(f.title == title for f in group.files):
            raise UserError(f"--attach: two files named {title!r} in one attachment")
        group.files.append(AttachmentFile(path, title, media_type))
    result = list(groups.values())
    for group in result:
        newest = max(f.path.stat().st_mtime for f in group.files)
        group.annotations[ANN_CREATED] = rfc3339(newest)
        if group.artifact_type == ARTIFACT_VERIFY:
            report = next((f for f in group.files if f.media_type == ARTIFACT_VERIFY), None)
            if report is not None:
                record = verify_report.load(report.path, ATTACHED_JSON_LIMIT, where=f"--attach {report.path}")
                group.annotations[ANN_VERDICT] = record.verdict
                skipped = record.skipped
                if skipped:  # the gate of `dedal publish` and who pulls it see what was never measured
                    group.annotations[ANN_SKIPPED] = skipped
    return result


@dataclass
class Attachment:
    artifact_type: str
    digest: str
    size: int
    files: List[str]
    annotations: Dict[str, str]

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


def push_attachment(
    client: RegistryClient,
    repository: str,
    subject: Dict[str, Any],
    group: AttachmentGroup,
    progress: Progress,
    uploaded: List[str],
    skipped: List[str],
) -> Tuple[Attachment, bool]:
    """Push one artifact manifest referring to ``subject``; returns it and whether the
    registry indexed it itself (``OCI-Subject`` header)."""
    layers = []
    for f in group.files:
        digest, size = reg.file_digest(f.path)
        sent = client.push_blob(repository, f.path, digest, size, progress)
        (uploaded if sent else skipped).append(digest)
        layers.append({"mediaType": f.media_type, "digest": digest, "size": size, "annotations": {ANN_TITLE: f.title}})
    _, _, sent = client.push_bytes(repository, EMPTY_JSON, None)
    (uploaded if sent else skipped).append(EMPTY_JSON_DIGEST)
    manifest = artifact_manifest(
        artifact_type=group.artifact_type, layers=layers, subject=subject, annotations=group.annotations
    )
    raw = canonical_json(manifest)
    digest = sha256_digest(raw)
    response = client.put_manifest(repository, digest, raw, OCI_MANIFEST)
    indexed = bool(response.headers.get("OCI-Subject"))
    return Attachment(
        group.artifact_type, digest, len(raw), [f.title for f in group.files], dict(group.annotations)
    ), indexed


def add_to_fallback_index(
    client: RegistryClient, repository: str, subject_digest: str, attachments: Sequence[Attachment]
) -> None:
    """Referrers tag schema: the index tagged ``sha256-<hex>`` lists the referrers."""
    tag = fallback_tag(subject_digest)
    try:
        index = client.get_manifest_raw(repository, tag, (OCI_INDEX,)).json()
    except reg.NotFound:
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
    manifests = [m for m in index.get("manifests") or [] if isinstance(m, dict)]
    known = {m.get("digest") for m in manifests}
    added = False
    for a in attachments:
        if a.digest in known:
            continue
        manifests.append(
            {
                "mediaType": OCI_MANIFEST,
                "digest": a.digest,
                "size": a.size,
                "artifactType": a.artifact_type,
                "annotations": dict(a.annotations),
            }
        )
        added = True
    if added:
        index["manifests"] = manifests
        index.setdefault("schemaVersion", 2)
        index["mediaType"] = OCI_INDEX
        client.put_manifest(repository, tag, canonical_json(index), OCI_INDEX)


def list_referrers(client: RegistryClient, repository: str, digest: str) -> Tuple[str, List[Dict[str, Any]]]:
    """("api" | "tag-schema", descriptors of the manifests that refer to ``digest``)."""
    found = client.referrers(repository, digest)
    if found is not None:
        return "api", found
    try:
        index = client.get_manifest_raw(repository, fallback_tag(digest), (OCI_INDEX,)).json()
    except reg.NotFound:
        return "tag-schema", []
    return "tag-schema", [m for m in index.get("manifests") or [] if isinstance(m, dict)]
