"""``dedal rebuild IMAGE``: rebuild an image from the environment, lock, package
repositories and base definition it carries, with its SOURCE_DATE_EPOCH, then compare.

Prints ``identical: ...`` (exit 0) or the ``dedal diff`` of the two images (exit 1); bad
input (not a SIF, an image without its inputs, another Spack or base definition here)
is one line and exit 2. IMAGE is a SIF file or ``oras://HOST/REPO:TAG`` (pulled first).
Offline with a source mirror (``-s mirror=DIR``) and a Spack checkout (``DEDAL_SPACK_ROOT``)
at the image's commit; online, dedal clones that commit and fetches the sources. See
:mod:`dedal.stages.rebuild`.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from dedal.commands._registry import add_registry_options, progress_printer, registry_options
from dedal.model.config import from_args
from dedal.ui.console import print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rebuild",
        help="rebuild an image from the inputs it carries and compare (identical or the diff)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    p.add_argument("image", metavar="IMAGE", help="SIF file or oras://HOST/REPO:TAG")
    p.add_argument(
        "--workdir",
        metavar="DIR",
        help="where the rebuild keeps its layers, work files and image (default: a new temporary directory)",
    )
    p.add_argument("--max-lines", type=int, default=40, metavar="N", help="diff lines shown per difference (0: all)")
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    add_registry_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dedal.stages.rebuild import rebuild
    from dedal.stages.sifdiff import render

    workdir = Path(args.workdir).resolve() if args.workdir else None  # None: the rebuild makes a temporary one
    image = Path(args.image)
    if args.image.startswith("oras://"):
        from dedal.stages import publish as pub

        _, access = registry_options(args)
        workdir = workdir or Path(tempfile.mkdtemp(prefix="dedal-rebuild-"))
        workdir.mkdir(parents=True, exist_ok=True)
        image = Path(
            pub.pull(
                args.image, workdir / "original.sif", force=True, progress=progress_printer(args.json), access=access
            ).path
        )
    say = progress_printer(args.json)
    result = rebuild(
        image, lambda overrides: from_args(args, **overrides), workdir=workdir, progress=say, quiet=args.json
    )
    if args.json:
        print_json(result.to_json())
    else:
        print(render(result.diff, args.max_lines))
        print(f"rebuilt in {result.seconds:.0f} s: {result.rebuilt} (work directory {result.workdir})")
    return 0 if result.identical else 1
