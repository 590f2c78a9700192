"""The base stage: a base image's root filesystem built from its definition, once.

A base is built in a temporary directory and renamed into place, under a lock, so a
half-built base never counts and concurrent builders wait for one another. Every later
stage runs Spack inside it (:func:`sandbox_runner`) and every image starts from it,
reusing its compressed bulk (:func:`base_part`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Optional, Sequence, Tuple

from dedal.adapters import debootstrap, squashfs
from dedal.adapters import runtime as rt
from dedal.errors import Signals, ToolError, UserError
from dedal.model.base import (
    HOST_BASE,
    BaseDefinition,
    BaseImage,
    definition_id,
    iter_cached,
    load_definition,
    parse_os_release,
    read_base,
)
from dedal.model.image import STD_PATH, image_tops
from dedal.model.artifacts import atomic_path, exclusive, inputs_digest, sha256_file, write_atomic
from dedal.ui.activity import activity

if TYPE_CHECKING:
    from dedal.model.config import Settings


Progress = Optional[Callable[[str], None]]


def resolve_mirror(defn: BaseDefinition, settings: Settings) -> Dict[str, str]:
    """Mirror URIs: definition, else the ``debian_mirror`` setting, else the host's apt
    sources, else deb.debian.org (the security archive likewise)."""
    host = debootstrap.host_mirrors()
    archive = defn.mirror or getattr(settings, "debian_mirror", "") or host.get("archive") or debootstrap.DEFAULT_MIRROR
    security = host.get("security") or debootstrap.DEFAULT_SECURITY_MIRROR
    return {"archive": archive.rstrip("/"), "security": security.rstrip("/")}


def _dir_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def ensure_base(name: str, settings: Settings, progress: Progress = None, *, rebuild: bool = False) -> BaseImage:
    """The built base ``name``, building it first if it is not in the cache."""
    defn = load_definition(name)
    bid = definition_id(defn)
    cache = Path(settings.base_cache)
    final = cache / bid
    say = progress or (lambda _msg: None)
    if not rebuild:
        found = read_base(final)
        if found:
            return found
    check_can_build(defn, cache, rebuild=rebuild)
    # SIGTERM (scancel, a CI timeout) like Ctrl-C: debootstrap is killed and the half-made
    # root filesystem removed on the way out, not left running and lying in the cache
    with Signals(f"base {name}"), exclusive(final, f"base {name}", say):
        if not rebuild:
            found = read_base(final)  # another process may have built it while we waited
            if found:
                return found
        return _build(defn, bid, settings, say)


def check_can_build(defn: BaseDefinition, cache: Path, *, rebuild: bool = False, euid: Optional[int] = None) -> None:
    """A Debian base is built as root (debootstrap makes device nodes and files owned by other
    users). Said before the work, with the way out a user who is not root has: a base that
    root built into a shared ``base_cache``. (It was said from inside debootstrap's step, after
    a line naming a log that was never written, as "use a prebuilt base", which no setting is.)"""
    if defn.kind != "debian" or (os.geteuid() if euid is None else euid) == 0:
        return
    why = "rebuilding it" if rebuild else f"it is not in base_cache {cache}, and building it"
    raise UserError(
        f"base {defn.name}: {why} needs root (debootstrap makes device nodes and files owned by other "
        f"users); let root run `dedal base build {defn.name}` with base_cache on a folder users can read, "
        "then set base_cache (or DEDAL_BASE_CACHE) to that folder"
    )


def _build(defn: BaseDefinition, bid: str, settings: Settings, say: Callable[[str], None]) -> BaseImage:
    cache = Path(settings.base_cache)
    final = cache / bid
    logs = cache / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{bid}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    tmp = cache / f".build-{bid}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    root = tmp / "rootfs"
    start = time.monotonic()
    mirrors = resolve_mirror(defn, settings)
    try:
        releases: Dict[str, Dict[str, str]] = {}
        if defn.kind == "debian":
            releases = _build_debian(defn, root, mirrors, log, say, start)
            packages = debootstrap.installed_packages(root)
        else:
            packages = _build_apptainer(defn, root, log, say, start)
        say(f"[{time.monotonic() - start:5.0f}s] mksquashfs rootfs -> rootfs.sqfs")
        with activity(f"{defn.name}: mksquashfs rootfs", log=log, announce=False):
            squashfs.pack([root], tmp / "rootfs.sqfs", log=log, what="mksquashfs (base rootfs)")
        versions = {k: packages[p] for k, p in defn.record_versions.items() if p in packages}
        versions.update(_probe_versions(defn, root, log))
        img = BaseImage(
            name=defn.name,
            id=bid,
            path=final,
            kind=defn.kind,
            os_release=parse_os_release(root),
            versions=versions,
            packages=packages,
            env=dict(defn.env),
            arch=defn.arch,
            mirror=mirrors["archive"] if defn.kind == "debian" else "",
            built_at=time.time(),
            build_seconds=round(time.monotonic() - start, 1),
            rootfs_bytes=_dir_bytes(root),
            squashfs_bytes=(tmp / "rootfs.sqfs").stat().st_size,
            definition_file=defn.path.name,
            apt_releases=releases,
        )
        shutil.copyfile(defn.path, tmp / defn.path.name)
        shutil.copyfile(log, tmp / "build.log")
        (tmp / "base.json").write_text(json.dumps(img.to_json(), indent=2, sort_keys=True) + "\n")
        if final.exists():  # a stale or broken directory (rebuild, or base.json missing)
            trash = cache / f".old-{bid}-{os.getpid()}"
            os.replace(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, final)
        # what every image assembled on this base reuses compressed (base_part): made now
        # for the configured install root and view, not by the first assembly
        base_part(
            img,
            base_sha256(img, settings),
            image_tops(str(settings.install_root), str(settings.view)),
            settings,
            log,
            say,
        )
        say(f"[{time.monotonic() - start:5.0f}s] base {bid} ready: {img.squashfs_bytes / 1e6:.0f} MB squashfs")
        return img
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, ToolError) and exc.log_path is None:
            raise ToolError(exc.what, exc.cmd, exc.returncode, log, exc.detail) from None
        raise


_VERSION_RE = re.compile(r"(\d+\.\d+(?:\.\d+)?)")


def _probe_versions(defn: BaseDefinition, root: Path, log: Path) -> Dict[str, str]:
    """Run each ``probe_versions`` command inside the finished root; keep the first version number."""
    found: Dict[str, str] = {}
    for key, command in defn.probe_versions.items():
        out = rt.run_in(root, ["/bin/sh", "-c", command], what=f"version probe {key}", runtime="bwrap").stdout
        m = _VERSION_RE.search(out)
        if not m:
            raise UserError(f"{defn.path}: probe_versions.{key}: `{command}` printed no version number")
        found[key] = m.group(1)
    return found


def _build_debian(
    defn: BaseDefinition, root: Path, mirrors: Dict[str, str], log: Path, say: Callable[[str], None], start: float
) -> Dict[str, Dict[str, str]]:
    """Build the root; returns the apt Release files it was built from (the live mirror's state)."""

    def stamp() -> str:
        return f"[{time.monotonic() - start:5.0f}s]"

    say(f"{stamp()} debootstrap --variant={defn.variant} {defn.suite} from {mirrors['archive']} (log: {log})")
    # each step on the display while it runs, with the tool's latest line ("I: Retrieving libc6")
    with activity(f"{defn.name}: debootstrap {defn.suite}", log=log, announce=False):
        debootstrap.bootstrap(root, defn.suite, mirrors["archive"], variant=defn.variant, arch=defn.arch, log=log)
    debootstrap.write_sources(
        root,
        defn.suite,
        mirrors["archive"],
        updates=defn.updates,
        security=mirrors["security"] if defn.security else None,
        components=defn.components,
    )
    pkgs = defn.all_packages
    say(f"{stamp()} apt-get install {len(pkgs)} packages (and their dependencies)")
    with activity(f"{defn.name}: apt-get install {len(pkgs)} packages", log=log, announce=False):
        debootstrap.apt_install(root, pkgs, log=log)
    if defn.python_venv:
        say(f"{stamp()} python venv {defn.python_venv['path']}: pip install {' '.join(defn.python_venv['packages'])}")
        with activity(f"{defn.name}: pip install {' '.join(defn.python_venv['packages'])}", log=log, announce=False):
            debootstrap.python_venv(root, defn.python_venv["path"], defn.python_venv["packages"], log=log)
    releases = debootstrap.apt_releases(root)
    debootstrap.clean_root(root)
    return releases


def _build_apptainer(
    defn: BaseDefinition, root: Path, log: Path, say: Callable[[str], None], start: float
) -> Dict[str, str]:
    say(f"[{time.monotonic() - start:5.0f}s] apptainer build --sandbox {defn.path.name} (log: {log})")
    with activity(f"{defn.name}: apptainer build --sandbox", log=log, announce=False):
        rt.apptainer_build_sandbox(defn.path, root, log=log)
    return rt.rpm_packages(root, log=log)


def base_root(name: str, settings: Settings, progress: Progress = None) -> Tuple[Optional[Path], Dict[str, str]]:
    """The root filesystem builds run in (None: the host), built on first use (its steps
    told to ``progress``), and the environment it defines (e.g. SPACK_PYTHON)."""
    if name == HOST_BASE:
        return None, {}
    base = ensure_base(name, settings, progress)
    return Path(base.rootfs_dir), dict(base.env)


def sandbox_runner(
    base_root: Optional[Path], binds: Sequence[rt.Bind], runtime: str, base_env: Optional[Dict[str, str]] = None
) -> Callable:
    """A Spack runner that executes inside the base image (or the host with a private
    mount namespace when ``base_root`` is None) with the stage at the install root."""

    def run(cmd, *, env, log, what, timeout=None):  # noqa: ANN001
        full = dict(base_env or {})
        full.update(env)
        full.setdefault("PATH", os.environ.get("PATH", STD_PATH) if base_root is None else STD_PATH)
        if base_root is None and "SPACK_PYTHON" in os.environ:
            full.setdefault("SPACK_PYTHON", os.environ["SPACK_PYTHON"])
        return rt.run_in(base_root, cmd, binds=binds, env=full, log=log, what=what, runtime=runtime, timeout=timeout)

    return run


def base_sha256(base: Optional[BaseImage], settings: Settings) -> str:
    """sha256 of the base's rootfs.sqfs (the base's content; its id only names its definition),
    remembered per file size and mtime under ``cache_dir`` so that it is hashed once."""
    sqfs = Path(base.squashfs)
    st = sqfs.stat()
    memo = Path(settings.cache_dir) / "assemble" / "base-sha256" / f"{base.id}.json"
    try:
        data = json.loads(memo.read_text())
        if data.get("size") == st.st_size and data.get("mtime_ns") == st.st_mtime_ns and data.get("sha256"):
            return str(data["sha256"])
    except (OSError, ValueError):
        pass
    digest = sha256_file(sqfs)
    try:
        write_atomic(memo, json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}) + "\n")
    except OSError:
        pass  # a read-only cache only costs hashing again next time
    return digest


BASE_PART_FORMAT = 1  # bump when what squashfs.pack writes changes: cached parts are then rebuilt
_WILDCARD = re.compile(r"[*?\\[\]]")


def base_part(
    base: Optional[BaseImage],
    base_digest: str,
    tops: Sequence[str],
    settings: Settings,
    log: Path,
    say: Callable[[str], None],
) -> Optional[Path]:
    """The base's squashfs without the top-level entries ``tops`` (those the image
    changes), made once per base and set of names under ``cache_dir``: the image is this
    plus the changed entries appended (``squashfs.append``), so the base's bulk (the OS,
    CUDA) is not compressed again for every image. None (pack the whole tree) for a host
    base or names mksquashfs's exclusion cannot express."""
    if base is None or not base_digest or not Path(base.rootfs_dir).is_dir() or not tops:
        return None
    if any(_WILDCARD.search(t) or t in (".", "..") for t in tops):
        return None
    key = inputs_digest([BASE_PART_FORMAT, base_digest, sorted(tops), squashfs.version()], length=16)
    parts = Path(settings.cache_dir) / "assemble" / "base-parts"
    path = parts / f"{base.id}-{key}.sqfs"
    if path.is_file():
        return path
    parts.mkdir(parents=True, exist_ok=True)
    say(f"base {base.id} without {', '.join('/' + t for t in tops)}: packed once, kept in {parts}")
    with atomic_path(path) as tmp, activity(f"{base.id}: mksquashfs base part", log=log, announce=False):
        squashfs.pack([Path(base.rootfs_dir)], tmp, exclude=list(tops), log=log, what="mksquashfs (base part)")
    # one part per base (the set of names rarely changes), none for bases no longer cached
    cached = {b.id for b in iter_cached(settings)} | {base.id}
    for old in parts.glob("*.sqfs"):
        if old != path and (old.name.startswith(f"{base.id}-") or old.name.rsplit("-", 1)[0] not in cached):
            old.unlink(missing_ok=True)
    return path
