"""`dedal build`: one squashfs layer per package, locally or on Slurm; resumable."""

from __future__ import annotations

import argparse

from dedal.commands._build import add_build_options, build_settings
from dedal.ui.console import human_seconds, out, print_json
from dedal.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "build",
        help="build the missing layers of an environment",
        description="Build every package of the environment that has no layer yet, each in its own "
        "stage under stage_dir, and pack it into the layer store. A rerun builds only "
        "what is missing.",
    )
    p.add_argument("target", metavar="PLAN_OR_ENV", help="env.yaml (or its directory), spack.lock or plan.json")
    add_build_options(p)
    p.add_argument("--layers", metavar="DIR", help="layer store (default: setting `layer_store`)")
    p.add_argument("--stage-dir", metavar="DIR", help="node-local build directory (default: /dev/shm)")
    p.add_argument(
        "--detach",
        action="store_true",
        default=None,
        help="Slurm: submit the jobs and exit; `dedal status` shows them, a later `dedal build` follows "
        "them (setting `slurm.detach`)",
    )
    p.add_argument(
        "--cache",
        metavar="oras://HOST/REPO",
        help="a remote layer cache: pull the layers it has before building, push the ones built "
        "(setting `layer_cache`)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dedal.model.target import resolve

    settings = build_settings(
        args, layer_store=args.layers, stage_dir=args.stage_dir, layer_cache=args.cache, **{"slurm.detach": args.detach}
    )
    if settings.get("slurm.detach") and settings.executor != "slurm":
        raise UserError("--detach (slurm.detach) needs the Slurm executor: local builds end with dedal")
    target = resolve(args.target, settings)
    from dedal.stages.building import check_build, run_build  # the stage's imports: after the input is checked
    from dedal.stages.workspace import prepare

    lock = target.read_lock()  # parsed once, and checked against the environment file
    plan = target.work_plan(lock)
    cache = check_build(plan, settings)  # bad input is refused before anything is written
    summary = run_build(
        prepare(target, lock, plan),
        settings,
        cache,
        executor=settings.executor,
        jobs=max(1, settings.jobs),
        keep_going=settings.keep_going,
        quiet=args.json,
    )
    if args.json:
        print_json(summary.to_json())
    else:
        out.print(
            f"{summary.env}: {len(summary.built)} built, {len(summary.reused)} reused, "
            f"{len(summary.failed)} failed, {len(summary.blocked)} not built, in {human_seconds(summary.seconds)}"
        )
        for label, error in summary.failed.items():
            out.print(f"  FAILED {label}: {error}")
        if summary.cache:
            c = summary.cache
            out.print(
                f"layer cache {c['ref']}: {len(c['pulled'])} pulled, {len(c['pushed'])} pushed"
                + (f", {len(c['problems'])} problem(s): {'; '.join(c['problems'])}" if c["problems"] else ""),
                markup=False,
            )
        if summary.detached:
            out.print(
                f"detached: {summary.jobs + summary.adopted} Slurm job(s) go on without dedal; `dedal status` "
                f"shows them, `dedal build` follows them and builds what they leave"
            )
    stop = summary.interruption()
    if stop is not None:
        raise stop
    return 0 if summary.ok else 1
