"""What goes wrong talking to a registry, and how it is told.

The error classes the transport raises (``RegistryError`` itself is defined with the
OCI values in ``dedal.model.oci``, since a manifest that is not what it should be is
one too; ``TooLarge``, exit 2, for an answer over the bytes dedal reads of it, which
:func:`read_body` bounds), the exceptions worth a retry, and the two helpers that keep
messages short and safe: ``redact_url`` drops user info and query strings (upload state, signed
tokens) and ``short_reason`` turns requests' nested exception texts into a few words.
Shared by the credential/challenge code (``auth``), the client, and the publish stage's
download loop.
"""

from __future__ import annotations

from typing import Tuple
from urllib.parse import urlsplit, urlunsplit

import requests
import requests.exceptions

from dedal.model.inputs import too_large
from dedal.model.oci import RegistryError

TRANSIENT_ERRORS = (
    requests.exceptions.ConnectionError,
    requests.exceptions.ChunkedEncodingError,
    requests.exceptions.Timeout,
)


class IntegrityError(RegistryError):
    """What the registry sent is not what its manifest promises (size, digest, SIF)."""


class RegistryAuthError(RegistryError):
    """Authentication was required and failed (no, or wrong, credentials)."""


class NotFound(RegistryError):
    """A manifest, blob or repository does not exist."""


class TooLarge(RegistryError):
    """What a registry sent is larger than dedal reads of its kind: refused input, exit 2."""

    exit_code = 2


ANSWER_LIMIT = 4 << 20  # bytes of an answer read whole (a manifest, an index, a token): the
#                         4 MiB the OCI distribution spec has registries accept for a manifest
ERROR_BODY_LIMIT = 64 << 10  # bytes of an error answer read for its error codes


def read_body(response: requests.Response, limit: int, what: str) -> bytes:
    """The body of a streamed ``response``, at most ``limit`` bytes: TooLarge (and the
    connection closed) for a larger one, whether its Content-Length says so or not."""
    length = response.headers.get("Content-Length", "")
    if length.isdigit() and int(length) > limit:
        response.close()
        raise TooLarge(too_large(what, limit, int(length)))
    data = bytearray()
    for chunk in response.iter_content(1 << 16):
        data += chunk
        if len(data) > limit:
            response.close()
            raise TooLarge(too_large(what, limit))
    return bytes(data)


def error_body(response: requests.Response) -> bytes:
    """The body of an error answer, for its error codes: empty where it is over
    ERROR_BODY_LIMIT (the status is the answer; a flood is not read further)."""
    try:
        return read_body(response, ERROR_BODY_LIMIT, "an error answer")
    except TooLarge:
        return b""


def transport_failure(exc: BaseException, timeouts: Tuple[float, float]) -> str:
    """A transport failure in a few words; a timeout with the time waited (``no answer in
    10 s``: the registry took the connection and said nothing)."""
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return f"no connection in {timeouts[0]:.0f} s"
    if isinstance(exc, requests.exceptions.Timeout):
        return f"no answer in {timeouts[1]:.0f} s"
    return short_reason(exc)


def redact_url(url: str) -> str:
    """A URL fit for messages: no user info, no query string (upload state, signed tokens)."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


_REASONS = (
    ("WRONG_VERSION_NUMBER", "the server does not speak TLS"),
    ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed"),
    ("Connection refused", "connection refused"),
    ("Name or service not known", "unknown host name"),
    ("Temporary failure in name resolution", "host name lookup failed"),
    ("timed out", "timed out"),
    ("Connection reset", "connection reset"),
    ("RemoteDisconnected", "the server closed the connection"),
    ("IncompleteRead", "the transfer broke off"),
)


def short_reason(exc: BaseException) -> str:
    """A short reason for a transport exception (requests' texts are long and nested)."""
    text = repr(exc)
    for needle, reason in _REASONS:
        if needle in text:
            return reason
    return type(exc).__name__
