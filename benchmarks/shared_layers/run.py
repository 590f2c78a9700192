#!/usr/bin/env python3
"""Layers two environments share: the specs (DAG hashes, hence layer keys) both
concrete environments build on the same base, built and stored once for both.

Each environment is concretized in its base image by `dedal fetch --lock-only` (nothing
is fetched or built; a lock already concretized from the same inputs is reused), then
the two plans are compared by layer key. Also lists the packages both have under
different hashes (what keeps them from sharing). Needs a real Spack (DEDAL_SPACK_ROOT)
and root (the base's root filesystem through bubblewrap). Writes results.json and
results.md next to this script.

    sudo DEDAL_SPACK_ROOT=~/.cache/dedal/spack .venv/bin/python benchmarks/shared_layers/run.py \\
        spack-envs/esd-cpu/env.yaml spack-envs/esd-neuro/env.yaml
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def dedal() -> str:
    cand = Path(sys.executable).parent / "dedal"
    return str(cand) if cand.exists() else "dedal"


def plan_of(env_file: str) -> dict:
    res = subprocess.run([dedal(), "fetch", env_file, "--lock-only", "--json"], text=True, capture_output=True)
    if res.returncode != 0:
        sys.exit(f"dedal fetch --lock-only {env_file} failed: {res.stderr.strip()}")
    return json.loads(Path(json.loads(res.stdout)["plan"]).read_text())


def layers(plan: dict) -> Dict[str, dict]:
    """Layer key -> node, for every node with a layer (externals have none)."""
    return {n["key"]: n for n in plan["nodes"].values() if n.get("key")}


def compare(a: dict, b: dict) -> dict:
    la, lb = layers(a), layers(b)
    shared = sorted(set(la) & set(lb), key=lambda k: la[k]["name"])
    names_a: Dict[str, List[str]] = {}
    for n in la.values():
        names_a.setdefault(n["name"], []).append(n["hash"])
    only = {
        a["env_name"]: sorted(f"{n['name']}@{n['version']}" for k, n in la.items() if k not in lb),
        b["env_name"]: sorted(f"{n['name']}@{n['version']}" for k, n in lb.items() if k not in la),
    }
    differing = sorted({n["name"] for k, n in lb.items() if k not in la and n["name"] in names_a})
    side = {}
    for plan, lay in ((a, la), (b, lb)):
        side[plan["env_name"]] = {
            "nodes": len(plan["nodes"]),
            "externals": sum(1 for n in plan["nodes"].values() if n["external"]),
            "layers": len(lay),
            "image_layers": sum(1 for n in lay.values() if n["runtime"]),
            "base_id": plan["base_id"],
        }
    return {
        "envs": side,
        "same_base": a["base_id"] == b["base_id"],
        "shared_layers": len(shared),
        "shared_image_layers": sum(1 for k in shared if la[k]["runtime"] and lb[k]["runtime"]),
        "shared": [f"{la[k]['name']}@{la[k]['version']}/{la[k]['hash'][:7]}" for k in shared],
        "same_package_other_hash": differing,
        "only_in": {name: names if len(names) <= 12 else len(names) for name, names in only.items()},
        "spack_commit": a.get("spack_commit", ""),
    }


def markdown(r: dict, command: str) -> str:
    (na, sa), (nb, sb) = r["envs"].items()
    lines = [
        f"# Layers shared by {na} and {nb}",
        "",
        f"Produced by `{command}` (concretized by the real Spack in the base image; "
        "layers are keyed by DAG hash and base).",
        "",
        "| environment | base | nodes | externals | layers (built by Spack) | of which in the image |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in r["envs"].items():
        lines.append(
            f"| {name} | {s['base_id']} | {s['nodes']} | {s['externals']} | {s['layers']} | {s['image_layers']} |"
        )
    lines += [
        "",
        f"**Shared layers: {r['shared_layers']}** ({r['shared_layers'] / sa['layers']:.0%} of {na}'s, "
        f"{r['shared_layers'] / sb['layers']:.0%} of {nb}'s); in both images: {r['shared_image_layers']}.",
        "",
        "Shared: " + ", ".join(r["shared"]) + ".",
        "",
        "Same package, other hash (not shared): " + (", ".join(r["same_package_other_hash"]) or "none") + ".",
    ]
    for name, only in r["only_in"].items():
        lines.append(
            f"Only in {name}: " + ((", ".join(only) or "none") if isinstance(only, list) else f"{only} layers") + "."
        )
    lines += [
        "",
        f"Spack {r['spack_commit'][:12]}; both concretized with `dedal fetch ENV --lock-only` "
        "(nothing fetched or built).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("env_a")
    ap.add_argument("env_b")
    args = ap.parse_args()
    result = compare(plan_of(args.env_a), plan_of(args.env_b))
    command = (
        f"DEDAL_SPACK_ROOT=~/.cache/dedal/spack .venv/bin/python benchmarks/shared_layers/run.py "
        f"{args.env_a} {args.env_b}"
    )
    result["command"] = command
    (HERE / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (HERE / "results.md").write_text(markdown(result, command))
    print(markdown(result, command))


if __name__ == "__main__":
    main()
