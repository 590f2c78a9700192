"""The assemble stage: base root filesystem + the layers of the runtime closure -> one SIF.

1. **Select** the packages: the runtime closure of the roots (build-only dependencies
   dropped unless ``keep_build_deps``), or of the roots named by ``only``.
2. **Audit** every layer before trusting it: its manifest names the package, the install
   root and the key; the squashfs matches the manifest's size and sha256; every entry is
   inside ``<prefix>/``; no device nodes; symlinks point into the install root (absolute
   ones, as Spack makes, or relative ones that do not climb out of it). Anything else is
   refused (UserError) before a byte of the image is written.
3. **Tree** in a stage under ``stage_dir`` (/dev/shm): the image's base root filesystem as the
   lower layer of an overlay mount (nothing copied; where no overlay can be mounted, the
   base's squashfs is extracted instead), each layer extracted at the install root.
   The image's base is the build base (the plan's, which the layer keys name), or the
   environment's ``runtime_base``: a smaller twin with only the runtime libraries (e.g.
   no CUDA toolkit), refused unless every Debian package the two share has one version
   (:func:`dedal.model.base.check_runtime_base`); labels, SBOM and manifest name both.
4. **Spack** runs inside the tree (writable, the Spack checkout and its user cache bound):
   ``reindex`` (the layers carry no database), ``env view regenerate`` at the view's
   final path, and ``env activate --sh``, whose output becomes
   ``/.singularity.d/env/91-environment.sh`` (PATH, MANPATH, ..., package run
   environments; Spack's own variables dropped, inherited values kept as ``$VAR``). The
   environment (spack.yaml, spack.lock) and the SBOM stay in the image under /opt/dedal.
   Then the **ELF closure** (:mod:`.closure`): every ELF file under the install root and
   the view finds each library it needs inside the image, the host driver's excepted;
   otherwise one UserError naming the files and libraries, before anything is packed.
5. **Apptainer's layout**: ``/.singularity.d/{actions,env,libs}``, the env scripts, a
   runscript, ``labels.json``, the mount points Apptainer expects.
6. **Reproducible**: one date for every time stamp (:mod:`dedal.stages.reproducible`:
   ``SOURCE_DATE_EPOCH``, else the Spack commit's date, never the wall clock), Spack's
   database install times included, its verifier derived from the content; mksquashfs
   fixes times and owners; the layers hold no build records. Same inputs, same bytes.
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
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from dedal import __version__
from dedal.adapters import squashfs
from dedal.errors import Signals, UserError
from dedal.model import git_sources, sbom as sbom_mod, sif as sif_mod
from dedal.model.base import (
    BaseImage,
    HOST_BASE,
    check_runtime_base,
    input_labels as base_input_labels,
    iter_cached,
    runtime_base_name,
)
from dedal.model.image import ENV_IN_IMAGE, ENV_TEST, SBOM_IN_IMAGE, image_tops
from dedal.model import artifacts
from dedal.model.artifacts import sha256_file
from dedal.model.layers import LayerStore
from dedal.model.config import Settings
from dedal.model.image_options import ImageOptions
from dedal.model.plan import Plan
from dedal.model.spack_env import local_inputs, read_spack_yaml, stage_manifest, write_env_dir
from dedal.model.spack_lock import SpackLock, load_lock
from dedal.stages.assemble import provenance
from dedal.stages.assemble import usage
from dedal.stages.assemble.apptainer_files import (
    DEFAULT_RUNSCRIPT,
    base_singularity,
    runscript_text,
    script_text,
    write_apptainer_files,
)
from dedal.stages.layer_audit import LayerInfo, audit_layers, inside
from dedal.stages.assemble.closure import library_path_of, require_closure
from dedal.stages.assemble.envscript import base_environment_script
from dedal.stages.assemble.manifest import IMAGE_FORMAT, AssembleResult, existing_image, image_manifest, image_paths
from dedal.stages.assemble.metadata import (
    BUNDLED_PMIX_HEADER,
    Contents,
    bundled_pmix_node,
    definition_text,
    image_versions,
    inspect_metadata,
    iso_date,
    make_labels,
    pmix_version_of_header,
    runtime_base_labels,
)
from dedal.stages.assemble.selection import select_packages
from dedal.stages.assemble.spack_run import normalize_spack_db, run_spack
from dedal.stages.assemble.tree import ImageTree, extract_layers, mkdirs, write_file
from dedal.stages.base import base_part, base_sha256, ensure_base
from dedal.stages.reproducible import LABEL as SDE_LABEL, image_date
from dedal.stages.stage_dir import Stage

Progress = Optional[Callable[[str], None]]


def _say(progress: Progress, start: float) -> Callable[[str], None]:
    def say(msg: str) -> None:
        if progress:
            progress(f"[{time.monotonic() - start:6.1f}s] {msg}")

    return say


def _find_base(plan: Plan, settings: Settings, say: Callable[[str], None]) -> Optional[BaseImage]:
    """The built base the plan's layers were made for (None for the host)."""
    if plan.base_image == HOST_BASE:
        return None

    for img in iter_cached(settings):
        if img.id == plan.base_id:
            return img
    img = ensure_base(plan.base_image, settings, progress=say)
    if img.id != plan.base_id:
        raise UserError(
            f"the layers of {plan.env_name} were built on base {plan.base_id}, which is not in the base "
            f"cache {settings.base_cache}; the definition of {plan.base_image} is now {img.id}: "
            "run `dedal build` again (new layers for the new base)"
        )
    return img


def reap_temporaries(*outputs: Path) -> List[str]:
    """Remove what an assembly of these outputs killed outright (kill -9, a node lost)
    left: the temporaries named after them (:func:`dedal.model.artifacts.temp_path`) whose
    owner is gone (on this host). SIGTERM and SIGINT clean up themselves (Signals); other
    hosts' files are left alone."""
    removed: List[str] = []
    for out in outputs:
        removed += artifacts.reap_temporaries(out.parent, of=out.name)
    return removed


def bundled_pmix(
    plan: Plan, hashes: Sequence[str], lock: SpackLock, infos: Sequence[LayerInfo], store: LayerStore
) -> Optional[Tuple[str, str]]:
    """(version, source) of the PMIx an Open MPI built with its own (``+internal-pmix``)
    carries, read from that Open MPI's layer; None where the image's Open MPI has none."""
    ompi = bundled_pmix_node(plan, hashes, lock)
    info = next((i for i in infos if ompi is not None and i.hash == ompi.hash), None)
    if info is None:
        return None
    member = posixpath.join(info.prefix, BUNDLED_PMIX_HEADER)  # the layer's prefix: relative to the install root
    found = pmix_version_of_header(squashfs.read_text(store.sqfs(info.key), member) or "")
    return (found, f"bundled with openmpi@{ompi.version}") if found else None


def check_can_assemble(base: Optional[BaseImage], euid: Optional[int] = None) -> None:
    """An image on a base is assembled as root: its tree is the base's root file system, whose
    directories are root's. Said before the work, in one line: a user who is not root met an
    internal error halfway (PermissionError creating /opt/dedal/env in the tree)."""
    if base is not None and (os.geteuid() if euid is None else euid) != 0:
        raise UserError(
            f"assembling an image on base {base.name} needs root: its tree is the base's root file system, "
            "whose directories are root's (a user who is not root can write neither /opt/dedal nor "
            "/.singularity.d into it); run the assemble stage as root (e.g. a CI job), fetch, build and "
            "verify run as any user"
        )


def assemble(
    plan: Plan,
    image: ImageOptions,
    settings: Settings,
    *,
    lock: Optional[SpackLock] = None,
    output: Optional[Union[str, os.PathLike]] = None,
    progress: Progress = None,
    force: bool = False,
) -> AssembleResult:
    """Assemble the image of ``plan``, as ``image`` says; see the module documentation.
    ``lock``: the plan's lock when the caller parsed it already (else read from its env dir)."""
    started = time.monotonic()
    say = _say(progress, started)
    timings: Dict[str, float] = {}
    only = list(image.only) if image.only is not None else None
    keep_build_deps = image.keep_build_deps
    runscript = image.runscript
    user_labels = dict(image.labels)
    description = image.description
    runtime_name = runtime_base_name(plan.base_image, image.runtime_base or plan.runtime_base or None)

    envdir = Path(plan.env_dir) if plan.env_dir else None
    if envdir is None or not (envdir / "spack.yaml").is_file() or not (envdir / "spack.lock").is_file():
        raise UserError(
            f"plan of {plan.env_name}: its environment directory {plan.env_dir!r} lacks spack.yaml "
            "or spack.lock (run `dedal build` on the environment file)"
        )
    manifest = read_spack_yaml(envdir / "spack.yaml")
    for p in (plan.view, plan.install_root):
        if not p.startswith("/") or posixpath.normpath(p) in ("/",) or posixpath.normpath(p).startswith("/dev/"):
            raise UserError(
                f"{p}: the install root and the view must be absolute paths outside /dev "
                "(Apptainer mounts the host's /dev over the image)"
            )
    if inside(posixpath.normpath(plan.view), posixpath.normpath(plan.install_root)):
        raise UserError(f"view {plan.view} is inside the install root {plan.install_root}")

    roots, hashes = select_packages(plan, only, keep_build_deps)
    only_names = [plan.nodes[h].name for h in roots] if only else []
    sif_path, json_path, sbom_path = image_paths(settings, plan, output, only_names)
    store = LayerStore(Path(settings.layer_store))
    say(
        f"{plan.env_name}: {len(hashes)} package(s) in the image"
        + (f" (only {', '.join(plan.nodes[h].label for h in roots)})" if only else "")
        + (", build dependencies kept" if keep_build_deps else "")
    )

    t0 = time.monotonic()
    infos = audit_layers(plan, hashes, store, say, memo=Path(settings.cache_dir) / "assemble" / "audited")
    timings["audit"] = time.monotonic() - t0
    build_base = _find_base(plan, settings, say)
    build_digest = base_sha256(build_base, settings) if build_base is not None else ""
    base, base_digest, shared = build_base, build_digest, 0  # base: what the image is made on
    if runtime_name != plan.base_image:
        base = ensure_base(runtime_name, settings, progress=say)
        shared = check_runtime_base(build_base, base)
        base_digest = base_sha256(base, settings)
        say(
            f"runtime base {base.id}: the {shared} Debian packages it shares with build base {build_base.id} "
            "have the same versions"
        )
    lock = lock if lock is not None else load_lock(envdir / "spack.lock")
    versions, version_sources = image_versions(plan, hashes, base)
    bundled = bundled_pmix(plan, hashes, lock, infos, store)
    if bundled:
        versions["pmix"], version_sources["pmix"] = bundled
    created, created_from = image_date(plan, settings, image.source_date_epoch)
    say(f"image date {iso_date(created)}: {created_from}")
    inputs = {
        "format": IMAGE_FORMAT,
        "dedal": __version__,
        "env": plan.env_name,
        "tag": plan.tag,
        "install_root": plan.install_root,
        "view": plan.view,
        "lock_sha256": plan.lock_sha256,
        "spack_commit": plan.spack_commit,
        "manifest": provenance.inputs_digest(manifest),  # no host path
        "base": {"id": build_base.id, "sha256": build_digest} if build_base else "host",
        "layers": [[i.key, i.sha256] for i in infos],
        "roots": roots,
        "keep_build_deps": keep_build_deps,
        "runscript": runscript,
        "help": image.help,
        "test": image.test,
        "labels": user_labels,
        "description": description,
        "source_date_epoch": created,
    }
    if base is not build_base:
        inputs["runtime_base"] = {"id": base.id, "sha256": base_digest}
    digest = artifacts.inputs_digest(inputs)
    if not force:
        kept = existing_image(sif_path, json_path, sbom_path, digest)
        if kept is not None:
            say(f"{sif_path} is up to date (same inputs, sha256 ok)")
            kept.status = "present"
            kept.seconds = round(time.monotonic() - started, 3)
            return kept
    check_can_assemble(base)

    inherited = base_singularity(base)  # an Apptainer-built base keeps its labels, environment, runscript
    contents = Contents(
        plan,
        infos,
        roots,
        build_base=build_base,
        runtime_base=base if base is not build_base else None,
        only_names=only_names,
        keep_build_deps=keep_build_deps,
        versions=versions,
        version_sources=version_sources,
    )
    labels_out = make_labels(contents, created, description, user_labels, inherited["labels"])
    if build_digest:
        labels_out["dedal.base.sha256"] = build_digest
    labels_out[SDE_LABEL] = str(created)
    if build_base is not None:
        labels_out.update(base_input_labels(build_base))
    if base is not build_base:
        labels_out.update(runtime_base_labels(build_base, base, base_digest, shared))
    runscript_sh = (
        runscript_text(runscript) if runscript.strip() or not inherited["runscript"] else inherited["runscript"]
    )
    env90 = base_environment_script(inherited["90-environment.sh"], base.env if base else {})
    help_file = usage.help_text(
        contents, labels_out, user_help=image.help, own_runscript=runscript_sh != DEFAULT_RUNSCRIPT
    )
    env_test = script_text(image.test) if image.test.strip() else ""
    layer_map = {i.hash: {"key": i.key, "sha256": i.sha256, "size": i.size} for i in infos}

    base_props = {"dedal:base_image": plan.base_image, "dedal:base_id": plan.base_id, "dedal:base_sha256": build_digest}
    if base is not build_base:
        base_props.update(
            {
                "dedal:runtime_base_image": base.name,
                "dedal:runtime_base_id": base.id,
                "dedal:runtime_base_sha256": base_digest,
            }
        )
    if only_names:
        base_props["dedal:only"] = ",".join(only_names)
    for comp, version in versions.items():  # the stack's versions, as the labels name them
        base_props[f"dedal:version:{comp}"] = f"{version} ({version_sources[comp]})"
    # sources archived from git repositories: the manifests of the local package repositories name their origin
    origins = git_sources.origins(
        local_inputs(manifest),
        ((h, plan.nodes[h].namespace, plan.nodes[h].name, plan.nodes[h].version) for h in hashes),
    )
    sbom_doc = sbom_mod.make_sbom(
        plan,
        hashes,
        layers=layer_map,
        lock=lock,
        created=created,
        roots=roots,
        properties=base_props,
        origins={h: git_sources.origin_record(s) for h, s in origins.items()},
    )
    sbom_bytes = sbom_mod.dumps(sbom_doc)

    logs = Path(settings.work_dir) / plan.env_name / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"assemble-{re.sub(r'[^A-Za-z0-9._-]+', '_', sif_path.stem)}.log"
    log.write_text(f"dedal assemble {plan.env_name} -> {sif_path} ({iso_date(int(time.time()))})\n")

    sif_path.parent.mkdir(parents=True, exist_ok=True)
    reap_temporaries(sif_path)  # every temporary of this output is named after the SIF
    tmp_tag = artifacts.temp_path(sif_path).name
    tmp_sqfs = sif_path.with_name(tmp_tag + ".sqfs")
    tmp_sif = sif_path.with_name(tmp_tag + ".sif")
    tmp_json = json_path.with_name(tmp_tag + ".image.json")
    tmp_sbom = sbom_path.with_name(tmp_tag + ".sbom.cdx.json")
    temps = [tmp_sqfs, tmp_sif, tmp_json, tmp_sbom]
    method = "none"
    closure: Dict[str, Any] = {}
    with Signals("assemble"):  # SIGTERM/SIGINT: the stage and every temporary file go away
        try:
            with Stage(Path(settings.stage_dir), "assemble") as stage:

                def fill(dest: Path) -> None:
                    t1 = time.monotonic()
                    extract_layers(store, infos, dest, log, plan.install_root)
                    os.chmod(dest, 0o755)
                    timings["layers"] = time.monotonic() - t1

                with ImageTree(stage, base, log, say, plan.install_root, fill) as tree:
                    method = tree.method
                    timings["tree"] = tree.seconds - timings["layers"]
                    root = tree.path

                    ir_dir = root / plan.install_root.lstrip("/")
                    say(f"extracted {len(infos)} layer(s) at {plan.install_root} ({tree.method})")

                    t0 = time.monotonic()
                    env_dir_img = mkdirs(root, ENV_IN_IMAGE)

                    # the local repositories and includes travel in the image, named there
                    provenance.copy_inputs(manifest, env_dir_img)
                    img_manifest = stage_manifest(
                        provenance.in_image(manifest),
                        install_root=plan.install_root,
                        stage=Path("/tmp/dedal-spack"),
                        view=plan.view,
                    )
                    write_env_dir(env_dir_img, img_manifest, envdir / "spack.lock")
                    spack_yaml_bytes = (env_dir_img / "spack.yaml").read_bytes()
                    env91 = run_spack(root, plan, settings, base, manifest, log, say)
                    if inherited["91-environment.sh"]:
                        env91 = inherited["91-environment.sh"].rstrip("\n") + "\n" + env91.split("\n", 1)[1]
                    # what Spack leaves in the environment directory besides ours is build-time state
                    for entry in list(env_dir_img.iterdir()):
                        if entry.name not in provenance.KEEP:
                            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
                    write_file(env_dir_img / "spack.yaml", spack_yaml_bytes)
                    shutil.copyfile(envdir / "spack.lock", env_dir_img / "spack.lock")
                    provenance.write_rebuild_inputs(
                        env_dir_img,
                        manifest,
                        provenance.dedal_section(plan, image, only=only_names, runtime_base=runtime_name),
                        provenance.definition_of(build_base),
                        provenance.definition_of(base) if base is not build_base else None,
                    )
                    normalize_spack_db(ir_dir, created)
                    timings["spack"] = time.monotonic() - t0

                    t0 = time.monotonic()
                    if base is not None:  # a host base's libraries are the host's: nothing to check in the image
                        closure = require_closure(
                            root,
                            [plan.install_root, plan.view],
                            arch=base.arch,
                            where=f"image {plan.env_name}:{plan.tag}",
                            log=log,
                            library_path=library_path_of(env90 + env91),
                        ).to_json()
                        say(
                            f"ELF closure: {closure['checked']} file(s) find their libraries in the image"
                            + (
                                f" (host driver's: {', '.join(sorted(closure['host_driver']))})"
                                if closure["host_driver"]
                                else ""
                            )
                        )
                    timings["closure"] = time.monotonic() - t0

                    t0 = time.monotonic()
                    # the test knows the image's own LD_LIBRARY_PATH (91-environment.sh is Spack's, made above)
                    test_file = usage.test_script(
                        contents,
                        image_library_path=library_path_of(env90 + env91),
                        env_test=ENV_TEST if env_test else "",
                    )
                    write_apptainer_files(
                        root,
                        env90=env90,
                        env91=env91,
                        runscript=runscript_sh,
                        labels=labels_out,
                        help=help_file,
                        test=test_file,
                        env_test=env_test,
                    )
                    write_file(root / SBOM_IN_IMAGE.lstrip("/"), sbom_bytes, 0o644)
                    timings["image_files"] = time.monotonic() - t0

                    definition = definition_text(contents, labels_out, env91, runscript_sh, help_file, test_file)
                    metadata = inspect_metadata(
                        contents, labels_out, definition, runscript_sh, env90, env91, help_file, test_file
                    )
                    # mksquashfs writes the partition at its place in the SIF: no copy afterwards
                    offset = sif_mod.partition_offset(
                        definition=definition, labels=labels_out, metadata=metadata, sbom=sbom_bytes
                    )
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
                        squashfs.append(
                            part,
                            [root / t for t in tops if os.path.lexists(root / t)],
                            tmp_sqfs,
                            offset=offset,
                            root_mode=os.stat(root).st_mode,
                            log=log,
                            what="mksquashfs (image, onto the base)",
                        )
                        method += ", base reused"
                    else:
                        say(f"mksquashfs {tree.method} tree -> {tmp_sqfs.name}")
                        squashfs.pack([root], tmp_sqfs, log=log, what="mksquashfs (image)", offset=offset)
                    timings["squashfs"] = time.monotonic() - t0
            squashfs_size = tmp_sqfs.stat().st_size - offset
            t0 = time.monotonic()
            # the image ID from everything that makes the bytes (saves hashing the squashfs again)
            ident = uuid.UUID(bytes=hashlib.sha256(f"{digest}:{created}".encode()).digest()[:16], version=4)
            sif_mod.write_sif(
                tmp_sif,
                tmp_sqfs,
                definition=definition,
                labels=labels_out,
                metadata=metadata,
                sbom=sbom_bytes,
                image_id=str(ident),
                created=created,
                in_place=True,
            )
            timings["sif"] = time.monotonic() - t0
            t0 = time.monotonic()

            sha = sha256_file(tmp_sif)
            size = tmp_sif.stat().st_size
            timings["digest"] = time.monotonic() - t0
            write_file(tmp_sbom, sbom_bytes, 0o644)
            result = AssembleResult(
                env=plan.env_name,
                tag=plan.tag,
                status="assembled",
                image=str(sif_path),
                image_json=str(json_path),
                sbom=str(sbom_path),
                sha256=sha,
                size=size,
                squashfs_size=squashfs_size,
                created=created,
                base_image=plan.base_image,
                base_id=plan.base_id,
                roots=[plan.nodes[h].label for h in roots],
                only=only_names,
                keep_build_deps=keep_build_deps,
                layers=[i.label() for i in infos],
                labels=labels_out,
                versions=versions,
                method=method,
                log=str(log),
                runtime_base=base.name if base is not build_base else "",
                runtime_base_id=base.id if base is not build_base else "",
                elf_closure=closure,
            )
            manifest_json = image_manifest(result, digest, contents, hashes)
            write_file(tmp_json, json.dumps(manifest_json, indent=1, sort_keys=True) + "\n", 0o644)
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
