"""Reading a user's files, and their JSON and YAML: every defect is one UserError line naming
the file. A file is read only if it is a regular file (a FIFO is never waited on, a device
never read), and only up to the bytes dedal reads of its kind.

Undecodable bytes, syntax errors, values the parsers refuse (a YAML timestamp
``2024-13-45``, an integer of 5,000 digits) and nesting so deep that a parser or a
later recursive walk would exhaust Python's stack all end here, not in a traceback."""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path
from typing import Any, BinaryIO, Optional, Union

import yaml

from dedal.errors import UserError

_KINDS = {
    0o010000: "a FIFO",
    0o020000: "a character device",
    0o060000: "a block device",
    0o140000: "a socket",
    0o040000: "a directory",
    0o120000: "a symlink",
}


def open_regular(path: Path, *, follow: bool = True) -> BinaryIO:
    """``path`` opened for reading in binary, if it is a regular file: a FIFO is refused
    at once (it is never waited on for a writer), so is a device, a socket, a directory,
    and, with ``follow=False``, a symlink at its end. UserError, one line, otherwise."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not a regular file") from None
    except PermissionError:
        raise UserError(f"{path}: permission denied") from None
    except (OSError, ValueError) as exc:  # ELOOP: a symlink at the end (follow=False); ValueError: a NUL
        if getattr(exc, "errno", None) == errno.ENAMETOOLONG:
            raise  # the CLI's one line for a path too long, wherever it is met
        try:
            mode = os.lstat(path).st_mode
        except (OSError, ValueError):
            raise UserError(f"{path}: cannot be opened ({getattr(exc, 'strerror', None) or exc})") from None
        raise UserError(f"{path}: is {_KINDS.get(mode & 0o170000, 'no regular file')}, not a regular file") from None
    mode = os.fstat(fd).st_mode
    if mode & 0o170000 != 0o100000:
        os.close(fd)
        raise UserError(f"{path}: is {_KINDS.get(mode & 0o170000, 'no regular file')}, not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


INPUT_LIMIT = 8 << 20  # bytes of an input file read whole: env.yaml, settings, base definitions, manifests, plans


def too_large(what: str, limit: int, size: Optional[int] = None) -> str:
    """The one line for an input over the bytes dedal reads of its kind (``size``: where
    known; a stream is cut off after ``limit``)."""
    got = f"{size} bytes" if size is not None else f"more than {limit} bytes"
    limit_text = f"{limit >> 20} MiB" if limit >= 1 << 20 and not limit % (1 << 20) else f"{limit} bytes"
    return f"{what}: too large ({got}; dedal reads at most {limit_text} of it)"


def read_input(path: Path, limit: int = INPUT_LIMIT) -> str:
    """A user's input file as text, or one clear UserError line: a FIFO, a device refused
    at once, a file over ``limit`` bytes (never read into memory whole)."""
    try:
        with open_regular(Path(path)) as fh:  # decoded as read_text() does (universal newlines)
            size = os.fstat(fh.fileno()).st_size
            if size > limit:
                raise UserError(too_large(str(path), limit, size))
            data = fh.read(limit + 1)  # a file that grows meanwhile is cut off here
            if len(data) > limit:
                raise UserError(too_large(str(path), limit))
            return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, expected a file") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise UserError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None


MAX_DEPTH = 64  # no dedal input nests deeper than about 10 levels


def _depth_problem(data: Any) -> str:
    """ "" or why the nesting is refused: deeper than MAX_DEPTH, or a YAML alias that
    contains itself. Iterative, and each container counted once (aliases share them):
    the point is neither to recurse nor to expand "billion laughs" documents."""

    def kids(value: Any) -> list:
        items = list(value.values()) + list(value.keys()) if isinstance(value, dict) else list(value)
        return [c for c in items if isinstance(c, (dict, list, tuple))]

    if not isinstance(data, (dict, list, tuple)):
        return ""
    height: dict = {}
    on_path: set = set()
    stack = [(data, False)]
    while stack:
        value, leaving = stack.pop()
        key = id(value)
        if leaving:
            height[key] = 1 + max((height[id(c)] for c in kids(value)), default=0)
            on_path.discard(key)
            if height[key] > MAX_DEPTH:
                return f"nested deeper than {MAX_DEPTH} levels"
            continue
        if key in height:
            continue
        if key in on_path:
            return "a YAML alias refers to a structure that contains it"
        on_path.add(key)
        stack.append((value, True))
        stack.extend((c, False) for c in kids(value) if id(c) not in height)
    return ""


def _json_depth_problem(data: Any) -> str:
    """:func:`_depth_problem` for what ``json.loads`` returns: a tree (no container is
    shared, keys are strings), so one level at a time, without the bookkeeping of shared
    containers: a lock of 20,000 specs has more than a million containers. ``json.loads``
    makes plain dicts and lists only, so their type is looked up, not ``isinstance``
    called (a third faster)."""
    level = [data] if type(data) in _JSON_CONTAINERS else []
    depth = 0
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH} levels"
        level = [c for v in level for c in (v.values() if type(v) is dict else v) if type(c) in _JSON_CONTAINERS]
    return ""


_JSON_CONTAINERS = frozenset((dict, list))
# every byte but brackets, quotes and backslashes (which never occur inside a UTF-8 sequence)
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"\\')
_AS_PARENS = bytes.maketrans(b"[]{}", b"()()")


def _json_text_depth(text: str) -> Optional[int]:
    """How deep the JSON ``text`` (valid: ``json.loads`` took it) nests, from its brackets
    alone, or None when a string holds a bracket, quote or backslash (then the parsed
    data is walked). Each pass of ``bytes.replace`` takes out every innermost pair, one
    level: twice as fast as walking the million containers of a 20 MB lock."""
    try:
        marks = text.encode("utf-8").translate(None, _NOT_STRUCTURE)
    except UnicodeEncodeError:
        return None
    marks = marks.replace(b'""', b"")  # strings with nothing but other characters in them
    if b'"' in marks or b"\\" in marks:
        return None
    marks = marks.translate(_AS_PARENS)
    depth = 0
    while marks and depth <= MAX_DEPTH:
        depth += 1
        marks = marks.replace(b"()", b"")
    return depth


def parse_json(text: str, where: Union[str, Path]) -> Any:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        hint = " (truncated?)" if exc.pos >= len(text.rstrip()) - 1 else ""
        raise UserError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}){hint}") from None
    except RecursionError:
        raise UserError(f"{where}: not accepted: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # e.g. an integer longer than Python's int_max_str_digits
        raise UserError(f"{where}: not valid JSON ({str(exc).splitlines()[0][:200]})") from None
    depth = _json_text_depth(text)
    problem = (
        _json_depth_problem(data)
        if depth is None
        else (f"nested deeper than {MAX_DEPTH} levels" if depth > MAX_DEPTH else "")
    )
    if problem:
        raise UserError(f"{where}: not accepted: {problem}")
    return data


def _yaml_problem(exc: yaml.YAMLError, where: Union[str, Path]) -> str:
    """PyYAML's complaint as one line with where it is: ``FILE:LINE:COLUMN: not valid YAML:
    PROBLEM (CONTEXT at LINE:COLUMN)`` for a file (a :class:`~pathlib.Path`: what editors and
    terminals jump to), ``WHERE: not valid YAML (PROBLEM at line L column C)`` for a value
    that is not a file (a ``-s`` setting). PyYAML counts lines and columns from 0."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return f"{where}: not valid YAML ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
    problem = exc.problem or exc.context or type(exc).__name__
    mark = exc.problem_mark or exc.context_mark
    context = ""
    if exc.problem and exc.context:
        at = exc.context_mark
        context = (
            f" ({exc.context}"
            + (
                f" at {at.line + 1}:{at.column + 1}"
                if at is not None and (mark is None or (at.line, at.column) != (mark.line, mark.column))
                else ""
            )
            + ")"
        )
    if mark is None:
        return f"{where}: not valid YAML: {problem}{context}"
    if isinstance(where, Path):
        return f"{where}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {problem}{context}"
    return f"{where}: not valid YAML ({problem} at line {mark.line + 1} column {mark.column + 1}){context}"


# what hides a bracket from the flow-depth count: a quoted scalar, a comment
_YAML_QUOTED_OR_COMMENT = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\n]|\'\')*\'|(?:^|(?<=[ \t]))#[^\n]*', re.M)
_YAML_FLOW = re.compile(r"[\[\]{}]")


def _yaml_flow_depth(text: str) -> int:
    """How deep ``text``'s flow collections (``[...]``, ``{...}``) nest, counted from the
    brackets outside quotes and comments, before PyYAML reads it: PyYAML's scanner takes
    time quadratic in the flow depth (1.2 s for a file of 100,000 ``[``; 4 minutes for
    150 such files in the fuzz test), only to have the result refused for its depth after.
    A bracket in a plain or block scalar counts too: a real file never has 64 open ones."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return 0
    depth = peak = 0
    for mark in _YAML_FLOW.findall(_YAML_QUOTED_OR_COMMENT.sub("", text)):
        depth = depth + 1 if mark in "[{" else max(depth - 1, 0)
        peak = max(peak, depth)
    return peak


def parse_yaml(text: str, where: Union[str, Path]) -> Any:
    if _yaml_flow_depth(text) > MAX_DEPTH:
        raise UserError(f"{where}: not accepted: nested deeper than {MAX_DEPTH} levels")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UserError(_yaml_problem(exc, where)) from None
    except RecursionError:
        raise UserError(f"{where}: not accepted: nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, TypeError, OverflowError) as exc:  # a constructor refused a value (dates, ...)
        raise UserError(
            f"{where}: not valid YAML ({str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__})"
        ) from None
    problem = _depth_problem(data)
    if problem:
        raise UserError(f"{where}: not accepted: {problem}")
    return data


def load_json(path: Union[str, Path]) -> Any:
    return parse_json(read_input(Path(path)), path)


def load_yaml(path: Union[str, Path]) -> Any:
    return parse_yaml(read_input(Path(path)), Path(path))
