"""Run with `spack -e ENV python list_sources.py OUT.json`: every source the concrete
environment needs (archives, git sources, URL patches, resources) with the paths Spack
looks for in a source mirror. dedal's fetch stage compares them with the mirror to say
exactly what is missing. Output format: a list of
{name, version, hash, has_code, sources: [...], patches: [...], resources: [...]}, each
entry {fetcher, url, digest, commit, mirror_paths: [storage path, cosmetic path]}.
"""

import json
import sys

import spack.environment as ev
import spack.patch


def describe(stage):
    fetcher = stage.fetcher
    return {
        "fetcher": type(fetcher).__name__,
        "url": getattr(fetcher, "url", None),
        "digest": getattr(fetcher, "digest", None),
        "commit": getattr(fetcher, "commit", None),
        "mirror_paths": list(stage.mirror_paths) if stage.mirror_paths else [],
    }


def main(out_path):
    env = ev.active_environment()
    if env is None:
        sys.exit("list_sources.py must run inside an environment (spack -e ENV python ...)")
    result = []
    seen = set()
    for spec in env.all_specs():
        if spec.external or spec.dag_hash() in seen:
            continue
        seen.add(spec.dag_hash())
        pkg = spec.package
        entry = {
            "name": spec.name,
            "version": str(spec.version),
            "hash": spec.dag_hash(),
            "has_code": bool(pkg.has_code),
            "sources": [],
            "patches": [],
            "resources": [],
        }
        for patch in spec.patches:
            if isinstance(patch, spack.patch.UrlPatch):
                entry["patches"].append(describe(patch.stage))
        if pkg.has_code:
            stages = list(pkg.stage)
            entry["sources"].append(describe(stages[0]))
            # this Spack's composite stage holds the URL patches' stages too: listed once, as patches
            patch_paths = [p["mirror_paths"] for p in entry["patches"]]
            entry["resources"].extend(d for d in map(describe, stages[1:]) if d["mirror_paths"] not in patch_paths)
        result.append(entry)
    with open(out_path, "w") as fh:
        json.dump(result, fh, indent=1)


main(sys.argv[1])
