"""`dedal pull oras://HOST[:PORT]/REPO:TAG -o FILE.sif`: download and verify a SIF image."""

from __future__ import annotations

import argparse

from dedal.commands._registry import add_registry_options, progress_printer, registry_options
from dedal.ui.console import out, print_json
from dedal.ui.progress import Transfers


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pull",
        help="download a SIF image from an OCI registry and verify it",
        description="Resolve the reference, download the SIF to a temporary file, check its size, "
        "sha256, SIF header and architecture, audit the entries of its root file system "
        "(no setuid file outside the system's program directories, no device but /dev's "
        "harmless ones, no world-writable directory without the sticky bit, no symlink out "
        "of the install root or above the root), then rename it into place.",
    )
    p.add_argument("ref", metavar="REF", help="oras://HOST[:PORT]/REPO:TAG or oras://HOST/REPO@sha256:...")
    p.add_argument("-o", "--output", metavar="FILE", help="output file or directory (default: <name>_<tag>.sif)")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    p.add_argument("--arch", help="accept an image for this architecture instead of the host's (e.g. arm64)")
    p.add_argument(
        "--verify",
        action="store_true",
        default=None,
        help="refuse an image not signed by a key of the local Apptainer keyring (apptainer verify "
        "--local; setting require_signature; setting signers: the fingerprints allowed)",
    )
    add_registry_options(p)
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # imported here: the registry client (requests) would add ~0.25 s to every `dedal` start, --help included
    from dedal.stages import publish as pub

    settings, access = registry_options(args)
    with Transfers(quiet=args.json):
        result = pub.pull(
            args.ref,
            args.output,
            arch=args.arch,
            force=args.force,
            progress=progress_printer(),
            verify=bool(args.verify or settings.require_signature),
            signers=list(settings.signers or []),
            access=access,
        )
    if args.json:
        print_json(result.to_json())
        return 0
    out.print(f"pulled {result.reference} -> {result.path}", markup=False)
    out.print(
        f"  sif {result.sif_digest} ({result.size} bytes, {result.arch}), verified; {result.entries} entries audited",
        markup=False,
    )
    if result.signed_by:
        out.print(
            f"  signed by {', '.join(result.signed_by['names'])} ({', '.join(result.signed_by['fingerprints'])})",
            markup=False,
        )
    return 0
