"""The image's record beside the SIF: where the files go (:func:`image_paths`), the
stage's result, the image manifest ``<tag>.image.json`` with the digest of the inputs, and
the check that an existing image with the same inputs is intact (then it is kept)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

from dedal import __version__
from dedal.errors import UserError
from dedal.model.artifacts import sha256_file
from dedal.stages.assemble.metadata import Contents, base_json, iso_date

if TYPE_CHECKING:
    from dedal.model.config import Settings
    from dedal.model.plan import Plan


#: part of every image's inputs: an image made by a dedal whose assembly wrote other files is made
#: again. Raised whenever what assembly writes changes (tests/stages/assemble/test_golden.py fails
#: until it is): the version alone does not say it between releases.
IMAGE_FORMAT = 4


@dataclass
class AssembleResult:
    env: str
    tag: str
    status: str  # assembled | present
    image: str  # the SIF
    image_json: str
    sbom: str
    sha256: str
    size: int
    squashfs_size: int
    created: int  # build date (seconds since 1970)
    base_image: str
    base_id: str
    roots: List[str]
    only: List[str]
    keep_build_deps: bool
    layers: List[Dict[str, Any]]
    labels: Dict[str, str]
    versions: Dict[str, str]
    method: str  # overlay (kernel|fuse), extract, none (host base)
    seconds: float = 0.0
    timings: Dict[str, float] = field(default_factory=dict)
    log: str = ""
    runtime_base: str = ""  # the base the image was assembled on, where not base_image
    runtime_base_id: str = ""
    elf_closure: Dict[str, Any] = field(default_factory=dict)  # closure.ClosureReport.to_json()

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


def image_paths(
    settings: Settings, plan: Plan, output: Optional[Union[str, os.PathLike]], only_names: Sequence[str]
) -> Tuple[Path, Path, Path]:
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


def image_manifest(result: AssembleResult, digest: str, contents: Contents, hashes: Sequence[str]) -> Dict[str, Any]:
    """The manifest: its ``base`` is the build base (the layers' key), ``runtime_base`` the
    base the image was assembled on where it is another; ``hashes``: every package in it."""
    plan = contents.plan
    extra: Dict[str, Any] = {"elf_closure": result.elf_closure} if result.elf_closure else {}
    if contents.runtime_base is not None:
        extra["runtime_base"] = base_json(plan, contents.runtime_base)
    return {
        **extra,
        "format": IMAGE_FORMAT,
        "path": result.image,
        "sha256": result.sha256,
        "size": result.size,
        "squashfs_size": result.squashfs_size,
        "env": result.env,
        "tag": result.tag,
        "created": iso_date(result.created),
        "created_epoch": result.created,
        "base": base_json(plan, contents.build_base),
        "base_id": plan.base_id,
        "lock_sha256": plan.lock_sha256,
        "spack_commit": plan.spack_commit,
        "install_root": plan.install_root,
        "view": plan.view,
        "roots": result.roots,
        "only": result.only,
        "keep_build_deps": result.keep_build_deps,
        "packages": [plan.nodes[h].label for h in hashes],
        "layers": [{**i.label(), "prefix": i.prefix} for i in contents.infos],
        "labels": result.labels,
        "versions": result.versions,
        "sbom": result.sbom,
        "inputs": digest,
        "dedal_version": __version__,
    }


def _recorded(sif_path: Path, json_path: Path, sbom_path: Path, digest: str) -> Tuple[Optional[dict], Optional[str]]:
    """(the image manifest, None) when the image was assembled from inputs of this
    ``digest`` and its files are intact; else (None, why it must be assembled again)."""
    try:
        data = json.loads(json_path.read_text())
    except (OSError, ValueError):
        return None, f"no readable {json_path.name}"
    if not isinstance(data, dict):
        return None, f"{json_path.name} is not an image manifest"
    if data.get("inputs") != digest:
        return None, "its inputs changed (environment, layers, base, labels, runscript or image date)"
    if not sbom_path.is_file():
        return None, f"no {sbom_path.name}"
    if not sif_path.is_file():
        return None, f"no {sif_path.name}"
    if sif_path.stat().st_size != data.get("size") or sha256_file(sif_path) != data.get("sha256"):
        return None, f"{sif_path.name} differs from its manifest (size or sha256)"
    return data, None


def current(sif_path: Path, json_path: Path, sbom_path: Path, digest: str) -> Optional[str]:
    """None when the image at ``sif_path`` is current for the inputs of ``digest`` (the
    stamp is ``inputs`` in its ``.image.json``), else why assemble must run again."""
    return _recorded(sif_path, json_path, sbom_path, digest)[1]


def existing_image(sif_path: Path, json_path: Path, sbom_path: Path, digest: str) -> Optional[AssembleResult]:
    """The result of an earlier assembly with the same inputs, if its files are intact."""
    data, _why = _recorded(sif_path, json_path, sbom_path, digest)
    if data is None:
        return None
    try:
        return AssembleResult(
            env=data["env"],
            tag=data["tag"],
            status="present",
            image=str(sif_path),
            image_json=str(json_path),
            sbom=str(sbom_path),
            sha256=data["sha256"],
            size=data["size"],
            squashfs_size=data.get("squashfs_size", 0),
            created=int(data.get("created_epoch", 0)),
            base_image=data["base"].get("name", ""),
            base_id=data["base_id"],
            roots=data["roots"],
            only=data["only"],
            keep_build_deps=data["keep_build_deps"],
            layers=[{k: v for k, v in layer.items() if k != "prefix"} for layer in data["layers"]],
            labels=data["labels"],
            versions=data["versions"],
            method="none",
            runtime_base=(data.get("runtime_base") or {}).get("name", ""),
            runtime_base_id=(data.get("runtime_base") or {}).get("id", ""),
            elf_closure=data.get("elf_closure", {}),
        )
    except (KeyError, TypeError, AttributeError):
        return None
