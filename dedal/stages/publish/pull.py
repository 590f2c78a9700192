"""Pulling a SIF image the way ``apptainer pull oras://`` does, and checking it.

An image index is resolved by architecture; the manifest must have exactly one layer of
the SIF media type (or the legacy, misspelt ``appliciation/vnd.sylabs.sif.layer.tar``).
The blob is streamed into a temporary file next to the target, checked for size and
sha256, opened as a SIF for the wanted architecture, its root file system's entries
audited as assemble audits the layers (:func:`audit_root`), with ``verify`` (``dedal pull
--verify``, setting ``require_signature``) its signature checked by ``apptainer verify``
against the local keyring (and the setting ``signers``), and only then renamed into
place: a refused pull (an unsigned or wrongly signed image too) leaves no file behind.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Union

from dedal.adapters import signing
from dedal.adapters.registry import Access, IntegrityError, Progress, RegistryClient, RegistryError
from dedal.adapters.registry.download import download_blob
from dedal.errors import UserError
from dedal.model import sif as sifmod
from dedal.model.artifacts import atomic_path, reap_temporaries
from dedal.stages.layer_audit import INSTALL_ROOT_LABEL, check_image_root
from dedal.model.oci import (
    ANN_CREATED,
    ANN_TITLE,
    DOCKER_MANIFEST_LIST,
    FALLBACK_TAG,
    OCI_INDEX,
    Manifest,
    Reference,
    check_sif_manifest,
    parse_reference,
)
from dedal.ui.console import human_size


@dataclass
class PullResult:
    reference: str
    path: str
    digest: str  # image manifest
    sif_digest: str
    size: int
    arch: str
    layer_media_type: str
    created: Optional[str] = None
    title: Optional[str] = None
    signed_by: Optional[Dict[str, Any]] = None  # with verify: the fingerprints and names of the signers
    entries: int = 0  # entries of the root file system, audited

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


def _resolve_image(client: RegistryClient, ref: Reference, arch: str) -> Manifest:
    """The image manifest for ``ref``; an image index is resolved by architecture."""
    m = client.get_manifest_raw(ref.repository, ref.ref)
    data = m.json()
    media_type = m.media_type or data.get("mediaType") or ""
    if media_type in (OCI_INDEX, DOCKER_MANIFEST_LIST) or ("manifests" in data and "layers" not in data):
        for entry in data.get("manifests") or []:
            platform = (entry.get("platform") or {}) if isinstance(entry, dict) else {}
            if platform.get("architecture") == arch and platform.get("os", "linux") == "linux":
                return client.get_manifest_raw(ref.repository, entry["digest"])
        raise RegistryError(f"{ref}: the image index has no manifest for linux/{arch}")
    return m


def default_pull_name(ref: Reference) -> str:
    """``<repository basename>_<tag>.sif``, like ``apptainer pull``."""
    name = ref.repository.rsplit("/", 1)[-1]
    return f"{name}_{ref.tag or (ref.digest or 'latest').replace(':', '-')[:19]}.sif"


def pull(
    ref: Union[str, Reference],
    out: Optional[Union[str, os.PathLike]] = None,
    *,
    access: Access = Access(),
    arch: Optional[str] = None,
    force: bool = False,
    progress: Progress = None,
    verify: bool = False,
    signers: Sequence[str] = (),
) -> PullResult:
    """Download the SIF of ``ref`` to ``out`` (default ``<name>_<tag>.sif``; a directory
    gets the layer's title). The bytes go to a temporary file next to ``out`` and are
    renamed only after size, sha256, SIF header, architecture and entry checks pass, and with
    ``verify`` its signature (by a key of the local keyring; one of ``signers`` where
    given); nothing is left behind otherwise."""
    r = ref if isinstance(ref, Reference) else parse_reference(ref)
    if not r.tag and not r.digest:
        r = r.with_tag("latest")
    if r.tag and FALLBACK_TAG.match(r.tag):
        image = "sha256:" + r.tag[len("sha256-") :]
        raise UserError(
            f"{r}: {r.tag} is not an image but the list of the attachments (reports, SBOM) of the "
            f"image {image} (the OCI referrers tag schema, for registries without the referrers "
            f"API); pull oras://{r.host}/{r.repository}@{image} instead"
        )
    want_arch = arch or sifmod.host_arch()
    if verify:
        signing.check_tool()  # before anything is downloaded
    client = access.client(r.host, r.repository)
    manifest = _resolve_image(client, r, want_arch)
    data = manifest.json()
    layer = check_sif_manifest(data, str(r))
    title = (layer.get("annotations") or {}).get(ANN_TITLE)
    target = Path(out) if out is not None else Path(default_pull_name(r))
    if target.is_dir():
        name = Path(title or default_pull_name(r)).name
        if not name or name in (".", ".."):
            name = default_pull_name(r)
        target = target / name
    if target.exists() and not force:
        raise UserError(f"{target}: already exists (pass --force to replace it)")
    if not target.parent.is_dir():
        raise UserError(f"{target.parent}: no such directory")
    expected_digest, expected_size = layer["digest"], layer["size"]
    if progress:
        progress(f"downloading {r} ({human_size(expected_size)}) to {target}")
    reap_temporaries(target.parent, of=target.name)  # downloads of killed pulls
    with atomic_path(target) as tmp:
        download_blob(client, r.repository, expected_digest, expected_size, tmp, str(r))
        try:
            info = sifmod.read_sif(tmp)
            sifmod.primary_partition(info)
        except UserError as exc:
            msg = str(exc).replace(str(tmp), title or "the download")
            raise IntegrityError(f"{r}: the downloaded file is not a usable SIF image ({msg})") from None
        if info.primary_arch != want_arch:
            raise UserError(
                f"{r}: the image is for {info.primary_arch}, this host is {want_arch} "
                f"(pass --arch {info.primary_arch} to download it anyway)"
            )
        if progress:
            progress(f"auditing the entries of {r}'s root file system")
        try:
            entries = audit_root(tmp, info, str(r))
        except UserError as exc:
            raise UserError(str(exc).replace(str(tmp), str(r)) + "; nothing written") from None
        signed_by = None
        if verify:
            if progress:
                progress(f"verifying the signature of {r} (apptainer verify --local)")
            try:
                signed_by = signing.verify(tmp, signers=signers).to_json()
            except UserError as exc:
                raise UserError(str(exc).replace(str(tmp), str(r)) + "; nothing written") from None
        os.chmod(tmp, 0o755)
    ann = data.get("annotations") or {}
    return PullResult(
        reference=str(r),
        path=str(target),
        digest=manifest.digest,
        sif_digest=expected_digest,
        size=expected_size,
        arch=info.primary_arch,
        layer_media_type=layer["mediaType"],
        created=ann.get(ANN_CREATED),
        title=title,
        signed_by=signed_by,
        entries=entries,
    )


def audit_root(path: Path, info: sifmod.SifInfo, where: str) -> int:
    """The entry audit of the image's root file system (:func:`check_image_root`: what
    assemble's audit holds the layers to under the install root its labels name, the base
    operating system's setuid programs and harmless /dev nodes elsewhere); UserError
    ``WHERE: refused: ...`` otherwise. The number of entries."""
    found = info.by_type(sifmod.DATA_LABELS)
    labels = sifmod.read_json_object(path, found[0]) if found else {}
    install_root = labels.get(INSTALL_ROOT_LABEL) if isinstance(labels, dict) else None
    if install_root is not None and not isinstance(install_root, str):
        raise UserError(f"{where}: refused: its labels name install root {install_root!r}, not a path")
    return check_image_root(path, sifmod.primary_partition(info).offset, install_root, where)
