"""`dedal publish IMAGE.sif oras://HOST[:PORT]/REPO:TAG [...]`: push a SIF the way
``apptainer pull oras://`` expects it, with its verification report and SBOM attached."""

from __future__ import annotations

import argparse
import os
from typing import Dict, List

from dedal.commands._registry import add_registry_options, progress_printer, registry_options
from dedal.ui.console import out, print_json
from dedal.ui.progress import Transfers
from dedal.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "publish",
        help="push a SIF image to an OCI registry (oras://), with its reports attached",
        description="Push IMAGE.sif as an ORAS SIF artifact that `apptainer pull oras://` accepts. "
        "Several references push the same manifest under several tags; blobs the "
        "registry already has are not uploaded again.",
    )
    p.add_argument("image", metavar="IMAGE.sif", help="the SIF image")
    p.add_argument(
        "refs",
        nargs="*",
        metavar="REF",
        help="oras://HOST[:PORT]/REPO[:TAG] (default: setting `registry`; the tag defaults to the "
        "file name without .sif)",
    )
    p.add_argument("--description", help="org.opencontainers.image.description (default: from the SIF labels)")
    p.add_argument(
        "--source",
        metavar="URL",
        help="org.opencontainers.image.source: the URL of the environment's repository (default: the "
        "SIF label, else the CI project: CI_PROJECT_URL, GITHUB_REPOSITORY)",
    )
    p.add_argument(
        "--revision",
        metavar="COMMIT",
        help="org.opencontainers.image.revision: the commit of those sources (default: the SIF label, "
        "else CI_COMMIT_SHA, GITHUB_SHA)",
    )
    p.add_argument("--env", dest="environment", metavar="NAME", help="environment name (default: from the SIF labels)")
    p.add_argument("--lock-hash", help="hash of spack.lock (default: from the SIF labels)")
    p.add_argument("--spack-commit", help="Spack commit (default: from the SIF labels)")
    p.add_argument(
        "--annotation", action="append", default=[], metavar="KEY=VALUE", help="extra manifest annotation (repeatable)"
    )
    p.add_argument(
        "--attach",
        action="append",
        nargs="+",
        default=[],
        metavar="FILE",
        help="attach files or a report directory (verify.json, report.md, plots, SBOM) as artifacts "
        "referring to the image",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="publish even when the attached verify.json has a verdict the setting verify_gate refuses "
        "(default gate: passed, i.e. good or suboptimal)",
    )
    p.add_argument(
        "--sign",
        action="store_true",
        default=None,
        help="push a copy signed with Apptainer's PGP key (setting sign; key: setting sign_keyidx; its "
        "passphrase in $DEDAL_SIGN_PASSPHRASE): `apptainer verify` and `dedal pull --verify` accept it",
    )
    p.add_argument(
        "--provenance",
        action="store_true",
        default=None,
        help="attach an in-toto/SLSA provenance statement of the build's inputs (from the image's labels) "
        "as a referrer (setting provenance)",
    )
    add_registry_options(p)
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # imported here: the registry client (requests) would add ~0.25 s to every `dedal` start, --help included
    from dedal.stages import publish as pub

    settings, access = registry_options(args)
    refs: List[str] = list(args.refs) + [f for group in args.attach for f in group if f.startswith("oras://")]
    if not refs:
        if not settings.registry:
            raise UserError(
                "no reference given and setting `registry` is empty (dedal publish IMAGE.sif oras://HOST/REPO:TAG)"
            )
        repo = pub.parse_reference(settings.registry, require_scheme=False, allow_digest=False)
        refs = [str(repo)]
    annotations: Dict[str, str] = {}
    for pair in args.annotation:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--annotation {pair!r}: expected KEY=VALUE")
        annotations[key.strip()] = value
    attachments = []
    for f in (f for group in args.attach for f in group):
        # `--attach a b oras://...` takes the reference into --attach: give it back
        if not f.startswith("oras://"):
            attachments.append(f)
    with Transfers(quiet=args.json):
        result = pub.publish(
            args.image,
            refs,
            description=args.description,
            source=args.source,
            revision=args.revision,
            environment=args.environment,
            lock_hash=args.lock_hash,
            spack_commit=args.spack_commit,
            annotations=annotations,
            attachments=attachments,
            progress=progress_printer(),
            gate="off" if args.force else settings.verify_gate,
            sign=bool(args.sign or settings.sign),
            sign_keyidx=int(settings.sign_keyidx),
            sign_passphrase=os.environ.get("DEDAL_SIGN_PASSPHRASE"),
            provenance=bool(args.provenance or settings.provenance),
            access=access,
        )
    if args.json:
        print_json(result.to_json())
        return 0
    for ref in result.references:
        out.print(f"published {ref}", markup=False)
    out.print(
        f"  manifest {result.digest}  sif {result.sif_digest} ({result.sif_size} bytes, {result.arch})", markup=False
    )
    out.print(
        f"  blobs uploaded: {len(result.blobs_uploaded)}, already in the registry: {len(result.blobs_skipped)}",
        markup=False,
    )
    if result.signed_by:
        out.print(
            f"  signed by {', '.join(result.signed_by['names'])} ({', '.join(result.signed_by['fingerprints'])})",
            markup=False,
        )
    for a in result.attachments:
        out.print(
            f"  attached {a.artifact_type}: {', '.join(a.files)} ({a.digest}, referrers: {result.referrers})",
            markup=False,
        )
    return 0
