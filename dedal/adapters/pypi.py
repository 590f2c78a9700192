"""The only code that talks to PyPI: a source file found by its sha256 in a project's
simple index (PEP 691 JSON), downloaded and checked.

Why: Spack's recipes for Python packages point at
``https://files.pythonhosted.org/packages/source/<c>/<project>/<file>`` (or pypi.io),
an alias PyPI's CDN does not always serve (404 where only the index and its hashed file
URLs are reachable), while the index lists the very same sdist under its hashed URL
with its sha256. A file is taken only when the index's sha256 equals the recipe's, and
the downloaded bytes are hashed again: the mirror gets exactly the file Spack verifies.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional
from urllib.parse import urljoin, urlsplit

import requests
import requests.exceptions

from dedal.errors import DedalError
from dedal.model.artifacts import atomic_path

DEFAULT_INDEX = "https://pypi.org/simple"
JSON_ACCEPT = "application/vnd.pypi.simple.v1+json"
# hosts whose /packages/<source|py3|...>/<c>/<project>/<file> URLs are PyPI's aliases (Spack's
# `pypi =` attribute; its wheels, e.g. py-pip's, use the Python tag); hashed URLs have two hex
# pairs there, never one character
_HOSTS = ("files.pythonhosted.org", "pypi.io", "pypi.org", "pypi.python.org")
_SOURCE_PATH = re.compile(r"^/packages/[^/]+/[^/]/(?P<project>[^/]+)/(?P<file>[^/]+)$")


class PyPIError(DedalError):
    """A request to the index or a download failed: the URL and what went wrong."""

    def __init__(self, url: str, detail: str, status: Optional[int] = None) -> None:
        self.url = url
        self.status = status
        super().__init__(f"PyPI: GET {url}: {detail}")


@dataclass
class IndexFile:
    filename: str
    url: str
    sha256: str


def project_of(url: str) -> Optional[str]:
    """The PyPI project a Spack source URL names, None when it is not a PyPI source URL."""
    parts = urlsplit(url or "")
    if parts.hostname not in _HOSTS:
        return None
    m = _SOURCE_PATH.match(parts.path)
    return m.group("project") if m else None


def normalize(project: str) -> str:
    """PEP 503's normalized name (what the simple index is keyed by)."""
    return re.sub(r"[-_.]+", "-", project).lower()


class PyPI:
    def __init__(self, index: str = DEFAULT_INDEX, timeout: float = 60.0) -> None:
        self.index = index.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()

    def files(self, project: str) -> List[IndexFile]:
        """Every file the index lists for ``project`` with its sha256."""
        url = f"{self.index}/{normalize(project)}/"
        try:
            resp = self.session.get(url, headers={"Accept": JSON_ACCEPT}, timeout=self.timeout)
        except requests.exceptions.RequestException as exc:
            raise PyPIError(url, str(exc)) from None
        if resp.status_code != 200:
            raise PyPIError(url, f"HTTP {resp.status_code}", resp.status_code)
        try:
            entries = resp.json().get("files", [])
        except ValueError:
            raise PyPIError(url, f"not a PEP 691 JSON page (Content-Type {resp.headers.get('Content-Type')})") from None
        found: List[IndexFile] = []
        for entry in entries:
            sha = (entry.get("hashes") or {}).get("sha256")
            if sha and entry.get("url") and entry.get("filename"):
                found.append(IndexFile(entry["filename"], urljoin(url, entry["url"]), sha.lower()))
        return found

    def find(self, project: str, sha256: str) -> Optional[IndexFile]:
        """The file of ``project`` whose listed sha256 is ``sha256``, None when there is none."""
        return next((f for f in self.files(project) if f.sha256 == sha256.lower()), None)

    def download(self, item: IndexFile, dest: Path) -> None:
        """``item`` to ``dest`` (temporary name, renamed once its sha256 is checked)."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        try:
            with atomic_path(dest) as tmp:
                with self.session.get(item.url, stream=True, timeout=self.timeout) as resp:
                    if resp.status_code != 200:
                        raise PyPIError(item.url, f"HTTP {resp.status_code}", resp.status_code)
                    with open(tmp, "wb") as fh:
                        for chunk in resp.iter_content(1 << 20):
                            digest.update(chunk)
                            fh.write(chunk)
                if digest.hexdigest() != item.sha256:
                    raise PyPIError(item.url, f"sha256 {digest.hexdigest()} differs from the index's {item.sha256}")
        except requests.exceptions.RequestException as exc:
            raise PyPIError(item.url, str(exc)) from None
