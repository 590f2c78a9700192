"""`dedal schema env`: print the JSON Schema of a dedal input file (draft-07, with dedal's
defaults), so that an editor checks and completes ``env.yaml`` as it is typed (e.g. the YAML
language server: ``# yaml-language-server: $schema=env.schema.json`` on the file's first line,
after ``dedal schema env > env.schema.json``)."""

from __future__ import annotations

import argparse
import sys

from dedal.model.schema import schema_names, schema_text


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "schema",
        help="print the JSON Schema of an input file (env: env.yaml)",
        description="Print the JSON Schema (draft-07) of a dedal input file, defaults included: "
        "the one dedal checks the file with, for editors to check it too.",
    )
    p.add_argument("name", choices=schema_names(), help="which file: env (an environment's env.yaml)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(schema_text(args.name))
    return 0
