"""The node build: what runs on one (compute) node for one build job.

1. a stage directory under ``stage_dir`` (/dev/shm), removed on success, failure,
   SIGTERM and SIGINT; one left by a process killed outright is removed by the next
   stage made on that host;
2. the job's build requirements materialized from their layers into ``<stage>/root``,
   which the sandbox shows at the fixed install root (Spack does not relocate layers,
   so the build-time path is the image path);
3. ``spack reindex``, then ``spack install --only package`` per package, offline, from
   the mirror, with a generated configuration;
4. each new prefix packed with mksquashfs into the layer store (temp name + rename),
   audited as every layer is before it is stored (:func:`~dedal.stages.layer_audit.check_packed`:
   a package that installs a setuid file or a symlink out of the install root fails
   here, not at the assembly), then its manifest written. Spack's build records (log, build environment, times,
   host) go beside the layer (:mod:`.records`), not into it: a layer is the same bytes
   whoever builds it, wherever and whenever.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import socket
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from dedal import __version__
from dedal.adapters import runtime as rt
from dedal.adapters import squashfs
from dedal.adapters.spack import Spack
from dedal.errors import BuildError, DedalError, Signals, ToolError, UserError
from dedal.model.artifacts import write_atomic
from dedal.model.layers import LayerManifest, LayerStore
from dedal.model.plan import Plan
from dedal.model.spack_env import local_inputs, read_spack_yaml, stage_manifest, write_env_dir
from dedal.stages.layer_audit import audit_layer, check_packed, parallel, unpack_layer
from dedal.stages.base import sandbox_runner
from dedal.stages.building.records import split_records
from dedal.stages.stage_dir import Stage


class LayerRefused(DedalError):
    """The layer of a package just built fails the entry audit: the package failed."""


@dataclass
class PackageResult:
    hash: str
    name: str
    key: str
    status: str  # built | present | failed | skipped
    seconds: float = 0.0
    log: str = ""
    error: str = ""


@dataclass
class JobResult:
    job: str
    host: str
    status: str  # ok | failed | interrupted
    packages: List[PackageResult] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0
    materialize_s: float = 0.0
    reindex_s: float = 0.0
    pack_s: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)

    def write(self, path: Path) -> None:
        write_atomic(path, json.dumps(self.to_json(), indent=1) + "\n")


SPACK_DEFAULT_JOBS = 16  # Spack's config:build_jobs when not set (etc/spack/defaults/config.yaml)


def make_jobs(build_jobs: int) -> int:
    """The ``make -j`` of a package build: ``build_jobs``, else what Spack picks: its
    default of 16, at most the CPUs this process may run on (Slurm's --cpus-per-task)."""
    if build_jobs > 0:
        return int(build_jobs)
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(SPACK_DEFAULT_JOBS, cpus))


def count_entries(path: Path) -> int:
    total = 1
    for _root, dirs, files in os.walk(path):
        total += len(dirs) + len(files)
    return total


def package_log(log_dir: Path, name: str, h: str) -> Path:
    """The build log of package ``h`` (named ``name``): the node build writes it, the executors point at it."""
    return log_dir / f"{name}-{h[:7]}.log"


def _full_hint(stage: Path) -> str:
    try:
        usage = shutil.disk_usage(stage)
    except OSError:
        return ""
    if usage.free < 64 * 1024 * 1024:
        return f"; the stage filesystem of {stage} is full ({usage.free // (1024 * 1024)} MiB free)"
    return ""


def missing_mirror(mirror: Path, labels: Sequence[str], why: str = "") -> UserError:
    """The refusal of a build that must build ``labels`` from sources without the source
    mirror (``why``: where else the layers were looked for)."""
    shown = ", ".join(labels[:5]) + (f" and {len(labels) - 5} more" if len(labels) > 5 else "")
    return UserError(
        f"source mirror {mirror} does not exist and {len(labels)} package(s) must be built from "
        f"source: {shown}{why}; run `dedal fetch` first or set `mirror`"
    )


def run_job(
    plan: Plan,
    hashes: Sequence[str],
    *,
    store: LayerStore,
    spack_root: Path,
    mirror: Path,
    stage_dir: Path,
    log_dir: Path,
    base_root: Optional[Path],
    base_env: Optional[Dict[str, str]] = None,
    runtime: str = "auto",
    build_jobs: int = 0,
    spack_cache: Optional[Path] = None,
    job_id: str = "",
    on_package: Optional[Callable[[PackageResult], None]] = None,
) -> JobResult:
    """Build ``hashes`` (one job) and store their layers; never raises for a build
    failure (the result says what failed, with the log), only for bad input."""
    started = time.monotonic()
    job_id = job_id or "+".join(plan.nodes[h].name for h in hashes)
    result = JobResult(job=job_id, host=socket.gethostname(), status="ok")
    unknown = [h for h in hashes if h not in plan.nodes]
    if unknown:
        raise UserError(f"{unknown[0]}: not a package of plan {plan.env_name}")
    order = [h for h in plan.to_build + [x for x in plan.nodes if x not in plan.to_build] if h in set(hashes)]
    todo = [h for h in order if not store.has(plan.nodes[h].key or "")]
    if todo and not Path(mirror).is_dir():  # the mirror is read only for what is built
        raise missing_mirror(Path(mirror), [plan.nodes[h].label for h in todo])
    store.ensure_writable()
    store.reap_temporaries()  # a Slurm job reaps those of killed builds on its node
    log_dir.mkdir(parents=True, exist_ok=True)
    for h in order:
        if h not in todo:
            result.packages.append(PackageResult(h, plan.nodes[h].name, plan.nodes[h].key or "", "present"))
    if not todo:
        result.seconds = time.monotonic() - started
        return result
    needed = sorted({r for h in todo for r in plan.build_requirements.get(h, [])} - set(todo))
    missing = [r for r in needed if not store.has(plan.nodes[r].key or "")]
    if missing:
        names = ", ".join(plan.nodes[r].label for r in missing)
        raise UserError(f"job {job_id}: dependency layers missing from {store.root}: {names} (build them first)")
    manifest = read_spack_yaml(Path(plan.env_dir) / "spack.yaml")
    lock = Path(plan.env_dir) / "spack.lock"
    if not lock.is_file():
        raise UserError(f"{lock}: missing; the plan's environment directory is incomplete")
    job_log = log_dir / f"job-{re.sub(r'[^A-Za-z0-9._+-]+', '_', job_id)[:80]}.log"

    stage_of_job = Stage(stage_dir, "build")
    with Signals(), stage_of_job as stage:
        if stage_of_job.reaped:
            with open(job_log, "a", encoding="utf-8") as fh:
                for old in stage_of_job.reaped:
                    fh.write(f"dedal: removed {old}, the stage of a dedal process on this host that was killed\n")
        try:
            root = stage / "root"
            root.mkdir()
            t0 = time.monotonic()
            # each dependency layer checked as the assembly checks it (sha256 against its
            # manifest, every entry), then unpacked so that no earlier layer can redirect it
            infos = parallel(lambda r: audit_layer(plan.nodes[r], store, plan.install_root), needed)
            for info in infos:
                unpack_layer(
                    store.sqfs(info.key),
                    info.prefix,
                    root,
                    stage,
                    plan.install_root,
                    f"layer {info.key} ({info.name}@{info.version})",
                    log=job_log,
                )
            for h in todo:
                if os.path.lexists(root / plan.nodes[h].prefix_name):
                    raise UserError(f"job {job_id}: {plan.nodes[h].prefix_name} exists in the stage before its build")
            result.materialize_s = time.monotonic() - t0
            envdir = stage / "env"
            write_env_dir(
                envdir,
                stage_manifest(
                    manifest, install_root=plan.install_root, stage=stage, mirror=Path(mirror), build_jobs=build_jobs
                ),
                lock,
            )
            # Spack's user cache holds the package repository index: rebuilding it costs a
            # minute per job, so it persists across jobs (Spack locks it for concurrent use)
            cache = Path(spack_cache) if spack_cache else stage / "spack-cache"
            cache.mkdir(parents=True, exist_ok=True)
            binds = [
                rt.Bind(root, plan.install_root),
                rt.Bind(stage),
                rt.Bind(spack_root, readonly=True),
                rt.Bind(mirror, readonly=True),
                rt.Bind(cache),
            ]
            for extra in local_inputs(manifest):
                binds.append(rt.Bind(extra, readonly=True))
            spack = Spack(spack_root, cache, sandbox_runner(base_root, binds, runtime, base_env))
            t0 = time.monotonic()
            spack.reindex(envdir, job_log)
            result.reindex_s = time.monotonic() - t0
        except ToolError as exc:
            result.status = "failed"
            result.error = exc.one_line() + _full_hint(stage)
            for h in todo:
                result.packages.append(
                    PackageResult(
                        h,
                        plan.nodes[h].name,
                        plan.nodes[h].key or "",
                        "skipped",
                        log=str(job_log),
                        error="job set-up failed",
                    )
                )
            result.seconds = time.monotonic() - started
            return result
        failed = False
        for h in todo:
            node = plan.nodes[h]
            pkg_log = package_log(log_dir, node.name, h)
            if failed:
                pr = PackageResult(
                    h,
                    node.name,
                    node.key or "",
                    "skipped",
                    log=str(pkg_log),
                    error="an earlier package of this job failed",
                )
                result.packages.append(pr)
                continue
            pkg_log.unlink(missing_ok=True)
            t0 = time.monotonic()
            try:
                spack.install_package(envdir, h, pkg_log, jobs=build_jobs)
                build_s = time.monotonic() - t0
                prefix = root / node.prefix_name
                if not (prefix / ".spack" / "spec.json").is_file():
                    raise ToolError(
                        f"spack install /{h[:7]}",
                        ["spack", "install", f"/{h}"],
                        0,
                        pkg_log,
                        f"no prefix {node.prefix_name} with .spack/spec.json under the install root",
                    )
                t1 = time.monotonic()
                records = stage / "records" / h
                # the layer: the same bytes on every build
                split_records(prefix, records, posixpath.join(plan.install_root, node.prefix_name))
                tmp = store.temp_path(node.key)  # type: ignore[arg-type]
                try:
                    squashfs.pack([prefix], tmp, keep_as_directory=True, log=pkg_log, processors=build_jobs or None)
                    try:
                        check_packed(tmp, node.prefix_name, plan.install_root, f"layer {node.key} ({node.label})")
                    except UserError as exc:
                        raise LayerRefused(exc.one_line()) from None
                    man = LayerManifest(
                        key=node.key or "",
                        name=node.name,
                        version=node.version,
                        hash=h,
                        namespace=node.namespace,
                        prefix=node.prefix_name,
                        install_root=plan.install_root,
                        base_id=plan.base_id,
                        files=count_entries(prefix),
                        build_seconds=round(build_s, 3),
                        build_cores=make_jobs(build_jobs),
                        pack_seconds=round(time.monotonic() - t1, 3),
                        built_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                        host=socket.gethostname(),
                        log=str(pkg_log),
                        dedal_version=__version__,
                        spack_version=plan.spack_version,
                        runtime_deps=sorted(c for c, t in node.deps.items() if {"link", "run"} & set(t)),
                    )
                    store.add(man, tmp, records)
                finally:
                    tmp.unlink(missing_ok=True)
                result.pack_s += time.monotonic() - t1
                pr = PackageResult(h, node.name, node.key or "", "built", round(time.monotonic() - t0, 3), str(pkg_log))
            except (ToolError, LayerRefused) as exc:
                failed = True
                result.status = "failed"
                err = BuildError(node.label, exc)
                result.error = err.one_line() + _full_hint(stage)
                pr = PackageResult(
                    h, node.name, node.key or "", "failed", round(time.monotonic() - t0, 3), str(pkg_log), result.error
                )
            result.packages.append(pr)
            if on_package:
                on_package(pr)
    result.seconds = time.monotonic() - started
    return result
