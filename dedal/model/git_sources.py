"""Sources that recipes take from git repositories, archived at a pinned commit: the
manifest ``git-sources.json`` that lies in a Spack package repository beside its
``repo.yaml`` (``recipes/repo/git-sources.json``), one entry per package version.

Each entry says where the source comes from (the repository URL, the ref as published
and the commit it names), how the archive is made (``git archive`` of the commit under
``prefix``, gzip'ed without name or time: the bytes GitHub's archive URL serves), and
what it is (its sha256 and size, which the recipe's ``version()`` pins too). The script
``recipes/gitsrc/archive.py`` makes the archives and puts them into the source mirror;
the image's SBOM names the origin of every package built from one (:func:`origins`).

Pure: reads and writes only the manifest.
"""

from __future__ import annotations

import json
import re
from dataclasses import MISSING, asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from dedal.errors import UserError
from dedal.model.artifacts import write_atomic
from dedal.model.inputs import parse_json, read_input

MANIFEST = "git-sources.json"
FORMAT = 1
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*/$")


@dataclass(frozen=True)
class GitSource:
    """One archived source: the recipe's package and version, and its origin."""

    package: str  # Spack package name
    version: str  # the version the recipe gives this archive
    repository: str  # origin: the repository's URL
    ref: str  # the tag or commit as published (v2.13.6, bed60f5)
    commit: str  # the commit it names (40 hex digits)
    prefix: str  # top directory of the archive, with a trailing '/'
    url: str  # where the archive can be downloaded (the recipe's URL)
    sha256: str = ""  # of the .tar.gz ("" until recorded)
    size: int = 0  # bytes
    note: str = ""

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"

    @property
    def storage_path(self) -> str:
        """Where Spack looks for it in a source mirror (by sha256)."""
        return f"_source-cache/archive/{self.sha256[:2]}/{self.sha256}.tar.gz"

    @property
    def cosmetic_path(self) -> str:
        """The mirror's human-readable name for it (a link to the storage path)."""
        return f"{self.package}/{self.package}-{self.version}.tar.gz"

    def to_json(self) -> Dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "note" or v}


@dataclass
class GitSources:
    """The manifest: the package repository's namespace and its archived sources."""

    namespace: str
    sources: List[GitSource] = field(default_factory=list)
    path: Optional[Path] = None

    def find(self, package: str, version: Optional[str] = None) -> Optional[GitSource]:
        for s in self.sources:
            if s.package == package and (version is None or s.version == version):
                return s
        return None

    def to_json(self) -> Dict[str, Any]:
        return {
            "format": FORMAT,
            "namespace": self.namespace,
            "sources": [s.to_json() for s in sorted(self.sources, key=lambda s: (s.package, s.version))],
        }

    @classmethod
    def from_json(cls, data: Any, where: str = MANIFEST) -> "GitSources":
        """The manifest from its JSON form; UserError (one line naming ``where``) when it is not one."""
        return _from_json(data, where)

    def replaced(self, entry: GitSource) -> "GitSources":
        """A copy with ``entry`` in place of the entry of the same package and version."""
        rest = [s for s in self.sources if (s.package, s.version) != (entry.package, entry.version)]
        return GitSources(self.namespace, rest + [entry], self.path)

    def write(self, path: Path) -> Path:
        """Whole or not at all (a temporary name, renamed)."""
        return write_atomic(path, json.dumps(self.to_json(), indent=2) + "\n", mkdir=False)


def _entry(raw: Any, where: str) -> GitSource:
    if not isinstance(raw, dict):
        raise UserError(f"{where}: not an object")
    known = list(GitSource.__dataclass_fields__)  # in order: the first defect said is always the same
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r}")
    values: Dict[str, Any] = {}
    for key in known:
        f = GitSource.__dataclass_fields__[key]
        required = f.default is MISSING
        value = raw.get(key, None if required else f.default)
        if value is None:
            raise UserError(f"{where}: {key!r} is missing")
        want = int if key == "size" else str
        if not isinstance(value, want) or isinstance(value, bool):
            raise UserError(f"{where}: {key!r} must be {'an integer' if want is int else 'a string'}")
        values[key] = value
    checks = (
        ("package", _NAME, "a Spack package name"),
        ("version", _VERSION, "a Spack version"),
        ("commit", _COMMIT, "40 lower-case hex digits"),
        ("prefix", _PREFIX, "a directory name ending in '/'"),
    )
    for key, pattern, what in checks:
        if not pattern.match(values[key]):
            raise UserError(f"{where}: {key} {values[key]!r} is not {what}")
    if values["sha256"] and not _SHA256.match(values["sha256"]):
        raise UserError(f"{where}: sha256 {values['sha256']!r} is not 64 lower-case hex digits")
    for key in ("repository", "url"):
        if not values[key].startswith(("https://", "http://", "file://")):
            raise UserError(f"{where}: {key} {values[key]!r} is not a URL")
    if values["size"] < 0:
        raise UserError(f"{where}: size must not be negative")
    return GitSource(**values)


def _from_json(data: Any, where: str) -> GitSources:
    if not isinstance(data, dict):
        raise UserError(f"{where}: not a JSON object")
    unknown = sorted(set(data) - {"format", "namespace", "sources"})
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r}")
    if data.get("format") != FORMAT:
        raise UserError(f"{where}: format {data.get('format')!r} is not {FORMAT}")
    namespace = data.get("namespace")
    if not isinstance(namespace, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", namespace):
        raise UserError(f"{where}: namespace {namespace!r} is not a Spack repository namespace")
    raw = data.get("sources")
    if not isinstance(raw, list):
        raise UserError(f"{where}: 'sources' must be a list")
    sources = [_entry(item, f"{where}: sources[{i}]") for i, item in enumerate(raw)]
    seen: Dict[Tuple[str, str], int] = {}
    for i, s in enumerate(sources):
        if (s.package, s.version) in seen:
            raise UserError(f"{where}: sources[{i}]: {s.spec} is listed twice")
        seen[(s.package, s.version)] = i
    return GitSources(namespace, sources)


def read(path: Path) -> GitSources:
    """The manifest at ``path``; UserError (one line naming the file) when it is not one."""
    manifest = GitSources.from_json(parse_json(read_input(Path(path)), path), str(path))
    manifest.path = Path(path)
    return manifest


def in_repo(repo_dir: Path) -> Optional[GitSources]:
    """The manifest of the package repository at ``repo_dir``, None where it has none."""
    path = Path(repo_dir) / MANIFEST
    return read(path) if path.is_file() else None


def origins(repo_dirs: Iterable[Path], nodes: Iterable[Tuple[str, str, str, str]]) -> Dict[str, GitSource]:
    """DAG hash -> archived source for every node ``(hash, namespace, name, version)``
    whose package repository (among ``repo_dirs``) lists its version in its manifest."""
    by_spec: Dict[Tuple[str, str, str], GitSource] = {}
    for repo in repo_dirs:
        manifest = in_repo(Path(repo))
        if manifest is None:
            continue
        for s in manifest.sources:
            by_spec.setdefault((manifest.namespace, s.package, s.version), s)
    found: Dict[str, GitSource] = {}
    for h, namespace, name, version in nodes:
        s = by_spec.get((namespace, name, version))
        if s is not None and s.sha256:
            found[h] = s
    return found


def archived_by_sha256(repo_dirs: Iterable[Path]) -> Dict[str, GitSource]:
    """sha256 -> archived source, over the manifests of the package repositories among
    ``repo_dirs`` (entries not recorded yet left out)."""
    found: Dict[str, GitSource] = {}
    for repo in repo_dirs:
        manifest = in_repo(Path(repo))
        for s in manifest.sources if manifest else []:
            if s.sha256:
                found.setdefault(s.sha256, s)
    return found


def origin_record(source: GitSource) -> Mapping[str, str]:
    """What the SBOM says of an archived source (plain strings)."""
    return {
        "repository": source.repository,
        "ref": source.ref,
        "commit": source.commit,
        "url": source.url,
        "sha256": source.sha256,
        "archive": f"git archive --prefix={source.prefix} {source.commit} | gzip -n",
    }
