"""The build provenance of a published image as an in-toto Statement (v1) with an SLSA
Provenance (v1) predicate: what a site can check an image against, attached to it in the
registry as an OCI referrer (artifact type ``application/vnd.in-toto+json``), which ``dedal
inspect`` reads and ``oras discover`` lists.

It is made from the labels dedal's assembly wrote into the SIF (nothing of the
publishing machine): the environment and its tag, the ``spack.lock`` sha256, the Spack
commit, the base image (name, id, content sha256) and, where the image was assembled on
another base, that one's, ``SOURCE_DATE_EPOCH`` and the digest of the layers. The subject
is the SIF that is pushed (the signed copy, with ``publish --sign``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:dedal:build-type:fetch-build-assemble:v1"  # the steps docs/REPRODUCIBLE.md describes
MEDIA_TYPE = "application/vnd.in-toto+json"
FILE_NAME = "provenance.intoto.json"
SPACK_URI = "git+https://github.com/spack/spack"


def statement(
    labels: Mapping[str, Any], *, name: str, sha256: str, source: Optional[str] = None, revision: Optional[str] = None
) -> Dict[str, Any]:
    """The statement for the SIF ``name`` (its file name) with content ``sha256`` (hex)."""
    lab = {str(k): str(v) for k, v in labels.items()}
    external: Dict[str, Any] = {
        k: lab[f"dedal.{k}"] for k in ("env", "tag", "install_root", "view") if lab.get(f"dedal.{k}")
    }
    if source:
        external["source"] = {"uri": source, **({"revision": revision} if revision else {})}
    deps: List[Dict[str, Any]] = []
    if lab.get("dedal.spack.commit"):
        deps.append(
            {
                "uri": f"{SPACK_URI}@{lab['dedal.spack.commit']}",
                "name": "spack",
                "digest": {"gitCommit": lab["dedal.spack.commit"]},
            }
        )
    if lab.get("dedal.lock.sha256"):
        deps.append({"name": "spack.lock", "digest": {"sha256": lab["dedal.lock.sha256"].split(":")[-1]}})
    for base in ("base", "runtime_base"):
        if lab.get(f"dedal.{base}.image"):
            dep: Dict[str, Any] = {"name": f"{base.replace('_', '-')}:{lab[f'dedal.{base}.image']}"}
            if lab.get(f"dedal.{base}.sha256"):
                dep["digest"] = {"sha256": lab[f"dedal.{base}.sha256"].split(":")[-1]}
            if lab.get(f"dedal.{base}.id"):
                dep["annotations"] = {"id": lab[f"dedal.{base}.id"]}
            deps.append(dep)
    if lab.get("dedal.layers.digest"):
        deps.append(
            {
                "name": "layers",
                "digest": {"sha256": lab["dedal.layers.digest"]},
                "annotations": {"count": lab.get("dedal.layers.count", "")},
            }
        )
    internal = {k: lab[f"dedal.{k}"] for k in ("source_date_epoch",) if lab.get(f"dedal.{k}")}
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": sha256.split(":")[-1]}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": external,
                "internalParameters": internal,
                "resolvedDependencies": deps,
            },
            "runDetails": {
                "builder": {"id": "urn:dedal:builder", "version": {"dedal": lab.get("dedal.version", "")}},
                "metadata": {k: v for k, v in (("finishedOn", lab.get("org.opencontainers.image.created")),) if v},
            },
        },
    }


def summary(data: Any) -> Optional[Dict[str, Any]]:
    """The inputs a statement records, flat (for ``dedal inspect``); None for what is not one."""
    if not isinstance(data, dict) or data.get("_type") != STATEMENT_TYPE:
        return None
    pred = data.get("predicate") if isinstance(data.get("predicate"), dict) else {}
    build = pred.get("buildDefinition") if isinstance(pred.get("buildDefinition"), dict) else {}
    found: Dict[str, Any] = {
        "predicateType": data.get("predicateType"),
        "subject": [s for s in data.get("subject") or [] if isinstance(s, dict)],
    }
    found.update({k: v for k, v in (build.get("externalParameters") or {}).items() if isinstance(k, str)})
    found.update({k: v for k, v in (build.get("internalParameters") or {}).items() if isinstance(k, str)})
    for dep in build.get("resolvedDependencies") or []:
        if isinstance(dep, dict) and isinstance(dep.get("name"), str):
            digest = dep.get("digest") if isinstance(dep.get("digest"), dict) else {}
            found[dep["name"]] = next((f"{k}:{v}" for k, v in digest.items()), dep.get("uri", ""))
    return found
