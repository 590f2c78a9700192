"""Base images as data: their definitions in ``base-images/`` and the built bases in the cache.

A base is defined by a file in ``base-images/``:

* ``<name>.yaml``: dedal-native Debian definition (suite, variant, packages), built
  here with debootstrap + apt inside the new root (bubblewrap);
* ``<name>.def``: an Apptainer definition, built with ``apptainer build --sandbox``
  where Apptainer exists.

A built base lives in ``<base_cache>/<id>/`` with ``rootfs/`` (the unpacked root, used
read-only by builds), ``rootfs.sqfs`` (the same, packed) and ``base.json`` (what it is:
OS release, package versions, sizes, build time). ``id`` is the hash of the definition
file and of ``RECIPE_VERSION`` (how dedal builds bases): a changed definition is a new
base. Building one is :mod:`dedal.stages.base`; ``host`` (:data:`HOST_BASE`) names the
machine itself, no base image.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Mapping, Optional, Tuple


from dedal import CHECKOUT
from dedal.errors import UserError
from dedal.model.inputs import parse_yaml, read_input

if TYPE_CHECKING:
    from dedal.model.config import Settings


#: Debian's archive areas a definition may enable (``components:``); main is always needed
#: (debootstrap builds the root from it)
COMPONENTS = ("main", "contrib", "non-free", "non-free-firmware")
RECIPE_VERSION = "1"  # bump when the way bases are built changes (invalidates every cached base)
HOST_BASE = "host"  # build on the host itself (private mount namespace), no base image


def definitions_dir() -> Path:
    """``base-images/`` of this checkout (``DEDAL_BASE_IMAGES_DIR`` overrides)."""
    env = os.environ.get("DEDAL_BASE_IMAGES_DIR")
    if env:
        return Path(env)
    return CHECKOUT / "base-images"


@dataclass
class BaseDefinition:
    name: str
    path: Path
    kind: str  # "debian" (debootstrap, built here) | "apptainer" (.def, needs Apptainer)
    text: str
    description: str = ""
    suite: str = ""
    variant: str = "minbase"
    arch: str = "amd64"
    mirror: str = ""
    updates: bool = False
    security: bool = False
    components: List[str] = field(default_factory=lambda: ["main"])  # apt archive areas (COMPONENTS)
    packages: Dict[str, List[str]] = field(default_factory=dict)
    record_versions: Dict[str, str] = field(default_factory=dict)
    probe_versions: Dict[str, str] = field(default_factory=dict)
    env: Dict[str, str] = field(default_factory=dict)
    python_venv: Dict[str, Any] = field(default_factory=dict)  # {path, packages}: pip packages Debian lacks

    @property
    def all_packages(self) -> List[str]:
        seen: List[str] = []
        for group in self.packages.values():
            for p in group:
                if p not in seen:
                    seen.append(p)
        return seen

    def to_json(self) -> Dict[str, Any]:
        data = asdict(self)
        data["path"] = str(self.path)
        data.pop("text")
        data["id"] = definition_id(self)
        return data


def _known() -> Dict[str, Path]:
    d = definitions_dir()
    found: Dict[str, Path] = {}
    if d.is_dir():
        for p in sorted(d.iterdir()):
            if p.suffix in (".yaml", ".yml", ".def") and p.is_file():
                found.setdefault(p.stem, p)
    return found


def known_names() -> List[str]:
    return sorted(_known())


def _expect(path: Path, data: Dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = data.get(key, default)
    if value is None:
        value = default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise UserError(f"{path}: {key}: expected {kind.__name__}, got {value!r}")
    return value


def _parse_yaml(name: str, path: Path, text: str) -> BaseDefinition:
    data = parse_yaml(text, path)
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping (name, suite, packages, ...)")
    known = {
        "name",
        "description",
        "os",
        "suite",
        "variant",
        "arch",
        "mirror",
        "updates",
        "security",
        "components",
        "packages",
        "record_versions",
        "probe_versions",
        "env",
        "python_venv",
    }
    unknown = sorted(set(data) - known)
    if unknown:
        raise UserError(f"{path}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    if data.get("os", "debian") != "debian":
        raise UserError(f"{path}: os: only debian definitions are built from YAML (use an Apptainer .def)")
    suite = _expect(path, data, "suite", str, "")
    if not suite:
        raise UserError(f"{path}: suite: required (e.g. trixie)")
    packages = _expect(path, data, "packages", (dict, list), {})  # type: ignore[arg-type]
    if isinstance(packages, list):
        packages = {"packages": packages}
    for group, items in packages.items():
        if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
            raise UserError(f"{path}: packages.{group}: expected a list of package names")
    components = _components(path, _expect(path, data, "components", list, ["main"]))
    record = _expect(path, data, "record_versions", dict, {})
    probes = _expect(path, data, "probe_versions", dict, {})
    env = _expect(path, data, "env", dict, {})
    venv = _expect(path, data, "python_venv", dict, {})
    if venv and (
        not isinstance(venv.get("path"), str)
        or not venv["path"].startswith("/")
        or not isinstance(venv.get("packages", []), list)
    ):
        raise UserError(f"{path}: python_venv: expected {{path: /absolute/dir, packages: [...]}}")
    return BaseDefinition(
        name=_expect(path, data, "name", str, name),
        path=path,
        kind="debian",
        text=text,
        description=_expect(path, data, "description", str, ""),
        suite=suite,
        variant=_expect(path, data, "variant", str, "minbase"),
        arch=_expect(path, data, "arch", str, "amd64"),
        mirror=_expect(path, data, "mirror", str, ""),
        updates=_expect(path, data, "updates", bool, False),
        security=_expect(path, data, "security", bool, False),
        components=components,
        packages={str(k): list(v) for k, v in packages.items()},
        record_versions={str(k): str(v) for k, v in record.items()},
        probe_versions={str(k): str(v) for k, v in probes.items()},
        env={str(k): str(v) for k, v in env.items()},
        python_venv={"path": venv["path"], "packages": [str(p) for p in venv.get("packages", [])]} if venv else {},
    )


def _components(path: Path, value: List[Any]) -> List[str]:
    """``components:`` checked: Debian archive areas, main among them, each once."""
    bad = [c for c in value if c not in COMPONENTS]
    if bad:
        raise UserError(
            f"{path}: components: unknown {', '.join(map(repr, bad))} (Debian's are {', '.join(COMPONENTS)})"
        )
    if "main" not in value:
        raise UserError(f"{path}: components: must include main (debootstrap builds the root from it)")
    if len(set(value)) != len(value):
        raise UserError(f"{path}: components: {', '.join(value)} names one twice")
    return [str(c) for c in value]


def _parse_def(name: str, path: Path, text: str) -> BaseDefinition:
    header: Dict[str, str] = {}
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("%"):
            break
        if ":" in s and not s.startswith("#"):
            k, v = s.split(":", 1)
            header[k.strip().lower()] = v.strip()
    if "bootstrap" not in header:
        raise UserError(f"{path}: not an Apptainer definition (no 'Bootstrap:' header)")
    desc = ""
    for line in text.splitlines():
        if line.startswith("#") and not desc:
            desc = line.lstrip("# ").strip()
    return BaseDefinition(
        name=name,
        path=path,
        kind="apptainer",
        text=text,
        description=desc,
        suite=header.get("from", ""),
        variant=header["bootstrap"],
    )


def unknown_base(name: str) -> str:
    """ "" when ``name`` names a base (``host``, a definition in base-images/, a path to a
    .yaml/.def file), else the line saying it does not, with the known names: what an
    environment file is checked against when it is read, before anything is written."""
    if name == HOST_BASE or _definition_file(name) is not None:
        return ""
    known = _known()
    return "" if name in known else _unknown(name, [*sorted(known), HOST_BASE] if known else [])


def _unknown(name: str, known: List[str]) -> str:
    names = ", ".join(known) or f"none (no definitions in {definitions_dir()})"
    return f"unknown base image {name!r}; known: {names}"


def _definition_file(name: str) -> Optional[Path]:
    """``name`` as the path of a definition file (.yaml/.yml/.def), when it is one (a FIFO
    or a device too: read_input refuses it, saying what it is)."""
    candidate = Path(name)
    try:
        return candidate if candidate.suffix in (".yaml", ".yml", ".def") and candidate.exists() else None
    except (OSError, ValueError):  # a name too long, a NUL: no file
        return None


def load_definition(name: str) -> BaseDefinition:
    """The definition called ``name`` in base-images/ (or a path to a .yaml/.def file)."""
    candidate = _definition_file(name)
    if candidate is not None:
        path, stem = candidate, candidate.stem
    else:
        known = _known()
        if name not in known:
            raise UserError(_unknown(name, sorted(known)))
        path, stem = known[name], name
    text = read_input(path)
    if path.suffix == ".def":
        return _parse_def(stem, path, text)
    return _parse_yaml(stem, path, text)


def definition_id(defn: BaseDefinition) -> str:
    """Content address of a base: its definition file and dedal's base recipe version."""
    h = hashlib.sha256()
    h.update(f"dedal-base-recipe:{RECIPE_VERSION}\n".encode())
    h.update(defn.text.encode())
    return f"{defn.name}-{h.hexdigest()[:16]}"


@dataclass
class BaseImage:
    name: str
    id: str
    path: Path
    kind: str
    os_release: Dict[str, str]
    versions: Dict[str, str]  # openmpi, pmix, ucx, gcc, ... (record_versions of the definition)
    packages: Dict[str, str]  # every installed package -> version
    env: Dict[str, str] = field(default_factory=dict)
    arch: str = "amd64"
    mirror: str = ""
    built_at: float = 0.0
    build_seconds: float = 0.0
    rootfs_bytes: int = 0
    squashfs_bytes: int = 0
    definition_file: str = ""
    apt_releases: Dict[str, Dict[str, str]] = field(default_factory=dict)  # Release file -> date, sha256

    @property
    def rootfs_dir(self) -> Path:
        return self.path / "rootfs"

    @property
    def squashfs(self) -> Path:
        return self.path / "rootfs.sqfs"

    @property
    def os_id(self) -> str:
        """``debian13``-style name of the OS (part of layer keys)."""
        return f"{self.os_release.get('ID', 'linux')}{self.os_release.get('VERSION_ID', '')}"

    def to_json(self) -> Dict[str, Any]:
        data = asdict(self)
        data["path"] = str(self.path)
        data["rootfs_dir"] = str(self.rootfs_dir)
        data["squashfs"] = str(self.squashfs)
        return data

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "BaseImage":
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        fields["path"] = Path(fields["path"])
        return cls(**fields)


def input_labels(base: BaseImage, prefix: str = "dedal.base") -> Dict[str, str]:
    """Image labels naming the base's inputs that its definition does not pin (a live
    mirror): its packages and versions (one digest), the mirror. A rebuild whose base differs
    tells from these whether its inputs moved on. Not the dates of the apt Release files
    (base.json keeps them): Debian signs trixie-security and trixie-updates again every day or
    two, new packages or not, and a label of their dates made two builds of the same packages
    on two days differ (measured: two bases built from the archive as signed on 27 and on 28 Nov,
    the same 309 packages and the same root file system, gave two images). ``prefix``:
    ``dedal.runtime_base`` for the base an image is assembled on when it is not its build base."""
    listing = "".join(f"{name}={version}\n" for name, version in sorted(base.packages.items()))
    labels = {
        f"{prefix}.packages.sha256": hashlib.sha256(listing.encode()).hexdigest(),
        f"{prefix}.packages.count": str(len(base.packages)),
    }
    if base.mirror:
        labels[f"{prefix}.mirror"] = base.mirror
    return labels


def runtime_base_name(build: str, runtime: Optional[str]) -> str:
    """The base an image is assembled on: ``runtime`` (an environment's ``runtime_base``)
    when given, else the build base. UserError for an unknown definition, or ``host`` on
    either side (a host build has no base to have a twin of)."""
    if not runtime or runtime == build:
        return build
    if HOST_BASE in (build, runtime):
        raise UserError(
            f"runtime_base {runtime}: a runtime base goes with a base image, not with base {HOST_BASE} "
            f"(base_image is {build})"
        )
    load_definition(runtime)
    return runtime


def package_mismatches(build: Mapping[str, str], runtime: Mapping[str, str]) -> List[Tuple[str, str, str]]:
    """(package, build version, runtime version) of every package both bases hold in
    different versions, sorted. A runtime base must match its build base here: a layer
    linked against one version of a library must run against that same version."""
    return [
        (name, build[name], runtime[name]) for name in sorted(set(build) & set(runtime)) if build[name] != runtime[name]
    ]


def check_runtime_base(build: BaseImage, runtime: BaseImage) -> int:
    """Refuse (one UserError) a runtime base that is not the build base's twin: another OS
    release or architecture, or a package the two share in another version (built from
    different mirror states). Returns how many shared packages were compared."""
    what = f"runtime base {runtime.name} ({runtime.id}) and build base {build.name} ({build.id})"
    if build.arch != runtime.arch or build.os_id != runtime.os_id:
        raise UserError(
            f"{what} differ: {runtime.os_id}/{runtime.arch} vs {build.os_id}/{build.arch}; "
            "a runtime base must have its build base's OS release and architecture"
        )
    shared = set(build.packages) & set(runtime.packages)
    if not shared:
        raise UserError(
            f"{what} share no package: no way to tell that they come from one distribution release and mirror state"
        )
    bad = package_mismatches(build.packages, runtime.packages)
    if bad:
        shown = ", ".join(f"{n} {b} (build) vs {r} (runtime)" for n, b, r in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise UserError(
            f"{what}: {len(bad)} of the {len(shared)} packages they share differ in version: {shown}{more}; "
            f"rebuild the runtime base (`dedal base build {runtime.name} --rebuild`), or both bases "
            "where the mirror has moved on since the build base was made"
        )
    return len(shared)


def read_base(path: Path) -> Optional[BaseImage]:
    meta = path / "base.json"
    if not (meta.is_file() and (path / "rootfs").is_dir() and (path / "rootfs.sqfs").is_file()):
        return None
    try:
        img = BaseImage.from_json(json.loads(meta.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    img.path = path  # the cache may have moved
    return img


def parse_os_release(root: Path) -> Dict[str, str]:
    result: Dict[str, str] = {}
    for rel in ("etc/os-release", "usr/lib/os-release"):
        p = root / rel
        if p.is_symlink():
            target = os.readlink(p)
            p = (p.parent / target) if not target.startswith("/") else root / target.lstrip("/")
        if p.is_file():
            for line in p.read_text(errors="replace").splitlines():
                if "=" in line and not line.startswith("#"):
                    k, v = line.split("=", 1)
                    result[k.strip()] = v.strip().strip('"')
            break
    dv = root / "etc/debian_version"
    if dv.is_file():
        result["DEBIAN_VERSION"] = dv.read_text().strip()
    return result


def find_base(name: str, settings: Settings) -> Optional[BaseImage]:
    """The built base for the current definition of ``name``, or None."""
    defn = load_definition(name)
    return read_base(Path(settings.base_cache) / definition_id(defn))


# ---------------------------------------------------------------------------- listing


def list_bases(settings: Settings) -> List[Dict[str, Any]]:
    """Every definition (built or not) and every cached base no definition names any more."""
    cache = Path(settings.base_cache)
    rows: List[Dict[str, Any]] = []
    current = set()
    for name in known_names():
        try:
            defn = load_definition(name)
        except UserError as exc:
            rows.append({"name": name, "kind": "?", "id": "", "built": False, "error": str(exc)})
            continue
        bid = definition_id(defn)
        current.add(bid)
        img = read_base(cache / bid)
        rows.append(
            {
                "name": name,
                "kind": defn.kind,
                "id": bid,
                "built": img is not None,
                "path": str(cache / bid) if img else "",
                "description": defn.description,
                "squashfs_bytes": img.squashfs_bytes if img else 0,
                "buildable_here": defn.kind == "debian" or shutil.which("apptainer") is not None,
            }
        )
    if cache.is_dir():
        for d in sorted(cache.iterdir()):
            if d.name.startswith(".") or d.name in current or not d.is_dir():
                continue
            img = read_base(d)
            if img:
                rows.append(
                    {
                        "name": img.name,
                        "kind": img.kind,
                        "id": img.id,
                        "built": True,
                        "stale": True,
                        "path": str(d),
                        "description": "definition changed since (stale)",
                        "squashfs_bytes": img.squashfs_bytes,
                        "buildable_here": False,
                    }
                )
    return rows


def show_base(name: str, settings: Settings) -> Dict[str, Any]:
    """The definition of ``name`` and, when built, what the built base holds."""
    defn = load_definition(name)
    img = read_base(Path(settings.base_cache) / definition_id(defn))
    return {"definition": defn.to_json(), "built": img is not None, "base": img.to_json() if img else None}


def iter_cached(settings: Settings) -> Iterator[BaseImage]:
    cache = Path(settings.base_cache)
    if cache.is_dir():
        for d in sorted(cache.iterdir()):
            img = read_base(d) if d.is_dir() and not d.name.startswith(".") else None
            if img:
                yield img


def host_identity() -> str:
    """Identity of the host as a base: its OS release and architecture."""
    info = parse_os_release(Path("/"))
    return f"host:{info.get('ID', 'linux')}-{info.get('VERSION_ID', '')}-{platform.machine()}"


def base_identity(name: str) -> str:
    """What layer keys name as the base: the definition's content address, or the host's OS."""
    if name == HOST_BASE:
        return host_identity()
    return definition_id(load_definition(name))
