"""Publishing a SIF image: the manifest ``apptainer push`` writes, under every
reference asked for, then the attachments.

The SIF is hashed once; its manifest carries ``org.opencontainers.image.created`` (the
SIF's creation time), description, source and dedal's provenance (environment, lock
hash, Spack commit), taken from the arguments or else from the SIF's JSON.Labels. Blobs
a registry already has are not sent again, and the attachments are validated before any
network traffic.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from dedal.adapters import registry as reg
from dedal.adapters import signing
from dedal.adapters.registry import Access, Progress, RegistryClient
from dedal.errors import UserError
from dedal.model import provenance as prov_mod
from dedal.model import sif as sifmod
from dedal.model.oci import (
    ANN_ARCH,
    ANN_CREATED,
    ANN_DESCRIPTION,
    ANN_ENVIRONMENT,
    ANN_LOCK_HASH,
    ANN_REVISION,
    ANN_SKIPPED,
    ANN_SOURCE,
    ANN_SPACK_COMMIT,
    ANN_VERDICT,
    ARTIFACT_VERIFY,
    EMPTY_JSON,
    EMPTY_JSON_DIGEST,
    OCI_MANIFEST,
    Reference,
    canonical_json,
    parse_reference,
    rfc3339,
    sha256_digest,
    sif_manifest,
    valid_tag,
)
from dedal.stages.publish.attachments import Attachment, add_to_fallback_index, group_attachments, push_attachment
from dedal.stages.verify import gate_refusal
from dedal.ui.console import human_size


def _norm_key(key: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", key.lower()).strip("_")


_LABEL_SUFFIXES = {
    "environment": ("environment", "env_name", "env"),
    "lock_hash": ("lock_hash", "lock_sha256", "lockhash"),
    "spack_commit": ("spack_commit", "spack_ref", "spack_revision"),
    "source": ("image_source",),
    "revision": ("image_revision",),
    "description": ("image_description",),
}


def provenance_from_labels(labels: Dict[str, Any]) -> Dict[str, str]:
    """Pick environment, lock hash, Spack commit, source and description out of SIF labels
    whatever their prefix (``org.dedal.lock-hash``, ``dedal.lock_hash``, ...)."""
    found: Dict[str, str] = {}
    for key, value in labels.items():
        if not isinstance(value, (str, int, float)) or isinstance(value, bool) or str(value) == "":
            continue
        norm = _norm_key(str(key))
        for name, suffixes in _LABEL_SUFFIXES.items():
            if name not in found and any(norm == s or norm.endswith("_" + s) for s in suffixes):
                found[name] = str(value)
    return found


def sif_labels(path: Path, info: sifmod.SifInfo) -> Dict[str, Any]:
    """The JSON.Labels object of a SIF (empty when it has none or it is not an object)."""
    for d in info.by_type(sifmod.DATA_LABELS):
        try:
            data = sifmod.read_json_object(path, d)
        except UserError:
            return {}
        return data if isinstance(data, dict) else {}
    return {}


def source_url(text: str, strict: bool = True) -> Optional[str]:
    """``text`` as the URL ``org.opencontainers.image.source`` holds: a URL as it is, an
    scp-like git remote (``git@host:group/repo.git``) as https. Anything else: a
    UserError (``strict``), else None (an old label such as "env spack@commit")."""
    text = text.strip()
    if re.match(r"^[a-z][a-z0-9+.-]*://[^\s/]+", text, re.I):
        return re.sub(r"^(\w+://)[^/@\s]*@", r"\1", text)  # no user (or token) in the URL
    m = re.match(r"^(?:[^@\s/]+@)?([^:\s/]+\.[^:\s/]+):(?!//)(\S+)$", text)
    if m:
        return f"https://{m.group(1)}/{m.group(2)}"
    if strict:
        raise UserError(f"--source {text!r}: expected the URL of the sources (e.g. https://host/group/repo)")
    return None


def ci_source() -> Optional[str]:
    """The repository URL a CI job builds from (GitLab CI_PROJECT_URL, GitHub's server and
    repository), None outside CI."""
    if os.environ.get("CI_PROJECT_URL"):
        return source_url(os.environ["CI_PROJECT_URL"], strict=False)
    if os.environ.get("GITHUB_REPOSITORY"):
        server = os.environ.get("GITHUB_SERVER_URL", "https://github.com").rstrip("/")
        return f"{server}/{os.environ['GITHUB_REPOSITORY']}"
    return None


def ci_revision() -> Optional[str]:
    """The commit a CI job builds (CI_COMMIT_SHA, GITHUB_SHA), None outside CI."""
    return os.environ.get("CI_COMMIT_SHA") or os.environ.get("GITHUB_SHA") or None


@dataclass
class PublishResult:
    references: List[str]
    digest: str  # of the image manifest
    manifest_size: int
    sif: str
    sif_digest: str
    sif_size: int
    arch: str
    created: str
    annotations: Dict[str, str]
    signed_by: Optional[Dict[str, Any]] = None  # with sign: the signer (fingerprint, name) of what was pushed
    blobs_uploaded: List[str] = field(default_factory=list)
    blobs_skipped: List[str] = field(default_factory=list)
    attachments: List[Attachment] = field(default_factory=list)
    referrers: str = "none"  # "api", "tag-schema", or "none" (nothing attached)
    retries: int = 0

    def to_json(self) -> Dict[str, Any]:
        data = asdict(self)
        data["attachments"] = [a.to_json() for a in self.attachments]
        return data


def publish(
    sif: Union[str, os.PathLike],
    refs: Sequence[Union[str, Reference]],
    *,
    description: Optional[str] = None,
    source: Optional[str] = None,
    revision: Optional[str] = None,
    environment: Optional[str] = None,
    lock_hash: Optional[str] = None,
    spack_commit: Optional[str] = None,
    created: Optional[float] = None,
    annotations: Optional[Dict[str, str]] = None,
    attachments: Sequence[Union[str, os.PathLike]] = (),
    access: Access = Access(),
    progress: Progress = None,
    gate: str = "passed",
    sign: bool = False,
    sign_keyidx: int = 0,
    sign_passphrase: Optional[str] = None,
    provenance: bool = False,
) -> PublishResult:
    """Push ``sif`` under every reference in ``refs`` (a reference without a tag gets the
    SIF's file stem), then the attachments. Blobs the registry has are not sent again.

    An attached verification report (verify.json) whose verdict the ``gate`` (setting
    ``verify_gate``: passed, good, off) does not let through is refused before anything is
    sent: a failed verification is not published unless forced (``gate="off"``), nor, with the
    strict gate ``good``, one whose planned checks did not all run (annotation ANN_SKIPPED).

    Provenance not given explicitly is read from the SIF's JSON.Labels object.

    ``sign``: what is pushed is a copy of the SIF signed with Apptainer's PGP key
    ``sign_keyidx`` (:mod:`dedal.adapters.signing`; the passphrase on its stdin), checked
    with ``apptainer verify`` before anything is sent; the SIF itself is left as it is.
    ``provenance``: an in-toto statement of the build's inputs (:mod:`dedal.model.provenance`,
    from the SIF's labels) about the SIF pushed, attached as a referrer.
    """
    path = original = Path(sif)
    info = sifmod.read_sif(path)  # UserError when missing / not a SIF
    sifmod.primary_partition(info)
    if not refs:
        raise UserError("no registry reference given (oras://HOST[:PORT]/REPO:TAG, or set `registry`)")
    stem = path.name[:-4] if path.name.endswith(".sif") else path.stem
    parsed: List[Reference] = []
    for r in refs:
        ref = r if isinstance(r, Reference) else parse_reference(r, allow_digest=False)
        if ref.digest:
            raise UserError(f"{ref}: publish needs a tag, not a digest")
        if not ref.tag:
            if not valid_tag(stem):
                raise UserError(f"{ref}: no tag given and the file name {path.name!r} is not a valid tag")
            ref = ref.with_tag(stem)
        parsed.append(ref)
    if sign:
        signing.check_tool()
    with tempfile.TemporaryDirectory(prefix="dedal-attach-") as scratch:  # a directory's logs archive
        groups = group_attachments(attachments, Path(scratch))  # validate before any network traffic
        for group in groups:
            verdict = group.annotations.get(ANN_VERDICT)
            if verdict is None:
                continue
            reason, overrides = gate_refusal(verdict, gate, group.annotations.get(ANN_SKIPPED, ""))
            if reason:
                report = next((str(f.path) for f in group.files if f.media_type == ARTIFACT_VERIFY), "the report")
                raise UserError(
                    f"{report}: {reason}, so the image is not published; pass --force (or set "
                    f"{' or '.join(overrides)}) to publish it with this report"
                )

        labels = sif_labels(path, info)
        prov = provenance_from_labels(labels)
        environment = environment or prov.get("environment")
        lock_hash = lock_hash or prov.get("lock_hash")
        spack_commit = spack_commit or prov.get("spack_commit")
        description = description or prov.get("description")
        # OCI: source is the URL of the sources the image is built from (the environment's
        # repository), revision their commit; the Spack commit has an annotation of its own
        source = (
            source_url(source)
            if source
            else (source_url(prov["source"], strict=False) if prov.get("source") else ci_source())
        )
        revision = revision or prov.get("revision") or ci_revision()
        if created is None:
            created = float(info.created) if info.created > 0 else path.stat().st_mtime
        ann: Dict[str, str] = {ANN_CREATED: rfc3339(created)}
        for key, value in (
            (ANN_DESCRIPTION, description),
            (ANN_SOURCE, source),
            (ANN_ENVIRONMENT, environment),
            (ANN_LOCK_HASH, lock_hash),
            (ANN_SPACK_COMMIT, spack_commit),
            (ANN_REVISION, revision),
            (ANN_ARCH, info.primary_arch),
        ):
            if value:
                ann[key] = str(value)
        ann.update(annotations or {})

        signed_by = None
        if sign:  # a signed copy (a signature is an object in the SIF), next to nothing of the user's
            copy = Path(scratch) / "signed" / path.name
            copy.parent.mkdir()
            if progress:
                progress(f"signing a copy of {path.name} with Apptainer's PGP key {sign_keyidx}")
            shutil.copyfile(path, copy)
            try:
                signed_by = signing.sign(copy, keyidx=sign_keyidx, passphrase=sign_passphrase).to_json()
            except UserError as exc:
                raise UserError(str(exc).replace(str(copy), str(path))) from None
            path = copy
            info = sifmod.read_sif(path)
        if progress:
            progress(f"hashing {path} ({human_size(info.file_size)})")
        sif_digest, sif_size = reg.file_digest(path)
        if provenance:
            statement = Path(scratch) / prov_mod.FILE_NAME
            statement.write_text(
                json.dumps(
                    prov_mod.statement(labels, name=path.name, sha256=sif_digest, source=source, revision=revision),
                    indent=1,
                    sort_keys=True,
                )
                + "\n"
            )
            os.utime(statement, (created, created))  # its created annotation: the image's (a republish adds none)
            groups = groups + group_attachments([statement], Path(scratch) / "provenance")
        manifest = sif_manifest(sif_digest=sif_digest, sif_size=sif_size, title=path.name, annotations=ann)
        raw = canonical_json(manifest)
        digest = sha256_digest(raw)
        result = PublishResult(
            references=[str(r) for r in parsed],
            digest=digest,
            manifest_size=len(raw),
            sif=str(original),
            sif_digest=sif_digest,
            sif_size=sif_size,
            arch=info.primary_arch,
            created=ann[ANN_CREATED],
            annotations=ann,
            signed_by=signed_by,
        )
        subject = {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(raw)}

        clients: Dict[str, RegistryClient] = {}
        by_repo: Dict[Tuple[str, str], List[Reference]] = {}
        for ref in parsed:
            by_repo.setdefault((ref.host, ref.repository), []).append(ref)
        modes = set()
        for (host, repository), repo_refs in by_repo.items():
            client = clients.get(host)
            if client is None:
                client = access.client(host, repository)
                clients[host] = client
            _, _, sent = client.push_bytes(repository, EMPTY_JSON, None)
            (result.blobs_uploaded if sent else result.blobs_skipped).append(EMPTY_JSON_DIGEST)
            sent = client.push_blob(repository, path, sif_digest, sif_size, progress)
            (result.blobs_uploaded if sent else result.blobs_skipped).append(sif_digest)
            for ref in repo_refs:
                client.put_manifest(repository, ref.tag or "latest", raw, OCI_MANIFEST)
                if progress:
                    progress(f"tagged {ref} -> {digest}")
            if groups:
                pushed: List[Attachment] = []
                indexed_all = True
                for group in groups:
                    att, indexed = push_attachment(
                        client, repository, subject, group, progress, result.blobs_uploaded, result.blobs_skipped
                    )
                    indexed_all = indexed_all and indexed
                    pushed.append(att)
                    if progress:
                        progress(f"attached {', '.join(att.files)} ({att.artifact_type}) -> {att.digest}")
                if not indexed_all:
                    add_to_fallback_index(client, repository, digest, pushed)
                modes.add("api" if indexed_all else "tag-schema")
                if not result.attachments:
                    result.attachments = pushed
    result.referrers = "/".join(sorted(modes)) if modes else "none"
    result.blobs_uploaded = list(dict.fromkeys(result.blobs_uploaded))
    result.blobs_skipped = [d for d in dict.fromkeys(result.blobs_skipped) if d not in result.blobs_uploaded]
    result.retries = sum(c.stats["retries"] for c in clients.values())
    return result
