"""The build stage: from an environment (or lock, or plan) to one layer per package.

:func:`~dedal.stages.workspace.prepare` (the command's, once) writes the environment's
artifacts into its work directory (spack.yaml, spack.lock, plan.json): every job, local or
on Slurm, reads those and nothing else; :func:`run_build` takes that prepared plan. The
jobs run through an executor (``executors/``: local process pool or Slurm), each one
:func:`dedal.stages.building.node.run_job` on its node. With a remote layer cache
(:mod:`~dedal.stages.building.cache`) the layers it has are pulled first and the ones
built pushed after. The source mirror is needed only for what must be built: a build
whose every missing layer the cache has runs without one. Each attempt is recorded
(:mod:`dedal.model.attempts`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from dedal.errors import DedalError, Interrupted, UserError
from dedal.model.attempts import Attempts
from dedal.model.config import Settings
from dedal.model.layers import LayerStore
from dedal.model.plan import Plan
from dedal.stages.base import base_root
from dedal.stages.building.executors.common import BuildSummary
from dedal.stages.building.node import missing_mirror
from dedal.stages.workspace import Prepared
from dedal.ui.progress import BuildProgress

if TYPE_CHECKING:
    from dedal.stages.building.cache import LayerCache


def check_build(plan: Plan, settings: Settings) -> Optional[LayerCache]:
    """Every check of a build before anything is written (bad input writes nothing; the
    caller prepares the work directory after it): the layer cache's reference, a mirror
    or every missing layer in the store or the cache, a writable store. The layer cache."""
    # the layer cache and its registry client (requests, oras-py) here, not at import: every
    # `dedal node-build` of a build job and `dedal status` import this package
    from dedal.adapters.registry import registry_access
    from dedal.stages.building.cache import LayerCache

    store = LayerStore(Path(settings.layer_store))
    cache = (
        LayerCache(str(settings.get("layer_cache")), access=registry_access(settings))
        if settings.get("layer_cache")
        else None
    )  # a bad reference is refused here
    mirror = Path(settings.mirror)
    if not mirror.is_dir():
        _check_without_mirror(plan, store, cache, mirror)
    store.ensure_writable()
    return cache


def run_build(
    prepared: Prepared,
    settings: Settings,
    cache: Optional[LayerCache],
    *,
    executor: str,
    jobs: int,
    keep_going: bool,
    quiet: bool = False,
) -> BuildSummary:
    """Build the layers ``prepared`` lacks; ``cache``: what :func:`check_build` returned."""
    from dedal.stages.building.cache import CacheReport

    plan, plan_path = prepared.plan, prepared.path
    store = LayerStore(Path(settings.layer_store))
    mirror = Path(settings.mirror)
    store.reap_temporaries()  # of builds killed on this host (kill -9 during mksquashfs)
    attempts = Attempts(Path(plan.env_dir or plan_path.parent))
    attempt = attempts.start(executor)
    started = time.monotonic()
    try:
        base_root(plan.base_image, settings)  # build the base once here, not in every job
        with BuildProgress(len(plan.to_build), title=f"build {plan.env_name}", quiet=quiet) as progress:
            report = CacheReport()
            if cache is not None:
                cache.say = progress.note
                cache.pull(plan, plan.to_build, store, report)
            if not mirror.is_dir():  # a layer the cache had failed its checks: it must be built
                lacking = [plan.nodes[h].label for h in plan.to_build if not store.has(plan.nodes[h].key or "")]
                if lacking:
                    raise missing_mirror(
                        mirror,
                        lacking,
                        f" (the layer cache's copies were refused: {'; '.join(report.problems)})"
                        if report.problems
                        else "",
                    )
            if executor == "slurm":
                from dedal.stages.building.executors import slurm

                summary = slurm.build(plan, plan_path, settings, keep_going=keep_going, progress=progress)
            else:
                from dedal.stages.building.executors import local

                summary = local.build(plan, plan_path, settings, jobs=jobs, keep_going=keep_going, progress=progress)
            if cache is not None:
                built = {plan.nodes[h].label: h for h in plan.to_build}
                if settings.get("layer_cache_push"):
                    cache.push(plan, [built[label] for label in summary.built if label in built], store, report)
                summary.cache = dict(report.to_json(), ref=cache.ref)
    except UserError:
        attempts.discard(attempt)  # refused (bad input, configuration, another dedal's build): no attempt
        raise
    except BaseException as exc:
        interrupted = isinstance(exc, (KeyboardInterrupt, Interrupted))
        error = exc.one_line() if isinstance(exc, DedalError) else f"{type(exc).__name__}: {exc}"
        attempts.finish(
            attempt,
            "interrupted" if interrupted else "failed",
            seconds=time.monotonic() - started,
            error=error,
            jobs=_slurm_jobs(plan, executor),
        )
        raise
    status = (
        "interrupted" if summary.interrupted else "detached" if summary.detached else "ok" if summary.ok else "failed"
    )
    attempts.finish(
        attempt, status, seconds=summary.seconds, summary=summary.to_json(), jobs=_slurm_jobs(plan, executor)
    )
    return summary


def _check_without_mirror(plan: Plan, store: LayerStore, cache: Optional[LayerCache], mirror: Path) -> None:
    """Without a source mirror, a build can only take its layers from the store and the
    cache: refuse it (before the build writes a layer) when either lacks one it needs."""
    lacking = [h for h in plan.to_build if not store.has(plan.nodes[h].key or "")]
    why = ""
    if lacking and cache is not None:
        lacking, why = cache.lacking(plan, lacking)
        why = f" ({why})"
    if lacking:
        raise missing_mirror(mirror, [plan.nodes[h].label for h in lacking], why)


def _slurm_jobs(plan: Plan, executor: str) -> list:
    """The jobs the Slurm record holds at the end of an attempt (kept with the attempt: the
    next attempt replaces the record)."""
    if executor != "slurm" or not plan.env_dir:
        return []
    from dedal.stages.building.executors.slurm import read_record

    try:
        record = read_record(Path(plan.env_dir)) or {}
    except DedalError:
        return []
    return [j for j in record.get("jobs", []) if isinstance(j, dict)]
