"""Registry credentials and authentication challenges.

Credentials come from ``resolve_credentials``: ``--password-stdin``,
``DEDAL_REGISTRY_USER`` / ``DEDAL_REGISTRY_PASSWORD``, ``$REGISTRY_AUTH_FILE``,
Podman's, Docker's and Apptainer's config files and the Docker credential helpers they name (run
through ``dedal.adapters.proc``). ``RegistryAuth`` answers a registry's 401 the way it
asks (HTTP Basic, or the bearer-token flow of ``WWW-Authenticate: Bearer
realm=...,service=...,scope=...``) and remembers tokens per scope for the client.

Kept apart from the client because none of it depends on how requests are retried or
bodies are uploaded, and because this is the code that handles secrets: they never
appear in an exception, a log record or a ``repr``.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import requests

from dedal.adapters import proc
from dedal.adapters.registry.errors import (
    ANSWER_LIMIT,
    TRANSIENT_ERRORS,
    RegistryAuthError,
    read_body,
    redact_url,
    short_reason,
)
from dedal.errors import UserError
from dedal.model.inputs import read_input
from dedal.model.oci import RegistryError

log = logging.getLogger("dedal.registry")


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
    ``$DOCKER_CONFIG/config.json`` (default ``~/.docker/config.json``), then what
    ``apptainer registry login`` wrote: ``$APPTAINER_CONFIGDIR/docker-config.json``
    (default ``~/.apptainer/docker-config.json``, Docker's format)."""
    env = os.environ if environ is None else environ
    files: List[Path] = []
    if env.get("REGISTRY_AUTH_FILE"):
        files.append(Path(env["REGISTRY_AUTH_FILE"]).expanduser())
    if env.get("XDG_RUNTIME_DIR"):
        files.append(Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json")
    docker_dir = env.get("DOCKER_CONFIG") or str(Path(env.get("HOME") or Path.home()) / ".docker")
    files.append(Path(docker_dir).expanduser() / "config.json")
    apptainer_dir = env.get("APPTAINER_CONFIGDIR") or str(Path(env.get("HOME") or Path.home()) / ".apptainer")
    files.append(Path(apptainer_dir).expanduser() / "docker-config.json")
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
    result = proc.run(
        [f"docker-credential-{helper}", "get"], input=host, what=f"credential helper {helper}", check=False
    )
    if result.returncode != 0:
        if "credentials not found" in (result.stdout + result.stderr).lower():
            return None
        # the helper's output may echo secrets: report only the exit code
        raise RegistryAuthError(
            f"credential helper docker-credential-{helper} (from {origin}) failed "
            f"for {host} with exit code {result.returncode}"
        )
    try:
        data = json.loads(result.stdout)
        return Credentials(str(data["Username"]), str(data["Secret"]), f"docker-credential-{helper}")
    except (ValueError, KeyError, TypeError):
        raise RegistryAuthError(
            f"credential helper docker-credential-{helper} returned no usable credentials for {host}"
        ) from None


def credentials_from_file(path: Path, host: str, repository: str = "") -> Optional[Credentials]:
    """Look ``host`` (or ``host/repository`` prefixes, most specific first) up in one
    Docker/Podman auth file; credential helpers named there are asked through ``proc``."""
    if not path.exists():
        return None
    try:  # a FIFO or device refused at once, a file over INPUT_LIMIT unread (read_input)
        data = json.loads(read_input(path))
    except ValueError:
        raise UserError(f"{path}: not valid JSON (registry credentials file)") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object (registry credentials file)")
    auths = data.get("auths") or {}
    by_key: Dict[str, Any] = {}
    for key, entry in auths.items() if isinstance(auths, dict) else []:
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
    params = {m.group(1).lower(): (m.group(2) if m.group(2) is not None else m.group(3)) for m in _PARAM.finditer(rest)}
    return scheme.lower(), params


class RegistryAuth:
    """Remembers how this registry wants to be authenticated; never logs secrets."""

    def __init__(self, host: str, creds: Optional[Credentials]) -> None:
        self.host = host
        self.creds = creds
        self.scheme: Optional[str] = None  # "basic" or "bearer" once the registry asked
        self.tokens: Dict[str, str] = {}  # scope -> bearer token
        self.current_scope: Optional[str] = None

    def __repr__(self) -> str:
        return f"RegistryAuth(host={self.host!r}, scheme={self.scheme!r}, credentials={'yes' if self.creds else 'no'})"

    def header(self) -> Dict[str, str]:
        if self.scheme == "basic" and self.creds:
            return {"Authorization": f"Basic {self.creds.basic()}"}
        if self.scheme == "bearer" and self.current_scope in self.tokens:
            return {"Authorization": f"Bearer {self.tokens[self.current_scope]}"}
        return {}

    def _who(self) -> str:
        if not self.creds:
            return (
                "no credentials were found (docker/podman/apptainer registry login, $REGISTRY_AUTH_FILE, "
                "DEDAL_REGISTRY_USER + DEDAL_REGISTRY_PASSWORD, or --password-stdin)"
            )
        return f"user {self.creds.username!r} from {self.creds.origin or 'the command line'}"

    def answer(self, response: requests.Response, session: requests.Session, verify: Any, already_sent: bool) -> None:
        """Handle a 401: set up what ``header()`` returns, or raise RegistryAuthError."""
        challenge = response.headers.get("WWW-Authenticate", "")
        scheme, params = parse_challenge(challenge) if challenge else ("", {})
        if scheme == "basic":
            if not self.creds:
                raise RegistryAuthError(f"registry {self.host} requires authentication; {self._who()}")
            if already_sent and self.scheme == "basic":
                raise RegistryAuthError(
                    f"registry {self.host} refused the credentials of {self._who()} (wrong user name or password?)"
                )
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
        raise RegistryAuthError(
            f"registry {self.host} asks for unsupported authentication {scheme or '(no WWW-Authenticate header)'}"
        )

    def _fetch_token(self, params: Dict[str, str], session: requests.Session, verify: Any) -> str:
        realm = params.get("realm")
        if not realm:
            raise RegistryAuthError(f"registry {self.host}: bearer challenge without a realm")
        query = {k: params[k] for k in ("service", "scope") if params.get(k)}
        headers = {"Accept": "application/json"}
        if self.creds:
            headers["Authorization"] = f"Basic {self.creds.basic()}"
        log.debug(
            "requesting a bearer token from %s (service=%s, scope=%s, with credentials: %s)",
            redact_url(realm),
            query.get("service"),
            query.get("scope"),
            bool(self.creds),
        )
        try:
            r = session.get(realm, params=query, headers=headers, verify=verify, timeout=60, stream=True)
            body = read_body(r, ANSWER_LIMIT, f"the answer of token server {redact_url(realm)}")
        except TRANSIENT_ERRORS as exc:
            raise RegistryError(
                f"token server {redact_url(realm)} of {self.host} unreachable ({short_reason(exc)})"
            ) from None
        if r.status_code in (401, 403):
            if not self.creds:
                raise RegistryAuthError(
                    f"registry {self.host} requires authentication (its token server "
                    f"{redact_url(realm)} answered HTTP {r.status_code}); {self._who()}"
                )
            raise RegistryAuthError(
                f"token server {redact_url(realm)} refused {self._who()} "
                f"(HTTP {r.status_code}; wrong user name or password?)"
            )
        if r.status_code != 200:
            raise RegistryAuthError(f"token server {redact_url(realm)} answered HTTP {r.status_code}")
        try:
            data = json.loads(body)
            token = data.get("token") or data.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not token:
            raise RegistryAuthError(f"token server {redact_url(realm)} returned no token")
        return str(token)
