"""`dedal rebuild IMAGE`: build an image again from what it carries, and compare, the way
distributions' rebuilders check their packages.

1. The SIF (a file, or ``oras://`` pulled first) gives its ``dedal.source_date_epoch``,
   ``dedal.spack.commit`` and base labels, and its ``/opt/dedal/env`` (``env.yaml``,
   ``spack.lock``, the local package repositories, ``base.yaml``:
   :mod:`dedal.stages.assemble.provenance`), copied out of the mounted partition.
2. The inputs this dedal would use are checked against it before anything is built: the
   base definition of that name must be the image's, the Spack checkout must be at the
   image's commit (without ``spack_root`` dedal clones that commit).
3. fetch, build, assemble of ``env.yaml`` with ``SOURCE_DATE_EPOCH`` set to the image's
   date, into a work directory of its own (layers, work files, images: nothing of an
   earlier build is reused; the source mirror, the base cache and Spack's caches are the
   configured ones: they are inputs, not results).
4. ``dedal diff`` of the two images: "identical", or what differs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

import yaml

from dedal.adapters import git as git_adapter
from dedal.adapters import squashfs
from dedal.errors import DedalError, UserError
from dedal.model import sif as sif_mod
from dedal.model.base import load_definition
from dedal.model.inputs import load_yaml
from dedal.model.image import BASE_FILE, ENV_FILE, ENV_IN_IMAGE, RUNTIME_BASE_FILE
from dedal.stages import image_files
from dedal.stages.reproducible import LABEL as SDE_LABEL
from dedal.stages.sifdiff import DiffResult, diff_images

if TYPE_CHECKING:
    from dedal.model.config import Settings


Progress = Optional[Callable[[str], None]]


@dataclass
class RebuildResult:
    image: str
    rebuilt: str
    identical: bool
    source_date_epoch: int
    spack_commit: str
    workdir: str
    diff: DiffResult
    seconds: float = 0.0
    stages: Dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> Dict[str, Any]:
        return {
            "image": self.image,
            "rebuilt": self.rebuilt,
            "identical": self.identical,
            "source_date_epoch": self.source_date_epoch,
            "spack_commit": self.spack_commit,
            "workdir": self.workdir,
            "seconds": self.seconds,
            "stages": self.stages,
            "diff": self.diff.to_json(),
        }


def image_labels(path: Path) -> Dict[str, str]:
    info = sif_mod.read_sif(path)
    found = info.by_type(sif_mod.DATA_LABELS)
    if not found:
        raise UserError(f"{path}: the SIF has no labels object (not an image dedal assembled)")
    labels = sif_mod.read_json_object(path, found[0])
    if not isinstance(labels, dict):
        raise UserError(f"{path}: its labels are not a JSON object")
    return {str(k): str(v) for k, v in labels.items()}


def extract_env(path: Path, dest: Path) -> Path:
    """Copy the image's /opt/dedal/env into ``dest`` (the partition mounted read-only), with
    the no-follow discipline of :mod:`dedal.stages.image_files`: a symlink on the way or
    inside (``/opt/dedal/env`` -> a host directory, ``env.yaml`` -> a host file), a FIFO,
    a device or too much is refused, never followed onto the host; a partition that cannot
    be mounted or read is a corrupt image. Written under a temporary name and renamed:
    a refusal leaves no ``dest``."""
    part = sif_mod.primary_partition(sif_mod.read_sif(path))
    where = str(path)
    with tempfile.TemporaryDirectory(prefix="dedal-rebuild-") as tmp:
        point = Path(tmp) / "root"
        try:
            method = squashfs.mount(path, point, offset=part.offset)
        except DedalError as exc:
            raise UserError(
                f"{path}: its root file system cannot be mounted ({exc.one_line()}); the image is corrupt"
            ) from None
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                image_files.copy_out(point, ENV_IN_IMAGE, dest, where, required=(ENV_FILE, "spack.lock"))
            except image_files.Missing:
                raise UserError(
                    f"{path}: the image carries no {ENV_IN_IMAGE}/{ENV_FILE} and spack.lock (assembled "
                    "by a dedal that did not record them); rebuild it from its environment file with "
                    "SOURCE_DATE_EPOCH set to its dedal.source_date_epoch label"
                ) from None
        finally:
            squashfs.unmount(point, method, lazy=True)
    try:
        check_carried(dest, f"{where}: {ENV_IN_IMAGE}")
    except UserError:
        shutil.rmtree(dest)
        raise
    return dest / ENV_FILE


def check_carried(env_dir: Path, where: str) -> None:
    """The carried ``env.yaml`` names only what the image carries: its local package
    repositories and includes relative, inside ``env_dir`` (as the assembly writes them),
    and its base by name; an absolute path, a ``..`` or a base given as a file would have
    the rebuild read the host's files. UserError naming the entry."""
    data = load_yaml(env_dir / ENV_FILE)
    spack = data.get("spack") if isinstance(data, dict) else None
    for key in ("repos", "include"):
        entries = spack.get(key) if isinstance(spack, dict) else None
        for entry in entries if isinstance(entries, list) else []:
            text = entry if isinstance(entry, str) else str(entry.get("path", "")) if isinstance(entry, dict) else ""
            if text.startswith("$spack/") or "://" in text:
                continue  # Spack's own files; a URL
            parts = text.split("/")
            if not text or text.startswith(("/", "~", "$")) or ".." in parts:
                raise UserError(
                    f"{where}/{ENV_FILE}: spack.{key} names {text!r}, not a path inside what the image "
                    "carries: refused (the rebuild reads nothing of the host)"
                )
    section = data.get("dedal") if isinstance(data, dict) else None
    for key in ("base_image", "runtime_base"):
        name = section.get(key) if isinstance(section, dict) else None
        if isinstance(name, str) and ("/" in name or name.endswith((".yaml", ".yml", ".def"))):
            raise UserError(
                f"{where}/{ENV_FILE}: dedal.{key} is the path {name!r}; a rebuild takes bases by name "
                "(base-images/<name>.yaml) and compares them with the carried definition"
            )


def check_inputs(env_dir: Path, labels: Dict[str, str], settings: Settings) -> Dict[str, Any]:
    """The overrides that make this dedal use the image's inputs; UserError where it cannot."""
    overrides: Dict[str, Any] = {}
    for carried, label in ((BASE_FILE, "dedal.base.image"), (RUNTIME_BASE_FILE, "dedal.runtime_base.image")):
        base_file = env_dir / carried
        if not base_file.is_file():
            continue
        name = str((yaml.safe_load(base_file.read_text()) or {}).get("name", labels.get(label, "")))
        local = load_definition(name)
        if local.text != base_file.read_text():
            raise UserError(
                f"base image {name}: its definition here ({local.path}) is not the one the image was built "
                f"from (carried in {ENV_IN_IMAGE}/{carried}); the rebuild would use another base"
            )
    commit = labels.get("dedal.spack.commit", "")
    if settings.spack_root:
        root = Path(settings.spack_root)
        have = git_adapter.head_commit(root) if (root / ".git").exists() else ""
        if commit and have and have != commit:
            raise UserError(
                f"the image was built with Spack {commit[:12]}, spack_root {root} is at {have[:12]}: "
                f"check out {commit[:12]} there, or unset spack_root (dedal then clones it)"
            )
    elif commit:
        overrides["spack_ref"] = commit
    return overrides


def rebuild(
    image: Path,
    settings_for: Callable[[Dict[str, Any]], Any],
    *,
    workdir: Optional[Path] = None,
    progress: Progress = None,
    quiet: bool = False,
) -> RebuildResult:
    """Rebuild ``image`` (a local SIF) and compare; ``settings_for(overrides)`` gives the
    settings with the overrides applied (the command's configuration)."""
    started = time.monotonic()
    say = progress or (lambda _m: None)
    image = Path(image).resolve()
    labels = image_labels(image)
    if SDE_LABEL not in labels:
        raise UserError(
            f"{image}: no {SDE_LABEL} label (assembled by a dedal that did not record its date); "
            f"its build date is {labels.get('org.opencontainers.image.created', 'unknown')}"
        )
    try:
        sde = int(labels[SDE_LABEL])
    except ValueError:
        raise UserError(f"{image}: label {SDE_LABEL}={labels[SDE_LABEL]!r} is not seconds since 1970") from None
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="dedal-rebuild-"))
    made = not workdir or not work.exists()  # a refused image leaves no work directory dedal made
    work.mkdir(parents=True, exist_ok=True)
    say(f"{image.name}: extracting {ENV_IN_IMAGE} into {work / 'env'}")
    try:
        env_file = extract_env(image, work / "env")
    except BaseException:
        if made:
            shutil.rmtree(work, ignore_errors=True)
        raise
    overrides = check_inputs(work / "env", labels, settings_for({}))
    overrides.update(
        {
            "layer_store": str(work / "layers"),
            "work_dir": str(work / "work"),
            "images_dir": str(work / "images"),
            "reports_dir": str(work / "reports"),
        }
    )
    settings = settings_for(overrides)

    from dedal.stages.pipeline import run_pipeline
    from dedal.model.image_options import ImageOptions
    from dedal.model.target import resolve

    target = resolve(str(env_file), settings)
    # assembly takes the date as a value; the variable is set too, for the tools the build runs
    # (compilers honour it) as they ran when the image was made
    saved = os.environ.get("SOURCE_DATE_EPOCH")
    os.environ["SOURCE_DATE_EPOCH"] = str(sde)
    try:
        say(f"fetch, build, assemble {target.name} with SOURCE_DATE_EPOCH={sde}")
        summary = run_pipeline(
            target,
            ImageOptions.of(target.env, source_date_epoch=sde),
            stages=["fetch", "build", "assemble"],
            executor=settings.executor,
            jobs=max(1, int(settings.jobs or 1)),
            keep_going=False,
            quiet=quiet,
        )
    finally:
        if saved is None:
            os.environ.pop("SOURCE_DATE_EPOCH", None)
        else:
            os.environ["SOURCE_DATE_EPOCH"] = saved
    if summary.failure is not None:
        raise summary.failure  # the stage's own error (a failed build, bad input), work directory kept
    if not summary.image:
        raise UserError(f"the rebuild assembled no image (work directory {work})")
    say(f"comparing {image.name} with the rebuilt {summary.image}")
    diff = diff_images(image, Path(summary.image))
    return RebuildResult(
        image=str(image),
        rebuilt=summary.image,
        identical=diff.identical,
        source_date_epoch=sde,
        spack_commit=labels.get("dedal.spack.commit", ""),
        workdir=str(work),
        diff=diff,
        seconds=round(time.monotonic() - started, 1),
        stages={
            s.name: {"status": s.status, "seconds": s.seconds, "detail": s.detail}
            for s in summary.stages
            if s.name in ("fetch", "build", "assemble")
        },
    )
