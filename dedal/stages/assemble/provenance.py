"""What a rebuild needs, carried in the image under ``/opt/dedal/env``, with no path of the
machine that built it.

Besides ``spack.yaml`` (the manifest Spack uses inside the image) and ``spack.lock``:

* ``repos/<i>`` and ``includes/<i>[.yaml]``: copies of the manifest's local package
  repositories and included files (``spack.repos``/``spack.include`` entries that are
  paths), which the image's ``spack.yaml`` names at these paths;
* ``env.yaml``: the environment file to rebuild from: the manifest with those entries
  relative to it, and a ``dedal:`` section with everything that decides the image
  (name, tag, base image, install root and view made explicit, description, labels,
  runscript, selection);
* ``base.yaml``: the base image's definition, as it was built; ``runtime-base.yaml``
  likewise for the base the image was assembled on where that is another
  (``runtime_base``).

`dedal rebuild` extracts this directory and builds ``env.yaml`` with ``spack.lock``
beside it. The copies are made the same way on every machine (sorted, no
``__pycache__``), so the image does not depend on where the environment was checked out.
"""

from __future__ import annotations

import copy
import hashlib
import json
import posixpath
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

import yaml

from dedal.errors import UserError
from dedal.model.envfile import load_yaml
from dedal.model.image_options import ImageOptions
from dedal.model.image import BASE_FILE, ENV_FILE, ENV_IN_IMAGE, RUNTIME_BASE_FILE
from dedal.model.plan import Plan

if TYPE_CHECKING:
    from dedal.model.base import BaseImage


KEEP = ("spack.yaml", "spack.lock", ENV_FILE, BASE_FILE, RUNTIME_BASE_FILE, "repos", "includes")
_IGNORED = ("__pycache__",)


def _local(entry: Any) -> bool:
    return isinstance(entry, str) and entry.startswith("/") and Path(entry).exists()


def _carried(manifest: Mapping[str, Any]) -> List[Tuple[str, int, str, str]]:
    """(key, index, source path, name under /opt/dedal/env) of every local input."""
    spack = manifest.get("spack", {}) if isinstance(manifest, Mapping) else {}
    found = []
    for key, folder in (("repos", "repos"), ("include", "includes")):
        for i, entry in enumerate(spack.get(key) or []):
            if _local(entry):
                suffix = "" if Path(entry).is_dir() else "".join(Path(entry).suffixes[-1:])
                found.append((key, i, entry, f"{folder}/{i}{suffix}"))
    return found


def _files(src: Path) -> List[Path]:
    if src.is_file():
        return [src]
    return sorted(p for p in src.rglob("*") if p.is_file() and not set(_IGNORED) & set(p.relative_to(src).parts))


def relocated(manifest: Mapping[str, Any], where: str) -> Dict[str, Any]:
    """``manifest`` with its local inputs named under ``where`` (``/opt/dedal/env`` in the
    image, ``""``: relative, as in ``env.yaml``)."""
    data = copy.deepcopy(dict(manifest))
    for key, i, _src, name in _carried(manifest):
        data["spack"][key][i] = posixpath.join(where, name) if where else name
    return data


def inputs_digest(manifest: Mapping[str, Any]) -> str:
    """sha256 of the manifest with its local inputs relocated and of their content: the
    same on every machine (unlike the paths the manifest names)."""
    h = hashlib.sha256(json.dumps(relocated(manifest, ""), sort_keys=True).encode())
    for _key, _i, src, name in _carried(manifest):
        for f in _files(Path(src)):
            rel = name if Path(src).is_file() else posixpath.join(name, f.relative_to(src).as_posix())
            h.update(rel.encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def copy_inputs(manifest: Mapping[str, Any], env_dir: Path) -> None:
    """Copy the local inputs into ``env_dir`` (the image's /opt/dedal/env)."""
    for _key, _i, src, name in _carried(manifest):
        source = Path(src)
        for f in _files(source):
            dest = env_dir / name if source.is_file() else env_dir / name / f.relative_to(source)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dest)
            dest.chmod(0o755 if f.stat().st_mode & 0o111 else 0o644)
    for d in sorted(p for p in env_dir.rglob("*") if p.is_dir()):
        d.chmod(0o755)


def dedal_section(plan: Plan, image: ImageOptions, *, only: List[str], runtime_base: str = "") -> Dict[str, Any]:
    """The ``dedal:`` section of ``env.yaml``: the environment file's own (verify and
    registry settings kept), with every value that decides the image made explicit
    (``image``'s, ``only``: the names of a subset image's packages, ``runtime_base``)."""
    raw: Dict[str, Any] = {}
    env_file = image.env_file
    if env_file is not None:
        try:
            found = load_yaml(Path(env_file)).get("dedal") or {}
            raw = dict(found) if isinstance(found, dict) else {}
        except (UserError, OSError):  # read once already; the values below are what counts
            raw = {}
    raw.pop("lock", None)  # spack.lock lies beside env.yaml
    raw.update(
        {
            "name": plan.env_name,
            "tag": plan.tag,
            "base_image": plan.base_image,
            "install_root": plan.install_root,
            "view": plan.view,
        }
    )
    runtime_base = "" if runtime_base == plan.base_image else runtime_base
    for key, value in (
        ("description", image.description),
        ("runscript", image.runscript),
        ("help", image.help),
        ("test", image.test),
        ("labels", dict(image.labels)),
        ("only", list(only)),
        ("keep_build_deps", image.keep_build_deps),
        ("runtime_base", runtime_base),
    ):
        if value:
            raw[key] = value
        else:
            raw.pop(key, None)
    return raw


def definition_of(base: Optional[BaseImage]) -> Optional[Path]:
    """The definition file a built base keeps beside its root (None: host, or none kept)."""
    return Path(base.path) / base.definition_file if base is not None and base.definition_file else None


def write_rebuild_inputs(
    env_dir: Path,
    manifest: Mapping[str, Any],
    dedal: Mapping[str, Any],
    base_definition: Optional[Path],
    runtime_definition: Optional[Path] = None,
) -> None:
    """``env.yaml``, ``base.yaml`` and ``runtime-base.yaml`` (see the module documentation)
    into ``env_dir``."""
    text = yaml.safe_dump({"spack": relocated(manifest, "")["spack"], "dedal": dict(dedal)}, sort_keys=False)
    (env_dir / ENV_FILE).write_text("# The environment this image was built from (dedal rebuild uses it)\n" + text)
    (env_dir / ENV_FILE).chmod(0o644)
    for source, name in ((base_definition, BASE_FILE), (runtime_definition, RUNTIME_BASE_FILE)):
        if source is not None and source.is_file():
            shutil.copyfile(source, env_dir / name)
            (env_dir / name).chmod(0o644)


def in_image(manifest: Mapping[str, Any]) -> Dict[str, Any]:
    return relocated(manifest, ENV_IN_IMAGE)
