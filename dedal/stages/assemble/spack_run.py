"""Spack inside the image tree (writable, the Spack checkout and its user cache bound):
``reindex`` (the layers carry no database), ``env view regenerate`` at the view's final
path and ``env activate --sh``; then the database made reproducible (install times from
the layers' build times, a verifier derived from the content)."""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, Sequence

from dedal.adapters import runtime as rt, spack as spack_adapter
from dedal.errors import UserError
from dedal.model.image import ENV_IN_IMAGE, STD_PATH
from dedal.model.spack_env import local_inputs
from dedal.stages.assemble.envscript import activation_script
from dedal.stages.assemble.tree import mkdirs, write_file

if TYPE_CHECKING:
    from dedal.model.base import BaseImage
    from dedal.model.config import Settings
    from dedal.model.plan import Plan


def run_spack(
    tree: Path,
    plan: Plan,
    settings: Settings,
    base: Optional[BaseImage],
    manifest: Mapping[str, Any],
    log: Path,
    say: Callable[[str], None],
) -> str:
    """reindex, view, activation inside the tree; returns the 91-environment.sh text."""
    spack_root = spack_adapter.locate(settings)
    cache = spack_adapter.user_cache(settings, spack_root)
    cache.mkdir(parents=True, exist_ok=True)
    binds = [rt.Bind(spack_root, readonly=True), rt.Bind(cache)]
    binds += [rt.Bind(p, readonly=True) for p in local_inputs(manifest)]
    host = base is None
    if host:
        view_parent = posixpath.dirname(posixpath.normpath(plan.view))
        if view_parent == "/":
            raise UserError(f"view {plan.view}: with base host the view needs a parent directory other than /")
        wanted = {posixpath.normpath(plan.install_root), view_parent, ENV_IN_IMAGE}
        for d in wanted:
            mkdirs(tree, d)
        binds += [rt.Bind(tree / d.lstrip("/"), d) for d in sorted(wanted, key=lambda x: (x.count("/"), x))]
    run_env = dict(base.env) if base is not None else {}
    run_env["PATH"] = STD_PATH  # not the caller's: Spack prepends to it, and that goes into the image
    # the tree is writable: Python must not (re)write the base's __pycache__ (they embed source mtimes)
    run_env["PYTHONDONTWRITEBYTECODE"] = "1"
    if host and "SPACK_PYTHON" in os.environ:
        run_env["SPACK_PYTHON"] = os.environ["SPACK_PYTHON"]
    seen: Dict[str, str] = {}

    def runner(cmd, *, env: Mapping[str, str], log: Optional[Path], what: str, timeout=None):  # noqa: ANN001
        full = dict(run_env)
        full.update(env)
        seen.update(full)
        return rt.run_in(
            None if host else tree,
            cmd,
            binds=binds,
            env=full,
            log=log,
            what=what,
            runtime=settings.runtime,
            writable=not host,
            timeout=timeout,
        )

    scratch = ("tmp", "var/tmp", "root", "run")
    before = _snapshot(tree, scratch) if not host else {}
    spack = spack_adapter.Spack(spack_root, cache, runner)
    envdir = Path(ENV_IN_IMAGE)
    say("spack reindex")
    spack.reindex(envdir, log)
    say(f"spack env view regenerate ({plan.view})")
    spack.view_regenerate(envdir, log)
    say("spack env activate --sh")
    text = spack.activate_sh(envdir)
    with open(log, "a") as fh:
        fh.write("$ spack env activate --sh -d " + ENV_IN_IMAGE + "\n" + text)
    if not host:
        _remove_new(tree, before)
    inner = rt.base_env(seen)  # what Spack saw: the runtime's clean environment plus ours
    return activation_script(text, inner)


def _snapshot(tree: Path, dirs: Sequence[str]) -> Dict[str, set]:
    return {d: set(os.listdir(tree / d)) if (tree / d).is_dir() else set() for d in dirs}


def _remove_new(tree: Path, before: Mapping[str, set]) -> None:
    for d, names in before.items():
        p = tree / d
        if not p.is_dir():
            continue
        for name in os.listdir(p):
            if name not in names:
                q = p / name
                if q.is_dir() and not q.is_symlink():
                    shutil.rmtree(q)
                else:
                    q.unlink()


def normalize_spack_db(install_root: Path, created: float) -> None:
    """Make ``<install_root>/.spack-db`` independent of when and where it was indexed:
    every installation time the image's date (``SOURCE_DATE_EPOCH``: when each layer was
    built is in the layer manifests, not in the image), records in hash order, a
    content-derived index_verifier, no backups."""
    db = install_root / ".spack-db"
    index = db / "index.json"
    if not index.is_file():
        raise UserError(f"spack reindex wrote no {index}; the Spack used is not compatible")
    try:
        data = json.loads(index.read_text())
        installs = data["database"]["installs"]
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{index}: not a Spack database ({exc})") from None
    for h, rec in installs.items():
        if isinstance(rec, dict) and "installation_time" in rec:
            rec["installation_time"] = float(created)
    data["database"]["installs"] = {h: installs[h] for h in sorted(installs)}
    raw = json.dumps(data, separators=(",", ":")).encode()
    write_file(index, raw, 0o644)
    verifier = db / "index_verifier"
    write_file(verifier, str(uuid.UUID(bytes=hashlib.sha256(raw).digest()[:16], version=4)), 0o644)
    for leftover in db.glob("index.json.*"):
        leftover.unlink()
