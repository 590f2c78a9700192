"""What an image says about itself: the versions of its MPI stack, its labels (provenance
first, the user's next, the base's under both), the definition object and
inspect-metadata.json of the SIF."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Sequence, Tuple

from dedal import __version__
from dedal.errors import UserError
from dedal.model.base import input_labels
from dedal.model.image import ENV_SCRIPT, HELP_FILE, SBOM_IN_IMAGE
from dedal.stages.layer_audit import LayerInfo

if TYPE_CHECKING:
    from dedal.model.base import BaseImage
    from dedal.model.plan import Plan, PlanNode
    from dedal.model.spack_lock import SpackLock


VERSION_COMPONENTS = ("openmpi", "pmix", "ucx", "cuda", "nccl")
_UPSTREAM = re.compile(r"\d+(?:\.\d+)+")


@dataclass(frozen=True)
class Contents:
    """What one image carries, as assembly chose it: the labels, the definition object,
    inspect-metadata.json and the image manifest each say it in their own way, from this one
    value. ``build_base``: what the layers were built on (None: the host); ``runtime_base``:
    the base the image is made on where it is another (None: it is ``build_base``)."""

    plan: Plan
    infos: Sequence[LayerInfo]
    roots: Sequence[str]
    build_base: Optional[BaseImage] = None
    runtime_base: Optional[BaseImage] = None
    only_names: Sequence[str] = ()
    keep_build_deps: bool = False
    versions: Mapping[str, str] = field(default_factory=dict)
    version_sources: Mapping[str, str] = field(default_factory=dict)


def iso_date(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def image_versions(
    plan: Plan, hashes: Sequence[str], base: Optional[BaseImage]
) -> Tuple[Dict[str, str], Dict[str, str]]:
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


_PMIX_PART = re.compile(r"^#define\s+PMIX_VERSION_(MAJOR|MINOR|RELEASE)\s+(\d+)L?\s*$", re.M)

#: where an Open MPI built with its bundled PMIx (Spack's ``+internal-pmix``) keeps that
#: PMIx's version, relative to its prefix
BUNDLED_PMIX_HEADER = "include/pmix_version.h"


def pmix_version_of_header(text: str) -> Optional[str]:
    """``5.0.5`` from a ``pmix_version.h`` (``#define PMIX_VERSION_MAJOR 5L`` ...)."""
    parts = dict(_PMIX_PART.findall(text or ""))
    if not all(k in parts for k in ("MAJOR", "MINOR", "RELEASE")):
        return None
    return f"{int(parts['MAJOR'])}.{int(parts['MINOR'])}.{int(parts['RELEASE'])}"


def bundled_pmix_node(plan: Plan, hashes: Sequence[str], lock: SpackLock) -> Optional[PlanNode]:
    """The image's Spack-built Open MPI when it carries its own PMIx (``+internal-pmix``) and
    no PMIx package of the image stands beside it: then that bundled PMIx is the one its
    ranks talk to, not a PMIx the base has."""
    names = {plan.nodes[h].name: h for h in hashes}
    h = names.get("openmpi")
    if h is None or "pmix" in names or plan.nodes[h].external:
        return None
    lnode = lock.nodes.get(h) if lock is not None and hasattr(lock, "nodes") else None
    params = lnode.raw.get("parameters", {}) if lnode is not None else {}
    return plan.nodes[h] if params.get("internal-pmix") is True else None


def make_labels(
    contents: Contents,
    created: int,
    description: str,
    user: Mapping[str, str],
    inherited: Optional[Mapping[str, str]] = None,
) -> Dict[str, str]:
    """The image's labels: dedal's provenance, then ``user``'s (which may not name one of
    dedal's), then the base's ``inherited`` ones under both."""
    plan, base, infos = contents.plan, contents.build_base, contents.infos
    date = iso_date(created)
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
        "dedal.roots": " ".join(plan.nodes[h].label for h in contents.roots),
        "dedal.layers": json.dumps([i.label() for i in infos], sort_keys=True, separators=(",", ":")),
        "dedal.layers.count": str(len(infos)),
        "dedal.layers.digest": hashlib.sha256("".join(i.sha256 for i in infos).encode()).hexdigest(),
        "dedal.sbom": SBOM_IN_IMAGE,
        # as `apptainer build` labels an image with a %help section (run-help prints it)
        "org.label-schema.usage": HELP_FILE,
        "org.label-schema.usage.apptainer.runscript.help": HELP_FILE,
    }
    if base is not None:
        labels["dedal.base.os"] = base.os_release.get("PRETTY_NAME", base.os_id)
    if description:
        labels["org.label-schema.description"] = description
        labels["org.opencontainers.image.description"] = description
    if contents.only_names:
        labels["dedal.only"] = ",".join(contents.only_names)
    if contents.keep_build_deps:
        labels["dedal.keep_build_deps"] = "true"
    for comp, version in contents.versions.items():
        labels[f"dedal.version.{comp}"] = version
        labels[f"dedal.version.{comp}.source"] = contents.version_sources[comp]
    clash = sorted(k for k in user if k in labels or k.startswith("dedal."))
    if clash:
        raise UserError(f"dedal.labels: {clash[0]} is a provenance label dedal sets itself")
    for k, v in user.items():
        labels[k] = str(v)
    for k, v in (inherited or {}).items():  # the base's labels, under ours
        labels.setdefault(k, v)
    return labels


def runtime_base_labels(build: BaseImage, runtime: BaseImage, digest: str, shared: int) -> Dict[str, str]:
    """Labels of the base an image is assembled on when it is not its build base: its name,
    id, content, OS and recorded versions, its inputs (:func:`input_labels`), and how many
    Debian packages it shares with the build base (all in the same version, checked). The
    build base's recorded versions come along, so both sets are read side by side."""
    compact = {"sort_keys": True, "separators": (",", ":")}
    labels = {
        "dedal.runtime_base.image": runtime.name,
        "dedal.runtime_base.id": runtime.id,
        "dedal.runtime_base.sha256": digest,
        "dedal.runtime_base.os": runtime.os_release.get("PRETTY_NAME", runtime.os_id),
        "dedal.runtime_base.versions": json.dumps(dict(runtime.versions), **compact),
        "dedal.runtime_base.shared_packages": str(shared),
        "dedal.base.versions": json.dumps(dict(build.versions), **compact),
    }
    labels.update(input_labels(runtime, prefix="dedal.runtime_base"))
    return labels


def definition_text(
    contents: Contents, labels: Mapping[str, str], env91: str, runscript: str, help: str = "", test: str = ""
) -> str:
    """The definition object: not an Apptainer recipe (no `apptainer build` made this image),
    a readable record of what went in, in the definition file's syntax."""
    plan, base, runtime = contents.plan, contents.build_base, contents.runtime_base

    def indent(text: str) -> str:
        return "".join(f"    {line}\n" for line in text.splitlines() if not line.startswith("#!"))

    lines = [
        f"# Assembled by dedal {__version__} (`dedal assemble`), not by `apptainer build`:",
        "# the base root filesystem, one squashfs layer per Spack package, spack reindex + view.",
        "Bootstrap: dedal",
        f"From: {plan.base_image}" + (f" ({base.id})" if base is not None else ""),
    ]
    if runtime is not None:
        lines[-1] = f"From: {runtime.name} ({runtime.id})"
        lines.append(
            f"# the layers were built on {plan.base_image} ({plan.base_id}); the image carries "
            f"{runtime.name}, its runtime twin"
        )
    lines += ["", "%labels"]
    lines += [f"    {k} {v}" for k, v in sorted(labels.items()) if k != "dedal.layers"]
    text = "\n".join(lines) + "\n\n%environment\n" + indent(env91) + "\n%runscript\n" + indent(runscript)
    if help:
        text += "\n%help\n" + indent(help)
    if test:
        text += "\n%test\n" + indent(test)
    return text


def inspect_metadata(
    contents: Contents,
    labels: Mapping[str, str],
    definition: str,
    runscript: str,
    env90: str,
    env91: str,
    help: str = "",
    test: str = "",
) -> Dict[str, Any]:
    """inspect-metadata.json as Apptainer writes it (data.attributes...), plus dedal's own
    section. Apptainer reads ``helpfile`` from here for ``run-help`` (``inspect --helpfile``)."""
    plan, runtime = contents.plan, contents.runtime_base
    attributes: Dict[str, Any] = {
        "labels": dict(labels),
        "deffile": definition,
        "runscript": runscript,
        "environment": {"/.singularity.d/env/90-environment.sh": env90, ENV_SCRIPT: env91},
    }
    if help:
        attributes["helpfile"] = help
    if test:
        attributes["test"] = test
    return {
        "data": {"attributes": attributes},
        "type": "container",
        "dedal": {
            "env": plan.env_name,
            "tag": plan.tag,
            "lock_sha256": plan.lock_sha256,
            "spack_commit": plan.spack_commit,
            "base": base_json(plan, contents.build_base),
            "roots": [plan.nodes[h].label for h in contents.roots],
            "only": list(contents.only_names),
            "keep_build_deps": contents.keep_build_deps,
            "versions": dict(contents.versions),
            "layers": [{**i.label(), "prefix": i.prefix, "files": i.files} for i in contents.infos],
            **({"runtime_base": base_json(plan, runtime)} if runtime is not None else {}),
        },
    }


def base_json(plan: Plan, base: Optional[BaseImage]) -> Dict[str, Any]:
    if base is None:
        return {"name": plan.base_image, "id": plan.base_id}
    return {
        "name": base.name,
        "id": base.id,
        "os": base.os_release.get("PRETTY_NAME", ""),
        "versions": dict(base.versions),
        "squashfs_bytes": base.squashfs_bytes,
    }
