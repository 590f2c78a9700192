"""`dedal ci generate|collect`: GitLab CI for a repository of environments (see ci/README.md).

``dedal ci generate [ENV...] [--changed-since REF | --all] [-o child.yml]`` writes the
child pipeline for the environments to build; ``dedal ci collect STAGE ENV`` copies a
stage's plan, logs, manifests and reports into ``ci-artifacts/<name>/<stage>/``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dedal.commands import needs_action
from dedal.model.config import from_args
from dedal.ui.console import err, out, print_json
from dedal.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ci",
        help="GitLab CI: generate the child pipeline, collect job artifacts",
        description="GitLab CI for a repository of environments (ci/README.md).",
    )
    csub = p.add_subparsers(dest="ci_command", metavar="ACTION")

    g = csub.add_parser(
        "generate",
        help="write the child pipeline (fetch -> build -> assemble -> verify -> publish) for the environments to build",
        description="Write a GitLab child pipeline with, per environment, the jobs fetch, build, assemble, "
        "verify and publish chained by needs:, extending the templates of ci/templates.yml. "
        "Which environments: those named, every one (--all), or those a change since REF touches "
        "(a file under the environment's directory, or under a repos:/include: path of it inside "
        "the repository). An unknown REF (empty, all zeros, outside a shallow clone) takes every "
        "environment, with a note. No environment gives a pipeline with one job saying so.",
    )
    g.add_argument(
        "envs",
        nargs="*",
        metavar="ENV",
        help="environment files or directories (default: every environment under --envs-dir)",
    )
    g.add_argument(
        "--changed-since",
        metavar="REF",
        help="only environments touched by `git diff REF HEAD` "
        "(e.g. $CI_COMMIT_BEFORE_SHA, $CI_MERGE_REQUEST_DIFF_BASE_SHA)",
    )
    g.add_argument("--all", dest="all_envs", action="store_true", help="every environment (full rebuild)")
    g.add_argument(
        "--envs-dir",
        default="spack-envs",
        metavar="DIR",
        help="directory of the environments, relative to the repository root (default: spack-envs)",
    )
    g.add_argument(
        "--repo",
        metavar="DIR",
        help="the repository (default: the git repository of the current directory, else the current directory)",
    )
    g.add_argument(
        "--templates",
        default="ci/templates.yml",
        metavar="PATH",
        help="job templates the child pipeline includes (include: local:, default: ci/templates.yml)",
    )
    g.add_argument("-o", "--output", metavar="FILE", help="write the pipeline here (default: standard output)")
    g.add_argument("--json", action="store_true", help="print the selection as JSON (with -o)")
    g.set_defaults(func=run_generate)

    c = csub.add_parser(
        "collect",
        help="copy a stage's plan, logs, layer manifests, image manifest, reports into ci-artifacts/",
        description="Copy the small outputs of STAGE for ENV from dedal's work directories into "
        "ci-artifacts/<name>/<stage>/ (GitLab artifacts:). After assemble also image.env "
        "(DEDAL_CI_IMAGE=<sif>, a dotenv report). What a failed stage did not produce is listed, "
        "not an error: run it in after_script so failed jobs keep their logs.",
    )
    c.add_argument(
        "stage",
        choices=("fetch", "build", "assemble", "verify", "publish"),
        metavar="STAGE",
        help="fetch, build, assemble, verify or publish",
    )
    c.add_argument("target", metavar="ENV", help="env.yaml (or its directory), spack.lock or plan.json")
    c.add_argument("-d", "--dir", metavar="DIR", help="destination (default: ci-artifacts/<name>/<stage>)")
    c.add_argument(
        "--dotenv",
        metavar="FILE",
        help="after assemble, also write DEDAL_CI_IMAGE=<sif> to FILE (for artifacts:reports:dotenv)",
    )
    c.add_argument("--json", action="store_true", help="print what was collected as JSON")
    c.set_defaults(func=run_collect)

    p.set_defaults(func=needs_action(p))


def _root(args: argparse.Namespace) -> Path:
    if args.repo:
        root = Path(args.repo)
        if not root.is_dir():
            raise UserError(f"--repo {args.repo}: no such directory")
        return root.resolve()
    from dedal.adapters import git as gitad  # GitPython: only when the command runs, not for --help

    try:
        return gitad.toplevel(Path.cwd())
    except UserError:
        if args.changed_since is not None:
            raise
        return Path.cwd().resolve()


def run_generate(args: argparse.Namespace) -> int:
    from dedal.ci import gitlab as ci  # the stages' imports: only when the command runs

    root = _root(args)
    selection = ci.select(
        root, envs=args.envs, envs_dir=args.envs_dir, changed_since=args.changed_since, all_envs=args.all_envs
    )
    text = ci.render(selection, args.templates)
    if selection.note:
        err.print(f"dedal: note: {selection.note}", markup=False)
    if args.output:
        ci.write_atomic(Path(args.output), text)
        if args.json:
            print_json(selection.to_json())
        else:
            names = ", ".join(e.name for e in selection.envs) or "none"
            out.print(
                f"{args.output}: {len(selection.envs)} environment(s) ({selection.reason}): {names}", markup=False
            )
            for env in selection.envs:
                touched = selection.changes.get(env.name)
                if touched:
                    out.print(f"  {env.name}: {', '.join(touched)}", markup=False)
    else:
        if args.json:
            raise UserError("--json describes the selection; give -o FILE for the pipeline")
        sys.stdout.write(text)
    return 0


def run_collect(args: argparse.Namespace) -> int:
    from dedal.ci import gitlab as ci  # the stages' imports: only when the command runs
    from dedal.model.target import resolve

    settings = from_args(args)
    target = resolve(args.target, settings)
    result = ci.collect(
        args.stage, target, Path(args.dir) if args.dir else None, Path(args.dotenv) if args.dotenv else None
    )
    if args.json:
        print_json(result.to_json())
        return 0
    out.print(
        f"{result.directory}: {len(result.files)} file(s) from the {result.stage} stage of {result.env}", markup=False
    )
    if result.image:
        out.print(f"  image {result.image} (DEDAL_CI_IMAGE in {ci.IMAGE_DOTENV})", markup=False)
    for miss in result.missing:
        out.print(f"  not there: {miss}", markup=False)
    return 0
