"""`dedal build-image`: fetch -> build -> assemble -> verify -> publish, resumable."""

from __future__ import annotations

import argparse

from rich.table import Table

from dedal.commands._build import add_build_options, build_settings
from dedal.errors import Interrupted, UserError
from dedal.ui.console import human_seconds, human_size, out, print_json
from dedal.ui.progress import Transfers
from dedal.stages.pipeline import STAGES, PipelineSummary, StageFailed, run_pipeline, stage_range
from dedal.model.image_options import ImageOptions
from dedal.model.sif import source_date_epoch
from dedal.model.target import resolve


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "build-image",
        help="fetch, build, assemble, verify and publish an environment's image",
        description="The maintainer's one command: every stage in order, each skipped when its "
        "output is current, so a rerun after a failure resumes where it stopped. "
        "Publishes only when a registry is configured and the verification passed.",
    )
    p.add_argument("target", metavar="ENV", help="env.yaml (or its directory)")
    p.add_argument("--from", dest="start", default="fetch", choices=STAGES, help="first stage to run")
    p.add_argument("--until", default="publish", choices=STAGES, help="last stage to run")
    add_build_options(p)
    p.add_argument(
        "--verify-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra variable for every verification run (e.g. UCX_TLS=tcp); repeatable",
    )
    p.add_argument("--reverify", action="store_true", help="verify again even if this image has a report")
    p.add_argument("--registry", metavar="oras://HOST/REPO", help="publish here (default: dedal.registry / setting)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = build_settings(args, registry=args.registry)
    target = resolve(args.target, settings)
    if target.env is None:
        raise UserError(f"{args.target}: build-image takes an environment file (env.yaml)")
    image = ImageOptions.of(target.env, source_date_epoch=source_date_epoch())  # the image's date: read here, once
    verify_env = {}
    for pair in args.verify_env:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UserError(f"--verify-env {pair!r}: expected KEY=VALUE")
        verify_env[key] = value
    with Transfers(quiet=args.json):
        summary = run_pipeline(
            target,
            image,
            stages=stage_range(args.start, args.until),
            executor=settings.executor,
            jobs=max(1, settings.jobs),
            keep_going=settings.keep_going,
            quiet=args.json,
            verify_env=verify_env,
            reverify=args.reverify,
        )
    if args.json:
        print_json(summary.to_json())
    else:
        show(summary)
    if isinstance(summary.failure, Interrupted):  # "verify interrupted by signal SIGINT", exit 130
        raise summary.failure
    if summary.failure is not None:  # one line naming the stage, with the stage's exit code
        raise StageFailed(summary.error, exit_code=summary.failure.exit_code)
    return 0


def show(summary: PipelineSummary) -> None:
    table = Table(title=f"build-image {summary.env}")
    for col in ("stage", "status", "time", "detail"):
        table.add_column(col)
    for s in summary.stages:
        table.add_row(s.name, s.status, human_seconds(s.seconds) if s.seconds else "", s.detail)
    out.print(table)
    if summary.image:
        out.print(f"image    {summary.image} ({human_size(summary.image_size)}, sha256 {summary.image_sha256[:16]})")
    out.print(f"layers   {summary.layers_built} built, {summary.layers_reused} reused")
    if summary.verdict:
        out.print(f"verdict  {summary.verdict_text} ({summary.report})")
        if summary.findings:
            out.print(f"findings {summary.findings}")
    if summary.published:
        out.print(f"published {', '.join(summary.published)}")
    out.print(f"total    {human_seconds(summary.seconds)}")
