"""debootstrap and apt: a Debian root filesystem for base images.

``bootstrap`` runs ``debootstrap --variant=minbase`` on the host (root needed);
``apt_install`` runs apt-get inside the new root through the runtime adapter
(bubblewrap, writable, the host's resolv.conf; no tmpfs on /tmp because apt's
``_apt`` user must be able to write there: real-components §4).
``installed_packages`` reads the root's dpkg database (no process).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
import shutil
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from dedal.adapters import proc, runtime
from dedal.errors import ToolError, UserError

HINT = "install debootstrap and debian-archive-keyring (apt-get install debootstrap debian-archive-keyring)"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_SECURITY_MIRROR = "http://deb.debian.org/debian-security"
APT_ENV = {"DEBIAN_FRONTEND": "noninteractive", "DEBCONF_NONINTERACTIVE_SEEN": "true"}


def _source_files(etc_apt: Path) -> List[Path]:
    files = []
    main = etc_apt / "sources.list"
    if main.is_file():
        files.append(main)
    d = etc_apt / "sources.list.d"
    if d.is_dir():
        files += sorted(p for p in d.iterdir() if p.suffix in (".list", ".sources") and p.is_file())
    return files


def host_sources(etc_apt: Path = Path("/etc/apt")) -> List[Dict[str, List[str]]]:
    """The host's apt sources (one-line ``.list`` and deb822 ``.sources``): uris, suites, types."""
    entries: List[Dict[str, List[str]]] = []
    for path in _source_files(etc_apt):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if path.suffix == ".list":
            for line in text.splitlines():
                line = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()  # type: ignore[assignment]
                if len(line) >= 3 and line[0] in ("deb", "deb-src"):
                    entries.append({"types": [line[0]], "uris": [line[1]], "suites": [line[2]]})
        else:
            for stanza in re.split(r"\n\s*\n", text):
                fields: Dict[str, List[str]] = {}
                for raw in stanza.splitlines():
                    if raw.lstrip().startswith("#") or ":" not in raw or raw[:1].isspace():
                        continue
                    key, value = raw.split(":", 1)
                    fields[key.strip().lower()] = value.split()
                if fields.get("enabled", ["yes"])[0].lower() == "no":
                    continue
                if "uris" in fields and "suites" in fields:
                    entries.append(
                        {"types": fields.get("types", ["deb"]), "uris": fields["uris"], "suites": fields["suites"]}
                    )
    return entries


def host_mirrors(etc_apt: Path = Path("/etc/apt")) -> Dict[str, str]:
    """``{"archive": URI, "security": URI}`` of the Debian mirrors the host uses (missing keys
    when the host has none, e.g. a non-Debian host)."""
    found: Dict[str, str] = {}
    for entry in host_sources(etc_apt):
        if "deb" not in entry["types"]:
            continue
        for uri in entry["uris"]:
            u = uri.rstrip("/")
            security = any(s.endswith("-security") or "/updates" in s for s in entry["suites"])
            if security and u.endswith("debian-security"):
                found.setdefault("security", u)
            elif not security and u.endswith("/debian"):
                found.setdefault("archive", u)
    return found


def bootstrap(
    target: Path,
    suite: str,
    mirror: str,
    *,
    variant: str = "minbase",
    arch: str = "amd64",
    log: Optional[Path] = None,
    timeout: Optional[float] = None,
) -> None:
    """``debootstrap --variant=VARIANT --arch=ARCH SUITE TARGET MIRROR`` (needs root: the
    base stage says so before it comes here, :func:`dedal.stages.base.check_can_build`)."""
    exe = proc.which("debootstrap", HINT)
    target.mkdir(parents=True, exist_ok=True)
    proc.run(
        [exe, f"--variant={variant}", f"--arch={arch}", suite, os.fspath(target), mirror],
        what=f"debootstrap {suite}",
        log=log,
        timeout=timeout,
        env={**os.environ, "LC_ALL": "C"},
    )


def write_sources(
    root: Path,
    suite: str,
    mirror: str,
    *,
    updates: bool,
    security: Optional[str],
    components: Sequence[str] = ("main",),
) -> None:
    """The root's own apt sources (deb822), as the image will keep them: the archive areas
    ``components`` (main, contrib, non-free, ...) of the suite, its updates and security."""
    areas = " ".join(components)
    lines = [
        "Types: deb",
        f"URIs: {mirror}",
        f"Suites: {suite}" + (f" {suite}-updates" if updates else ""),
        f"Components: {areas}",
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg",
        "",
    ]
    if security:
        lines += [
            "Types: deb",
            f"URIs: {security}",
            f"Suites: {suite}-security",
            f"Components: {areas}",
            "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg",
            "",
        ]
    d = root / "etc/apt/sources.list.d"
    d.mkdir(parents=True, exist_ok=True)
    (d / "debian.sources").write_text("\n".join(lines))
    old = root / "etc/apt/sources.list"
    if old.exists():
        old.unlink()


def apt(
    root: Path,
    args: Sequence[str],
    *,
    log: Optional[Path] = None,
    what: str = "apt-get",
    timeout: Optional[float] = None,
) -> None:
    """``apt-get ARGS`` inside ``root`` (writable, bubblewrap, host resolv.conf)."""
    runtime.run_in(
        root,
        ["apt-get", "-q", "-o", "Dpkg::Use-Pty=0", "-o", "Acquire::Languages=none", *args],
        env=APT_ENV,
        log=log,
        what=what,
        runtime="bwrap",
        writable=True,
        timeout=timeout,
    )


def apt_install(
    root: Path, packages: Iterable[str], *, log: Optional[Path] = None, timeout: Optional[float] = None
) -> None:
    """apt-get update + install --no-install-recommends + clean, inside ``root``."""
    pkgs = list(packages)
    apt(root, ["update"], log=log, what="apt-get update", timeout=timeout)
    if pkgs:
        try:
            apt(
                root,
                ["install", "-y", "--no-install-recommends", *pkgs],
                log=log,
                what="apt-get install",
                timeout=timeout,
            )
        except ToolError as exc:
            text = Path(log).read_text(errors="replace") if log else ""
            m = re.search(r"E: (Unable to locate package \S+|Package '\S+' has no installation candidate)", text)
            if m:
                raise UserError(f"base image packages: {m.group(1)} (see {log})") from None
            raise exc
    apt(root, ["clean"], log=log, what="apt-get clean")


def python_venv(
    root: Path, venv: str, packages: Iterable[str], *, log: Optional[Path] = None, timeout: Optional[float] = None
) -> None:
    """A Python virtual environment inside ``root`` with ``packages`` from PyPI (e.g. clingo
    for Spack's concretizer, which Debian does not package).

    The wheels are downloaded on the host, with the host's pip configuration (index,
    proxy, CA bundle), for the root's Python version, then installed inside the root
    without network: a site's TLS-intercepting proxy is trusted by the host, not by a
    fresh Debian root."""
    runtime.run_in(
        root,
        ["python3", "-m", "venv", venv],
        log=log,
        what="python3 -m venv",
        runtime="bwrap",
        writable=True,
        timeout=timeout,
    )
    pkgs = list(packages)
    if not pkgs:
        return
    pyver = runtime.run_in(
        root,
        [f"{venv}/bin/python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        what="python3 --version",
        runtime="bwrap",
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="dedal-wheels-") as wheels:
        proc.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--only-binary=:all:",
                "--python-version",
                pyver,
                "--implementation",
                "cp",
                "--platform",
                "manylinux_2_28_x86_64",
                "--platform",
                "manylinux2014_x86_64",
                "-d",
                wheels,
                *pkgs,
            ],
            log=log,
            what="pip download",
            timeout=timeout,
        )
        runtime.run_in(
            root,
            [
                f"{venv}/bin/python3",
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--find-links",
                "/opt/dedal-wheels",
                *pkgs,
            ],
            binds=[runtime.Bind(wheels, "/opt/dedal-wheels", readonly=True)],
            log=log,
            what="pip install",
            runtime="bwrap",
            writable=True,
            timeout=timeout,
        )
    # pip (and ensurepip) compile timestamp-based bytecode: the source files' install times
    # inside every .pyc make each build of the base different bytes. Hash-based bytecode
    # that Python never re-checks (the image is read-only) is the same on every build
    # (reproducible-builds.org, "Python bytecode"; PEP 552)
    runtime.run_in(
        root,
        [f"{venv}/bin/python3", "-m", "compileall", "-q", "-f", "--invalidation-mode", "unchecked-hash", venv],
        log=log,
        what="python3 -m compileall",
        runtime="bwrap",
        writable=True,
        timeout=timeout,
    )


def clean_root(root: Path) -> None:
    """Drop what a base should not carry: apt lists and caches, logs, the build's /tmp."""
    for rel in ("var/lib/apt/lists", "var/cache/apt", "var/cache/debconf", "tmp", "var/tmp", "var/log"):
        d = root / rel
        if not d.is_dir():
            continue
        for entry in d.iterdir():
            if entry.name in ("partial", "lock", "auxfiles", "config.dat", "templates.dat", "passwords.dat"):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                try:
                    entry.unlink()
                except OSError:
                    pass
    for f in ("var/cache/ldconfig/aux-cache", "etc/machine-id"):
        p = root / f
        if p.is_file():
            p.write_text("") if f.endswith("machine-id") else p.unlink()


def apt_releases(root: Path) -> Dict[str, Dict[str, str]]:
    """What apt fetched from the live mirror (to be read before ``clean_root``): per
    Release file, its ``Date:`` and sha256. A base rebuilt from the same definition is
    the same only from the same Release files: these tell "the mirror moved on" from
    "the build is not reproducible"."""
    found: Dict[str, Dict[str, str]] = {}
    lists = root / "var/lib/apt/lists"
    if not lists.is_dir():
        return found
    for path in sorted(lists.iterdir()):
        if not path.name.endswith(("_InRelease", "_Release")) or not path.is_file():
            continue
        data = path.read_bytes()
        m = re.search(rb"^Date:\s*(.+)$", data, re.M)
        found[path.name] = {
            "date": m.group(1).decode(errors="replace").strip() if m else "",
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    return found


def installed_packages(root: Path) -> Dict[str, str]:
    """``{package: version}`` of what dpkg has installed in ``root`` (from /var/lib/dpkg/status)."""
    status = root / "var/lib/dpkg/status"
    if not status.is_file():
        raise UserError(f"{root}: no dpkg database (not a Debian root filesystem)")
    result: Dict[str, str] = {}
    for stanza in status.read_text(errors="replace").split("\n\n"):
        fields: Dict[str, str] = {}
        for line in stanza.splitlines():
            if line[:1].isspace() or ":" not in line:
                continue
            k, v = line.split(":", 1)
            fields[k] = v.strip()
        if "Package" in fields and "install ok installed" in fields.get("Status", ""):
            name = fields["Package"]
            if fields.get("Architecture") not in (None, "all", "") and name in result:
                continue
            result[name] = fields.get("Version", "")
    return result
