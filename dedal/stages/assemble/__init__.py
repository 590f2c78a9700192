"""The assemble stage: base root filesystem + the layers of the runtime closure -> one SIF.

1. **Select** the packages: the runtime closure of the roots (build-only dependencies
   dropped unless ``keep_build_deps``), or of the roots named by ``only``.
2. **Audit** every layer before trusting it: its manifest names the package, the install
   root and the key; the squashfs matches the manifest's size and sha256; every entry is
   inside ``<prefix>/``; no device nodes; symlinks point into the install root (absolute
   ones, as Spack makes, or relative ones that do not climb out of it). Anything else is
   refused (UserError) before a byte of the image is written.
3. **Tree** in a stage under ``stage_dir`` (/dev/shm): the base root filesystem as the
   lower layer of an overlay mount (nothing copied; where no overlay can be mounted, the
   base's squashfs is extracted instead), each layer extracted at the install root.
4. **Spack** runs inside the tree (writable, the Spack checkout and its user cache bound):
   ``reindex`` (the layers carry no database), ``env view regenerate`` at the view's
   final path, and ``env activate --sh``, whose output becomes
   ``/.singularity.d/env/91-environment.sh`` (PATH, MANPATH, ..., package run
   environments; Spack's own variables dropped, inherited values kept as ``$VAR``). The
   environment (spack.yaml, spack.lock) and the SBOM stay in the image under /opt/dedal.
5. **Apptainer's layout**: ``/.singularity.d/{actions,env,libs}``, the env scripts, a
   runscript, ``labels.json``, the mount points Apptainer expects.
6. **Reproducible**: Spack's database install times are set to the layers' build times
   and its verifier derived from the content; mksquashfs fixes times and owners; the build
   date is ``SOURCE_DATE_EPOCH`` when set. Same inputs (with SOURCE_DATE_EPOCH), same bytes.
7. **Pack** one squashfs (zstd, all cores) straight at its place in the SIF
   (``mksquashfs -offset``): the base's squashfs without the few top-level entries an
   image changes (``/opt``, ``/etc``, ``/.singularity.d``, ...; :func:`image_tops`),
   packed once per base and cached, is copied in and those entries are compressed and
   appended to it, so the base's bulk (the OS, CUDA) is not compressed again for every
   image (same content as one mksquashfs of the tree; a host base, or an overlay-less
   stage without the base's unpacked root, packs the whole tree). Then the rest of the
   SIF with ``dedal.model.sif.write_sif``
   (definition, inspect-metadata.json, labels, SBOM, primary system partition), and the
   image manifest ``<tag>.image.json`` and ``<tag>.sbom.cdx.json`` beside it. All are
   written under temporary names and renamed at the end; nothing is left on failure.

An existing image whose manifest records the same inputs (and whose SIF still has its
recorded sha256) is kept as it is (``status: present``) unless ``force``.
"""
from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import shlex
import shutil
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from dedal import __version__
from dedal.adapters import overlay, runtime as rt, spack as spack_adapter, squashfs
from dedal.errors import DedalError, Signals, UserError
from dedal.model import sbom as sbom_mod, sif as sif_mod
from dedal.model.layers import LayerStore, sha256_file
from dedal.model.plan import Plan
from dedal.model.sif import source_date_epoch
from dedal.model.spack_env import local_inputs, read_spack_yaml, stage_manifest, write_env_dir
from dedal.model.spack_lock import load_lock
from dedal.model.base import HOST_BASE, iter_cached
from dedal.model.image import ENV_IN_IMAGE, ENV_SCRIPT, MOUNT_POINTS, SBOM_IN_IMAGE, STD_PATH, SYMLINKS, image_tops
from dedal.stages.base import base_part, base_sha256, ensure_base
from dedal.stages.stage_dir import Stage
from dedal.stages.workspace import Target, prepare

IMAGE_FORMAT = 1
VERSION_COMPONENTS = ("openmpi", "pmix", "ucx", "cuda")
RUNTIME_TYPES = frozenset(("link", "run"))
BIG_LAYER = 64 << 20  # bytes of squashfs: extracted alone, with every core
_UPSTREAM = re.compile(r"\d+(?:\.\d+)+")
_PATH_LIKE = {"MANPATH", "INFOPATH", "CMAKE_PREFIX_PATH", "PKG_CONFIG_PATH", "ACLOCAL_PATH", "CPATH",
              "LIBRARY_PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "PERL5LIB", "XDG_DATA_DIRS", "MODULEPATH"}

Progress = Optional[Callable[[str], None]]


# ---------------------------------------------------------------------------- results


@dataclass
class LayerInfo:
    hash: str
    key: str
    name: str
    version: str
    prefix: str
    sha256: str
    size: int
    files: int = 0
    built_at: str = ""

    def label(self) -> Dict[str, Any]:
        return {"key": self.key, "name": self.name, "version": self.version, "hash": self.hash,
                "sha256": self.sha256, "size": self.size}


@dataclass
class AssembleResult:
    env: str
    tag: str
    status: str                 # assembled | present
    image: str                  # the SIF
    image_json: str
    sbom: str
    sha256: str
    size: int
    squashfs_size: int
    created: int                # build date (seconds since 1970)
    base_image: str
    base_id: str
    roots: List[str]
    only: List[str]
    keep_build_deps: bool
    layers: List[Dict[str, Any]]
    labels: Dict[str, str]
    versions: Dict[str, str]
    method: str                 # overlay (kernel|fuse), extract, none (host base)
    seconds: float = 0.0
    timings: Dict[str, float] = field(default_factory=dict)
    log: str = ""

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------- selection


def _closure(plan: Any, starts: Sequence[str], types: Optional[frozenset]) -> List[str]:
    seen: Dict[str, None] = {}
    stack = list(starts)
    while stack:
        h = stack.pop()
        if h in seen or h not in plan.nodes:
            continue
        seen[h] = None
        for child, deptypes in plan.nodes[h].deps.items():
            if types is None or set(deptypes) & types:
                stack.append(child)
    return list(seen)


def match_specs(plan: Any, only: Sequence[str]) -> List[str]:
    """The DAG hashes ``only`` names: ``name``, ``name@version`` or ``/hash-prefix``; roots
    first, then any package of the runtime closure (an MPI-only image of a bigger env)."""
    runtime = [h for h in plan.runtime_closure if not plan.nodes[h].external]
    chosen: List[str] = []
    for raw in only:
        spec = raw.strip()
        if not spec:
            continue
        if spec.startswith("/"):
            found = [h for h in runtime if h.startswith(spec[1:])]
        else:
            name, _, version = spec.partition("@")
            def fits(h: str) -> bool:
                n = plan.nodes[h]
                return n.name == name and (not version or n.version == version)
            found = [h for h in plan.roots if fits(h)] or [h for h in runtime if fits(h)]
        if not found:
            roots = ", ".join(sorted(plan.nodes[h].name for h in plan.roots))
            raise UserError(f"--only {spec}: no such package in the image of {plan.env_name} (roots: {roots})")
        if len(found) > 1:
            labels = ", ".join(sorted(plan.nodes[h].label for h in found))
            raise UserError(f"--only {spec}: ambiguous ({labels}); use name@version or /hash")
        if found[0] not in chosen:
            chosen.append(found[0])
    if not chosen:
        raise UserError("--only: no package named")
    return chosen


def select_packages(plan: Any, only: Optional[Sequence[str]] = None,
                    keep_build_deps: bool = False) -> Tuple[List[str], List[str]]:
    """(roots, every package of the image in dependency order, externals included)."""
    order = plan.runtime_layers(keep_build_deps=True)
    externals = [h for h in plan.nodes if plan.nodes[h].external]
    if not only:
        roots = list(plan.roots)
        wanted = set(plan.runtime_closure) | (set(plan.build_only) if keep_build_deps else set())
    else:
        roots = match_specs(plan, only)
        wanted = set(_closure(plan, roots, RUNTIME_TYPES))
        if keep_build_deps:
            wanted |= set(_closure(plan, roots, None))
    ordered = [h for h in order if h in wanted] + sorted(h for h in externals if h in wanted)
    return roots, ordered


# ---------------------------------------------------------------------------- audit


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def entry_problem(entry: Mapping[str, str], prefix: str, install_root: str) -> Optional[str]:
    """Why one entry of a layer may not go into an image (None: it may)."""
    path = entry["path"]
    parts = path.split("/")
    if ".." in parts or not (path == prefix or path.startswith(prefix + "/")):
        return f"path {path!r} is outside its prefix {prefix}/"
    mode = entry.get("mode", "")
    if mode[:1] in ("c", "b"):
        return f"{path!r} is a device node"
    if mode[:1] == "l":
        target = entry.get("target", "")
        root = posixpath.normpath(install_root)
        if target.startswith("/"):
            if not _inside(posixpath.normpath(target), root):
                return f"symlink {path} -> {target} points outside the install root {install_root}"
        else:
            resolved = posixpath.normpath(posixpath.join(root, posixpath.dirname(path), target))
            if not _inside(resolved, root):
                return f"symlink {path} -> {target} escapes the install root {install_root}"
    return None


AUDIT_RULES = 1  # bump when entry_problem changes: remembered audits are then redone


def audit_layers(plan: Any, hashes: Sequence[str], store: Any, say: Callable[[str], None],
                 memo: Optional[Path] = None) -> List[LayerInfo]:
    """Check every layer of ``hashes`` (externals have none); UserError for the first
    problem, after listing every missing layer at once.

    The sha256 is always recomputed; the entry listing of a squashfs whose sha256 already
    passed these rules for the same prefix and install root is remembered under ``memo``
    (content-addressed: the same bytes cannot give another answer)."""
    built = [h for h in hashes if not plan.nodes[h].external]
    missing = [h for h in built if not plan.nodes[h].key or not store.has(plan.nodes[h].key)]
    if missing:
        names = ", ".join(f"{plan.nodes[h].label} ({plan.nodes[h].key})" for h in missing)
        raise UserError(f"{len(missing)} layer(s) missing from the layer store {store.root}: {names}; "
                        f"run `dedal build` for {plan.env_name} first")
    def audit_one(h: str) -> LayerInfo:
        node = plan.nodes[h]
        key = node.key
        man = store.manifest(key)
        sqfs = store.sqfs(key)
        where = f"layer {key} ({node.label})"
        if man.key != key or man.hash != h:
            raise UserError(f"{where}: its manifest names {man.key} / {man.hash}, not this package")
        if man.prefix != node.prefix_name:
            raise UserError(f"{where}: its manifest names prefix {man.prefix!r}, expected {node.prefix_name!r}")
        if posixpath.normpath(man.install_root) != posixpath.normpath(plan.install_root):
            raise UserError(f"{where}: built for install root {man.install_root}, the image uses {plan.install_root}")
        size = sqfs.stat().st_size
        if man.size and size != man.size:
            raise UserError(f"{where}: corrupt: {sqfs} has {size} bytes, its manifest says {man.size}; "
                            "remove the layer and run `dedal build` again")
        digest = sha256_file(sqfs)
        if digest != man.sha256:
            raise UserError(f"{where}: corrupt: sha256 of {sqfs} is {digest[:16]}..., its manifest says "
                            f"{man.sha256[:16]}...; remove the layer and run `dedal build` again")
        passed = {"rules": AUDIT_RULES, "sha256": digest, "prefix": node.prefix_name,
                  "install_root": posixpath.normpath(plan.install_root)}
        memo_file = memo / f"{digest}.json" if memo is not None else None
        if memo_file is not None:
            try:
                known = json.loads(memo_file.read_text())
                if {k: known.get(k) for k in passed} == passed and isinstance(known.get("files"), int):
                    return LayerInfo(hash=h, key=key, name=node.name, version=node.version,
                                     prefix=node.prefix_name, sha256=digest, size=size, files=known["files"],
                                     built_at=man.built_at)
            except (OSError, ValueError):
                pass
        try:
            entries = squashfs.entries(sqfs)
        except DedalError as exc:
            raise UserError(f"{where}: unreadable squashfs ({exc.one_line()})") from None
        if not entries:
            raise UserError(f"{where}: the squashfs holds nothing")
        for e in entries:
            problem = entry_problem(e, node.prefix_name, plan.install_root)
            if problem:
                raise UserError(f"{where}: refused: {problem}")
        if memo_file is not None:
            try:
                memo_file.parent.mkdir(parents=True, exist_ok=True)
                tmp = memo_file.with_name(f".{memo_file.name}.{os.getpid()}.{threading.get_ident()}")
                tmp.write_text(json.dumps({**passed, "files": len(entries)}) + "\n")
                os.replace(tmp, memo_file)
            except OSError:
                pass  # not remembered: listed again next time
        return LayerInfo(hash=h, key=key, name=node.name, version=node.version, prefix=node.prefix_name,
                         sha256=digest, size=size, files=len(entries), built_at=man.built_at)

    # hashing and listing run in parallel (threads: hashlib and the unsquashfs processes do
    # the work); the first problem in layer order is the one reported
    infos = _parallel(audit_one, built)
    say(f"audited {len(infos)} layer(s): sha256, paths and symlinks ok")
    return infos


def _workers() -> int:
    # process start-up is part of every call: more threads than cores still pay off
    return max(4, min(8, 2 * (os.cpu_count() or 2)))


def _parallel(fn: Callable[[Any], Any], items: Sequence[Any]) -> List[Any]:
    """``[fn(x) for x in items]`` on a thread pool; the first failure (in item order) is raised
    after every started call has finished."""
    if len(items) <= 1:
        return [fn(x) for x in items]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=_workers()) as pool:
        futures = [pool.submit(fn, x) for x in items]
        outcomes = []
        for f in futures:
            try:
                outcomes.append((f.result(), None))
            except BaseException as exc:  # noqa: BLE001 - re-raised below, in order
                outcomes.append((None, exc))
    for _value, exc in outcomes:
        if exc is not None:
            raise exc
    return [v for v, _e in outcomes]


def extract_layers(store: Any, infos: Sequence[LayerInfo], dest: Path, log: Path) -> None:
    """Unpack the layers into ``dest`` (the install root in the tree): big layers one after
    the other with every core, the many small ones side by side, one core each."""
    big = [i for i in infos if i.size >= BIG_LAYER]
    small = [i for i in infos if i.size < BIG_LAYER]
    for info in big:
        squashfs.extract(store.sqfs(info.key), dest, log=log)
    _parallel(lambda i: squashfs.extract(store.sqfs(i.key), dest, processors=1, log=log), small)


# ---------------------------------------------------------------------------- environment script


def _q(value: str) -> str:
    return shlex.quote(value)


def activation_script(text: str, before: Mapping[str, str]) -> str:
    """``spack env activate --sh`` output as an image environment script.

    Spack's own variables (SPACK_ENV, SPACK_ENV_VIEW, ...) and aliases are dropped (no
    Spack in the image). A value Spack built by prepending to what the variable held
    while it ran (``before``) keeps the prepended part and refers to ``$VAR`` for the
    rest; path lists Spack created become ``new${VAR:+:$VAR}``; others are kept as is."""
    out: List[str] = []
    for raw in re.split(r";\s*\n|\n", text):
        s = raw.strip().rstrip(";").strip()
        if not s or s.startswith("#") or s.startswith(("alias ", "unalias ")):
            continue
        try:
            words = shlex.split(s)
        except ValueError:
            raise UserError(f"spack env activate --sh printed a line dedal cannot parse: {s!r}") from None
        if words[0] == "unset":
            names = [w for w in words[1:] if not w.startswith("-") and not w.startswith("SPACK_")]
            if names:
                out.append("unset " + " ".join(names))
            continue
        if words[0] != "export":
            if any("SPACK" in w for w in words):
                continue
            out.append(s)
            continue
        for word in words[1:]:
            name, eq, value = word.partition("=")
            if not eq or name.startswith("SPACK_") or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                continue
            out.append(_export(name, value, before.get(name, "")))
    body = "\n".join(out)
    return ("#!/bin/sh\n# The Spack environment of this image (`spack env activate --sh`), made by dedal assemble\n"
            + (body + "\n" if body else ""))


def _export(name: str, value: str, old: str) -> str:
    ref = "${%s:+:$%s}" % (name, name)
    if old:
        if value == old:
            return f"# {name} unchanged"
        had = set(old.split(":"))
        entries = value.split(":")
        if had & set(entries) and ":" in value:
            # a list Spack prepended to (and may have deduplicated): keep what it added
            new = [e for e in dict.fromkeys(entries) if e and e not in had]
            if not new:
                return f"# {name} unchanged"
            if entries[0] in had:  # appended rather than prepended
                return f'export {name}="${{{name}:+${name}:}}"{_q(":".join(new))}'
            return f'export {name}={_q(":".join(new))}"{ref}"'
        return f"export {name}={_q(value)}"
    if name.endswith("PATH") or name in _PATH_LIKE:
        if value.endswith(":"):  # MANPATH's trailing colon: "and the default path"
            return f'export {name}={_q(value)}"${{{name}:-}}"'
        return f'export {name}={_q(value)}"{ref}"'
    return f"export {name}={_q(value)}"


def _env_lines(env: Mapping[str, str]) -> str:
    return "".join(f"export {k}={_q(v)}\n" for k, v in sorted(env.items()))


# ---------------------------------------------------------------------------- Apptainer's files

# Same behaviour as the files `apptainer build` writes (internal/pkg/build/sources/
# base_environment.go), written here in dedal's words.
_SOURCE_ENV = 'for script in /.singularity.d/env/*.sh; do\n    if [ -f "$script" ]; then\n        . "$script"\n    fi\ndone\n'
ACTIONS = {
    "exec": "#!/bin/sh\n" + _SOURCE_ENV + '\nexec "$@"\n',
    "run": "#!/bin/sh\n" + _SOURCE_ENV + (
        '\nif [ -n "${APPTAINER_APPNAME:-}" ]; then\n'
        '    if [ -x "/scif/apps/${APPTAINER_APPNAME}/scif/runscript" ]; then\n'
        '        exec "/scif/apps/${APPTAINER_APPNAME}/scif/runscript" "$@"\n'
        '    fi\n'
        '    echo "No runscript for the app ${APPTAINER_APPNAME} in this image" >&2\n'
        '    exit 1\n'
        'elif [ -x /.singularity.d/runscript ]; then\n'
        '    exec /.singularity.d/runscript "$@"\n'
        'fi\n'
        'echo "No runscript in this image, running /bin/sh" >&2\n'
        'exec /bin/sh "$@"\n'),
    "shell": "#!/bin/sh\n" + _SOURCE_ENV + (
        '\nif [ -n "${APPTAINER_SHELL:-}" ] && [ -x "$APPTAINER_SHELL" ]; then\n'
        '    exec "$APPTAINER_SHELL" "$@"\n'
        'elif [ -x /bin/bash ]; then\n'
        '    SHELL=/bin/bash\n'
        '    PS1="Apptainer ${APPTAINER_NAME:-}:\\\\w> "\n'
        '    export SHELL PS1\n'
        '    exec /bin/bash --norc "$@"\n'
        'elif [ -x /bin/sh ]; then\n'
        '    SHELL=/bin/sh\n'
        '    export SHELL\n'
        '    exec /bin/sh "$@"\n'
        'fi\n'
        'echo "ERROR: no /bin/sh in this image" >&2\n'
        'exit 1\n'),
    "start": "#!/bin/sh\n\n# tell the instance's PID 1 to go on (Apptainer instances)\nkill -CONT 1\n\n" + _SOURCE_ENV + (
        '\nif [ -x /.singularity.d/startscript ]; then\n    exec /.singularity.d/startscript\nfi\n'),
    "test": "#!/bin/sh\n" + _SOURCE_ENV + (
        '\nif [ -x /.singularity.d/test ]; then\n    exec /.singularity.d/test "$@"\nfi\n'
        'echo "No test in this image, running /bin/sh -c true" >&2\nexec /bin/sh -c true\n'),
}
ENV_01_BASE = "#!/bin/sh\n# base environment of the image (Apptainer's 01-base.sh): nothing to set\n"
ENV_95_APPS = ('#!/bin/sh\n# SCIF apps (`apptainer run --app NAME`): dedal images define none\n'
               'if [ -n "${APPTAINER_APPNAME:-}" ] && [ ! -d "/scif/apps/${APPTAINER_APPNAME}" ]; then\n'
               '    echo "Could not locate the container application: ${APPTAINER_APPNAME}"\n    exit 1\nfi\n')
ENV_99_BASE = ('#!/bin/sh\n# Apptainer adds its bound libraries (e.g. --nv) after everything else\n'
               'if [ -z "${LD_LIBRARY_PATH:-}" ]; then\n    LD_LIBRARY_PATH=/.singularity.d/libs\n'
               'else\n    LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/.singularity.d/libs"\nfi\n'
               'PS1="Apptainer> "\nexport LD_LIBRARY_PATH PS1\n')
ENV_99_RUNTIMEVARS = ('#!/bin/sh\n# PATH set by `apptainer --env PATH=...`, --env PREPEND_PATH / APPEND_PATH\n'
                      'if [ -n "${SING_USER_DEFINED_PREPEND_PATH:-}" ]; then\n'
                      '    PATH="${SING_USER_DEFINED_PREPEND_PATH}:${PATH}"\nfi\n'
                      'if [ -n "${SING_USER_DEFINED_APPEND_PATH:-}" ]; then\n'
                      '    PATH="${PATH}:${SING_USER_DEFINED_APPEND_PATH}"\nfi\n'
                      'if [ -n "${SING_USER_DEFINED_PATH:-}" ]; then\n    PATH="${SING_USER_DEFINED_PATH}"\nfi\n'
                      'unset SING_USER_DEFINED_PREPEND_PATH SING_USER_DEFINED_APPEND_PATH SING_USER_DEFINED_PATH\n'
                      'export PATH\n')
DEFAULT_RUNSCRIPT = ('#!/bin/sh\n# dedal default runscript: `apptainer run IMAGE CMD [ARG...]` runs CMD in the\n'
                     '# image\'s environment; without a command, a shell\n'
                     'if [ $# -eq 0 ]; then\n    exec /bin/sh\nfi\nexec "$@"\n')
STARTSCRIPT = "#!/bin/sh\n"
def runscript_text(runscript: str) -> str:
    if not runscript.strip():
        return DEFAULT_RUNSCRIPT
    if runscript.startswith("#!"):
        return runscript if runscript.endswith("\n") else runscript + "\n"
    return "#!/bin/sh\n" + runscript.rstrip("\n") + "\n"


def _write(path: Path, text: Union[str, bytes], mode: int = 0o644) -> None:
    """Write through a new inode (never into a file shared with the base)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    data = text.encode("utf-8") if isinstance(text, str) else text
    with open(path, "wb") as fh:
        fh.write(data)
    os.chmod(path, mode)


def _mkdirs(tree: Path, rel: str, mode: int = 0o755) -> Path:
    """Create ``rel`` and its missing parents with ``mode`` (not the umask's)."""
    cur = tree
    for part in [p for p in rel.strip("/").split("/") if p]:
        cur = cur / part
        if not cur.exists() and not cur.is_symlink():
            cur.mkdir()
            os.chmod(cur, mode)
    return cur


def write_apptainer_files(tree: Path, *, env90: str, env91: str, runscript: str, labels: Mapping[str, str]) -> None:
    for rel, mode in MOUNT_POINTS.items():
        p = tree / rel
        if not p.exists() and not p.is_symlink():
            _mkdirs(tree, rel)
            os.chmod(p, mode)
    for rel in (".singularity.d/libs", ".singularity.d/actions", ".singularity.d/env"):
        _mkdirs(tree, rel)
    for name, text in ACTIONS.items():
        _write(tree / ".singularity.d/actions" / name, text, 0o755)
    env = tree / ".singularity.d/env"
    _write(env / "01-base.sh", ENV_01_BASE, 0o755)
    _write(env / "90-environment.sh", env90, 0o755)
    _write(env / "91-environment.sh", env91, 0o755)
    _write(env / "95-apps.sh", ENV_95_APPS, 0o755)
    _write(env / "99-base.sh", ENV_99_BASE, 0o755)
    _write(env / "99-runtimevars.sh", ENV_99_RUNTIMEVARS, 0o755)
    _write(tree / ".singularity.d/runscript", runscript, 0o755)
    _write(tree / ".singularity.d/startscript", STARTSCRIPT, 0o755)
    _write(tree / ".singularity.d/labels.json", json.dumps(dict(labels), indent=4, sort_keys=True) + "\n", 0o644)
    for name, target in SYMLINKS.items():
        p = tree / name
        if not p.exists() and not p.is_symlink():
            os.symlink(target, p)
    for name in ("hosts", "resolv.conf"):  # Apptainer binds the host's over these
        p = tree / "etc" / name
        if p.is_symlink() or not p.exists():
            _write(p, "", 0o644)


# ---------------------------------------------------------------------------- Spack database


def _epoch(iso: str, default: float) -> float:
    try:
        return datetime.fromisoformat(iso).timestamp()
    except (TypeError, ValueError):
        return default


def normalize_spack_db(install_root: Path, built_at: Mapping[str, float], default: float) -> None:
    """Make ``<install_root>/.spack-db`` independent of when and where it was indexed:
    installation times from the layers' build times (``default`` for records without a
    layer), records in hash order, a content-derived index_verifier, no backups."""
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
            rec["installation_time"] = float(built_at.get(h, default))
    data["database"]["installs"] = {h: installs[h] for h in sorted(installs)}
    raw = json.dumps(data, separators=(",", ":")).encode()
    _write(index, raw, 0o644)
    verifier = db / "index_verifier"
    _write(verifier, str(uuid.UUID(bytes=hashlib.sha256(raw).digest()[:16], version=4)), 0o644)
    for leftover in db.glob("index.json.*"):
        leftover.unlink()


# ---------------------------------------------------------------------------- helpers


def _say(progress: Progress, start: float) -> Callable[[str], None]:
    def say(msg: str) -> None:
        if progress:
            progress(f"[{time.monotonic() - start:6.1f}s] {msg}")
    return say


def build_date() -> int:
    sde = source_date_epoch()
    return sde if sde is not None else int(time.time())


def _iso(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def image_paths(settings: Any, plan: Any, output: Optional[Union[str, os.PathLike]],
                only_names: Sequence[str]) -> Tuple[Path, Path, Path]:
    """(SIF, image manifest, SBOM): ``output`` and its siblings, else
    ``<images_dir>/<env>/<tag>[-only-<names>].sif``."""
    if output:
        sif_path = Path(output).expanduser().resolve()
        if sif_path.is_dir():
            raise UserError(f"-o {output}: is a directory; give the image file name (e.g. {output}/image.sif)")
        stem = sif_path.name[:-4] if sif_path.name.endswith(".sif") else sif_path.name
    else:
        stem = plan.tag
        if only_names:
            joined = "+".join(re.sub(r"[^A-Za-z0-9._-]+", "_", n) for n in only_names)
            if len(joined) > 60:
                joined = hashlib.sha256(joined.encode()).hexdigest()[:12]
            stem = f"{stem}-only-{joined}"
        sif_path = Path(settings.images_dir) / plan.env_name / f"{stem}.sif"
    return sif_path, sif_path.with_name(f"{stem}.image.json"), sif_path.with_name(f"{stem}.sbom.cdx.json")


def _find_base(plan: Any, settings: Any, say: Callable[[str], None]) -> Any:
    """The built base the plan's layers were made for (None for the host)."""
    if plan.base_image == HOST_BASE:
        return None

    for img in iter_cached(settings):
        if img.id == plan.base_id:
            return img
    img = ensure_base(plan.base_image, settings, progress=say)
    if img.id != plan.base_id:
        raise UserError(f"the layers of {plan.env_name} were built on base {plan.base_id}, which is not in the base "
                        f"cache {settings.base_cache}; the definition of {plan.base_image} is now {img.id}: "
                        "run `dedal build` again (new layers for the new base)")
    return img


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


def inputs_digest(data: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------------------- the stage


def _resolve_plan(target_or_plan: Any) -> Tuple[Any, Any]:
    """(plan, env file or None) from a Target (env.yaml, lock, plan.json) or a Plan."""
    if isinstance(target_or_plan, Plan):
        return target_or_plan, None
    if not isinstance(target_or_plan, Target):
        raise TypeError("assemble() takes a workspace.Target or a plan.Plan")
    target = target_or_plan
    if target.given_plan is not None:
        return target.given_plan, None

    plan, _path = prepare(target)
    return plan, target.env


def assemble(
    target_or_plan: Any,
    settings: Any,
    *,
    output: Optional[Union[str, os.PathLike]] = None,
    only: Optional[Sequence[str]] = None,
    keep_build_deps: Optional[bool] = None,
    progress: Progress = None,
    force: bool = False,
    runscript: Optional[str] = None,
    labels: Optional[Mapping[str, str]] = None,
    description: Optional[str] = None,
) -> AssembleResult:
    """Assemble the image of an environment; see the module documentation."""
    started = time.monotonic()
    say = _say(progress, started)
    timings: Dict[str, float] = {}
    plan, env = _resolve_plan(target_or_plan)
    if only is None and env is not None and env.only:
        only = list(env.only)
    if keep_build_deps is None:
        keep_build_deps = bool(env.keep_build_deps) if env is not None else False
    runscript = runscript if runscript is not None else (env.runscript if env is not None else "")
    user_labels = dict(env.labels) if env is not None else {}
    user_labels.update(labels or {})
    description = description if description is not None else (env.description if env is not None else "")


    envdir = Path(plan.env_dir) if plan.env_dir else None
    if envdir is None or not (envdir / "spack.yaml").is_file() or not (envdir / "spack.lock").is_file():
        raise UserError(f"plan of {plan.env_name}: its environment directory {plan.env_dir!r} lacks spack.yaml "
                        "or spack.lock (run `dedal build` on the environment file)")
    manifest = read_spack_yaml(envdir / "spack.yaml")
    for p in (plan.view, plan.install_root):
        if not p.startswith("/") or posixpath.normpath(p) in ("/",) or posixpath.normpath(p).startswith("/dev/"):
            raise UserError(f"{p}: the install root and the view must be absolute paths outside /dev "
                            "(Apptainer mounts the host's /dev over the image)")
    if _inside(posixpath.normpath(plan.view), posixpath.normpath(plan.install_root)):
        raise UserError(f"view {plan.view} is inside the install root {plan.install_root}")

    roots, hashes = select_packages(plan, only, keep_build_deps)
    only_names = [plan.nodes[h].name for h in roots] if only else []
    sif_path, json_path, sbom_path = image_paths(settings, plan, output, only_names)
    store = LayerStore(Path(settings.layer_store))
    say(f"{plan.env_name}: {len(hashes)} package(s) in the image"
        + (f" (only {', '.join(plan.nodes[h].label for h in roots)})" if only else "")
        + (", build dependencies kept" if keep_build_deps else ""))

    t0 = time.monotonic()
    infos = audit_layers(plan, hashes, store, say, memo=Path(settings.cache_dir) / "assemble" / "audited")
    timings["audit"] = time.monotonic() - t0
    base = _find_base(plan, settings, say)
    base_digest = base_sha256(base, settings) if base is not None else ""
    versions, version_sources = _versions(plan, hashes, base)
    created = build_date()
    sde_set = bool(os.environ.get("SOURCE_DATE_EPOCH", "").strip())
    inputs = {
        "format": IMAGE_FORMAT, "dedal": __version__, "env": plan.env_name, "tag": plan.tag,
        "install_root": plan.install_root, "view": plan.view, "lock_sha256": plan.lock_sha256,
        "spack_commit": plan.spack_commit, "manifest": hashlib.sha256((envdir / "spack.yaml").read_bytes()).hexdigest(),
        "base": {"id": base.id, "sha256": base_digest} if base else "host",
        "layers": [[i.key, i.sha256] for i in infos], "roots": roots, "keep_build_deps": keep_build_deps,
        "runscript": runscript, "labels": user_labels, "description": description,
        "source_date_epoch": created if sde_set else None,
    }
    digest = inputs_digest(inputs)
    if not force:
        kept = _existing(sif_path, json_path, sbom_path, digest)
        if kept is not None:
            say(f"{sif_path} is up to date (same inputs, sha256 ok)")
            kept.status = "present"
            kept.seconds = round(time.monotonic() - started, 3)
            return kept

    inherited = _base_singularity(base)  # an Apptainer-built base keeps its labels, environment, runscript
    labels_out = _labels(plan, base, infos, roots, only_names, keep_build_deps, versions, version_sources,
                         created, description, user_labels, inherited["labels"])
    if base_digest:
        labels_out["dedal.base.sha256"] = base_digest
    runscript_sh = runscript_text(runscript) if runscript.strip() or not inherited["runscript"] \
        else inherited["runscript"]
    env90 = (inherited["90-environment.sh"].rstrip("\n") + "\n" if inherited["90-environment.sh"]
             else "#!/bin/sh\n") + "# environment of the base image\n" + _env_lines(
        {k: v for k, v in (base.env if base else {}).items() if not k.startswith("SPACK")})
    layer_map = {i.hash: {"key": i.key, "sha256": i.sha256, "size": i.size} for i in infos}

    lock = load_lock(envdir / "spack.lock")
    base_props = {"dedal:base_image": plan.base_image, "dedal:base_id": plan.base_id,
                  "dedal:base_sha256": base_digest}
    if only_names:
        base_props["dedal:only"] = ",".join(only_names)
    sbom_doc = sbom_mod.make_sbom(plan, hashes, layers=layer_map, lock=lock, created=created, roots=roots,
                                  properties=base_props)
    sbom_bytes = sbom_mod.dumps(sbom_doc)

    logs = Path(settings.work_dir) / plan.env_name / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"assemble-{re.sub(r'[^A-Za-z0-9._-]+', '_', sif_path.stem)}.log"
    log.write_text(f"dedal assemble {plan.env_name} -> {sif_path} ({_iso(int(time.time()))})\n")


    sif_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_tag = f".{sif_path.name}.assemble-{os.getpid()}"
    tmp_sqfs = sif_path.with_name(tmp_tag + ".sqfs")
    tmp_sif = sif_path.with_name(tmp_tag + ".sif")
    tmp_json = json_path.with_name(tmp_tag + ".image.json")
    tmp_sbom = sbom_path.with_name(tmp_tag + ".sbom.cdx.json")
    temps = [tmp_sqfs, tmp_sif, tmp_json, tmp_sbom]
    method = "none"
    with Signals("assemble"):  # SIGTERM/SIGINT: the stage and every temporary file go away
        try:
            with Stage(Path(settings.stage_dir), "assemble") as stage:
                def fill(dest: Path) -> None:
                    t1 = time.monotonic()
                    extract_layers(store, infos, dest, log)
                    os.chmod(dest, 0o755)
                    timings["layers"] = time.monotonic() - t1

                with _Tree(stage, base, log, say, plan.install_root, fill) as tree:
                    method = tree.method
                    timings["tree"] = tree.seconds - timings["layers"]
                    root = tree.path

                    ir_dir = root / plan.install_root.lstrip("/")
                    say(f"extracted {len(infos)} layer(s) at {plan.install_root} ({tree.method})")

                    t0 = time.monotonic()
                    env_dir_img = _mkdirs(root, ENV_IN_IMAGE)

                    img_manifest = stage_manifest(manifest, install_root=plan.install_root, stage=Path("/tmp/dedal-spack"),
                                                  view=plan.view)
                    write_env_dir(env_dir_img, img_manifest, envdir / "spack.lock")
                    spack_yaml_bytes = (env_dir_img / "spack.yaml").read_bytes()
                    env91 = _run_spack(root, plan, settings, base, manifest, log, say)
                    if inherited["91-environment.sh"]:
                        env91 = inherited["91-environment.sh"].rstrip("\n") + "\n" + env91.split("\n", 1)[1]
                    # what Spack leaves in the environment directory besides the two files is build-time state
                    for entry in list(env_dir_img.iterdir()):
                        if entry.name not in ("spack.yaml", "spack.lock"):
                            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
                    _write(env_dir_img / "spack.yaml", spack_yaml_bytes)
                    shutil.copyfile(envdir / "spack.lock", env_dir_img / "spack.lock")
                    built_at = {i.hash: _epoch(i.built_at, created) for i in infos}
                    normalize_spack_db(ir_dir, built_at, created)
                    timings["spack"] = time.monotonic() - t0

                    t0 = time.monotonic()
                    write_apptainer_files(root, env90=env90, env91=env91, runscript=runscript_sh, labels=labels_out)
                    _write(root / SBOM_IN_IMAGE.lstrip("/"), sbom_bytes, 0o644)
                    timings["image_files"] = time.monotonic() - t0

                    definition = _definition(plan, base, labels_out, env91, runscript_sh)
                    metadata = _metadata(labels_out, definition, runscript_sh, env90, env91, plan, base, infos, roots,
                                         only_names, keep_build_deps, versions)
                    # mksquashfs writes the partition at its place in the SIF: no copy afterwards
                    offset = sif_mod.partition_offset(definition=definition, labels=labels_out, metadata=metadata,
                                                      sbom=sbom_bytes)
                    t0 = time.monotonic()
                    tops = image_tops(plan.install_root, plan.view)
                    stray = sorted(set(tree.changed_tops() or ()) - set(tops))
                    part = base_part(base, base_digest, tops, settings, log, say)
                    if part is not None and stray:
                        with open(log, "a") as fh:  # build-time leftovers, as with an extracted base
                            fh.write(f"changed outside {tops}, not in the image: {stray}\n")
                    timings["base_part"] = time.monotonic() - t0
                    t0 = time.monotonic()
                    if part is not None:
                        # the base's untouched top-level entries come compressed already
                        say(f"base without {', '.join('/' + t for t in tops)} + mksquashfs of those -> {tmp_sqfs.name}")
                        squashfs.append(part, [root / t for t in tops if os.path.lexists(root / t)], tmp_sqfs,
                                        offset=offset, root_mode=os.stat(root).st_mode, log=log,
                                        what="mksquashfs (image, onto the base)")
                        method += ", base reused"
                    else:
                        say(f"mksquashfs {tree.method} tree -> {tmp_sqfs.name}")
                        squashfs.pack([root], tmp_sqfs, log=log, what="mksquashfs (image)", offset=offset)
                    timings["squashfs"] = time.monotonic() - t0
            squashfs_size = tmp_sqfs.stat().st_size - offset
            t0 = time.monotonic()
            # the image ID from everything that makes the bytes (saves hashing the squashfs again)
            ident = uuid.UUID(bytes=hashlib.sha256(f"{digest}:{created}".encode()).digest()[:16], version=4)
            sif_mod.write_sif(tmp_sif, tmp_sqfs, definition=definition, labels=labels_out, metadata=metadata,
                              sbom=sbom_bytes, image_id=str(ident), in_place=True)
            timings["sif"] = time.monotonic() - t0
            t0 = time.monotonic()

            sha = sha256_file(tmp_sif)
            size = tmp_sif.stat().st_size
            timings["digest"] = time.monotonic() - t0
            _write(tmp_sbom, sbom_bytes, 0o644)
            result = AssembleResult(
                env=plan.env_name, tag=plan.tag, status="assembled", image=str(sif_path), image_json=str(json_path),
                sbom=str(sbom_path), sha256=sha, size=size, squashfs_size=squashfs_size, created=created,
                base_image=plan.base_image, base_id=plan.base_id, roots=[plan.nodes[h].label for h in roots],
                only=only_names, keep_build_deps=keep_build_deps, layers=[i.label() for i in infos],
                labels=labels_out, versions=versions, method=method, log=str(log),
            )
            manifest_json = _image_manifest(result, digest, plan, base, infos, hashes)
            _write(tmp_json, json.dumps(manifest_json, indent=1, sort_keys=True) + "\n", 0o644)
            # the manifest last: an image exists when its manifest does
            os.replace(tmp_sbom, sbom_path)
            os.replace(tmp_sif, sif_path)
            os.replace(tmp_json, json_path)
        except BaseException:
            for t in temps:
                try:
                    t.unlink()
                except FileNotFoundError:
                    pass
            raise
    result.seconds = round(time.monotonic() - started, 3)
    result.timings = {k: round(v, 3) for k, v in timings.items()}
    say(f"{sif_path}: {size / 1e6:.1f} MB, sha256 {sha[:16]}..., {len(infos)} layer(s), in {result.seconds:.1f} s")
    return result


class _Tree:
    """The image tree in the stage: an overlay of the base's unpacked root (nothing
    copied), else the base's squashfs extracted, else (host base) an empty root.

    ``fill(dir)`` puts the layers into ``dir`` (the install root): with an overlay it
    writes straight into the upper directory before the mount (plain tmpfs, not through
    overlayfs), with the base's parent directories' modes; otherwise into the tree."""

    def __init__(self, stage: Path, base: Any, log: Path, say: Callable[[str], None], install_root: str,
                 fill: Callable[[Path], None]) -> None:
        self.stage = stage
        self.base = base
        self.log = log
        self.say = say
        self.install_root = install_root
        self.fill = fill
        self.path = stage / "root"
        self.method = "none"
        self.mounted: Optional[str] = None
        self.upper: Optional[Path] = None
        self.seconds = 0.0

    def _prefill_upper(self, lower: Path, upper: Path) -> bool:
        """Layers into ``upper`` before mounting; False where the base has a symlink on the
        way to the install root (a real directory in upper would hide it)."""
        parts = [p for p in self.install_root.strip("/").split("/") if p]
        cur_lower, cur_upper = lower, upper
        for part in parts:
            cur_lower, cur_upper = cur_lower / part, cur_upper / part
            if cur_lower.is_symlink():
                return False
        upper.mkdir(parents=True, exist_ok=True)
        cur_lower, cur_upper = lower, upper
        for part in parts:
            cur_lower, cur_upper = cur_lower / part, cur_upper / part
            cur_upper.mkdir(exist_ok=True)
            os.chmod(cur_upper, cur_lower.stat().st_mode & 0o7777 if cur_lower.is_dir() else 0o755)
        self.fill(cur_upper)
        return True

    def __enter__(self) -> "_Tree":
        t0 = time.monotonic()
        filled = False
        if self.base is None:
            self.path.mkdir()
            os.chmod(self.path, 0o755)
            self.say("base host: the image carries no operating system, only the software (install root, view)")
        else:
            lower = Path(self.base.rootfs_dir)
            upper = self.stage / "upper"
            if lower.is_dir() and overlay.available():
                filled = self._prefill_upper(lower, upper)
                self.mounted = overlay.mount(lower, upper, self.stage / "work", self.path, log=self.log)
            if self.mounted:
                self.method = f"overlay ({self.mounted})"
                self.upper = upper
            else:
                if upper.exists():
                    shutil.rmtree(upper)
                filled = False
                self.path.mkdir(exist_ok=True)
                squashfs.extract(Path(self.base.squashfs), self.path, log=self.log)
                self.method = "extract"
        if not filled:
            self.fill(_mkdirs(self.path, self.install_root))
        self.seconds = time.monotonic() - t0
        return self

    def changed_tops(self) -> Optional[List[str]]:
        """Top-level names of the tree that differ from the base (what the overlay's upper
        directory holds: new, changed, deleted or merely copied up), None where unknown."""
        if self.upper is None or not self.upper.is_dir():
            return None
        return sorted(os.listdir(self.upper))

    def __exit__(self, *exc: object) -> None:
        if self.mounted:
            overlay.unmount(self.path, self.mounted, log=self.log)
            self.mounted = None


def _run_spack(tree: Path, plan: Any, settings: Any, base: Any, manifest: Mapping[str, Any], log: Path,
               say: Callable[[str], None]) -> str:
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
            _mkdirs(tree, d)
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
        return rt.run_in(None if host else tree, cmd, binds=binds, env=full, log=log, what=what,
                         runtime=settings.runtime, writable=not host, timeout=timeout)

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


def _versions(plan: Any, hashes: Sequence[str], base: Any) -> Tuple[Dict[str, str], Dict[str, str]]:
    """Versions of Open MPI, PMIx, UCX, CUDA in the image: a Spack package of the image
    wins (its view comes first on PATH), else what the base recorded."""
    versions: Dict[str, str] = {}
    sources: Dict[str, str] = {}
    names = {plan.nodes[h].name: plan.nodes[h] for h in hashes}
    for comp in VERSION_COMPONENTS:
        node = names.get(comp)
        if node is not None:
            versions[comp] = node.version
            sources[comp] = "external" if node.external else "spack"
        elif base is not None and base.versions.get(comp):
            recorded = str(base.versions[comp])  # a distribution package version, e.g. 5.0.7-1, 1:2.3-4
            m = _UPSTREAM.search(recorded.split(":", 1)[-1])
            versions[comp] = m.group(0) if m else recorded
            sources[comp] = "base" if versions[comp] == recorded else f"base package {recorded}"
    return versions, sources


def _base_singularity(base: Any) -> Dict[str, Any]:
    """What a base built by Apptainer carries in /.singularity.d (labels, %environment,
    $SINGULARITY_ENVIRONMENT, runscript), which an image built from it inherits."""
    found: Dict[str, Any] = {"labels": {}, "90-environment.sh": "", "91-environment.sh": "", "runscript": ""}
    if base is None:
        return found
    sd = Path(base.rootfs_dir) / ".singularity.d"
    try:
        data = json.loads((sd / "labels.json").read_text())
        if isinstance(data, dict):
            found["labels"] = {str(k): str(v) for k, v in data.items()}
    except (OSError, ValueError):
        pass
    for name, rel in (("90-environment.sh", "env/90-environment.sh"), ("91-environment.sh", "env/91-environment.sh"),
                      ("runscript", "runscript")):
        try:
            text = (sd / rel).read_text()
        except (OSError, UnicodeDecodeError):
            continue
        body = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
        if body and "There is no runscript defined" not in text:  # Apptainer's placeholders carry nothing
            found[name] = text
    return found


def _labels(plan: Any, base: Any, infos: Sequence[LayerInfo], roots: Sequence[str], only_names: Sequence[str],
            keep_build_deps: bool, versions: Mapping[str, str], sources: Mapping[str, str], created: int,
            description: str, user: Mapping[str, str], inherited: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    date = _iso(created)
    labels: Dict[str, str] = {
        "org.label-schema.schema-version": "1.0",
        "org.label-schema.build-date": date,
        "org.label-schema.name": plan.env_name,
        "org.label-schema.version": plan.tag,
        "org.opencontainers.image.created": date,
        "org.opencontainers.image.title": plan.env_name,
        "org.opencontainers.image.version": plan.tag,
        "dedal.version": __version__,
        "dedal.env": plan.env_name,
        "dedal.tag": plan.tag,
        "dedal.lock.sha256": plan.lock_sha256,
        "dedal.spack.version": plan.spack_version,
        "dedal.spack.commit": plan.spack_commit,
        "dedal.base.image": plan.base_image,
        "dedal.base.id": plan.base_id,
        "dedal.install_root": plan.install_root,
        "dedal.view": plan.view,
        "dedal.roots": " ".join(plan.nodes[h].label for h in roots),
        "dedal.layers": json.dumps([i.label() for i in infos], sort_keys=True, separators=(",", ":")),
        "dedal.layers.count": str(len(infos)),
        "dedal.layers.digest": hashlib.sha256("".join(i.sha256 for i in infos).encode()).hexdigest(),
        "dedal.sbom": SBOM_IN_IMAGE,
    }
    if base is not None:
        labels["dedal.base.os"] = base.os_release.get("PRETTY_NAME", base.os_id)
    if description:
        labels["org.label-schema.description"] = description
        labels["org.opencontainers.image.description"] = description
    if only_names:
        labels["dedal.only"] = ",".join(only_names)
    if keep_build_deps:
        labels["dedal.keep_build_deps"] = "true"
    for comp, version in versions.items():
        labels[f"dedal.version.{comp}"] = version
        labels[f"dedal.version.{comp}.source"] = sources[comp]
    clash = sorted(k for k in user if k in labels or k.startswith("dedal."))
    if clash:
        raise UserError(f"dedal.labels: {clash[0]} is a provenance label dedal sets itself")
    for k, v in user.items():
        labels[k] = str(v)
    for k, v in (inherited or {}).items():  # the base's labels, under ours
        labels.setdefault(k, v)
    return labels


def _definition(plan: Any, base: Any, labels: Mapping[str, str], env91: str, runscript: str) -> str:
    """The definition object: not an Apptainer recipe (no `apptainer build` made this image),
    a readable record of what went in, in the definition file's syntax."""
    def indent(text: str) -> str:
        return "".join(f"    {line}\n" for line in text.splitlines() if not line.startswith("#!"))

    lines = [f"# Assembled by dedal {__version__} (`dedal assemble`), not by `apptainer build`:",
             "# the base root filesystem, one squashfs layer per Spack package, spack reindex + view.",
             "Bootstrap: dedal",
             f"From: {plan.base_image}" + (f" ({base.id})" if base is not None else ""),
             "", "%labels"]
    lines += [f"    {k} {v}" for k, v in sorted(labels.items()) if k != "dedal.layers"]
    text = "\n".join(lines) + "\n\n%environment\n" + indent(env91) + "\n%runscript\n" + indent(runscript)
    return text


def _metadata(labels: Mapping[str, str], definition: str, runscript: str, env90: str, env91: str, plan: Any,
              base: Any, infos: Sequence[LayerInfo], roots: Sequence[str], only_names: Sequence[str],
              keep_build_deps: bool, versions: Mapping[str, str]) -> Dict[str, Any]:
    """inspect-metadata.json as Apptainer writes it (data.attributes...), plus dedal's own section."""
    return {
        "data": {"attributes": {
            "labels": dict(labels), "deffile": definition, "runscript": runscript,
            "environment": {"/.singularity.d/env/90-environment.sh": env90, ENV_SCRIPT: env91},
        }},
        "type": "container",
        "dedal": {
            "env": plan.env_name, "tag": plan.tag, "lock_sha256": plan.lock_sha256,
            "spack_commit": plan.spack_commit, "base": _base_json(plan, base),
            "roots": [plan.nodes[h].label for h in roots], "only": list(only_names),
            "keep_build_deps": keep_build_deps, "versions": dict(versions),
            "layers": [{**i.label(), "prefix": i.prefix, "files": i.files, "built_at": i.built_at} for i in infos],
        },
    }


def _base_json(plan: Any, base: Any) -> Dict[str, Any]:
    if base is None:
        return {"name": plan.base_image, "id": plan.base_id}
    return {"name": base.name, "id": base.id, "os": base.os_release.get("PRETTY_NAME", ""),
            "versions": dict(base.versions), "squashfs_bytes": base.squashfs_bytes}


def _image_manifest(result: AssembleResult, digest: str, plan: Any, base: Any, infos: Sequence[LayerInfo],
                    hashes: Sequence[str]) -> Dict[str, Any]:
    return {
        "format": IMAGE_FORMAT,
        "path": result.image, "sha256": result.sha256, "size": result.size,
        "squashfs_size": result.squashfs_size,
        "env": result.env, "tag": result.tag, "created": _iso(result.created), "created_epoch": result.created,
        "base": _base_json(plan, base), "base_id": plan.base_id,
        "lock_sha256": plan.lock_sha256, "spack_commit": plan.spack_commit,
        "install_root": plan.install_root, "view": plan.view,
        "roots": result.roots, "only": result.only, "keep_build_deps": result.keep_build_deps,
        "packages": [plan.nodes[h].label for h in hashes],
        "layers": [{**i.label(), "prefix": i.prefix} for i in infos],
        "labels": result.labels, "versions": result.versions,
        "sbom": result.sbom, "inputs": digest, "dedal_version": __version__,
    }


def _existing(sif_path: Path, json_path: Path, sbom_path: Path, digest: str) -> Optional[AssembleResult]:
    """The result of an earlier assembly with the same inputs, if its files are intact."""
    try:
        data = json.loads(json_path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("inputs") != digest or not sbom_path.is_file():
        return None
    if not sif_path.is_file() or sif_path.stat().st_size != data.get("size") or sha256_file(sif_path) != data.get("sha256"):
        return None
    try:
        return AssembleResult(
            env=data["env"], tag=data["tag"], status="present", image=str(sif_path), image_json=str(json_path),
            sbom=str(sbom_path), sha256=data["sha256"], size=data["size"], squashfs_size=data.get("squashfs_size", 0),
            created=int(data.get("created_epoch", 0)), base_image=data["base"].get("name", ""),
            base_id=data["base_id"], roots=data["roots"], only=data["only"],
            keep_build_deps=data["keep_build_deps"], layers=[{k: v for k, v in l.items() if k != "prefix"}
                                                             for l in data["layers"]],
            labels=data["labels"], versions=data["versions"], method="none")
    except (KeyError, TypeError, AttributeError):
        return None
