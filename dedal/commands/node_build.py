"""`dedal node-build`: the procedure one build job runs on its node (used by the
executors: the local one starts it as a process, a Slurm job script runs it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dedal.model.config import from_args
from dedal.ui.console import print_json
from dedal.errors import DedalError, UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("node-build", help="build one job's packages on this node (run by the executors)")
    p.add_argument("plan", metavar="PLAN", help="plan.json written by `dedal build`/`dedal fetch`")
    p.add_argument("--hashes", required=True, help="comma-separated DAG hashes of the job, any order")
    p.add_argument("--job", default="", help="job name for logs")
    p.add_argument("--result", metavar="FILE", help="write the job result as JSON to FILE")
    p.add_argument("--log-dir", metavar="DIR", help="per-package logs (default: <env dir>/logs)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # the stage's imports: only when it runs, not for --help
    from dedal.adapters.spack import locate, user_cache
    from dedal.model.layers import LayerStore
    from dedal.model.plan import Plan
    from dedal.stages.base import base_root
    from dedal.stages.building.node import JobResult, run_job

    settings = from_args(args)
    plan = Plan.read(Path(args.plan))
    hashes = [h for h in args.hashes.split(",") if h]
    if not hashes:
        raise UserError("--hashes: no package given")
    result_path = Path(args.result) if args.result else None
    spack_root = locate(settings)
    root, root_env = base_root(plan.base_image, settings)
    try:
        result = run_job(
            plan,
            [plan.nodes[h].hash if h in plan.nodes else h for h in hashes],
            store=LayerStore(Path(settings.layer_store)),
            spack_root=spack_root,
            mirror=Path(settings.mirror),
            stage_dir=Path(settings.stage_dir),
            log_dir=Path(args.log_dir or Path(plan.env_dir) / "logs"),
            base_root=root,
            base_env=root_env,
            runtime=settings.runtime,
            build_jobs=settings.build_jobs,
            spack_cache=user_cache(settings, spack_root),
            job_id=args.job,
        )
    except Exception as exc:  # the executor reads the reason from the result file
        if result_path:
            reason = exc.one_line() if isinstance(exc, DedalError) else f"{type(exc).__name__}: {exc}"
            JobResult(job=args.job, host="", status="failed", error=reason).write(result_path)
        raise
    if result_path:
        result.write(result_path)
    else:
        print_json(result.to_json())
    return 0 if result.status == "ok" else 1
