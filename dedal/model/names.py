"""One rule set for names that become file or directory names.

Package names, versions and hashes from a spack.lock (a prefix is
``<name>-<version>-<hash>``), the environment name and tag of a plan or environment
file (``<work_dir>/<env>/``, ``<images_dir>/<env>/<tag>.sif``), the environment name a
lock file's name gives, layer keys: each is checked here where it enters, so that no
``..``, ``/`` or NUL can carry a path outside the directory it is joined to."""

from __future__ import annotations

import re
from typing import Any

from dedal.errors import UserError

_CONTROL = re.compile("[\x00-\x1f\x7f]")  # control characters: one search, not a test per character
MAX_NAME_BYTES = 200  # NAME_MAX is 255; room for the suffixes added to a name (.sif, .image.json, -<hash>.log)
# names that pass every rule of name_problem() at a glance (ASCII letters, digits and ``_.+-``,
# not first ``.`` or ``-``, at most MAX_NAME_BYTES): the hashes, names and versions of a lock
# of 10,000 specs, checked by one match instead of the rules one by one
_PLAIN = re.compile(r"[A-Za-z0-9_+][A-Za-z0-9_.+-]{0,%d}" % (MAX_NAME_BYTES - 1))


def name_problem(value: Any) -> str:
    """Why ``value`` may not be one path component ("" when it may)."""
    if not isinstance(value, str):
        return f"expected a string, got {type(value).__name__}"
    if not value:
        return "empty"
    if value in (".", ".."):
        return f"{value!r} is not a name"
    if "/" in value:
        return "contains '/'"
    if "\0" in value:
        return "contains a NUL character"
    if _CONTROL.search(value):
        return "contains a control character"
    if value.startswith("-"):
        return "starts with '-'"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if size > MAX_NAME_BYTES:
        return f"longer than {MAX_NAME_BYTES} bytes ({size})"
    return ""


def safe_name(value: Any, what: str, where: str = "") -> str:
    """``value`` if it may be used as one path component, else UserError naming ``what``
    (e.g. "package name") and ``where`` (the file it came from)."""
    if type(value) is str and _PLAIN.fullmatch(value):
        return value
    problem = name_problem(value)
    if problem:
        shown = repr(value) if not isinstance(value, str) or len(value) <= 80 else repr(value[:77] + "...")
        raise UserError(f"{where + ': ' if where else ''}{what} {shown} cannot be used as a file name: {problem}")
    return value
