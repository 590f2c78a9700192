"""`dedal fetch`: Spack, the concrete environment, every source in the mirror, the plan."""

from __future__ import annotations

import argparse

from dedal.model.config import from_args
from dedal.ui.console import human_seconds, out, print_json
from dedal.ui.progress import BuildProgress


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fetch",
        help="concretize and mirror every source (needs network)",
        description="Clone Spack at the pinned ref (or use spack_root), concretize the environment "
        "inside the build base image unless a spack.lock is given, fill the source "
        "mirror and write the build plan. A rerun fetches only what is missing.",
    )
    p.add_argument("target", metavar="ENV", help="env.yaml (or its directory) or a spack.lock")
    p.add_argument("--mirror", metavar="DIR", help="source mirror (default: setting `mirror`)")
    p.add_argument("--envs-url", metavar="URL", help="git repository of environments; ENV is a path inside it")
    p.add_argument("--envs-ref", metavar="REF", help="commit, tag or branch of --envs-url (default: main)")
    p.add_argument(
        "--lock-only",
        action="store_true",
        help="only concretize (in the base image) and write the plan; leave the mirror alone "
        "(does the environment concretize? works offline)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dedal.stages.fetch import envs_checkout, run_fetch  # the stage's imports: only when it runs
    from dedal.model.target import resolve

    settings = from_args(args, mirror=args.mirror, envs_url=args.envs_url, envs_ref=args.envs_ref)
    env_arg = args.target
    if settings.envs_url:
        checkout, _commit = envs_checkout(settings)
        env_arg = str(checkout / args.target)
    target = resolve(env_arg, settings)
    with BuildProgress(0, title=f"fetch {target.name}", quiet=args.json) as progress:
        result, _prepared = run_fetch(target, progress=progress, sources_too=not args.lock_only)
    if args.json:
        print_json(result.to_json())
    elif not result.mirrored:
        out.print(
            f"{result.env}: lock {result.lock}{' (concretized)' if result.concretized else ' (unchanged)'}; "
            f"plan {result.plan}; mirror not filled (--lock-only); {human_seconds(result.seconds)}"
        )
    else:
        sources = (
            f"{result.sources} sources ({result.already_present} already in the mirror, {result.fetched} fetched"
            + (")" if result.listed else ", as counted by spack mirror create)")
        )
        out.print(
            f"{result.env}: {sources}; lock {result.lock}{' (concretized)' if result.concretized else ''}; "
            f"plan {result.plan}; {human_seconds(result.seconds)}"
        )
    return 0
