"""The ELF closure of an image: every program and library under the install root and the
view finds each library it needs (``DT_NEEDED``) inside the image, as the dynamic loader
would look for it, except the host driver's (what ``apptainer --nv`` binds: the library
names of Apptainer's ``nvliblist.conf``, :data:`dedal.adapters.runtime.nvidia.NV_LIBRARIES`).

The loader's search, per file: its ``DT_RPATH`` (when it has no ``DT_RUNPATH``), the
image environment's ``LD_LIBRARY_PATH`` (:func:`library_path_of` its scripts: a package's
run environment may set one), its ``DT_RUNPATH``, then the directories of the image's ``/etc/ld.so.conf`` (and its
``include`` files: what ``/etc/ld.so.cache`` is made of) and the default directories;
``$ORIGIN`` is the directory of the file (its real path, as the loader takes it for a
program and for a library found through a symlink's directory alike), ``$LIB`` and
``$PLATFORM`` the architecture's. A candidate counts when it exists inside the image
(symlinks followed inside the image, never into the host) and has the file's ELF class
and machine. Libraries found outside the checked directories (the base's) are checked
in turn, so the closure is the whole chain. Files for another machine or word size (CUDA
device code is ELF too; 32-bit multilib files) are passed over; files that start like ELF but cannot be read are listed.

Pure Python (:mod:`dedal.model.elf`), no container runtime and no ``ldd``: it runs on the
image tree at assembly, before anything is packed, so that an image whose software
cannot start is never written.
"""

from __future__ import annotations

import collections
import glob
import os
import posixpath
import re
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple

from dedal.adapters.runtime.common import resolve_in_image
from dedal.adapters.runtime.nvidia import NV_LIBRARIES
from dedal.errors import UserError
from dedal.model.elf import MACHINES, ElfError, ElfFile, elf_id, read_elf

#: multiarch triplet ($LIB is lib/<triplet> on Debian) and $PLATFORM, per architecture
_ARCH_DIRS = {
    "amd64": ("x86_64-linux-gnu", "x86_64"),
    "arm64": ("aarch64-linux-gnu", "aarch64"),
    "ppc64le": ("powerpc64le-linux-gnu", "powerpc64le"),
    "386": ("i386-linux-gnu", "i686"),
}
_SHOWN = 12  # files named in the error (all of them in the report and the log)


def host_driver_library(name: str) -> bool:
    """Whether ``name`` is one of the libraries the host's driver provides at run time."""
    return name.startswith(NV_LIBRARIES)


@dataclass
class ClosureReport:
    """What the check found: ``missing`` maps a file (path in the image) to the libraries it
    needs that are nowhere in the image; ``host_driver`` the driver's libraries needed (left
    to the host) and how many files need each."""

    checked: int = 0  # dynamically linked ELF files checked
    elf_files: int = 0  # ELF files seen under the directories
    missing: Dict[str, List[str]] = field(default_factory=dict)
    host_driver: Dict[str, int] = field(default_factory=dict)
    unreadable: Dict[str, str] = field(default_factory=dict)
    foreign: int = 0  # ELF files of another machine, passed over
    opened: List[str] = field(default_factory=list)  # the paths the loader opens (symlinks kept)

    @property
    def ok(self) -> bool:
        return not self.missing

    def to_json(self) -> Dict[str, object]:
        """Its fields but ``opened``, the paths an ELF copy must keep: what the check found, not its working list."""
        return {k: v for k, v in asdict(self).items() if k != "opened"}

    def problem(self, where: str, log: Optional[Path] = None) -> str:
        """One line: the files with missing libraries (the first few) and where the rest is."""
        items = sorted(self.missing.items())
        shown = "; ".join(f"{path}: {', '.join(libs)}" for path, libs in items[:_SHOWN])
        more = f"; and {len(items) - _SHOWN} more file(s)" if len(items) > _SHOWN else ""
        names = sorted({lib for libs in self.missing.values() for lib in libs})
        return (
            f"{where}: {len(items)} ELF file(s) need libraries that are not in the image "
            f"({', '.join(names)}) and are not the host driver's: {shown}{more}"
            + (f" (full list in {log})" if log else "")
        )


_LD_LIBRARY_PATH = re.compile(r"^\s*(?:export\s+)?LD_LIBRARY_PATH=(.*)$", re.M)


def library_path_of(script: str) -> List[str]:
    """The directories an environment script puts on ``LD_LIBRARY_PATH`` (its literal,
    absolute entries; ``$LD_LIBRARY_PATH`` and other expansions left out)."""
    dirs: List[str] = []
    for value in _LD_LIBRARY_PATH.findall(script):
        value = re.sub(r"\$\{[^}]*\}", ":", value.split(";", 1)[0])  # ${VAR:+:$VAR}: no entry of its own
        value = re.sub(r"\$[A-Za-z_][A-Za-z0-9_]*", "\0", value)  # $HOME/lib: not a literal directory
        for entry in value.replace('"', "").replace("'", "").split(":"):
            entry = entry.strip()
            if entry.startswith("/") and "\0" not in entry and posixpath.normpath(entry) not in dirs:
                dirs.append(posixpath.normpath(entry))
    return dirs


def ld_so_conf_dirs(root: Path, conf: str = "/etc/ld.so.conf", depth: int = 0) -> List[str]:
    """The directories of the image's ld.so.conf, ``include`` globs followed inside the image."""
    found: List[str] = []
    host = root / conf.lstrip("/")
    if depth > 10 or not host.is_file():
        return found
    for raw in host.read_text(errors="replace").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("hwcap "):
            continue
        if line.startswith("include "):
            for pattern in line.split()[1:]:
                pattern = pattern if pattern.startswith("/") else posixpath.join(posixpath.dirname(conf), pattern)
                for match in sorted(glob.glob(str(root / pattern.lstrip("/")))):
                    found += [
                        d
                        for d in ld_so_conf_dirs(root, "/" + os.path.relpath(match, root), depth + 1)
                        if d not in found
                    ]
            continue
        for d in line.replace(",", " ").split():
            d = d.split("=", 1)[0]  # the old "dir=TYPE" form
            if d.startswith("/") and d not in found:
                found.append(posixpath.normpath(d))
    return found


def system_dirs(root: Path, arch: str = "amd64") -> List[str]:
    """Where the loader looks after a file's own paths: ld.so.conf's, then the defaults."""
    triplet = _ARCH_DIRS.get(arch, _ARCH_DIRS["amd64"])[0]
    dirs = ld_so_conf_dirs(root)
    for d in (f"/lib/{triplet}", f"/usr/lib/{triplet}", "/lib64", "/usr/lib64", "/lib", "/usr/lib"):
        if d not in dirs:
            dirs.append(d)
    return dirs


class _Resolver:
    def __init__(self, root: Path, arch: str, library_path: Sequence[str] = ()) -> None:
        self.root = root
        self.library_path = list(library_path)
        self.lib, self.platform = _ARCH_DIRS.get(arch, _ARCH_DIRS["amd64"])
        self.lib = f"lib/{self.lib}"
        self.system = system_dirs(root, arch)
        self.found: Dict[Tuple[str, str, Tuple[int, int]], Optional[str]] = {}
        self.opened: Dict[str, None] = {}  # directory/name of every library found, as the loader opens it

    def real(self, cpath: str) -> Optional[str]:
        """The image path ``cpath`` leads to (symlinks resolved inside the image), None if absent."""
        try:
            existing, missing = resolve_in_image(self.root, cpath)
        except UserError:  # a symlink loop
            return None
        return None if missing else existing

    def expand(self, entries: Sequence[str], origin: str) -> List[str]:
        out = []
        for e in entries:
            for token, value in (("ORIGIN", origin), ("LIB", self.lib), ("PLATFORM", self.platform)):
                e = e.replace("${" + token + "}", value).replace("$" + token, value)
            if e.startswith("/"):  # relative entries are relative to the working directory: not the image's
                out.append(posixpath.normpath(e))
        return out

    def lookup(self, directory: str, name: str, ident: Tuple[int, int]) -> Optional[str]:
        key = (directory, name, ident)
        if key not in self.found:
            path = self.real(posixpath.join(directory, name))
            hit = None
            if path is not None:
                host = self.root / path.lstrip("/")
                hit = path if host.is_file() and elf_id(host) == ident else None
            self.found[key] = hit
        return self.found[key]

    def resolve(self, elf: ElfFile, cpath: str, name: str) -> Optional[str]:
        """Where the loader finds ``name`` for the file ``cpath`` (image path), None if nowhere."""
        origin = posixpath.dirname(cpath)
        if "/" in name:
            return self.real(name if name.startswith("/") else posixpath.join(origin, name))
        dirs = [] if elf.runpath else self.expand(elf.rpath, origin)
        dirs += self.library_path + self.expand(elf.runpath, origin) + self.system
        for d in dirs:
            hit = self.lookup(d, name, elf.ident)
            if hit is not None:
                self.opened[posixpath.join(d, name)] = None
                return hit
        return None


def _elf_files(root: Path, dirs: Sequence[str]) -> List[str]:
    """Image paths of the regular files (symlinks not followed, each inode once) under
    ``dirs`` that start like ELF."""
    seen: Set[Tuple[int, int]] = set()
    out: List[str] = []
    for d in dirs:
        top = root / d.lstrip("/")
        if top.is_symlink() or not top.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                try:
                    st = os.lstat(full)
                    if not stat.S_ISREG(st.st_mode) or st.st_size < 52 or (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                    with open(full, "rb") as fh:
                        if fh.read(4) != b"\x7fELF":
                            continue
                except OSError:
                    continue
                out.append("/" + os.path.relpath(full, root))
    return out


def check_closure(
    root: Path, dirs: Sequence[str], *, arch: str = "amd64", library_path: Sequence[str] = ()
) -> ClosureReport:
    """Check every ELF file under the image directories ``dirs`` (image paths) of the image
    tree ``root`` and, in turn, every library they load from elsewhere in the image;
    ``library_path``: the image environment's LD_LIBRARY_PATH."""
    return elf_closure(root, _elf_files(Path(root), dirs), arch=arch, library_path=library_path)[1]


def elf_closure(
    root: Path, files: Sequence[str], *, arch: str = "amd64", library_path: Sequence[str] = ()
) -> Tuple[List[str], ClosureReport]:
    """The ELF closure of ``files`` (image paths of the image tree ``root``, symlinks followed
    inside the image): the files and, in turn, every library they load, as the loader finds
    them (their image paths, the files themselves first), and the report of what is missing
    (:func:`check_closure`'s), with the paths the loader opens (``opened``: the symlinks of the
    library names, which a copy of these files must keep)."""
    root = Path(root)
    machine = MACHINES.get(arch, MACHINES["amd64"])
    width = 1 if arch == "386" else 2  # x32 or 32-bit multilib files in a 64-bit image: not its programs
    resolver = _Resolver(root, arch, library_path)
    report = ClosureReport()
    queue = collections.deque(dict.fromkeys(resolver.real(f) or f for f in files))  # a symlink: its file
    report.elf_files = len(queue)
    done: Dict[str, None] = dict.fromkeys(queue)
    while queue:
        cpath = queue.popleft()
        try:
            elf = read_elf(root / cpath.lstrip("/"))
        except (OSError, ElfError) as exc:
            report.unreadable[cpath] = str(exc)
            continue
        if elf is None:
            continue
        if elf.machine != machine or elf.elf_class != width:
            report.foreign += 1
            continue
        if not elf.dynamic:
            continue
        report.checked += 1
        missing: List[str] = []
        if elf.interp and resolver.real(elf.interp) is None:
            missing.append(elf.interp)
        for name in elf.needed:
            if host_driver_library(name):
                report.host_driver[name] = report.host_driver.get(name, 0) + 1
                continue
            hit = resolver.resolve(elf, cpath, name)
            if hit is None:
                missing.append(name)
            elif hit not in done:
                done[hit] = None
                queue.append(hit)
        if missing:
            report.missing[cpath] = missing
    report.opened = list(resolver.opened)
    return list(done), report


def require_closure(
    root: Path,
    dirs: Sequence[str],
    *,
    arch: str,
    where: str,
    log: Optional[Path] = None,
    library_path: Sequence[str] = (),
) -> ClosureReport:
    """:func:`check_closure`, written to ``log``; a UserError naming the files and the libraries
    they miss when any is missing."""
    report = check_closure(root, dirs, arch=arch, library_path=library_path)
    if log is not None:
        with open(log, "a") as fh:
            fh.write(
                f"ELF closure of {', '.join(dirs)}: {report.checked} dynamically linked file(s) checked, "
                f"{report.foreign} of another machine passed over; host driver's libraries left to the host: "
                f"{', '.join(sorted(report.host_driver)) or 'none'}\n"
            )
            for path, libs in sorted(report.missing.items()):
                fh.write(f"  missing for {path}: {', '.join(libs)}\n")
            for path, problem in sorted(report.unreadable.items()):
                fh.write(f"  unreadable ELF {path}: {problem}\n")
    if not report.ok:
        raise UserError(report.problem(where, log))
    return report
