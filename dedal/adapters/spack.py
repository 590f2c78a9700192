"""The only code that runs Spack.

Every call is isolated from the user's own Spack configuration
(``SPACK_DISABLE_LOCAL_CONFIG``, a private ``SPACK_USER_CACHE_PATH``) and works on an
environment directory dedal generated (spack.yaml + spack.lock). Commands may run on the
host or inside a sandbox (base image, fixed install root): the caller passes a
``runner`` with the signature of ``proc.run``; the default runs on the host.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from dedal.adapters import proc
from dedal.errors import ToolError, UserError

Runner = Callable[..., proc.Result]


def _host_runner(
    cmd: Sequence[str], *, env: Mapping[str, str], log: Optional[Path], what: str, timeout: Optional[float] = None
) -> proc.Result:
    full = dict(os.environ)
    full.update(env)
    return proc.run(cmd, env=full, log=log, what=what, timeout=timeout)


@dataclass
class SpackVersion:
    version: str
    commit: str


class Spack:
    def __init__(self, root: Path, user_cache: Path, runner: Optional[Runner] = None) -> None:
        self.root = Path(root)
        self.exe = self.root / "bin" / "spack"
        if not self.exe.is_file():
            raise UserError(f"{self.root} is not a Spack checkout (no bin/spack); set spack_root / DEDAL_SPACK_ROOT")
        self.user_cache = Path(user_cache)
        self.runner: Runner = runner or _host_runner

    def with_runner(self, runner: Runner) -> "Spack":
        return Spack(self.root, self.user_cache, runner)

    def env(self) -> Dict[str, str]:
        return {
            "SPACK_DISABLE_LOCAL_CONFIG": "1",  # no ~/.spack, no /etc/spack: only what dedal generates
            "SPACK_USER_CACHE_PATH": str(self.user_cache),
            "SPACK_ROOT": str(self.root),
            # Spack reads its commit with git (into spack.lock, whose date is the image's): from a
            # checkout another user owns (a site's shared Spack) git refused ("dubious ownership"),
            # the lock named no commit, and the image was dated 1970
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "safe.directory",
            "GIT_CONFIG_VALUE_0": str(self.root),
        }

    def _run(
        self,
        args: Sequence[str],
        *,
        envdir: Optional[Path] = None,
        log: Optional[Path] = None,
        what: str = "spack",
        timeout: Optional[float] = None,
    ) -> proc.Result:
        cmd: List[str] = [str(self.exe)]
        if envdir is not None:
            cmd += ["-e", str(envdir)]
        cmd += list(args)
        try:
            return self.runner(cmd, env=self.env(), log=log, what=what, timeout=timeout)
        except ToolError as exc:
            quote = error_lines(exc.output)
            if not quote:
                raise
            raise ToolError(
                exc.what, exc.cmd, exc.returncode, exc.log_path, " | ".join(quote), output=exc.output, quote=quote
            ) from None

    # -- queries -------------------------------------------------------------------
    def version(self) -> SpackVersion:
        out = self._run(["--version"], what="spack --version").stdout.strip()
        m = re.match(r"(\S+)(?:\s+\(([^)]*)\))?", out)
        if not m:
            raise ToolError("spack --version", [str(self.exe), "--version"], 0, None, f"unexpected output {out!r}")
        commit = m.group(2) or ""
        return SpackVersion(m.group(1), commit if re.fullmatch(r"[0-9a-f]{7,40}", commit) else "")

    # -- build node ------------------------------------------------------------------
    def reindex(self, envdir: Path, log: Path) -> None:
        """Rebuild the database from the prefixes under the install root (mandatory after
        materializing layers: without it Spack sees the files but not the packages)."""
        self._run(["reindex"], envdir=envdir, log=log, what="spack reindex")

    def install_package(self, envdir: Path, dag_hash: str, log: Path, jobs: int = 0) -> None:
        """Build exactly one concrete spec of the environment, never its dependencies,
        never from a binary cache (what `spack env depfile` generates per package)."""
        args = ["install", "--only-concrete", "--only", "package", "--no-cache", "--fail-fast", "-v"]
        if jobs:
            args += ["-j", str(jobs)]
        self._run([*args, f"/{dag_hash}"], envdir=envdir, log=log, what=f"spack install /{dag_hash[:7]}")

    # -- fetch -----------------------------------------------------------------------
    def concretize(self, envdir: Path, log: Path, force: bool = False) -> None:
        """Concretize the environment. Where Spack says the environment's own input is wrong
        (:func:`input_error`: an unknown package, variant or version, a malformed spec), a
        UserError with Spack's lines; any other failure stays a ToolError (command, log)."""
        try:
            self._run(["concretize", *(["-f"] if force else [])], envdir=envdir, log=log, what="spack concretize")
        except ToolError as exc:
            lines = input_error(exc.quote)
            if lines:
                raise UserError("Spack cannot concretize it: " + " | ".join(lines)) from None
            raise

    def python_script(self, envdir: Path, script: Path, args: Sequence[str], log: Path) -> None:
        """Run a script with Spack's Python API inside the environment (``spack python``)."""
        self._run(["python", str(script), *args], envdir=envdir, log=log, what=f"spack python {Path(script).name}")

    def mirror_create(self, envdir: Path, mirror: Path, log: Path) -> None:
        self._run(["mirror", "create", "-d", str(mirror), "--all"], envdir=envdir, log=log, what="spack mirror create")

    # -- assembly ----------------------------------------------------------------------
    def view_regenerate(self, envdir: Path, log: Path) -> None:
        self._run(["env", "view", "regenerate"], envdir=envdir, log=log, what="spack env view regenerate")

    def activate_sh(self, envdir: Path, log: Optional[Path] = None) -> str:
        """Shell code that sets up the environment's view (PATH, package run environments)."""
        return self._run(["env", "activate", "--sh", "-d", str(envdir)], what="spack env activate --sh").stdout


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ERROR = re.compile(r"^==> (?:\[[^\]]*\] )?Error: ?(.*)$")  # with -d, Spack adds a [timestamp]
_NEXT = re.compile(r"^(?:==> |\[\+\] |\$ )")  # Spack's next message, an installed prefix, dedal's "$ cmd"
_EXCERPT_HEAD = re.compile(r"^\d+ (?:errors?|warnings?) found in build log:$")
_EXCERPT_HIT = re.compile(r"^\s*>>\s+\d+\s+(.*)$")
_EXCERPT_CONTEXT = re.compile(r"^\s+\d+\s")
_NUMBERED = re.compile(r"^\d+\.\s")
# the concretizer's reason for every package an unsatisfiable requirement touches (e.g. a
# `require: '%gcc@13'` on a base without GCC 13: one per package, the cause elsewhere)
_UNSATISFIED = re.compile(r"^\d+\.\s+cannot satisfy a requirement for package '([^']+)'\.?$")


def error_lines(text: str, limit: int = 10, width: int = 300) -> List[str]:
    """Spack's own error report in ``text`` (a command's output): each ``==> Error:``
    block, condensed to the lines a user needs. A failed command's tail is usually
    Spack's generic advice ("Use 'spack create' ...") or a repeat of the error, while the
    block says what is wrong: "Package 'zlibb' not found", the conflicts the concretizer
    found (their "required because" chains left out; its one-per-package "cannot satisfy
    a requirement" reasons as one line after them), the lines of a build log Spack
    marked as errors. Empty when there is no such block."""
    blocks: List[List[str]] = []
    current: Optional[List[str]] = None
    for raw in _ANSI.sub("", text).splitlines():
        line = raw.rstrip()
        m = _ERROR.match(line)
        if m:
            current = [m.group(1).strip()]
            blocks.append(current)
        elif current is not None:
            if _NEXT.match(line):
                current = None
            else:
                current.append(line)
    out: List[str] = []
    firsts: List[str] = []
    for block in blocks:
        if any(block[0].endswith(f) for f in firsts if f):
            continue  # "Terminating after first install failure: <the error above>"
        firsts.append(block[0])
        out += _condense(block)
    seen, lines = set(), []
    for line in out:
        key = _NUMBERED.sub("", line)
        if key not in seen:
            seen.add(key)
            lines.append(line if len(line) <= width else line[: width - 3] + "...")
    if len(lines) > limit:
        lines = lines[: limit - 1] + [f"... ({len(lines) - limit + 1} more lines in the log)"]
    return lines


# The first line of a Spack error that says the user's input is wrong: the same input fails
# the same way on every machine and every rerun, so it is bad input (exit 2, Spack's words),
# not a failed tool. Messages of Spack e8f8cf85 (June 2024), as it prints them in the base.
_INPUT_ERROR = re.compile(
    "|".join(
        [
            r"Package '[^']+' not found",  # spack.repo.UnknownPackageError
            r"Unknown namespace: ",  # spack.repo.UnknownNamespaceError
            r'trying to set variants? ".*" in package ".*", but the package has no such variants?',  # UnknownVariantError
            r'invalid values for variant "[^"]+"',  # InvalidVariantValueError
            r'multiple values are not allowed for variant "[^"]+"',  # MultipleValuesInExclusiveVariantError
            r"Invalid variant \S+ for spec ",  # InvalidVariantForSpecError
            r"unexpected tokens in the spec string",  # spack.parser.SpecSyntaxError
            r"\S+ cannot have multiple (?:versions|compilers)",  # the spec parser
            r"Package \S+ does not depend on ",  # InvalidDependencyError (zlib ^hdf5)
            r"No providers found for virtual package: ",  # NoProviderError
            r"Version requirement \S+ on \S+ for \S+ cannot match any known version",  # packages: require: '@99'
            r"Detected \d+ missing include path\(s\):",  # the environment's include: entries
        ]
    )
)
_CONCRETIZATION_FAILED = "concretization failed for the following reasons:"
# the reasons of a failed concretization that name versions the user's specs ask for, as in
# "Cannot satisfy 'zlib@99'" (no such version) or 'Cannot select a single "version"' (two
# specs ask for different ones); Spack leaves the closing quote off "Cannot satisfy 'a' and 'b"
_VERSION_REASON = re.compile(
    r"""^\d+\.\s+(?:Cannot satisfy '.*"""
    r"""|Cannot select a single "version" for package "[^"]+")$"""
)
_SPACK_ADVICE = ("Use 'spack create' to create a new package.",)


def input_error(quote: Sequence[str]) -> List[str]:
    """Spack's error lines (:func:`error_lines`) when they say the user's input is wrong,
    else []. Kept here, in one place, because only Spack's words tell a misspelled package
    from a broken Spack: an unknown package, namespace or variant, an invalid variant value,
    a malformed spec, a dependency the package does not have, a missing include file, and a
    concretization that fails only because no version satisfies what the specs ask for.
    Everything else stays a failed tool (exit 1, command and log): a concretization that
    fails on a compiler, OS, target or package requirement (often the base image's doing,
    such as a ``require: '%gcc@13'`` on a base without GCC 13), a solver that cannot be
    bootstrapped, a broken repository, Spack's own bugs. Returned without Spack's advice
    to run ``spack create`` and without the caret line under a malformed spec, which mean
    nothing once joined into one line."""
    lines = [line for line in quote if line.strip(" ^") and line not in _SPACK_ADVICE]
    if not lines or not lines[0].startswith("==> Error: "):
        return []
    first = lines[0][len("==> Error: ") :]
    if _INPUT_ERROR.match(first):
        return lines
    reasons = [line for line in lines[1:] if not line.startswith("==> Error: ")]
    if first == _CONCRETIZATION_FAILED and reasons and all(_VERSION_REASON.match(r) for r in reasons):
        return lines
    return []


def _condense(block: List[str]) -> List[str]:
    """One ``==> Error:`` block as lines: its message, an indented list or value joined
    to the line that introduces it ("...:", "...?"), build-log excerpts as the lines
    Spack marked with ``>>`` (context lines left out)."""
    lines = ["==> Error: " + block[0]] if block[0] else []
    unsatisfied: List[str] = []  # packages the generic "cannot satisfy a requirement" names
    excerpt = hit = False
    joining = " " if block[0].endswith((":", "?")) else ""  # joins the next indented line to the last
    for raw in block[1:]:
        text = raw.strip()
        if not text:
            excerpt = hit = False
            joining = ""
            continue
        if text.startswith("required because"):
            continue  # the concretizer's derivation of a conflict: long, and the conflict says it
        if excerpt:
            m = _EXCERPT_HIT.match(raw)
            if m:
                lines.append(">> " + m.group(1).strip())
                hit = True
            elif _EXCERPT_CONTEXT.match(raw):
                hit = False
            elif hit:
                lines[-1] += text  # Spack wraps long log lines at a fixed column
            continue
        m = _UNSATISFIED.match(text)
        if m:
            unsatisfied.append(m.group(1))
            continue
        indented = raw[:1].isspace() and not _NUMBERED.match(text)
        if indented and joining and lines:
            lines[-1] += joining + text
            joining = ", "
            continue
        lines.append(text)
        excerpt = bool(_EXCERPT_HEAD.match(text))
        joining = " " if text.endswith((":", "?")) else ""
    if unsatisfied:  # after the specific reasons (the conflicts), which say why
        shown = ", ".join(unsatisfied[:8]) + (f" and {len(unsatisfied) - 8} more" if len(unsatisfied) > 8 else "")
        lines.append(f"cannot satisfy a requirement for {len(unsatisfied)} package(s): {shown}")
    return lines


def user_cache(settings, spack_root: Path) -> Path:
    """A persistent Spack user cache per Spack checkout (repository index, misc cache)."""
    digest = hashlib.sha256(str(Path(spack_root).resolve()).encode()).hexdigest()[:12]
    return Path(settings.cache_dir) / "spack-user-cache" / digest


def locate(settings, spack_root: Optional[Path] = None) -> Path:
    """An existing Spack checkout: the given/configured one, else the one fetch cloned."""
    root = spack_root or settings.spack_root
    if root:
        root = Path(root)
        if not (root / "bin" / "spack").is_file():
            raise UserError(f"spack_root {root}: not a Spack checkout (no bin/spack)")
        return root
    cloned = Path(settings.cache_dir) / "spack" / settings.spack_ref
    if (cloned / "bin" / "spack").is_file():
        return cloned
    raise UserError(
        "no Spack available: set DEDAL_SPACK_ROOT (or spack_root) to a Spack checkout, "
        "or run `dedal fetch` where the Spack repository can be cloned"
    )
