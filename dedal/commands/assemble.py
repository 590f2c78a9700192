"""`dedal assemble PLAN_OR_ENV [-o IMAGE.sif]`: base + runtime layers -> one SIF image."""

from __future__ import annotations

import argparse

from dedal.model.config import from_args
from dedal.ui.console import err, human_seconds, human_size, out, print_json
from dedal.ui.progress import Transfers
from dedal.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "assemble",
        help="assemble the layers of an environment into a SIF image",
        description="Stack the base root filesystem and the layers of the environment's runtime closure "
        "(build-only dependencies dropped), run spack reindex and make the view at its final "
        "path, bake the environment into /.singularity.d, and pack one squashfs into a SIF with "
        "provenance labels and a CycloneDX SBOM. Default output: <images_dir>/<env>/<tag>.sif, "
        "with <tag>.image.json and <tag>.sbom.cdx.json beside it. Set SOURCE_DATE_EPOCH for "
        "byte-identical images.",
    )
    p.add_argument("target", metavar="PLAN_OR_ENV", help="env.yaml (or its directory), spack.lock or plan.json")
    p.add_argument("-o", "--output", metavar="IMAGE.sif", help="where to write the image")
    p.add_argument(
        "--only",
        metavar="SPEC,...",
        action="append",
        default=None,
        help="a subset image: only these packages (name, name@version or /hash) and their "
        "link/run dependencies (repeatable)",
    )
    p.add_argument(
        "--keep-build-deps", action="store_true", default=None, help="also put build-only dependencies into the image"
    )
    p.add_argument(
        "--runtime-base",
        metavar="NAME",
        default=None,
        help="assemble on this base instead of the one the layers were built on (default: the "
        "environment's dedal.runtime_base, else its base_image): its runtime twin, e.g. "
        "debian-trixie-cuda-runtime for debian-trixie-cuda",
    )
    p.add_argument("--force", action="store_true", help="assemble even if an identical image is there")
    p.add_argument("--layers", metavar="DIR", help="layer store (default: setting `layer_store`)")
    p.add_argument("--stage-dir", metavar="DIR", help="where the image tree is put together (default: /dev/shm)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dedal.stages.assemble import assemble  # the stage's imports: only when it runs, not for --help
    from dedal.model.image_options import ImageOptions
    from dedal.model.sif import source_date_epoch
    from dedal.stages.workspace import prepare
    from dedal.model.target import resolve

    settings = from_args(args, layer_store=args.layers, stage_dir=args.stage_dir)
    only = None
    if args.only:
        only = [s.strip() for chunk in args.only for s in chunk.split(",") if s.strip()]
        if not only:
            raise UserError("--only: no package named")
    target = resolve(args.target, settings)
    image = ImageOptions.of(
        target.env,
        only=only,
        keep_build_deps=args.keep_build_deps,
        runtime_base=args.runtime_base,
        source_date_epoch=source_date_epoch(),
    )
    if target.given_plan is not None:  # a plan.json as it is: nothing written
        plan, lock = target.given_plan, None
    else:  # the work directory prepared, the lock parsed once
        plan, _path, lock = prepare(target)
    progress = None if args.json else (lambda line: err.print(line, markup=False, highlight=False))
    with Transfers(quiet=args.json):
        result = assemble(plan, image, settings, lock=lock, output=args.output, progress=progress, force=args.force)
    if args.json:
        print_json(result.to_json())
        return 0
    verb = "up to date" if result.status == "present" else f"assembled in {human_seconds(result.seconds)}"
    out.print(f"{result.image}: {verb}, {human_size(result.size)}, {len(result.layers)} layer(s)", markup=False)
    out.print(f"  sha256 {result.sha256}", markup=False)
    if result.runtime_base:
        out.print(f"  on runtime base {result.runtime_base_id} (layers built on {result.base_id})", markup=False)
    if result.versions:
        out.print("  " + ", ".join(f"{k} {v}" for k, v in sorted(result.versions.items())), markup=False)
    out.print(f"  manifest {result.image_json}", markup=False)
    out.print(f"  SBOM     {result.sbom}", markup=False)
    return 0
