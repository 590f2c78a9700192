"""The registry client: one host, the requests dedal makes of it, over dedal's transport.

``RegistryClient`` is oras-py's ``Registry`` with :class:`~dedal.adapters.registry.transport.Transport`
underneath (authentication, retries within a deadline, https probing, bounded answers); it adds
what publish, pull and the layer cache ask of a registry: blob existence checks and chunked
uploads (restarted from a new session on failure), manifests as raw bytes in and out (digests
are over bytes, so dedal never lets a JSON library re-serialise a manifest it has to refer to),
the OCI 1.1 referrers API, paginated tag lists and streamed or small in-memory blob downloads.

Errors name the registry, the method and the path, never credentials.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Union

import oras.container
import oras.provider
import requests
import requests.exceptions

from dedal.adapters.registry.auth import Credentials, resolve_credentials
from dedal.adapters.registry.errors import NotFound, RegistryAuthError, TooLarge
from dedal.adapters.registry.stall import Counted
from dedal.adapters.registry.transport import BACKOFF, CHUNK, DEADLINE, RETRIES, TIMEOUT, Transport
from dedal.model.inputs import too_large
from dedal.model.oci import MANIFEST_TYPES, OCI_INDEX, Manifest, RegistryError, sha256_digest
from dedal.ui.console import human_size
from dedal.ui.progress import meter

if TYPE_CHECKING:
    from dedal.model.config import Settings

Progress = Optional[Callable[[str], None]]


def file_digest(path: Union[str, os.PathLike]) -> Tuple[str, int]:
    """``("sha256:<hex>", size)`` of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            h.update(chunk)
            size += len(chunk)
    return "sha256:" + h.hexdigest(), size


class RegistryClient(Transport):
    """One registry host (``host[:port]``); oras-py's Registry with dedal's transport
    (:class:`~dedal.adapters.registry.transport.Transport`: its arguments, ``retries``,
    ``backoff``, ``insecure``, ``timeout``, ``deadline``, are the bounds of every request)."""

    def __repr__(self) -> str:
        return f"RegistryClient({self.host!r}, insecure={self.insecure}, credentials={'yes' if self._auth.creds else 'no'})"

    __str__ = __repr__

    def ping(self) -> None:
        """``GET /v2/``: reachable, speaks the registry API, and our credentials work."""
        r = self.do_request("/v2/", "GET")
        if r.status_code != 200:
            raise self.error(r, "GET", self.url("/v2/"))

    def container(self, repository: str, ref: str = "latest") -> oras.container.Container:
        """An oras-py Container for this host (fields set directly: oras-py's parser would
        take a host without a dot or port, e.g. ``localhost``, for a namespace)."""
        c = oras.container.Container("placeholder", registry=self.host)
        c.registry = self.host
        namespace, _, name = repository.rpartition("/")
        c.namespace = namespace or None
        c.repository = name
        c.tag, c.digest = (None, ref) if ref.startswith("sha256:") else (ref, None)
        return c

    def blob_exists_digest(self, repository: str, digest: str) -> bool:
        """HEAD the blob (oras-py's ``blob_exists``)."""
        _ = self.base
        return bool(self.blob_exists({"digest": digest}, self.container(repository)))

    def push_blob(
        self, repository: str, path: Union[str, os.PathLike], digest: str, size: int, progress: Progress = None
    ) -> bool:
        """Upload a file as a blob unless the registry already has it (HEAD first).

        Returns True when bytes were sent. A failed upload (broken connection, 5xx) is
        restarted from a new upload session, with backoff, ``retries`` times.
        """
        if self.blob_exists_digest(repository, digest):
            self.stats["blobs_skipped"] += 1
            if progress:
                progress(f"blob {digest[:19]} ({human_size(size)}) already in the registry, not uploaded")
            return False
        if progress:
            progress(f"uploading blob {digest[:19]} ({human_size(size)})")
        attempt = 0
        furthest = [0]  # bytes of the blob the furthest attempt got out: only more is progress
        while True:
            try:
                self._upload_once(repository, Path(path), digest, size, furthest)
                break
            except RegistryAuthError:
                raise
            except RegistryError as exc:
                attempt += 1
                if attempt > self.retries:
                    raise
                if self.blob_exists_digest(repository, digest):  # finished server-side after all
                    break
                self.wait_before_retry(attempt, f"upload of {digest[:19]} failed: {exc.one_line()}", kind="upload")
        self.stats["blobs_uploaded"] += 1
        self.stats["bytes_uploaded"] += size
        return True

    def _all_sent(self) -> None:
        if self._stall is not None:
            self._stall.finished_sending()

    def _upload_once(self, repository: str, path: Path, digest: str, size: int, furthest: List[int]) -> None:
        r = self.do_request(f"/v2/{repository}/blobs/uploads/", "POST", headers={"Content-Length": "0"}, ok=(202,))
        location = self._get_location(r, self.container(repository))
        if not location:
            raise RegistryError(f"POST /v2/{repository}/blobs/uploads/: no Location header in the answer")
        if location.startswith("/"):
            location = self.url(location)
        sep = "&" if "?" in location else "?"
        put_url = f"{location}{sep}digest={digest}"
        at = [0]
        with open(path, "rb") as fh, meter(f"upload {digest[7:19]}", size) as m:

            def sent(n: int) -> None:
                m.advance(n)
                at[0] += n
                self.progressed(n, new=at[0] > furthest[0])
                furthest[0] = max(furthest[0], at[0])

            r = self.do_request(
                put_url,
                "PUT",
                data=Counted(fh, size, sent, self._all_sent),  # type: ignore[arg-type]
                headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
                retry=False,
            )
        if r.status_code != 201:
            raise self.error(r, "PUT", put_url)
        got = r.headers.get("Docker-Content-Digest")
        if got and got != digest:
            raise RegistryError(f"registry {self.host} stored blob {got}, expected {digest}")

    def push_bytes(self, repository: str, data: bytes, progress: Progress = None) -> Tuple[str, int, bool]:
        """Upload a small in-memory blob (config, JSON); returns (digest, size, uploaded)."""
        digest = sha256_digest(data)
        with tempfile.NamedTemporaryFile(prefix="dedal-blob-") as fh:
            fh.write(data)
            fh.flush()
            uploaded = self.push_blob(repository, fh.name, digest, len(data), progress)
        return digest, len(data), uploaded

    def put_manifest(self, repository: str, ref: str, raw: bytes, media_type: str) -> requests.Response:
        """PUT manifest bytes under a tag or digest; checks the digest the registry reports."""
        url = f"/v2/{repository}/manifests/{ref}"
        r = self.do_request(url, "PUT", data=raw, headers={"Content-Type": media_type}, ok=(200, 201))
        got = r.headers.get("Docker-Content-Digest")
        if got and got != sha256_digest(raw):
            raise RegistryError(
                f"registry {self.host} stored manifest {repository}:{ref} as {got}, expected {sha256_digest(raw)}"
            )
        return r

    def get_manifest_raw(self, repository: str, ref: str, accept: Tuple[str, ...] = MANIFEST_TYPES) -> Manifest:
        """GET a manifest by tag or digest, as bytes (NotFound when absent)."""
        url = f"/v2/{repository}/manifests/{ref}"
        r = self.do_request(url, "GET", headers={"Accept": ", ".join(accept)}, ok=(200,))
        raw = r.content
        digest = sha256_digest(raw)
        if ref.startswith("sha256:") and digest != ref:
            raise RegistryError(f"manifest {repository}@{ref}: the registry sent bytes with digest {digest}")
        media_type = (r.headers.get("Content-Type") or "").split(";")[0].strip()
        if not media_type or media_type in ("application/json", "application/octet-stream"):
            try:
                media_type = json.loads(raw).get("mediaType") or media_type
            except (ValueError, AttributeError):
                pass
        return Manifest(raw, media_type, digest)

    def head_manifest(self, repository: str, ref: str) -> Optional[str]:
        """The digest a tag points to, or None when it does not exist."""
        r = self.do_request(
            f"/v2/{repository}/manifests/{ref}", "HEAD", headers={"Accept": ", ".join(MANIFEST_TYPES)}, ok=(200, 404)
        )
        if r.status_code == 404:
            return None
        return r.headers.get("Docker-Content-Digest")

    def delete_manifest(self, repository: str, digest: str) -> None:
        self.do_request(f"/v2/{repository}/manifests/{digest}", "DELETE", ok=(202, 200))

    def tags(self, repository: str) -> List[str]:
        """All tags of a repository (oras-py ``get_tags``, which follows pagination)."""
        _ = self.base
        try:
            return list(self.get_tags(self.container(repository)))
        except NotFound:
            raise NotFound(f"repository {self.host}/{repository} not found") from None

    def referrers(
        self, repository: str, digest: str, artifact_type: Optional[str] = None
    ) -> Optional[List[Dict[str, Any]]]:
        """Descriptors of manifests whose ``subject`` is ``digest`` through the OCI 1.1
        referrers API; None when the registry has no such API (404)."""
        url = f"/v2/{repository}/referrers/{digest}"
        if artifact_type:
            url += f"?artifactType={artifact_type}"
        r = self.do_request(url, "GET", headers={"Accept": OCI_INDEX}, ok=(200, 404, 400, 405))
        if r.status_code != 200:
            return None
        try:
            data = r.json()
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("manifests"), list):
            return None
        found = [d for d in data["manifests"] if isinstance(d, dict)]
        if artifact_type:
            found = [d for d in found if d.get("artifactType") == artifact_type]
        return found

    def get_blob_stream(self, repository: str, digest: str) -> requests.Response:
        """A streaming GET of a blob (oras-py ``get_blob``); the caller closes it."""
        _ = self.base
        r = self.get_blob(self.container(repository), digest, stream=True)
        if r.status_code != 200:
            raise self.error(r, "GET", self.url(f"/v2/{repository}/blobs/{digest}"))
        return r

    def get_blob_bytes(self, repository: str, digest: str, limit: int = 16 << 20) -> bytes:
        """A small blob in memory (a config, a layer's manifest, a report), checked against
        its digest; TooLarge (exit 2) beyond ``limit`` bytes."""
        with self.get_blob_stream(repository, digest) as r:
            data = b""
            for chunk in r.iter_content(CHUNK):
                self.progressed()
                data += chunk
                if len(data) > limit:
                    raise TooLarge(too_large(f"blob {repository}@{digest}", limit))
        if sha256_digest(data) != digest:
            raise RegistryError(f"blob {repository}@{digest}: the registry sent bytes with another sha256")
        return data


@dataclass(frozen=True)
class Access:
    """How one command reaches its registries: plain HTTP or TLS (``insecure``), whose
    credentials (``creds`` as given, else ``username``/``password``, else those found for
    the host: $DEDAL_REGISTRY_USER, the auth files) and the bounds of every request
    (``retries``, ``backoff``, ``timeout``, ``deadline``; ``sleep``: how a retry waits).
    One value, so that publish, pull, list, inspect and the layer cache open their clients
    the same way and take the same thing."""

    insecure: bool = False
    creds: Optional[Credentials] = None
    username: Optional[str] = None
    password: Optional[str] = field(default=None, repr=False)
    retries: int = RETRIES
    backoff: float = BACKOFF
    timeout: float = TIMEOUT
    deadline: float = DEADLINE
    sleep: Callable[[float], None] = time.sleep

    def client(self, host: str, repository: str = "") -> RegistryClient:
        """A client of ``host`` with the credentials for ``repository`` resolved."""
        creds = self.creds
        if creds is None:
            creds = resolve_credentials(host, repository, username=self.username, password=self.password)
        return RegistryClient(
            host,
            creds=creds,
            insecure=self.insecure,
            retries=self.retries,
            backoff=self.backoff,
            timeout=self.timeout,
            deadline=self.deadline,
            sleep=self.sleep,
        )


def registry_access(settings: Settings, *, username: Optional[str] = None, password: Optional[str] = None) -> Access:
    """The access dedal's settings give (registry_insecure, registry_timeout_s,
    registry_deadline_s), with the user's credentials where given."""
    return Access(
        insecure=bool(settings.registry_insecure),
        username=username,
        password=password,
        timeout=float(settings.registry_timeout_s),
        deadline=float(settings.registry_deadline_s),
    )
