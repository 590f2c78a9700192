"""The OCI registry adapter: the one place dedal talks HTTP to registries.

This is its public face; the parts are split the way Spack splits ``spack.oci``:

* ``auth``: credentials (flags, ``DEDAL_REGISTRY_USER`` / ``DEDAL_REGISTRY_PASSWORD``,
  ``$REGISTRY_AUTH_FILE``, Podman's and Docker's config files, Docker credential
  helpers) and the answers to authentication challenges (Basic, bearer tokens);
* ``transport``: oras-py's ``Registry`` with dedal's transport underneath (retries with
  backoff within a deadline, https probing, answers read bounded);
* ``client``: ``RegistryClient``, the requests dedal makes over that transport (chunked
  uploads, streaming downloads, manifests as raw bytes, referrers, tags);
* ``download``: ``download_blob``, one blob streamed to a file, its length and sha256
  checked (``IntegrityError`` where they are not what the manifest states);
* ``errors``: ``NotFound``, ``IntegrityError``, ``RegistryAuthError``, ``TooLarge`` (an answer over
  ``ANSWER_LIMIT``, exit 2), what counts as a transient failure, and URLs and reasons
  cut down for messages.

The values it carries (media types, ``Manifest``, digests, ``RegistryError``) are
``dedal.model.oci``'s and are re-exported here for callers that only speak to the
registry. Credentials never appear in an exception, a log record or a ``repr``: errors
name the registry, the method and the path (query strings, which may carry signed
tokens, are cut off).
"""

from __future__ import annotations

from dedal.adapters.registry.auth import (
    Credentials,
    RegistryAuth,
    auth_files,
    credentials_from_file,
    parse_challenge,
    resolve_credentials,
)
from dedal.adapters.registry.client import (
    Access,
    Progress,
    RegistryClient,
    file_digest,
    registry_access,
)
from dedal.adapters.registry.download import download_blob
from dedal.adapters.registry.transport import CHUNK, RETRY_STATUS
from dedal.adapters.registry.errors import (
    ANSWER_LIMIT,
    TRANSIENT_ERRORS,
    IntegrityError,
    NotFound,
    RegistryAuthError,
    TooLarge,
    redact_url,
    short_reason,
)
from dedal.model.oci import (
    DOCKER_MANIFEST,
    DOCKER_MANIFEST_LIST,
    MANIFEST_TYPES,
    OCI_INDEX,
    OCI_MANIFEST,
    Manifest,
    RegistryError,
    sha256_digest,
)

__all__ = [
    "DOCKER_MANIFEST",
    "DOCKER_MANIFEST_LIST",
    "MANIFEST_TYPES",
    "OCI_INDEX",
    "OCI_MANIFEST",
    "Manifest",
    "RegistryError",
    "RegistryAuthError",
    "NotFound",
    "Credentials",
    "RegistryAuth",
    "auth_files",
    "credentials_from_file",
    "resolve_credentials",
    "parse_challenge",
    "RegistryClient",
    "Access",
    "registry_access",
    "Progress",
    "sha256_digest",
    "file_digest",
    "redact_url",
    "short_reason",
    "CHUNK",
    "RETRY_STATUS",
    "TRANSIENT_ERRORS",
    "TooLarge",
    "ANSWER_LIMIT",
    "IntegrityError",
    "download_blob",
]
