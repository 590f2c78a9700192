"""The fetch stage (where there is network): Spack at its pinned ref, the environment
concretized inside the build base image (unless a lock is given), every source in the
mirror, and the plan. Everything after it works offline.

A rerun fetches only what is missing. Offline, it names every source the mirror lacks
and how to point dedal at an existing Spack checkout and mirror.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import List, Mapping, Optional, Tuple

from dedal.adapters import git as gitad
from dedal.adapters import runtime as rt
from dedal.adapters.spack import Spack, user_cache
from dedal.model.config import Settings
from dedal.errors import DedalError, ToolError, UserError
from dedal.model.base import base_identity, unknown_base
from dedal.model.git_sources import GitSource, archived_by_sha256
from dedal.stages.base import base_root, sandbox_runner
from dedal.model.spack_env import inputs_digest, local_inputs, stage_env_dir, stage_manifest, write_env_dir
from dedal.model.target import Target
from dedal.stages.workspace import Prepared, write_plan
from dedal.ui.activity import activity


@dataclass
class MissingSource:
    package: str
    kind: str  # source | patch | resource
    url: str
    mirror_path: str
    digest: str = ""
    hint: str = ""  # how to get it where downloading cannot (an archived git source)

    def line(self) -> str:
        return f"{self.package} {self.kind} {self.url or '?'} -> {self.mirror_path}" + (
            f" ({self.hint})" if self.hint else ""
        )


@dataclass
class FetchResult:
    env: str
    spack_root: str
    spack_commit: str
    lock: str
    concretized: bool
    sources: int
    already_present: int
    fetched: int
    plan: str
    seconds: float
    listed: bool = True  # sources listed per package (else checked by `spack mirror create` alone)
    mirrored: bool = True  # False: --lock-only, the mirror was left alone
    missing: List[MissingSource] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def obtain_spack(settings: Settings) -> Tuple[Path, str]:
    """The configured Spack checkout, else a clone of ``spack_url`` at ``spack_ref`` in the cache."""
    if settings.spack_root:
        root = Path(settings.spack_root)
        if not (root / "bin" / "spack").is_file():
            raise UserError(f"spack_root {root}: not a Spack checkout (no bin/spack)")
        commit = gitad.head_commit(root) if (root / ".git").exists() else ""
        return root, commit
    dest = Path(settings.cache_dir) / "spack" / settings.spack_ref
    try:
        with activity(f"fetching Spack {settings.spack_ref} from {settings.spack_url}", announce=False):
            commit = gitad.checkout(settings.spack_url, settings.spack_ref, dest)
    except ToolError as exc:
        raise UserError(
            f"cannot obtain Spack {settings.spack_ref} from {settings.spack_url} ({exc.detail or exc.one_line()}); "
            "without network, set DEDAL_SPACK_ROOT (or spack_root) to a local Spack checkout, "
            "or spack_url to a local clone"
        ) from None
    return dest, commit


def envs_checkout(settings: Settings) -> Tuple[Path, str]:
    """The spack-envs repository at ``envs_ref`` (cloned or updated in the cache)."""
    digest = hashlib.sha256(settings.envs_url.encode()).hexdigest()[:12]
    dest = Path(settings.cache_dir) / "spack-envs" / f"{digest}-{re.sub(r'[^A-Za-z0-9._-]+', '_', settings.envs_ref)}"
    try:
        commit = gitad.checkout(settings.envs_url, settings.envs_ref, dest)
    except ToolError as exc:
        raise UserError(
            f"cannot obtain the environments repository {settings.envs_url} at {settings.envs_ref} "
            f"({exc.detail or exc.one_line()})"
        ) from None
    return dest, commit


_KIND = {"sources": "source", "patches": "patch", "resources": "resource"}


def _missing(sources: List[dict], mirror: Path) -> Tuple[List[MissingSource], int]:
    missing: List[MissingSource] = []
    total = 0
    for pkg in sources:
        for kind in ("sources", "patches", "resources"):
            for src in pkg.get(kind, []):
                paths = src.get("mirror_paths") or []
                if not paths:
                    continue
                total += 1
                if not any((mirror / p).exists() for p in paths):
                    missing.append(
                        MissingSource(
                            f"{pkg['name']}@{pkg['version']}",
                            _KIND[kind],
                            src.get("url") or "",
                            paths[0],
                            src.get("digest") or "",
                        )
                    )
    return missing, total


def _from_pypi(sources: List[dict], mirror: Path, index: str, note) -> int:  # noqa: ANN001
    """Sources still missing whose recipe URL is PyPI's, taken from PyPI's simple index:
    the file listed with the recipe's sha256, stored where Spack looks for it (the first
    mirror path, ``_source-cache/archive/<sha[:2]>/<sha>.<ext>``). Returns how many were
    added; what is not found stays missing and is reported with the rest."""
    if not index:
        return 0
    from dedal.adapters import pypi  # requests: only for a fetch that asks PyPI

    index_client = pypi.PyPI(index)
    added = 0
    for pkg in sources:
        for kind in ("sources", "patches", "resources"):
            for src in pkg.get(kind, []):
                paths = src.get("mirror_paths") or []
                project = pypi.project_of(src.get("url") or "")
                digest = src.get("digest") or ""
                if not paths or not project or len(digest) != 64 or any((mirror / p).exists() for p in paths):
                    continue
                try:
                    item = index_client.find(project, digest)
                    if item is None:
                        note(
                            f"{pkg['name']}@{pkg['version']}: no file with sha256 {digest[:12]}... in {index}/{project}/"
                        )
                        continue
                    index_client.download(item, mirror / paths[0])
                except pypi.PyPIError as exc:
                    note(f"{pkg['name']}@{pkg['version']}: {exc.one_line()}")
                    continue
                note(f"{pkg['name']}@{pkg['version']}: {item.filename} from {index} (sha256 {digest[:12]}...)")
                added += 1
    return added


def _list_sources(spack: Spack, fenv: Path, work: Path, logs: Path, note) -> Optional[List[dict]]:  # noqa: ANN001
    """Every source with its mirror paths, through Spack's Python API; None when this
    Spack cannot run the listing (another API version, or no `spack python`)."""
    sources_file = work / "sources.json"
    script = work / "list_sources.py"
    script.write_text(resources.files("dedal").joinpath("data/list_sources.py").read_text())
    sources_file.unlink(missing_ok=True)
    try:
        with activity("listing the sources of every package", log=logs / "list-sources.log", announce=False):
            spack.python_script(fenv, script, [str(sources_file)], logs / "list-sources.log")
        data = json.loads(sources_file.read_text())
    except (ToolError, OSError, json.JSONDecodeError) as exc:
        note(
            f"could not list sources per package ({getattr(exc, 'detail', '') or exc}); relying on spack mirror create"
        )
        return None
    return data if isinstance(data, list) else None


def _archive_stats(log: Path) -> Tuple[int, int]:
    """(already present, added) from the last "Archive stats" of `spack mirror create`."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return 0, 0
    block = text.rsplit("Archive stats", 1)[-1] if "Archive stats" in text else ""
    present = re.search(r"(\d+)\s+already present", block)
    added = re.search(r"(\d+)\s+added", block)
    return (int(present.group(1)) if present else 0, int(added.group(1)) if added else 0)


def _failed_downloads(log: Path) -> List[str]:
    """Specs Spack reports as failed in `spack mirror create` output."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return []
    failed: List[str] = []
    for line in text.splitlines():
        m = re.search(r"Failed downloads:\s*(.*)$", line) or re.search(r"Error while fetching (\S+)", line)
        if m and m.group(1).strip():
            failed.extend(t for t in m.group(1).split() if t not in failed)
    return failed


def _git_hints(missing: List[MissingSource], archived: Mapping[str, GitSource]) -> None:
    """Name the origin of each missing source that is a git repository's archive (by its
    sha256, as the package repositories' git-sources.json record it)."""
    for m in missing:
        s = archived.get(m.digest)
        if s is not None:
            m.hint = (
                f"archived from {s.repository} at {s.commit[:12]}: recipes/gitsrc/archive.py "
                "of dedal's checkout puts it into the mirror"
            )


def _fill_mirror(
    spack: Spack,
    fenv: Path,
    work: Path,
    logs: Path,
    mirror: Path,
    note,
    pypi_index: str = "",
    archived: Optional[Mapping[str, GitSource]] = None,
) -> Tuple[int, int, List[MissingSource], bool]:  # noqa: ANN001
    """Every source of the concrete environment into ``mirror``: (sources, missing before,
    still missing, listed per package); DedalError naming what could not be fetched
    (``archived``: sha256 -> a git repository's archive, named as such)."""
    sources = _list_sources(spack, fenv, work, logs, note)
    offline_hint = (
        "Offline, point dedal at a mirror that has them (-s mirror=DIR or DEDAL_MIRROR) "
        f"and at a local Spack checkout (DEDAL_SPACK_ROOT); log: {logs / 'mirror-create.log'}"
    )
    if sources is None:
        # no per-source listing: Spack's own mirror creation decides, and its report names the failures
        note(f"filling the mirror {mirror} with spack mirror create")
        try:
            with activity("spack mirror create", log=logs / "mirror-create.log", announce=False):
                spack.mirror_create(fenv, mirror, logs / "mirror-create.log")
        except ToolError as exc:
            failed = _failed_downloads(logs / "mirror-create.log")
            raise DedalError(
                f"sources missing from the mirror {mirror} could not be fetched (no network?): "
                f"{', '.join(failed) or exc.detail}. {offline_hint}"
            ) from None
        present, added = _archive_stats(logs / "mirror-create.log")
        return present + added, added, [], False
    missing, total = _missing(sources, mirror)
    before = len(missing)
    if missing:
        note(f"fetching {len(missing)} of {total} sources into {mirror}")
        try:
            with activity("spack mirror create", log=logs / "mirror-create.log", announce=False):
                spack.mirror_create(fenv, mirror, logs / "mirror-create.log")
        except ToolError:
            pass  # what is still missing is reported below, precisely
        # Spack fetches from a mirror by the storage path alone (the <pkg>/<pkg>-<ver> link is cosmetic)
        _from_pypi(sources, mirror, pypi_index, note)
        missing, total = _missing(sources, mirror)
    if missing:
        _git_hints(missing, archived or {})
        lines = "; ".join(m.line() for m in missing[:10]) + (
            f"; and {len(missing) - 10} more" if len(missing) > 10 else ""
        )
        raise DedalError(
            f"{len(missing)} of {total} sources are missing from the mirror {mirror} and could "
            f"not be fetched (no network?): {lines}. {offline_hint}"
        )
    return total, before, missing, True


def _missing_dirs(path: Path) -> List[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first."""
    missing: List[Path] = []
    for candidate in (path, *path.parents):
        if candidate.exists():
            break
        missing.append(candidate)
    return missing


class _Undo:
    """What a fetch writes before Spack can say that the input is bad (concretize's
    UserError), taken back. A work dir it created is removed; the mirror and the parents it
    created (the data dir) are removed when empty, as they are unless another fetch has put
    something there meanwhile. In a work dir of an earlier fetch, the manifests and included
    files it rewrote are put back, and the lock of Spack's environment, so that the earlier
    lock, plan and build still go together; the stamp of the earlier concretization stays
    valid. Logs stay (no rerun takes them for progress)."""

    def __init__(self, work: Path, mirror: Path) -> None:
        self.work = work
        self.new_work = not work.exists()
        self.new_dirs = sorted(
            set(_missing_dirs(work) + _missing_dirs(mirror)) - {work}, key=lambda d: len(d.parts), reverse=True
        )
        self.includes = work / "includes"
        kept = [work / "spack.yaml", work / "fetch-env" / "spack.yaml", work / "fetch-env" / "spack.lock"]
        if self.includes.is_dir():
            kept += [f for f in self.includes.rglob("*") if f.is_file()]
        self.kept = kept
        self.saved = {f: f.read_bytes() for f in kept if f.is_file()}

    def __call__(self) -> None:
        if self.new_work:
            shutil.rmtree(self.work, ignore_errors=True)
        else:
            if self.includes.is_dir():
                for f in self.includes.rglob("*"):
                    if f not in self.saved and not f.is_dir():
                        f.unlink(missing_ok=True)
            for f in self.kept:
                if f in self.saved:
                    tmp = f.with_name(f.name + ".undo-tmp")
                    tmp.write_bytes(self.saved[f])
                    tmp.replace(f)
                else:
                    f.unlink(missing_ok=True)
        for d in self.new_dirs:  # deepest first; one that holds something now is another's
            try:
                d.rmdir()
            except OSError:
                pass


CONCRETIZED_STAMP = ".concretized-from"  # in the work directory: the inputs digest spack.lock was made from


def current(work: Path, manifest_digest: str, given_lock: Optional[Path] = None) -> Optional[str]:
    """None when ``work``'s spack.lock was concretized from these inputs (the manifest and
    its local inputs, :func:`dedal.model.spack_env.inputs_digest`), else why fetch must
    concretize (or take the given lock) again."""
    if given_lock is not None:
        return f"the lock {given_lock} is given"
    if not (work / "spack.lock").is_file():
        return "no spack.lock yet"
    stamp = work / CONCRETIZED_STAMP
    if not stamp.is_file():
        return f"no {CONCRETIZED_STAMP} stamp beside spack.lock"
    if stamp.read_text() != manifest_digest:
        return "the manifest or one of its local inputs changed since the last concretization"
    return None


def run_fetch(
    target: Target,
    *,
    progress=None,  # noqa: ANN001
    sources_too: bool = True,
) -> Tuple[FetchResult, Prepared]:
    """Concretize (unless a lock is given), fill the mirror, write the plan; with
    ``sources_too`` False only the lock and the plan (whether an environment
    concretizes on its base, offline: sources are a separate matter). Returns the result and
    the plan as written, which the later stages of the same command take."""
    started = time.monotonic()
    settings = target.settings
    note = progress.note if progress else (lambda line: None)
    if target.runtime_base != target.base_image:  # an unknown runtime base is said now, not after the build
        note(f"layers built on base {target.base_image}, the image assembled on base {target.runtime_base}")
    problem = unknown_base(target.base_image)  # the setting's, or a lock's (an env file's is checked when read)
    if problem:
        raise UserError(f"{target.base_source}: {problem}")
    base_identity(target.base_image)  # a definition that does not parse: said before anything is written too
    spack_root, commit = obtain_spack(settings)
    note(f"spack {commit[:12] or spack_root}")
    work = target.workdir
    mirror = Path(settings.mirror)
    undo = _Undo(work, mirror)
    work.mkdir(parents=True, exist_ok=True)
    mirror.mkdir(parents=True, exist_ok=True)
    logs = target.logs_dir
    given_lock: Optional[Path] = target.lock_path
    if given_lock is None and target.env is not None:
        near = target.env.directory / "spack.lock"
        given_lock = target.env.lock or (near if near.is_file() else None)
    bare_lock = None if target.env else target.read_lock()  # a bare lock: its roots make the manifest
    manifest = stage_env_dir(work, target.manifest(bare_lock), given_lock)
    manifest_digest = inputs_digest(work / "spack.yaml", manifest)
    stamp = work / CONCRETIZED_STAMP
    stale = current(work, manifest_digest, given_lock)

    # Spack works in its own environment directory: the user's manifest plus a writable
    # install tree and stage (concretization opens the store; nothing is installed there)
    fenv = work / "fetch-env"
    write_env_dir(
        fenv,
        stage_manifest(manifest, install_root=str(work / "fetch-store"), stage=work / "fetch-stage", mirror=mirror),
        given_lock,
    )
    if stale is None:
        shutil.copyfile(work / "spack.lock", fenv / "spack.lock")
    root, root_env = base_root(target.base_image, settings, note)  # built here the first time: minutes
    cache = user_cache(settings, spack_root)
    cache.mkdir(parents=True, exist_ok=True)
    binds = [rt.Bind(work), rt.Bind(mirror), rt.Bind(spack_root, readonly=True), rt.Bind(cache)]
    binds += [rt.Bind(p, readonly=True) for p in local_inputs(manifest)]
    spack = Spack(spack_root, cache, sandbox_runner(root, binds, settings.runtime, root_env))

    concretized = False
    if given_lock is not None:
        stamp.unlink(missing_ok=True)
    elif stale is not None:
        note(f"concretizing in the base image ({stale})")
        (fenv / "spack.lock").unlink(missing_ok=True)
        try:
            with activity(f"concretizing in {target.base_image}", log=logs / "concretize.log", announce=False):
                spack.concretize(fenv, logs / "concretize.log", force=True)
        except UserError as exc:  # Spack says the input is wrong: leave nothing a rerun would build on
            undo()
            raise UserError(f"{target.env.path if target.env else target.name}: {exc}") from None
        shutil.copyfile(fenv / "spack.lock", work / "spack.lock")
        stamp.write_text(manifest_digest)
        concretized = True
    total = before = 0
    missing: List[MissingSource] = []
    listed = False
    if sources_too:
        total, before, missing, listed = _fill_mirror(
            spack, fenv, work, logs, mirror, note, settings.pypi_index, archived_by_sha256(local_inputs(manifest))
        )
    prepared = write_plan(
        replace(target, lock_path=work / "spack.lock", plan_path=None, given_plan=None),
        bare_lock if given_lock is not None else None,
    )  # a given lock was copied as it is; one Spack wrote is read (and checked against the manifest)
    return FetchResult(
        env=target.name,
        spack_root=str(spack_root),
        spack_commit=commit,
        lock=str(work / "spack.lock"),
        concretized=concretized,
        sources=total,
        already_present=total - before,
        fetched=before - len(missing),
        plan=str(prepared.path),
        seconds=time.monotonic() - started,
        listed=listed,
        mirrored=sources_too,
    ), prepared
