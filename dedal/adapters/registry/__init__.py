"""The OCI registry adapter: the one place dedal talks HTTP to registries.

Built on oras-py's ``Registry`` (blob existence checks, chunked uploads, paginated tag
lists, blob downloads, URL building), with dedal's own transport underneath
(``do_request``):

* authentication: HTTP Basic and the bearer-token flow (``WWW-Authenticate: Bearer
  realm=...,service=...,scope=...``), answered only when the registry asks;
* retries with exponential backoff on 5xx/429 answers and broken connections (a
  body read from a file is rewound before every attempt);
* ``https`` with certificate verification unless ``insecure`` is asked for, in which
  case unverified https is tried first and plain http second;
* raw manifest bytes in and out (digests are over bytes, so dedal never lets a JSON
  library re-serialise a manifest it has to refer to), the OCI 1.1 referrers API and
  the tag listing.

Credentials come from ``resolve_credentials`` (flags, ``DEDAL_REGISTRY_USER`` /
``DEDAL_REGISTRY_PASSWORD``, ``$REGISTRY_AUTH_FILE``, Podman's and Docker's config
files, Docker credential helpers). They never appear in an exception, a log record or a
``repr``: errors name the registry, the method and the path (query strings, which may
carry signed tokens, are cut off).
"""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Dict, List, Mapping, Optional, Tuple, Union
from urllib.parse import urlsplit, urlunsplit

import oras.container
import oras.defaults
import oras.provider
import requests
import requests.exceptions

from dedal.adapters import proc
from dedal.errors import UserError
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

log = logging.getLogger("dedal.registry")

RETRY_STATUS = (429, 500, 502, 503, 504)
TRANSIENT_ERRORS = (
    requests.exceptions.ConnectionError,
    requests.exceptions.ChunkedEncodingError,
    requests.exceptions.Timeout,
)
CHUNK = 1 << 20


class RegistryAuthError(RegistryError):
    """Authentication was required and failed (no, or wrong, credentials)."""


class NotFound(RegistryError):
    """A manifest, blob or repository does not exist."""


def redact_url(url: str) -> str:
    """A URL fit for messages: no user info, no query string (upload state, signed tokens)."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


# --------------------------------------------------------------------------- credentials


@dataclass(frozen=True)
class Credentials:
    """A user name and a secret (password or token); the secret never shows in repr/str."""

    username: str
    password: str
    origin: str = ""  # where they came from, e.g. "$REGISTRY_AUTH_FILE" (for messages)

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, password=<hidden>, origin={self.origin!r})"

    __str__ = __repr__

    def basic(self) -> str:
        return base64.b64encode(f"{self.username}:{self.password}".encode("utf-8")).decode("ascii")


def auth_files(environ: Optional[Mapping[str, str]] = None) -> List[Path]:
    """Container-tool credential files in the order they are consulted (like Podman):
    ``$REGISTRY_AUTH_FILE``, ``$XDG_RUNTIME_DIR/containers/auth.json``,
    ``$DOCKER_CONFIG/config.json`` (default ``~/.docker/config.json``)."""
    env = os.environ if environ is None else environ
    files: List[Path] = []
    if env.get("REGISTRY_AUTH_FILE"):
        files.append(Path(env["REGISTRY_AUTH_FILE"]).expanduser())
    if env.get("XDG_RUNTIME_DIR"):
        files.append(Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json")
    docker_dir = env.get("DOCKER_CONFIG") or str(Path(env.get("HOME") or Path.home()) / ".docker")
    files.append(Path(docker_dir).expanduser() / "config.json")
    return files


def _auth_key_host(key: str) -> str:
    """``https://host:5000/v1/`` -> ``host:5000``; ``host/ns/repo`` stays as it is."""
    if "://" in key:
        key = key.split("://", 1)[1].split("/", 1)[0]
    return key.rstrip("/")


def _entry_credentials(entry: Any, origin: str) -> Optional[Credentials]:
    if not isinstance(entry, dict):
        return None
    if isinstance(entry.get("auth"), str) and entry["auth"]:
        try:
            text = base64.b64decode(entry["auth"], validate=False).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            raise UserError(f"{origin}: an 'auth' entry is not base64 of user:password") from None
        if ":" not in text:
            raise UserError(f"{origin}: an 'auth' entry is not base64 of user:password")
        user, password = text.split(":", 1)
        return Credentials(user, password, origin)
    if entry.get("username") and entry.get("password"):
        return Credentials(str(entry["username"]), str(entry["password"]), origin)
    return None


def _credential_helper(helper: str, host: str, origin: str) -> Optional[Credentials]:
    result = proc.run([f"docker-credential-{helper}", "get"], input=host, what=f"credential helper {helper}",
                      check=False)
    if result.returncode != 0:
        if "credentials not found" in (result.stdout + result.stderr).lower():
            return None
        # the helper's output may echo secrets: report only the exit code
        raise RegistryAuthError(f"credential helper docker-credential-{helper} (from {origin}) failed "
                                f"for {host} with exit code {result.returncode}")
    try:
        data = json.loads(result.stdout)
        return Credentials(str(data["Username"]), str(data["Secret"]), f"docker-credential-{helper}")
    except (ValueError, KeyError, TypeError):
        raise RegistryAuthError(f"credential helper docker-credential-{helper} returned no usable "
                                f"credentials for {host}") from None


def credentials_from_file(path: Path, host: str, repository: str = "") -> Optional[Credentials]:
    """Look ``host`` (or ``host/repository`` prefixes, most specific first) up in one
    Docker/Podman auth file; credential helpers named there are asked through ``proc``."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UserError(f"{path}: cannot read registry credentials ({exc.strerror})") from None
    except ValueError:
        raise UserError(f"{path}: not valid JSON (registry credentials file)") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object (registry credentials file)")
    auths = data.get("auths") or {}
    by_key: Dict[str, Any] = {}
    for key, entry in (auths.items() if isinstance(auths, dict) else []):
        by_key.setdefault(_auth_key_host(str(key)), entry)
    wanted = [host]
    parts = [p for p in repository.split("/") if p]
    for i in range(len(parts), 0, -1):
        wanted.insert(len(wanted) - 1, f"{host}/{'/'.join(parts[:i])}")
    for key in wanted:
        creds = _entry_credentials(by_key.get(key), str(path))
        if creds:
            return creds
    helpers = data.get("credHelpers") or {}
    if isinstance(helpers, dict) and helpers.get(host):
        return _credential_helper(str(helpers[host]), host, str(path))
    if data.get("credsStore") and host in by_key:
        return _credential_helper(str(data["credsStore"]), host, str(path))
    return None


def resolve_credentials(
    host: str,
    repository: str = "",
    *,
    username: Optional[str] = None,
    password: Optional[str] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> Optional[Credentials]:
    """Credentials for ``host``, from the first source that has some:

    1. ``password`` given by the caller (``--password-stdin``), with ``username`` or
       ``DEDAL_REGISTRY_USER``;
    2. ``DEDAL_REGISTRY_USER`` + ``DEDAL_REGISTRY_PASSWORD``;
    3. the auth files of ``auth_files()`` (Podman/Docker format, credential helpers).

    None means anonymous access.
    """
    env = os.environ if environ is None else environ
    user = username or env.get("DEDAL_REGISTRY_USER") or ""
    if password is not None:
        if not user:
            raise UserError("a password was given but no user name: pass --username or set DEDAL_REGISTRY_USER")
        if not password:
            raise UserError("the password read from standard input is empty")
        return Credentials(user, password, "standard input")
    env_password = env.get("DEDAL_REGISTRY_PASSWORD")
    if env_password:
        if not user:
            raise UserError("DEDAL_REGISTRY_PASSWORD is set but DEDAL_REGISTRY_USER is not")
        return Credentials(user, env_password, "DEDAL_REGISTRY_USER/DEDAL_REGISTRY_PASSWORD")
    if username and not env_password:
        raise UserError(f"--username {username} needs a password: --password-stdin or DEDAL_REGISTRY_PASSWORD")
    for path in auth_files(env):
        creds = credentials_from_file(path, host, repository)
        if creds:
            return creds
    return None


# --------------------------------------------------------------------------- auth challenges


_PARAM = re.compile(r'([A-Za-z_]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]+))')


def parse_challenge(header: str) -> Tuple[str, Dict[str, str]]:
    """``Bearer realm="https://auth",service="reg",scope="repository:a:pull"`` ->
    ("bearer", {...}). Only the first challenge is used."""
    header = header.strip()
    scheme, _, rest = header.partition(" ")
    params = {m.group(1).lower(): (m.group(2) if m.group(2) is not None else m.group(3))
              for m in _PARAM.finditer(rest)}
    return scheme.lower(), params


class _Auth:
    """Remembers how this registry wants to be authenticated; never logs secrets."""

    def __init__(self, host: str, creds: Optional[Credentials]) -> None:
        self.host = host
        self.creds = creds
        self.scheme: Optional[str] = None  # "basic" or "bearer" once the registry asked
        self.tokens: Dict[str, str] = {}  # scope -> bearer token
        self.current_scope: Optional[str] = None

    def __repr__(self) -> str:
        return f"_Auth(host={self.host!r}, scheme={self.scheme!r}, credentials={'yes' if self.creds else 'no'})"

    def header(self) -> Dict[str, str]:
        if self.scheme == "basic" and self.creds:
            return {"Authorization": f"Basic {self.creds.basic()}"}
        if self.scheme == "bearer" and self.current_scope in self.tokens:
            return {"Authorization": f"Bearer {self.tokens[self.current_scope]}"}
        return {}

    def _who(self) -> str:
        if not self.creds:
            return ("no credentials were found (docker/podman login, $REGISTRY_AUTH_FILE, "
                    "DEDAL_REGISTRY_USER + DEDAL_REGISTRY_PASSWORD, or --password-stdin)")
        return f"user {self.creds.username!r} from {self.creds.origin or 'the command line'}"

    def answer(self, response: requests.Response, session: requests.Session, verify: Any,
               already_sent: bool) -> None:
        """Handle a 401: set up what ``header()`` returns, or raise RegistryAuthError."""
        challenge = response.headers.get("WWW-Authenticate", "")
        scheme, params = parse_challenge(challenge) if challenge else ("", {})
        if scheme == "basic":
            if not self.creds:
                raise RegistryAuthError(f"registry {self.host} requires authentication; {self._who()}")
            if already_sent and self.scheme == "basic":
                raise RegistryAuthError(f"registry {self.host} refused the credentials of {self._who()} "
                                        "(wrong user name or password?)")
            self.scheme = "basic"
            return
        if scheme == "bearer":
            scope = params.get("scope", "")
            if already_sent and self.scheme == "bearer" and scope == self.current_scope:
                what = "refused the token it issued" if self.creds else "requires authentication"
                raise RegistryAuthError(f"registry {self.host} {what}; {self._who()}")
            self.scheme = "bearer"
            self.current_scope = scope
            if scope not in self.tokens:
                self.tokens[scope] = self._fetch_token(params, session, verify)
            return
        raise RegistryAuthError(f"registry {self.host} asks for unsupported authentication "
                                f"{scheme or '(no WWW-Authenticate header)'}")

    def _fetch_token(self, params: Dict[str, str], session: requests.Session, verify: Any) -> str:
        realm = params.get("realm")
        if not realm:
            raise RegistryAuthError(f"registry {self.host}: bearer challenge without a realm")
        query = {k: params[k] for k in ("service", "scope") if params.get(k)}
        headers = {"Accept": "application/json"}
        if self.creds:
            headers["Authorization"] = f"Basic {self.creds.basic()}"
        log.debug("requesting a bearer token from %s (service=%s, scope=%s, with credentials: %s)",
                  redact_url(realm), query.get("service"), query.get("scope"), bool(self.creds))
        try:
            r = session.get(realm, params=query, headers=headers, verify=verify, timeout=60)
        except TRANSIENT_ERRORS as exc:
            raise RegistryError(f"token server {redact_url(realm)} of {self.host} unreachable "
                                f"({short_reason(exc)})") from None
        if r.status_code in (401, 403):
            if not self.creds:
                raise RegistryAuthError(f"registry {self.host} requires authentication (its token server "
                                        f"{redact_url(realm)} answered HTTP {r.status_code}); {self._who()}")
            raise RegistryAuthError(f"token server {redact_url(realm)} refused {self._who()} "
                                    f"(HTTP {r.status_code}; wrong user name or password?)")
        if r.status_code != 200:
            raise RegistryAuthError(f"token server {redact_url(realm)} answered HTTP {r.status_code}")
        try:
            data = r.json()
            token = data.get("token") or data.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not token:
            raise RegistryAuthError(f"token server {redact_url(realm)} returned no token")
        return str(token)


# --------------------------------------------------------------------------- the client


def file_digest(path: Union[str, os.PathLike]) -> Tuple[str, int]:
    """``("sha256:<hex>", size)`` of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            h.update(chunk)
            size += len(chunk)
    return "sha256:" + h.hexdigest(), size


class RegistryClient(oras.provider.Registry):
    """One registry host (``host[:port]``); oras-py's Registry with dedal's transport.

    ``retries``: extra attempts after a transient failure; ``backoff``: first delay in
    seconds, doubled each time (with jitter). ``insecure``: unverified https, then plain
    http. ``timeout``: seconds to wait for a response to start.
    """

    def __init__(
        self,
        host: str,
        *,
        creds: Optional[Credentials] = None,
        insecure: bool = False,
        retries: int = 4,
        backoff: float = 0.5,
        timeout: float = 300.0,
        session: Optional[requests.Session] = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(hostname=host, insecure=insecure, tls_verify=not insecure)
        if session is not None:
            self.session = session
        self.host = host
        self.insecure = insecure
        self.retries = max(0, int(retries))
        self.backoff = float(backoff)
        self.timeout = timeout
        self._sleep = sleep
        self._auth = _Auth(host, creds)
        self._scheme: Optional[str] = None
        self.stats: Dict[str, int] = {"requests": 0, "retries": 0, "blobs_uploaded": 0, "blobs_skipped": 0,
                                      "bytes_uploaded": 0}

    def __repr__(self) -> str:
        return f"RegistryClient({self.host!r}, insecure={self.insecure}, credentials={'yes' if self._auth.creds else 'no'})"

    __str__ = __repr__

    # ------------------------------------------------------------- transport

    @property
    def base(self) -> str:
        """``scheme://host``, found on first use (https; with insecure, http if TLS fails)."""
        if self._scheme is None:
            self._scheme = self._probe_scheme()
            self.prefix = self._scheme  # oras-py builds its URLs with self.prefix
            self.auth.prefix = self._scheme
        return f"{self._scheme}://{self.host}"

    def _probe_scheme(self) -> str:
        url = f"https://{self.host}/v2/"
        try:
            self.session.get(url, verify=not self.insecure, timeout=min(self.timeout, 30))
            return "https"
        except requests.exceptions.SSLError as exc:
            if self.insecure:
                log.debug("TLS to %s failed, using plain http (--insecure)", self.host)
                return "http"
            raise RegistryError(f"registry {self.host}: TLS connection failed ({short_reason(exc)}); if it serves "
                                "plain HTTP or has a certificate you do not trust, pass --insecure "
                                "(setting registry_insecure)") from None
        except TRANSIENT_ERRORS as exc:
            if self.insecure:
                return "http"
            raise RegistryError(f"registry {self.host} unreachable over https ({short_reason(exc)}); if it serves "
                                "plain HTTP, pass --insecure (setting registry_insecure)") from None

    def url(self, path: str) -> str:
        return f"{self.base}{path}"

    def do_request(  # type: ignore[override]
        self,
        url: str,
        method: str = "GET",
        data: Optional[Union[dict, bytes, IO[bytes]]] = None,
        headers: Optional[dict] = None,
        json: Optional[dict] = None,
        stream: bool = False,
        *,
        retry: bool = True,
        ok: Tuple[int, ...] = (),
    ) -> requests.Response:
        """One request with auth and retries; used by oras-py's methods as well.

        Transient failures (5xx, 429, broken connections) are retried up to
        ``self.retries`` times with backoff when ``retry``; the last one raises
        RegistryError. Other statuses are returned, or raised unless in ``ok`` when
        ``ok`` is given.
        """
        if url.startswith("/"):
            url = self.url(url)
        elif not self._scheme:
            _ = self.base
        attempts = 1 + (self.retries if retry else 0)
        auth_rounds = 0
        attempt = 0
        while True:
            hdrs = dict(headers or {})
            hdrs.update(self._auth.header())
            if hasattr(data, "seek"):
                data.seek(0)  # type: ignore[union-attr]
            self.stats["requests"] += 1
            try:
                response = self.session.request(method, url, data=data, json=json, headers=hdrs, stream=stream,
                                                verify=not self.insecure, timeout=self.timeout,
                                                allow_redirects=True)
            except requests.exceptions.SSLError as exc:
                raise RegistryError(f"{method} {redact_url(url)}: TLS error ({short_reason(exc)}); pass --insecure "
                                    "only if you trust this registry") from None
            except TRANSIENT_ERRORS as exc:
                attempt += 1
                if attempt >= attempts:
                    raise RegistryError(f"{method} {redact_url(url)}: connection failed after {attempt} "
                                        f"attempt(s) ({short_reason(exc)})") from None
                self.wait_before_retry(attempt, f"{method} {redact_url(url)}: {short_reason(exc)}")
                continue
            if response.status_code == 401 and auth_rounds < 3:
                self._auth.answer(response, self.session, not self.insecure,
                                  already_sent="Authorization" in hdrs)
                auth_rounds += 1
                response.close()
                continue
            if response.status_code in RETRY_STATUS and retry:
                attempt += 1
                if attempt < attempts:
                    delay = _retry_after(response)
                    response.close()
                    self.wait_before_retry(attempt, f"{method} {redact_url(url)}: HTTP {response.status_code}", delay)
                    continue
            if ok and response.status_code not in ok:
                raise self.error(response, method, url)
            return response

    def wait_before_retry(self, attempt: int, why: str, delay: Optional[float] = None) -> None:
        self.stats["retries"] += 1
        if delay is None:
            delay = self.backoff * (2 ** (attempt - 1))
            delay += random.uniform(0, delay / 4)
        log.warning("registry %s: %s; retry %d/%d in %.1f s", self.host, why, attempt, self.retries, delay)
        self._sleep(delay)

    def error(self, response: requests.Response, method: str, url: str) -> RegistryError:
        """A RegistryError naming the request, the status and the registry's error codes."""
        detail = ""
        try:
            body = response.json()
            errs = body.get("errors") if isinstance(body, dict) else None
            if errs:
                detail = "; ".join(f"{e.get('code', '')}: {e.get('message', '')}".strip(": ")
                                   for e in errs if isinstance(e, dict))
        except ValueError:
            pass
        msg = f"{method} {redact_url(url)}: HTTP {response.status_code} {response.reason or ''}".rstrip()
        if detail:
            msg += f" ({detail})"
        if response.status_code == 404:
            return NotFound(msg)
        if response.status_code in (401, 403):
            return RegistryAuthError(msg + "; check the credentials and your access to this repository")
        return RegistryError(msg)

    def _check_200_response(self, response: requests.Response) -> None:  # oras-py hook
        if response.status_code not in (200, 201, 202):
            raise self.error(response, response.request.method or "", response.request.url or "")

    # ------------------------------------------------------------- API

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

    def push_blob(self, repository: str, path: Union[str, os.PathLike], digest: str, size: int,
                  progress: Optional[Callable[[str], None]] = None) -> bool:
        """Upload a file as a blob unless the registry already has it (HEAD first).

        Returns True when bytes were sent. A failed upload (broken connection, 5xx) is
        restarted from a new upload session, with backoff, ``retries`` times.
        """
        if self.blob_exists_digest(repository, digest):
            self.stats["blobs_skipped"] += 1
            if progress:
                progress(f"blob {digest[:19]} ({_human(size)}) already in the registry, not uploaded")
            return False
        if progress:
            progress(f"uploading blob {digest[:19]} ({_human(size)})")
        attempt = 0
        while True:
            try:
                self._upload_once(repository, Path(path), digest, size)
                break
            except RegistryAuthError:
                raise
            except RegistryError as exc:
                attempt += 1
                if attempt > self.retries:
                    raise
                if self.blob_exists_digest(repository, digest):  # finished server-side after all
                    break
                self.wait_before_retry(attempt, f"upload of {digest[:19]} failed: {exc.one_line()}")
        self.stats["blobs_uploaded"] += 1
        self.stats["bytes_uploaded"] += size
        return True

    def _upload_once(self, repository: str, path: Path, digest: str, size: int) -> None:
        r = self.do_request(f"/v2/{repository}/blobs/uploads/", "POST",
                            headers={"Content-Length": "0"}, ok=(202,))
        location = self._get_location(r, self.container(repository))
        if not location:
            raise RegistryError(f"POST /v2/{repository}/blobs/uploads/: no Location header in the answer")
        if location.startswith("/"):
            location = self.url(location)
        sep = "&" if "?" in location else "?"
        put_url = f"{location}{sep}digest={digest}"
        with open(path, "rb") as fh:
            r = self.do_request(put_url, "PUT", data=fh,  # type: ignore[arg-type]
                                headers={"Content-Type": "application/octet-stream",
                                         "Content-Length": str(size)}, retry=False)
        if r.status_code != 201:
            raise self.error(r, "PUT", put_url)
        got = r.headers.get("Docker-Content-Digest")
        if got and got != digest:
            raise RegistryError(f"registry {self.host} stored blob {got}, expected {digest}")

    def push_bytes(self, repository: str, data: bytes, progress: Optional[Callable[[str], None]] = None) -> Tuple[str, int, bool]:
        """Upload a small in-memory blob (config, JSON); returns (digest, size, uploaded)."""
        import tempfile

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
            raise RegistryError(f"registry {self.host} stored manifest {repository}:{ref} as {got}, "
                                f"expected {sha256_digest(raw)}")
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
        r = self.do_request(f"/v2/{repository}/manifests/{ref}", "HEAD",
                            headers={"Accept": ", ".join(MANIFEST_TYPES)}, ok=(200, 404))
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

    def referrers(self, repository: str, digest: str, artifact_type: Optional[str] = None) -> Optional[List[Dict[str, Any]]]:
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

    def get_blob_bytes(self, repository: str, digest: str, limit: int = 64 << 20) -> bytes:
        """A small blob in memory, checked against its digest."""
        with self.get_blob_stream(repository, digest) as r:
            data = b""
            for chunk in r.iter_content(CHUNK):
                data += chunk
                if len(data) > limit:
                    raise RegistryError(f"blob {digest} is larger than {_human(limit)}")
        if sha256_digest(data) != digest:
            raise RegistryError(f"blob {repository}@{digest}: the registry sent bytes with another sha256")
        return data


def _retry_after(response: requests.Response) -> Optional[float]:
    value = response.headers.get("Retry-After", "")
    try:
        return min(float(value), 60.0) if value else None
    except ValueError:
        return None


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


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def human_size(size: int) -> str:
    return _human(size)


__all__ = [
    "DOCKER_MANIFEST", "DOCKER_MANIFEST_LIST", "MANIFEST_TYPES", "OCI_INDEX", "OCI_MANIFEST", "Manifest",
    "RegistryError", "RegistryAuthError", "NotFound", "Credentials", "auth_files", "credentials_from_file",
    "resolve_credentials", "parse_challenge", "RegistryClient", "sha256_digest", "file_digest", "redact_url",
    "short_reason", "human_size", "CHUNK", "RETRY_STATUS", "TRANSIENT_ERRORS",
]
