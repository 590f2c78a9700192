"""OCI values dedal publishes and reads: references, media types, annotations, digests
and the manifests themselves, built and checked here without any I/O.

They are kept apart from the registry transport (``dedal.adapters.registry``) and the
publish stage (``dedal.stages.publish``) for the reason Spack keeps
``spack.oci.image`` apart from its opener: what a valid reference, a SIF manifest or
a referrers index looks like does not depend on how the bytes travel, and a manifest
can be built and checked (and tested) without a registry.

* references follow the distribution grammar (``oras://host[:port]/repo[:tag][@sha256:...]``);
* the image manifest is the one ``apptainer push`` writes for a SIF (empty config of
  ``application/vnd.sylabs.sif.config.v1+json``, one ``...sif.layer.v1.sif`` layer
  titled with the file name); pulls also accept the legacy (sic)
  ``appliciation/vnd.sylabs.sif.layer.tar``;
* attachments are OCI 1.1 artifact manifests whose ``subject`` is that image manifest;
* manifests are serialised once, compactly (``canonical_json``): digests are over
  those bytes, so they are never re-serialised by a JSON library afterwards.

``RegistryError`` lives here because checking what a registry holds (a manifest that is
not JSON, not a SIF image) is part of these values; the adapter adds the transport's
own errors (``NotFound``, ``RegistryAuthError``) as subclasses.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional

from dedal.errors import DedalError, UserError

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_TYPES = (OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_MANIFEST_LIST)

SIF_CONFIG_MEDIA_TYPE = "application/vnd.sylabs.sif.config.v1+json"
SIF_LAYER_MEDIA_TYPE = "application/vnd.sylabs.sif.layer.v1.sif"
SIF_LAYER_MEDIA_TYPE_PROTO = "appliciation/vnd.sylabs.sif.layer.tar"  # sic: Singularity < 3.7, still accepted
SIF_LAYER_MEDIA_TYPES = (SIF_LAYER_MEDIA_TYPE, SIF_LAYER_MEDIA_TYPE_PROTO)
EMPTY_JSON = b"{}"
EMPTY_JSON_DIGEST = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
OCI_EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"

ANN_TITLE = "org.opencontainers.image.title"
ANN_CREATED = "org.opencontainers.image.created"
ANN_DESCRIPTION = "org.opencontainers.image.description"
ANN_SOURCE = "org.opencontainers.image.source"
ANN_REVISION = "org.opencontainers.image.revision"
ANN_ENVIRONMENT = "org.dedal.environment"
ANN_LOCK_HASH = "org.dedal.lock-hash"
ANN_SPACK_COMMIT = "org.dedal.spack-commit"
ANN_ARCH = "org.dedal.arch"
ANN_VERDICT = "org.dedal.verdict"
#: what the verification planned and did not run ("GPU checks skipped: no GPU"); absent when everything ran
ANN_SKIPPED = "org.dedal.verdict.skipped"

ARTIFACT_VERIFY = "application/vnd.dedal.verify.v1+json"
ARTIFACT_CYCLONEDX = "application/vnd.cyclonedx+json"
ARTIFACT_SPDX = "application/spdx+json"
ARTIFACT_FILE = "application/vnd.dedal.file.v1"
ARTIFACT_LOGS = "application/vnd.dedal.logs.v1.tar+gzip"  # the other files of an attached directory
ARTIFACT_LAYER = "application/vnd.dedal.layer.v1"  # a layer in a remote layer cache
ARTIFACT_INTOTO = "application/vnd.in-toto+json"  # a provenance statement (dedal.model.provenance)
LAYER_SQUASHFS = "application/vnd.dedal.layer.v1.squashfs"
LAYER_MANIFEST = "application/vnd.dedal.layer.manifest.v1+json"

FALLBACK_TAG = re.compile(r"^sha256-[0-9a-f]{64}$")


class RegistryError(DedalError):
    """A registry answered with an error, or could not be reached."""


# --------------------------------------------------------------------------- references

_HOST = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?$"
)
_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
SCHEME = "oras://"


@dataclass(frozen=True)
class Reference:
    """``oras://host[:port]/repository[:tag][@sha256:...]``."""

    host: str
    repository: str
    tag: Optional[str] = None
    digest: Optional[str] = None

    @property
    def ref(self) -> str:
        """What goes after ``/manifests/``: the digest if there is one, else the tag."""
        return self.digest or self.tag or "latest"

    @property
    def repo_url(self) -> str:
        return f"{SCHEME}{self.host}/{self.repository}"

    def with_tag(self, tag: str) -> "Reference":
        return Reference(self.host, self.repository, tag, None)

    def __str__(self) -> str:
        text = self.repo_url
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def valid_tag(text: str) -> bool:
    """Whether ``text`` is a tag the distribution grammar allows (at most 128 characters)."""
    return bool(_TAG.match(text))


def parse_reference(
    text: str, *, require_scheme: bool = True, repository_only: bool = False, allow_digest: bool = True
) -> Reference:
    """Parse an ``oras://`` reference; UserError (never echoing credentials) when bad."""
    original = text.strip() if isinstance(text, str) else ""
    if not original:
        raise UserError("empty registry reference (expected oras://HOST[:PORT]/REPO:TAG)")
    rest = original
    if rest.startswith(SCHEME):
        rest = rest[len(SCHEME) :]
    elif "://" in rest:
        scheme = rest.split("://", 1)[0]
        raise UserError(
            f"{scheme}:// references are not supported: dedal publishes and pulls oras://HOST[:PORT]/REPO:TAG"
        )
    elif require_scheme:
        raise UserError(f"{original!r}: expected oras://HOST[:PORT]/REPO:TAG")
    host, slash, path = rest.partition("/")
    if "@" in host:
        raise UserError(
            "credentials must not be written into the registry reference; use docker/podman "
            "login, $REGISTRY_AUTH_FILE, DEDAL_REGISTRY_USER + DEDAL_REGISTRY_PASSWORD or "
            "--password-stdin"
        )
    shown = f"{SCHEME}{rest}"
    if not host or not _HOST.match(host):
        raise UserError(f"{shown}: {host!r} is not a registry host[:port]")
    port = host.rsplit(":", 1)[1] if ":" in host and not host.endswith("]") else ""
    if port and not 0 < int(port) < 65536:
        raise UserError(f"{shown}: port {port} is not a TCP port (1-65535)")
    if not slash or not path:
        raise UserError(f"{shown}: no repository after the host (expected oras://{host}/REPO:TAG)")
    digest: Optional[str] = None
    if "@" in path:
        path, digest = path.split("@", 1)
        if not allow_digest:
            raise UserError(f"{shown}: a digest reference is not allowed here, use a tag")
        if not _DIGEST.match(digest):
            raise UserError(f"{shown}: {digest!r} is not a sha256 digest (sha256:<64 hex digits>)")
    tag: Optional[str] = None
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, tag = path.rsplit(":", 1)
        if not _TAG.match(tag):
            raise UserError(f"{shown}: {tag!r} is not a valid tag (letters, digits, '_', '.', '-'; at most 128)")
    for component in path.split("/"):
        if not component:
            raise UserError(f"{shown}: empty path component in repository {path!r}")
        if component != component.lower() and _COMPONENT.match(component.lower()):
            raise UserError(f"{shown}: repository names must be lowercase ({path!r})")
        if not _COMPONENT.match(component):
            raise UserError(
                f"{shown}: {component!r} is not a valid repository name component "
                "(lowercase letters, digits and single '.', '_' or '-' between them)"
            )
    if len(host) + 1 + len(path) > 255:
        raise UserError(f"{shown}: repository name longer than 255 characters")
    if repository_only and (tag or digest):
        raise UserError(f"{shown}: expected a repository (oras://{host}/{path}), not a tag or digest")
    return Reference(host, path, tag, digest)


def is_remote(arg: str) -> bool:
    return isinstance(arg, str) and arg.startswith(SCHEME)


def fallback_tag(digest: str) -> str:
    """The referrers tag schema's tag for ``digest``: ``sha256-<hex>``."""
    return digest.replace(":", "-", 1)


# --------------------------------------------------------------------------- digests, times, JSON


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def canonical_json(obj: Dict[str, Any]) -> bytes:
    """The bytes dedal sends for a manifest or index: compact, keys in insertion order."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


# --------------------------------------------------------------------------- manifests


@dataclass
class Manifest:
    """A manifest as the registry stores it: raw bytes, media type and digest."""

    raw: bytes
    media_type: str
    digest: str

    def json(self) -> Dict[str, Any]:
        try:
            data = json.loads(self.raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise RegistryError(f"manifest {self.digest} is not valid JSON") from None
        if not isinstance(data, dict):
            raise RegistryError(f"manifest {self.digest} is not a JSON object")
        return data


def sif_manifest(*, sif_digest: str, sif_size: int, title: str, annotations: Dict[str, str]) -> Dict[str, Any]:
    """The manifest ``apptainer push`` writes for a SIF (plus dedal's annotations)."""
    return {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": SIF_CONFIG_MEDIA_TYPE, "digest": EMPTY_JSON_DIGEST, "size": 2, "data": "e30="},
        "layers": [
            {
                "mediaType": SIF_LAYER_MEDIA_TYPE,
                "digest": sif_digest,
                "size": sif_size,
                "annotations": {ANN_TITLE: title},
            }
        ],
        "annotations": dict(annotations),
    }


def artifact_manifest(
    *, artifact_type: str, layers: List[Dict[str, Any]], subject: Dict[str, Any], annotations: Dict[str, str]
) -> Dict[str, Any]:
    """An OCI 1.1 artifact manifest (empty config) that refers to ``subject``."""
    return {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": {"mediaType": OCI_EMPTY_MEDIA_TYPE, "digest": EMPTY_JSON_DIGEST, "size": 2, "data": "e30="},
        "layers": layers,
        "subject": subject,
        "annotations": dict(annotations),
    }


def layer_artifact(
    *, squashfs: Dict[str, Any], manifest: Dict[str, Any], annotations: Dict[str, str]
) -> Dict[str, Any]:
    """The OCI 1.1 artifact of one layer in a remote layer cache: its squashfs and its
    layer manifest (dedal.model.layers) as blobs, found by a tag derived from the key."""
    return {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": ARTIFACT_LAYER,
        "config": {"mediaType": OCI_EMPTY_MEDIA_TYPE, "digest": EMPTY_JSON_DIGEST, "size": 2, "data": "e30="},
        "layers": [dict(squashfs, mediaType=LAYER_SQUASHFS), dict(manifest, mediaType=LAYER_MANIFEST)],
        "annotations": dict(annotations),
    }


def check_sif_manifest(manifest: Dict[str, Any], where: str) -> Dict[str, Any]:
    """The SIF layer of a manifest, with Apptainer's rules (one layer, SIF media type)."""
    layers = manifest.get("layers")
    if not isinstance(layers, list):
        raise RegistryError(f"{where}: not an image manifest (no layers)")
    if len(layers) != 1:
        raise RegistryError(f"{where}: ORAS SIF image should have a single layer, found {len(layers)}")
    layer = layers[0]
    if not isinstance(layer, dict) or layer.get("mediaType") not in SIF_LAYER_MEDIA_TYPES:
        mt = layer.get("mediaType") if isinstance(layer, dict) else None
        raise RegistryError(
            f"{where}: invalid layer mediatype: {mt} (not a SIF image; expected {SIF_LAYER_MEDIA_TYPE})"
        )
    if not isinstance(layer.get("digest"), str) or not _DIGEST.match(layer["digest"]):
        raise RegistryError(f"{where}: the SIF layer has no sha256 digest")
    if not isinstance(layer.get("size"), int) or layer["size"] < 0:
        raise RegistryError(f"{where}: the SIF layer has no valid size")
    return layer


def sif_problems(manifest: Dict[str, Any]) -> List[str]:
    """Where a manifest differs from what ``apptainer push`` writes (empty: identical shape)."""
    problems: List[str] = []
    if manifest.get("mediaType") != OCI_MANIFEST:
        problems.append(f"manifest media type {manifest.get('mediaType')!r}")
    cfg = manifest.get("config") or {}
    if cfg.get("mediaType") != SIF_CONFIG_MEDIA_TYPE:
        problems.append(f"config media type {cfg.get('mediaType')!r}")
    if cfg.get("digest") != EMPTY_JSON_DIGEST or cfg.get("size") != 2:
        problems.append("config is not {}")
    try:
        layer = check_sif_manifest(manifest, "manifest")
        if layer.get("mediaType") != SIF_LAYER_MEDIA_TYPE:
            problems.append(f"legacy layer media type {layer.get('mediaType')!r}")
        if not (layer.get("annotations") or {}).get(ANN_TITLE):
            problems.append("no title annotation on the layer")
    except RegistryError as exc:
        problems.append(str(exc).split(": ", 1)[-1])
    return problems


# the private IPv4 networks of RFC 1918
PRIVATE_NETWORKS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")


def local_registry(host: str) -> bool:
    """A registry Apptainer reaches over plain http when https fails, without
    ``--no-https`` (go-containerregistry's ``name.Registry.Scheme``): ``localhost:PORT``,
    ``*.localhost``, a loopback address (127.0.0.0/8, ::1) or a private one (RFC 1918:
    10/8, 172.16/12, 192.168/16). Certificates are still verified when https answers."""
    if host.startswith("[") and "]" in host:  # [IPv6]:PORT
        name = host[1 : host.index("]")]
    else:
        name = host.split(":")[0] if host.count(":") == 1 else host
    name = name.lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        addr = ipaddress.ip_address(name)
    except ValueError:
        return False
    if addr.is_loopback:
        return True
    return addr.version == 4 and any(addr in ipaddress.ip_network(n) for n in PRIVATE_NETWORKS)
