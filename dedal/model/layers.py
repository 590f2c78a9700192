"""The content-addressed layer store: one ``<key>.sqfs`` and one ``<key>.json`` per package,
and ``<key>.records/`` with Spack's build records of it (log, build environment, times).

A layer exists when its manifest exists: the squashfs is renamed into place first and
the manifest written (temp file + rename) last, so a reader never sees half a layer.
Concurrent builders of one key are serialized by a lock file; the loser discards its
copy. The key covers everything that makes the bytes (DAG hash, install root, base).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Set

from dedal.errors import UserError
from dedal.model.artifacts import is_temporary, reap_temporaries, sha256_file, temp_path, temp_state
from dedal.model.inputs import load_json
from dedal.model.owner import ALIVE, GONE, UNKNOWN

LAYER_FORMAT = 2  # 2: Spack's build records beside the layer (<key>.records/), not in it
TMP_GRACE_S = 6 * 3600
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def _json_str(value: object) -> str:
    """What json.dumps writes for ``value`` (a str: its C string encoder, directly)."""
    return json.encoder.encode_basestring_ascii(value) if isinstance(value, str) else json.dumps(value)


def layer_key(name: str, version: str, dag_hash: str, install_root: str, base_id: str) -> str:
    """``<name>-<version>-<hash7>-<digest>``: readable, and the digest pins every input."""
    # json.dumps({"format": ..., "hash": ..., "install_root": ..., "base": ...}, sort_keys=True),
    # spelled out: a plan of 20,000 specs asks 20,000 times (tests/model/test_layers.py holds
    # it to json.dumps)
    payload = (
        f'{{"base": {_json_str(base_id)}, "format": {LAYER_FORMAT}, "hash": {_json_str(dag_hash)}, '
        f'"install_root": {_json_str(str(install_root))}}}'
    )
    digest = hashlib.sha256(payload.encode()).hexdigest()[:16]
    return f"{_UNSAFE.sub('_', name)}-{_UNSAFE.sub('_', version)[:40]}-{dag_hash[:7]}-{digest}"


def _owned(name: str) -> bool:
    """Whether a temporary's name records its owner (:meth:`LayerStore.temp_path`)."""
    return is_temporary(name)


def _young(path: Path) -> bool:
    """Younger than TMP_GRACE_S: it may belong to a build that is still running."""
    try:
        return path.stat().st_mtime >= time.time() - TMP_GRACE_S
    except OSError:
        return True


def temp_owner(name: str) -> str:
    """ALIVE, GONE or UNKNOWN: the state of the process a :meth:`LayerStore.temp_path`
    name records (UNKNOWN for other names, and where this host cannot tell)."""
    return temp_state(name)


@dataclass
class LayerManifest:
    key: str
    name: str
    version: str
    hash: str
    namespace: str
    prefix: str  # directory name under the install root
    install_root: str
    base_id: str
    size: int = 0  # bytes of the squashfs
    files: int = 0  # entries (files, dirs, links) in the prefix
    sha256: str = ""
    build_seconds: float = 0.0
    build_cores: int = 0  # make -j of that build (0: not recorded, manifests before dedal recorded it)
    pack_seconds: float = 0.0
    built_at: str = ""
    host: str = ""
    log: str = ""
    dedal_version: str = ""
    spack_version: str = ""
    runtime_deps: List[str] = field(default_factory=list)  # DAG hashes of link/run dependencies
    records: List[str] = field(default_factory=list)  # names in <key>.records/ (Spack's build log, ...)
    format: int = LAYER_FORMAT

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "LayerManifest":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass
class StoreCheck:
    ok: List[str] = field(default_factory=list)
    corrupt: List[str] = field(default_factory=list)  # "key: reason"
    orphaned: List[str] = field(default_factory=list)  # files without a complete layer
    refused: List[str] = field(default_factory=list)  # whole layers the entry audit refuses (one line each)
    # temporaries that are no fault of the store: those of dedal processes that are gone
    # (killed during mksquashfs: the next build and `layers gc` remove them) and those of
    # processes this host cannot judge (another node's build, which may be running)
    temporaries: List[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.corrupt and not self.orphaned and not self.refused

    def to_json(self) -> dict:
        return {
            "ok": len(self.ok),
            "corrupt": self.corrupt,
            "orphaned": self.orphaned,
            "refused": self.refused,
            "temporaries": self.temporaries,
            "clean": self.clean,
        }


class LayerStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # -- paths -----------------------------------------------------------------
    def sqfs(self, key: str) -> Path:
        return self.root / f"{key}.sqfs"

    def manifest_path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def records_dir(self, key: str) -> Path:
        """Spack's build records of the layer (kept out of it: they differ on every build)."""
        return self.root / f"{key}.records"

    @property
    def tmp_dir(self) -> Path:
        return self.root / ".tmp"

    def ensure_writable(self) -> None:
        """Fail early, before any build starts, when the store cannot be written."""
        try:
            self.tmp_dir.mkdir(parents=True, exist_ok=True)
            probe = self.tmp_dir / f".probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise UserError(f"layer store {self.root} is not writable ({exc.strerror or exc})") from None

    def temp_path(self, key: str, suffix: str = ".sqfs") -> Path:
        """A unique name inside the store (same filesystem: the final rename is atomic) that
        names its owner (:func:`temp_owner`), so that the temporaries of a killed process
        are known as such and removed by the next build (:meth:`reap_temporaries`): the
        one temporary name of :mod:`dedal.model.artifacts`, in ``.tmp/``."""
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        return temp_path(self.tmp_dir / key, suffix)

    def reap_temporaries(self) -> List[str]:
        """Remove the temporaries of dedal processes that are gone (killed during mksquashfs,
        say); those of live processes, of other hosts, and unnamed ones stay (``gc``
        removes the last after a grace period). Returns the names removed."""
        return reap_temporaries(self.tmp_dir)

    # -- queries ---------------------------------------------------------------
    def current(self, key: str) -> Optional[str]:
        """None when layer ``key`` is stored whole, else why it must be built (or taken from
        a cache) again. The key pins every input of the layer (:func:`layer_key`), so its
        manifest is the stamp: a new DAG hash, install root or base is a new key."""
        if not self.manifest_path(key).is_file():
            return f"no layer {key} in {self.root}"
        if not self.sqfs(key).is_file():
            return f"layer {key}: its manifest has no squashfs"
        return None

    def has(self, key: str) -> bool:
        return self.current(key) is None

    def manifest(self, key: str) -> LayerManifest:
        path = self.manifest_path(key)
        if not path.is_file():
            raise UserError(f"layer {key} is not in the store {self.root}")
        data = load_json(path)
        if not isinstance(data, dict):
            raise UserError(f"{path}: unreadable layer manifest (not an object)")
        try:
            return LayerManifest.from_json(data)
        except TypeError as exc:
            raise UserError(f"{path}: unreadable layer manifest ({exc})") from None

    def keys(self) -> List[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.stem for p in self.root.glob("*.json") if self.sqfs(p.stem).is_file())

    def manifests(self) -> List[LayerManifest]:
        return [self.manifest(k) for k in self.keys()]

    # -- writes ----------------------------------------------------------------
    @contextlib.contextmanager
    def _key_lock(self, key: str) -> Iterator[None]:
        lock_dir = self.root / ".locks"
        lock_dir.mkdir(parents=True, exist_ok=True)
        with open(lock_dir / f"{key}.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def add(self, manifest: LayerManifest, packed: Path, records: Optional[Path] = None) -> LayerManifest:
        """Move a packed squashfs (from ``temp_path``) into the store under its key, and
        the directory ``records`` (on the same file system or not) to ``records_dir``.

        If another builder stored the same key meanwhile, its layer is kept (same key,
        same content) and ours is discarded."""
        key = manifest.key
        with self._key_lock(key):
            if self.has(key):
                packed.unlink(missing_ok=True)
                return self.manifest(key)
            manifest.size = packed.stat().st_size
            manifest.sha256 = sha256_file(packed)
            if records is not None and records.is_dir():
                final = self.records_dir(key)
                if final.exists():
                    shutil.rmtree(final)
                shutil.move(str(records), str(final))
                manifest.records = sorted(os.listdir(final))
            os.replace(packed, self.sqfs(key))
            tmp = self.temp_path(key, ".json")
            tmp.write_text(json.dumps(manifest.to_json(), indent=1, sort_keys=True) + "\n")
            os.replace(tmp, self.manifest_path(key))
        return manifest

    def remove(self, key: str) -> None:
        with self._key_lock(key):
            self.manifest_path(key).unlink(missing_ok=True)  # manifest first: the layer stops existing
            self.sqfs(key).unlink(missing_ok=True)
            shutil.rmtree(self.records_dir(key), ignore_errors=True)

    # -- maintenance -------------------------------------------------------------
    def verify(self, keys: Optional[Iterable[str]] = None) -> StoreCheck:
        """Re-hash layers against their manifests and list files that belong to no layer."""
        check = StoreCheck()
        if not self.root.is_dir():
            return check
        selected = list(keys) if keys is not None else None
        for man_path in sorted(self.root.glob("*.json")):
            key = man_path.stem
            if selected is not None and key not in selected:
                continue
            sqfs = self.sqfs(key)
            if not sqfs.is_file():
                check.orphaned.append(f"{man_path.name}: manifest without squashfs")
                continue
            try:
                man = self.manifest(key)
            except UserError as exc:
                check.corrupt.append(f"{key}: {exc.one_line()}")
                continue
            if man.key != key:
                check.corrupt.append(f"{key}: manifest names key {man.key}")
            elif sqfs.stat().st_size != man.size:
                check.corrupt.append(f"{key}: size {sqfs.stat().st_size} != manifest {man.size}")
            elif sha256_file(sqfs) != man.sha256:
                check.corrupt.append(f"{key}: sha256 mismatch")
            else:
                check.ok.append(key)
        if selected is None:
            for sqfs in sorted(self.root.glob("*.sqfs")):
                if not self.manifest_path(sqfs.stem).is_file():
                    check.orphaned.append(f"{sqfs.name}: squashfs without manifest")
            if self.tmp_dir.is_dir():
                for tmp in sorted(self.tmp_dir.iterdir()):
                    state = temp_owner(tmp.name)
                    if state == ALIVE:
                        continue  # a build is writing it
                    if state == GONE:
                        check.temporaries.append(
                            f".tmp/{tmp.name}: left by a dedal process that is gone (killed); "
                            "the next build or `dedal layers gc` removes it"
                        )
                    elif _owned(tmp.name) and _young(tmp):
                        check.temporaries.append(
                            f".tmp/{tmp.name}: of a dedal process on another host or in another "
                            "PID namespace (it may still be writing it); kept"
                        )
                    else:
                        check.orphaned.append(f".tmp/{tmp.name}: leftover temporary file")
        return check

    def gc(self, referenced: Set[str], dry_run: bool = False) -> List[str]:
        """Remove layers (and leftovers) not referenced by any known plan."""
        removed: List[str] = []
        for key in self.keys():
            if key not in referenced:
                removed.append(key)
                if not dry_run:
                    self.remove(key)
        if self.root.is_dir():
            for sqfs in sorted(self.root.glob("*.sqfs")):
                if not self.manifest_path(sqfs.stem).is_file():
                    removed.append(sqfs.name)
                    if not dry_run:
                        sqfs.unlink(missing_ok=True)
            for records in sorted(self.root.glob("*.records")):
                if not self.manifest_path(records.name[: -len(".records")]).is_file():
                    removed.append(records.name)
                    if not dry_run:
                        shutil.rmtree(records, ignore_errors=True)
            if self.tmp_dir.is_dir():
                cutoff = time.time() - TMP_GRACE_S  # younger ones may belong to a running build
                for tmp in sorted(self.tmp_dir.iterdir()):
                    state = temp_owner(tmp.name)
                    if state == GONE or (state == UNKNOWN and tmp.stat().st_mtime < cutoff):
                        removed.append(f".tmp/{tmp.name}")
                        if not dry_run:
                            tmp.unlink(missing_ok=True)
        return removed

    def entries(self) -> Dict[str, LayerManifest]:
        return {m.key: m for m in self.manifests()}
