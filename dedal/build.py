"""The build stage: from an environment (or lock, or plan) to one layer per package.

``prepare`` writes the environment's artifacts into its work directory (spack.yaml,
spack.lock, plan.json): every job, local or on Slurm, reads those and nothing else.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Dict, Optional, Tuple

from dedal.config import Settings
from dedal.errors import UserError
from dedal.executors.common import BuildSummary
from dedal.plan import Plan
from dedal.progress import BuildProgress
from dedal.spack_env import carry_includes, minimal_manifest, write_env_dir
from dedal.workspace import Target

HOST_BASE = "host"  # build on the host itself (private mount namespace), no base image


def host_identity() -> str:
    """Identity of the host as a base: its OS release and architecture."""
    info = {}
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                info[k] = v.strip('"')
    except OSError:
        pass
    return f"host:{info.get('ID', 'linux')}-{info.get('VERSION_ID', '')}-{platform.machine()}"


def base_identity(name: str) -> str:
    if name == HOST_BASE:
        return host_identity()
    from dedal.base import definition_id, load_definition
    return definition_id(load_definition(name))


def base_root(name: str, settings: Settings) -> Tuple[Optional[Path], Dict[str, str]]:
    """The root filesystem builds run in (None: the host), built on first use, and the
    environment it defines (e.g. SPACK_PYTHON)."""
    if name == HOST_BASE:
        return None, {}
    from dedal.base import ensure_base
    base = ensure_base(name, settings)
    return Path(base.rootfs_dir), dict(base.env)


def prepare(target: Target) -> Tuple[Plan, Path]:
    """Write spack.yaml, spack.lock and plan.json into the work directory."""
    if target.given_plan is not None and target.plan_path is not None:
        plan = target.given_plan
        if not plan.env_dir or not (Path(plan.env_dir) / "spack.yaml").is_file():
            raise UserError(f"{target.plan_path}: its environment directory {plan.env_dir!r} has no spack.yaml")
        fresh = target.make_plan()  # cached/to-build against today's store, same env dir
        fresh.env_dir = plan.env_dir
        fresh.write(target.plan_path)
        return fresh, target.plan_path
    work = target.workdir
    work.mkdir(parents=True, exist_ok=True)
    lock_src = target.find_lock()
    lock = target.lock()
    manifest = carry_includes(target.env.spack_yaml() if target.env else minimal_manifest(lock.root_specs), work)
    dest_lock = work / "spack.lock"
    same = dest_lock.exists() and os.path.samefile(lock_src, dest_lock)
    write_env_dir(work, manifest, None if same else lock_src)
    target_lock = Target(target.settings, target.name, env=target.env, lock_path=dest_lock)
    plan = target_lock.make_plan()
    plan.env_dir = str(work)
    plan.lock_path = str(dest_lock)
    return plan, plan.write(work / "plan.json")


def run_build(target: Target, *, executor: str, jobs: int, keep_going: bool, quiet: bool = False) -> BuildSummary:
    settings = target.settings
    plan, plan_path = prepare(target)
    if not Path(settings.mirror).is_dir():
        raise UserError(f"source mirror {settings.mirror} does not exist; run `dedal fetch` first or set `mirror`")
    from dedal.layers import LayerStore
    LayerStore(Path(settings.layer_store)).ensure_writable()
    base_root(plan.base_image, settings)  # build the base once here, not in every job
    with BuildProgress(len(plan.to_build), title=f"build {plan.env_name}", quiet=quiet) as progress:
        if executor == "slurm":
            from dedal.executors import slurm
            return slurm.build(plan, plan_path, settings, keep_going=keep_going, progress=progress)
        from dedal.executors import local
        return local.build(plan, plan_path, settings, jobs=jobs, keep_going=keep_going, progress=progress)
