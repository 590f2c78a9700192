#!/usr/bin/env python3
"""The real MPI stack (spack-envs/mpi-offline, or another environment with --env, e.g.
esd-cpu) through dedal, against one plain `spack install` of the same environment in one install tree, same machine, same
Spack, same base image (debian-trixie: gcc 14), same source mirror, one after the other.

dedal side: `dedal fetch` (concretize in the base image + fill the mirror from the
Debian archive), `dedal build` (one stage and one squashfs layer per package, local
executor, default parallelism), `dedal assemble` (SIF), then a smoke run of
`mpirun -np 2 dedal_latency` inside the image (timed apart, not part of the total).

plain side: a Spack environment with the same manifest and the same generated
configuration dedal gives Spack in each build job (install root /opt/esd/software, stage
and install tree in /dev/shm, the mirror dedal filled, `view: false`), concretized
afresh in the same base image (the lock must come out identical: same DAG hashes), then
`spack install` of the whole environment into one tree.

Counts: layers and files on the layer store against files in the flat install tree.

Needs root, a real Spack in DEDAL_SPACK_ROOT and the Debian archive reachable (fetch).
Writes results.json and results.md next to this script (or --out).

    sudo DEDAL_SPACK_ROOT=/path/to/spack .venv/bin/python benchmarks/mpi_offline/run.py
    sudo DEDAL_SPACK_ROOT=/path/to/spack .venv/bin/python benchmarks/mpi_offline/run.py \
        --env spack-envs/esd-cpu/env.yaml --out benchmarks/mpi_offline/esd-cpu
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
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from dedal.adapters import runtime as rt  # noqa: E402
from dedal.adapters.spack import user_cache  # noqa: E402
from dedal.stages.base import base_root  # noqa: E402
from dedal.model.config import load_settings  # noqa: E402
from dedal.model.envfile import load_env  # noqa: E402
from dedal.model.image import STD_PATH  # noqa: E402
from dedal.model.layers import LayerStore  # noqa: E402
from dedal.model.spack_env import read_spack_yaml, stage_manifest, write_env_dir  # noqa: E402
from tests.conftest import dedal_exe, is_real_spack  # noqa: E402

DEFAULT_ENV = ROOT / "spack-envs" / "mpi-offline" / "env.yaml"
INSTALL_ROOT = "/opt/esd/software"


def load() -> List[float]:
    return [round(x, 2) for x in os.getloadavg()]


def timed(label: str, cmd: List[str], env: Dict[str, str], log: Path) -> Dict[str, object]:
    print(f"== {label}: {' '.join(cmd)}", flush=True)
    before = load()
    t0 = time.monotonic()
    with open(log, "w") as fh:
        res = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=fh, text=True)
    wall = time.monotonic() - t0
    with open(log, "a") as fh:
        fh.write(res.stdout)
    if res.returncode != 0:
        raise SystemExit(f"{label} failed (exit {res.returncode}); log {log}")
    print(f"   {wall:.1f} s", flush=True)
    try:
        out = json.loads(res.stdout)
    except json.JSONDecodeError:
        out = {"stdout": res.stdout[-2000:]}
    return {"wall_s": round(wall, 1), "load_before": before, "load_after": load(), "output": out}


def tree_counts(path: Path) -> Dict[str, int]:
    files = links = dirs = size = 0
    for top, dnames, fnames in os.walk(path):
        dirs += len(dnames)
        for name in fnames:
            p = Path(top) / name
            if p.is_symlink():
                links += 1
            else:
                files += 1
                size += p.stat().st_size
        for name in dnames:
            if (Path(top) / name).is_symlink():
                links += 1
                dirs -= 1
    return {"files": files, "symlinks": links, "dirs": dirs, "entries": files + links + dirs, "bytes": size}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", help="work directory (default: a new one under /var/tmp, removed at the end)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--out", default=str(HERE))
    ap.add_argument("--env", default=str(DEFAULT_ENV), help="environment file (default: spack-envs/mpi-offline)")
    args = ap.parse_args()
    env_file = Path(args.env).resolve()
    env_name = load_env(env_file).name
    spack_root = Path(os.environ.get("DEDAL_SPACK_ROOT", ""))
    if not is_real_spack(spack_root):
        raise SystemExit("needs a real Spack checkout in DEDAL_SPACK_ROOT")
    if os.geteuid() != 0:
        raise SystemExit("needs root")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="dedal-bench-mpi-", dir="/var/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / "data"
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEDAL_")}
    env.update(DEDAL_DATA_DIR=str(data), DEDAL_SPACK_ROOT=str(spack_root))
    for key in ("DEDAL_CACHE_DIR", "DEDAL_BASE_CACHE", "DEDAL_DEBIAN_MIRROR"):
        if key in os.environ:
            env[key] = os.environ[key]
    result: Dict[str, object] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "spack_root": str(spack_root),
        "env": str(env_file.relative_to(ROOT)),
        "description": load_env(env_file).description,
        "work": str(work),
    }

    # -- dedal --------------------------------------------------------------------------------
    exe = dedal_exe()
    dedal: Dict[str, object] = {}
    dedal["fetch"] = timed("dedal fetch", [exe, "fetch", str(env_file), "--json"], env, logs / "fetch.log")
    dedal["build"] = timed("dedal build", [exe, "build", str(env_file), "--json"], env, logs / "build.log")
    dedal["assemble"] = timed("dedal assemble", [exe, "assemble", str(env_file), "--json"], env, logs / "assemble.log")
    out = dedal["assemble"]["output"]  # type: ignore[index]
    sif = Path(out.get("image") or out.get("sif") or out.get("path"))  # type: ignore[union-attr]
    t0 = time.monotonic()
    smoke = subprocess.run(
        [exe, "exec", "--no-cwd", str(sif), "--", "mpirun", "-np", "2", "dedal_latency", "-m", "1024"],
        env=env,
        text=True,
        capture_output=True,
    )
    dedal["smoke"] = {
        "wall_s": round(time.monotonic() - t0, 1),
        "returncode": smoke.returncode,
        "output": smoke.stdout[-1500:] + smoke.stderr[-500:],
    }
    dedal["total_s"] = round(sum(dedal[s]["wall_s"] for s in ("fetch", "build", "assemble")), 1)  # type: ignore[index]
    dedal["sif_bytes"] = sif.stat().st_size
    result["dedal"] = dedal

    settings = load_settings(environ=env)
    store = LayerStore(Path(settings.layer_store))
    manifests = store.manifests()
    store_files = [p for p in Path(settings.layer_store).rglob("*") if p.is_file()]
    result["store"] = {
        "layers": len(manifests),
        "files_on_store": len(store_files),
        "bytes_on_store": sum(p.stat().st_size for p in store_files),
        "entries_in_layers": sum(m.files for m in manifests),
        "per_package": sorted(
            (
                {
                    "name": m.name,
                    "version": m.version,
                    "hash": m.hash[:7],
                    "namespace": m.namespace,
                    "entries": m.files,
                    "sqfs_bytes": m.size,
                    "build_s": m.build_seconds,
                    "pack_s": m.pack_seconds,
                }
                for m in manifests
            ),
            key=lambda r: r["name"],
        ),
    }

    # -- plain spack install, same manifest, config, base, mirror --------------------------------
    workdir = data / "work" / env_name
    mirror = Path(settings.mirror)
    plain_dir = Path(tempfile.mkdtemp(prefix="dedal-bench-plain-", dir=settings.stage_dir))
    tree = plain_dir / "tree"
    tree.mkdir()
    envdir = work / "plain-env"
    manifest = read_spack_yaml(workdir / "spack.yaml")
    write_env_dir(envdir, stage_manifest(manifest, install_root=INSTALL_ROOT, stage=plain_dir, mirror=mirror), None)
    root, base_env = base_root("debian-trixie", settings)
    cache = user_cache(settings, spack_root)
    binds = [
        rt.Bind(tree, INSTALL_ROOT),
        rt.Bind(plain_dir),
        rt.Bind(envdir),
        rt.Bind(spack_root, readonly=True),
        rt.Bind(mirror, readonly=True),
        rt.Bind(cache),
    ]
    # the environment's local repositories and included files (esd-cpu includes the base's externals)
    binds += [rt.Bind(r, readonly=True) for key in ("repos", "include") for r in manifest["spack"].get(key, [])]
    spack_env = dict(
        base_env,
        SPACK_DISABLE_LOCAL_CONFIG="1",
        SPACK_USER_CACHE_PATH=str(cache),
        SPACK_ROOT=str(spack_root),
        PATH=STD_PATH,
    )
    spack = [str(spack_root / "bin" / "spack"), "-e", str(envdir)]
    plain: Dict[str, object] = {}
    try:
        for label, cmd in (
            ("concretize", [*spack, "concretize", "-f"]),
            ("install", [*spack, "install", "--fail-fast"]),
        ):
            print(f"== plain spack {label}", flush=True)
            before = load()
            t0 = time.monotonic()
            rt.run_in(
                root,
                cmd,
                binds=binds,
                env=spack_env,
                log=logs / f"plain-{label}.log",
                what=f"spack {label}",
                runtime=settings.runtime,
            )
            plain[label] = {"wall_s": round(time.monotonic() - t0, 1), "load_before": before, "load_after": load()}
            print(f"   {plain[label]['wall_s']} s", flush=True)
        plain["total_s"] = round(plain["concretize"]["wall_s"] + plain["install"]["wall_s"], 1)  # type: ignore[index]
        dedal_lock = json.loads((workdir / "spack.lock").read_text())
        plain_lock = json.loads((envdir / "spack.lock").read_text())
        plain["same_dag_as_dedal"] = set(dedal_lock["concrete_specs"]) == set(plain_lock["concrete_specs"])
        counts = tree_counts(tree)
        prefixes = sorted(p for p in tree.iterdir() if p.is_dir() and not p.name.startswith("."))
        per_pkg = {}
        for p in prefixes:
            times = p / ".spack" / "install_times.json"
            per_pkg[p.name] = json.loads(times.read_text())["total"] if times.is_file() else None
        plain["tree"] = dict(counts, prefixes=len(prefixes))
        plain["per_package_install_s"] = per_pkg
    finally:
        shutil.rmtree(plain_dir, ignore_errors=True)
    result["plain"] = plain
    result["ratios"] = {
        "build_vs_install": round(dedal["build"]["wall_s"] / plain["install"]["wall_s"], 3),  # type: ignore[index]
        "dedal_total_vs_plain_total": round(dedal["total_s"] / plain["total_s"], 3),  # type: ignore[operator]
        "store_files_vs_tree_files": round(result["store"]["files_on_store"] / counts["files"], 5),  # type: ignore[index]
        "layer_entries_vs_tree_entries": round(result["store"]["entries_in_layers"] / counts["entries"], 4),  # type: ignore[index]
    }
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (outdir / "results.md").write_text(report(result))
    print(report(result))
    if not args.keep and not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def report(r: dict) -> str:
    d, p, s, q = r["dedal"], r["plain"], r["store"], r["ratios"]
    by_name = {row["name"]: row for row in s["per_package"]}
    plain_pkg = {name.rsplit("-", 2)[0]: secs for name, secs in p["per_package_install_s"].items()}
    lines = [
        "# The real MPI stack: dedal vs one plain `spack install`",
        "",
        f"Measured {r['date']} on `{r['host']}` ({r['cpus']} cores), Spack {r['spack_root']}, environment "
        f"`{r['env']}` ({r.get('description', '')}; sources: Debian's pool through recipes/debsrc), base image "
        "debian-trixie (gcc 14), one after the other in one run of `benchmarks/mpi_offline/run.py`.",
        "",
        "## Wall time",
        "",
        "| step | dedal (s) | plain spack (s) | ratio |",
        "|---|---|---|---|",
        f"| concretize + sources | {d['fetch']['wall_s']} (`dedal fetch`: concretize in the base, mirror from Debian) "
        f"| {p['concretize']['wall_s']} (`spack concretize -f`, mirror already filled) | "
        f"{d['fetch']['wall_s'] / p['concretize']['wall_s']:.2f} |",
        f"| build | {d['build']['wall_s']} (`dedal build`: {s['layers']} stages + layers) | {p['install']['wall_s']} "
        f"(`spack install`, one tree) | **{q['build_vs_install']:.2f}** |",
        f"| assemble | {d['assemble']['wall_s']} (`dedal assemble`: SIF of {d['sif_bytes'] / 2**20:.0f} MiB) | – | |",
        f"| **total** | **{d['total_s']}** | **{p['total_s']}** | **{q['dedal_total_vs_plain_total']:.2f}** |",
        "",
        f"Same DAG on both sides (identical DAG hashes): **{p['same_dag_as_dedal']}**. "
        f"`mpirun -np 2 dedal_latency` inside the SIF: exit {d['smoke']['returncode']} ({d['smoke']['wall_s']} s)"
        + (
            " (the image's `mpirun` is Spack's stub of `openmpi schedulers=slurm ~legacylaunchers`, which says "
            "to use srun: such an image is run by `srun --mpi=pmix`, as `dedal verify` does on the test cluster)."
            if "legacylaunchers" in d["smoke"]["output"]
            else "."
        ),
        f"Load average (1/5/15 min) before the dedal build {d['build']['load_before']}, before the plain install "
        f"{p['install']['load_before']}: the machine is shared, so the ratio carries that noise.",
        "",
        "## Per package (Spack's own install_times.json total vs the dedal job's `spack install`)",
        "",
        "| package | namespace | dedal: spack install in the job (s) | dedal: pack (s) | plain: Spack's total (s) | "
        "entries in layer | layer (KiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in sorted(by_name):
        row = by_name[name]
        plain_s = plain_pkg.get(name)
        lines.append(
            f"| {name}@{row['version']} | {row['namespace']} | {row['build_s']:.1f} | {row['pack_s']:.2f} | "
            f"{'' if plain_s is None else f'{plain_s:.1f}'} | {row['entries']} | {row['sqfs_bytes'] // 1024} |"
        )
    t = p["tree"]
    lines += [
        "",
        "## Layers and files",
        "",
        "| | dedal layer store | flat install tree (plain) |",
        "|---|---|---|",
        f"| units | {s['layers']} layers (one per package) | {t['prefixes']} prefixes in one tree |",
        f"| files on disk | {s['files_on_store']} (`<key>.sqfs` + `<key>.json` per layer) | {t['files']} regular files "
        f"+ {t['symlinks']} symlinks in {t['dirs']} directories |",
        f"| entries (files, links, dirs) | {s['entries_in_layers']} inside the layers | {t['entries']} |",
        f"| bytes | {s['bytes_on_store'] / 2**20:.1f} MiB (zstd squashfs) | {t['bytes'] / 2**20:.1f} MiB |",
        "",
        "The flat tree's top level also holds Spack's `bin/` (sbang) beside the package prefixes; the files on "
        "the store include one lock file per layer key (`.locks/`, empty).",
        "",
        f"Files on the store / files in the tree: {q['store_files_vs_tree_files']}; entries inside the layers / entries "
        f"of the tree: {q['layer_entries_vs_tree_entries']} (the tree also holds Spack's database `.spack-db`).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
