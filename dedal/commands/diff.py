"""``dedal diff A.sif B.sif [--json]``: what differs between two images.

A summary line first (``identical: ...`` or ``differ: ...``), then one line per header
field, SIF object, label and file of the root file system that differs, with a diff of
text content below it. Exit 0 when the two files are identical, 1 when they differ, 2 on
bad input (not a SIF, missing file). See :mod:`dedal.stages.sifdiff`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dedal.ui.console import print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diff",
        help="what differs between two SIF images (header, objects, labels, files)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    p.add_argument("a", metavar="A.sif")
    p.add_argument("b", metavar="B.sif")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--no-files",
        action="store_true",
        help="do not mount and walk the root file systems (say only that they differ)",
    )
    p.add_argument(
        "--max-lines",
        type=int,
        default=40,
        metavar="N",
        help="diff lines shown per difference (0: all; --json always has all)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dedal.stages.sifdiff import diff_images, render  # only when it runs, not for --help

    result = diff_images(Path(args.a), Path(args.b), files=not args.no_files)
    if args.json:
        print_json(result.to_json())
    else:
        print(render(result, args.max_lines))
    return 0 if result.identical else 1
