"""The build stage: from an environment (or lock, or plan) to one layer per package.

:func:`~dedal.stages.workspace.prepare` writes the environment's artifacts into its work
directory (spack.yaml, spack.lock, plan.json): every job, local or on Slurm, reads those
and nothing else. The jobs run through an executor (``executors/``: local process pool
or Slurm), each one :func:`dedal.stages.build.node.run_job` on its node.
"""
from __future__ import annotations

from pathlib import Path

from dedal.errors import UserError
from dedal.model.layers import LayerStore
from dedal.stages.base import base_root
from dedal.stages.build.executors.common import BuildSummary
from dedal.stages.workspace import Target, prepare
from dedal.ui.progress import BuildProgress



def run_build(target: Target, *, executor: str, jobs: int, keep_going: bool, quiet: bool = False) -> BuildSummary:
    settings = target.settings
    # every check on the input before the first write (bad input writes nothing)
    if not Path(settings.mirror).is_dir():
        raise UserError(f"source mirror {settings.mirror} does not exist; run `dedal fetch` first or set `mirror`")
    target.lock()
    LayerStore(Path(settings.layer_store)).ensure_writable()
    plan, plan_path = prepare(target)
    base_root(plan.base_image, settings)  # build the base once here, not in every job
    with BuildProgress(len(plan.to_build), title=f"build {plan.env_name}", quiet=quiet) as progress:
        if executor == "slurm":
            from dedal.stages.build.executors import slurm
            return slurm.build(plan, plan_path, settings, keep_going=keep_going, progress=progress)
        from dedal.stages.build.executors import local
        return local.build(plan, plan_path, settings, jobs=jobs, keep_going=keep_going, progress=progress)
