"""Downloading one blob: streamed into a file, its length and sha256 checked against what
the manifest states, broken transfers restarted (transient errors, up to the client's
retries). Shared by ``dedal pull`` (the publish stage) and the build stage's remote layer
cache, which both refuse what is not what its manifest promises (:class:`IntegrityError`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from dedal.adapters.registry.client import CHUNK, RegistryClient
from dedal.adapters.registry.errors import TRANSIENT_ERRORS, IntegrityError, short_reason
from dedal.model.oci import RegistryError
from dedal.ui.progress import meter

__all__ = ["download_blob"]


def download_blob(client: RegistryClient, repository: str, digest: str, size: int, tmp: Path, what: str) -> None:
    """Stream a blob into ``tmp`` checking length and sha256; broken transfers restart."""
    attempt = 0
    furthest = 0  # bytes the furthest attempt got: only more is progress (a retry reads the start again)
    while True:
        h = hashlib.sha256()
        got = 0
        try:
            with (
                client.get_blob_stream(repository, digest) as response,
                open(tmp, "wb") as fh,
                meter(f"download {digest[7:19]}", size) as m,
            ):
                for chunk in response.iter_content(CHUNK):
                    got += len(chunk)
                    m.update(got)
                    client.progressed(new=got > furthest)  # bytes came: the operation's deadline starts again
                    furthest = max(furthest, got)
                    if got > size:
                        raise IntegrityError(
                            f"{what}: the registry sent more than the {size} bytes the "
                            "manifest states; refusing the download"
                        )
                    h.update(chunk)
                    fh.write(chunk)
                fh.flush()
                os.fsync(fh.fileno())
            break
        except TRANSIENT_ERRORS as exc:
            attempt += 1
            if attempt > client.retries:
                raise RegistryError(
                    f"{what}: download of {digest} broke off after {attempt} attempt(s) ({short_reason(exc)})"
                ) from None
            client.wait_before_retry(
                attempt, f"download of {digest[:19]} broke off ({short_reason(exc)})", kind="download"
            )
    if got != size:
        raise IntegrityError(
            f"{what}: size mismatch: the manifest states {size} bytes, the registry sent {got}; refusing the download"
        )
    actual = "sha256:" + h.hexdigest()
    if actual != digest:
        raise IntegrityError(
            f"{what}: sha256 mismatch: the manifest states {digest}, the downloaded bytes "
            f"are {actual}; refusing the download"
        )
