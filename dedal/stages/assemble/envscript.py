"""The image's environment scripts: ``spack env activate --sh`` output turned into
``/.singularity.d/env/91-environment.sh`` (Spack's own variables dropped, inherited values
kept as ``$VAR``), and the base's environment as plain exports."""

from __future__ import annotations

import re
import shlex
from typing import List, Mapping

from dedal.errors import UserError

_PATH_LIKE = {
    "MANPATH",
    "INFOPATH",
    "CMAKE_PREFIX_PATH",
    "PKG_CONFIG_PATH",
    "ACLOCAL_PATH",
    "CPATH",
    "LIBRARY_PATH",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "PERL5LIB",
    "XDG_DATA_DIRS",
    "MODULEPATH",
}


def _q(value: str) -> str:
    return shlex.quote(value)


def activation_script(text: str, before: Mapping[str, str]) -> str:
    """``spack env activate --sh`` output as an image environment script.

    Spack's own variables (SPACK_ENV, SPACK_ENV_VIEW, ...) and aliases are dropped (no
    Spack in the image). A value Spack built by prepending to what the variable held
    while it ran (``before``) keeps the prepended part and refers to ``$VAR`` for the
    rest; path lists Spack created become ``new${VAR:+:$VAR}``; others are kept as is."""
    out: List[str] = []
    for raw in re.split(r";\s*\n|\n", text):
        s = raw.strip().rstrip(";").strip()
        if not s or s.startswith("#") or s.startswith(("alias ", "unalias ")):
            continue
        try:
            words = shlex.split(s)
        except ValueError:
            raise UserError(f"spack env activate --sh printed a line dedal cannot parse: {s!r}") from None
        if words[0] == "unset":
            names = [w for w in words[1:] if not w.startswith("-") and not w.startswith("SPACK_")]
            if names:
                out.append("unset " + " ".join(names))
            continue
        if words[0] != "export":
            if any("SPACK" in w for w in words):
                continue
            out.append(s)
            continue
        for word in words[1:]:
            name, eq, value = word.partition("=")
            if not eq or name.startswith("SPACK_") or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                continue
            out.append(_export(name, value, before.get(name, "")))
    body = "\n".join(out)
    return "#!/bin/sh\n# The Spack environment of this image (`spack env activate --sh`), made by dedal assemble\n" + (
        body + "\n" if body else ""
    )


def _export(name: str, value: str, old: str) -> str:
    ref = "${%s:+:$%s}" % (name, name)
    if old:
        if value == old:
            return f"# {name} unchanged"
        had = set(old.split(":"))
        entries = value.split(":")
        if had & set(entries) and ":" in value:
            # a list Spack prepended to (and may have deduplicated): keep what it added
            new = [e for e in dict.fromkeys(entries) if e and e not in had]
            if not new:
                return f"# {name} unchanged"
            if entries[0] in had:  # appended rather than prepended
                return f'export {name}="${{{name}:+${name}:}}"{_q(":".join(new))}'
            return f'export {name}={_q(":".join(new))}"{ref}"'
        return f"export {name}={_q(value)}"
    if name.endswith("PATH") or name in _PATH_LIKE:
        if value.endswith(":"):  # MANPATH's trailing colon: "and the default path"
            return f'export {name}={_q(value)}"${{{name}:-}}"'
        return f'export {name}={_q(value)}"{ref}"'
    return f"export {name}={_q(value)}"


def env_lines(env: Mapping[str, str]) -> str:
    return "".join(f"export {k}={_q(v)}\n" for k, v in sorted(env.items()))


def base_environment_script(inherited: str, env: Mapping[str, str]) -> str:
    """``/.singularity.d/env/90-environment.sh``: what an Apptainer-built base had there
    (``inherited``, else a bare ``#!/bin/sh``), then the base's environment as exports,
    Spack's own variables left out."""
    head = inherited.rstrip("\n") + "\n" if inherited else "#!/bin/sh\n"
    own = {k: v for k, v in env.items() if not k.startswith("SPACK")}
    return head + "# environment of the base image\n" + env_lines(own)
