#!/usr/bin/env python3
"""Build-stage overhead, measured side by side in one run.

1. Per-job overhead of dedal's node build (materialize the dependency layers + spack
   reindex + pack the new prefix) against the package's own build time (Spack's
   install_times.json total), for every package of the tiny environment, each built as
   its own job as on separate nodes.
2. Layer packing: one mksquashfs per package (what the layer store holds) against a
   single mksquashfs of the same install tree, same compressor and threads: time ratio
   and size ratio.

Uses the Spack at DEDAL_SPACK_ROOT when it is a real Spack (and says so), else the
test stand-in. Writes results.json and results.md next to this script.

    sudo .venv/bin/python benchmarks/build_overhead/run.py [--lock tiny-dedal]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from dedal.adapters import squashfs  # noqa: E402
from dedal.model.layers import LayerStore  # noqa: E402
from tests.conftest import SPACK_DATA, is_real_spack  # noqa: E402
from tests.standin import install_standin, standin_env  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lock", default="tiny-dedal", help="recorded lock under ../shared/data/spack")
    ap.add_argument("--out", default=str(HERE))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dedal-bench-build-"))
    spack_env = os.environ.get("DEDAL_SPACK_ROOT", "")
    real = bool(spack_env) and is_real_spack(Path(spack_env))
    spack_root = Path(spack_env) if real else install_standin(work / "spack")
    env_dir = work / "env"
    env_dir.mkdir()
    spec = (
        {"specs": ["dedal-app"]}
        if args.lock == "tiny-dedal"
        else {"specs": [r["spec"] for r in json.loads((SPACK_DATA / f"{args.lock}.spack.lock").read_text())["roots"]]}
    )
    manifest = {
        "spack": dict(spec, concretizer={"unify": True}),
        "dedal": {"name": "bench", "base_image": "host", "install_root": "/opt/esd/software"},
    }
    mirror = work / "mirror"
    if real and args.lock == "tiny-dedal":
        import hashlib

        manifest["spack"]["repos"] = [str(SPACK_DATA / "tiny-repo" / "repo")]
        for tarball in sorted((SPACK_DATA / "tiny-repo" / "src").glob("*.tar.gz")):
            digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
            dest = mirror / "_source-cache" / "archive" / digest[:2] / f"{digest}.tar.gz"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tarball, dest)
    (env_dir / "env.yaml").write_text(yaml.safe_dump(manifest))
    shutil.copyfile(SPACK_DATA / f"{args.lock}.spack.lock", env_dir / "spack.lock")
    if not real:
        filler = work / "fill"
        filler.mkdir()
        (filler / "spack.yaml").write_text(yaml.safe_dump(manifest))
        shutil.copyfile(env_dir / "spack.lock", filler / "spack.lock")
        subprocess.run(
            [str(spack_root / "bin" / "spack"), "-e", str(filler), "mirror", "create", "-d", str(mirror), "--all"],
            check=True,
            capture_output=True,
            env=standin_env(cache=work / "c"),
        )
    env = dict(
        os.environ,
        DEDAL_DATA_DIR=str(work / "data"),
        DEDAL_MIRROR=str(mirror),
        DEDAL_SPACK_ROOT=str(spack_root),
        DEDAL_STAGE_DIR=str(work / "stage"),
    )
    (work / "stage").mkdir()
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "dedal", "build", str(env_dir / "env.yaml"), "-j", "1", "--json"],
        env=env,
        text=True,
        capture_output=True,
    )
    wall = time.monotonic() - t0
    if res.returncode != 0:
        print(res.stdout, res.stderr, file=sys.stderr)
        return 1
    jobs_dir = work / "data" / "work" / "bench" / "jobs"
    store = LayerStore(work / "data" / "layers")
    rows = []
    for result_file in sorted(jobs_dir.glob("*.json")):
        job = json.loads(result_file.read_text())
        pkg = job["packages"][0]
        man = store.manifest(pkg["key"])
        tree = work / "x" / pkg["name"]
        squashfs.extract(store.sqfs(man.key), tree)
        times = json.loads((tree / man.prefix / ".spack" / "install_times.json").read_text())
        overhead = job["materialize_s"] + job["reindex_s"] + job["pack_s"]
        rows.append(
            {
                "package": pkg["name"],
                "bare_build_s": round(times["total"], 3),
                "spack_install_s": round(pkg["seconds"] - job["pack_s"], 3),
                "materialize_s": round(job["materialize_s"], 3),
                "reindex_s": round(job["reindex_s"], 3),
                "pack_s": round(job["pack_s"], 3),
                "overhead_s": round(overhead, 3),
                "job_s": round(job["seconds"], 3),
            }
        )
    # packing: per-package layers vs one mksquashfs of the whole tree
    tree = work / "tree"
    for man in store.manifests():
        squashfs.extract(store.sqfs(man.key), tree)
    per_pkg_s, per_pkg_bytes = 0.0, 0
    for man in store.manifests():
        out = work / "repack" / f"{man.key}.sqfs"
        out.parent.mkdir(exist_ok=True)
        t = time.monotonic()
        squashfs.pack([tree / man.prefix], out, keep_as_directory=True)
        per_pkg_s += time.monotonic() - t
        per_pkg_bytes += out.stat().st_size
    t = time.monotonic()
    squashfs.pack([tree], work / "one.sqfs")
    one_s = time.monotonic() - t
    one_bytes = (work / "one.sqfs").stat().st_size
    tree_bytes = sum(p.stat().st_size for p in tree.rglob("*") if p.is_file() and not p.is_symlink())
    result = {
        "spack": "real Spack " + str(spack_root) if real else "dedal test stand-in (no real Spack here)",
        "lock": args.lock,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "build_wall_s": round(wall, 2),
        "jobs": rows,
        "totals": {
            k: round(sum(r[k] for r in rows), 3)
            for k in ("bare_build_s", "spack_install_s", "materialize_s", "reindex_s", "pack_s", "overhead_s", "job_s")
        },
        "packing": {
            "layers": len(store.manifests()),
            "tree_mib": round(tree_bytes / 2**20, 2),
            "per_package_s": round(per_pkg_s, 3),
            "single_s": round(one_s, 3),
            "time_ratio": round(per_pkg_s / one_s, 2) if one_s else None,
            "per_package_bytes": per_pkg_bytes,
            "single_bytes": one_bytes,
            "size_ratio": round(per_pkg_bytes / one_bytes, 3),
            "throughput_mib_s": round(tree_bytes / 2**20 / per_pkg_s, 1) if per_pkg_s else None,
        },
    }
    out = Path(args.out)
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    t = result["totals"]
    lines = [
        f"# Build-stage overhead ({result['spack']}, lock {args.lock}, {result['cpus']} cores)",
        "",
        "Each package built as its own job, as on separate nodes (`-j 1`, base `host`).",
        "",
        "| package | bare build (s) | spack install (s) | materialize (s) | reindex (s) | pack (s) | overhead (s) | overhead / bare |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = r["overhead_s"] / r["bare_build_s"] if r["bare_build_s"] else float("inf")
        lines.append(
            f"| {r['package']} | {r['bare_build_s']} | {r['spack_install_s']} | {r['materialize_s']} | "
            f"{r['reindex_s']} | {r['pack_s']} | {r['overhead_s']} | {ratio:.1f} |"
        )
    lines += [
        f"| **total** | {t['bare_build_s']} | {t['spack_install_s']} | {t['materialize_s']} | {t['reindex_s']} | "
        f"{t['pack_s']} | {t['overhead_s']} | {t['overhead_s'] / t['bare_build_s']:.1f} |",
        "",
        "`bare build` is Spack's own install_times.json total (the package's phases); `spack install` is the "
        "whole `spack install --only package` command (Spack start-up included); overhead is what dedal adds.",
        "",
        "## Packing",
        "",
        "| layers | tree (MiB) | per-package mksquashfs (s) | one mksquashfs (s) | time ratio | "
        "size ratio | throughput (MiB/s) |",
        "|---|---|---|---|---|---|---|",
        f"| {result['packing']['layers']} | {result['packing']['tree_mib']} | {result['packing']['per_package_s']} | "
        f"{result['packing']['single_s']} | {result['packing']['time_ratio']} | {result['packing']['size_ratio']} | "
        f"{result['packing']['throughput_mib_s']} |",
        "",
    ]
    (out / "results.md").write_text("\n".join(lines))
    print("\n".join(lines))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
