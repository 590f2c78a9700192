#!/usr/bin/env python3
"""The bundle of the GPU verification kit (``benchmarks/gpu/README.md``): everything that
``benchmarks/gpu/kit.sh`` needs to run ``dedal verify`` of a GPU image on a machine with a GPU,
no network and at most 64 MiB carried (this checkout included), made here, without a GPU.

    .venv/bin/python benchmarks/gpu/make_bundle.py IMAGE.sif [-o .gpu-kit] [--budget-mib 56]
                                                   [--build-root DIR] [--keep-over-mib 64]

Writes into OUT (default ``.gpu-kit/`` of this checkout, which ``.git/info/exclude`` ignores):

- ``root.tar.xz``: the image slimmed to the ELF closure of what ``dedal verify`` runs: the
  programs it looks for (``dedal_*``, ``osu_*``, ``all_reduce_perf``, ``mpirun``, ``ompi_info``,
  ``ucx_info``, ``ucx_perftest``), the launcher's own programs (``prterun``, ``prted``), the
  shell and the few tools the image's environment scripts and dedal's wrappers use; then the
  plugin directories of the MPI, PMIx, PRRTE, UCX, hwloc and libfabric libraries in that closure
  (their components are opened at run time, not linked) and, in turn, their closure; the help
  texts and configuration of those packages, ``/.singularity.d``, the Spack metadata dedal reads
  (``.spack/spec.json``), a few files of ``/etc``, and every top-level directory, empty (not the
  image's own ``apptainer test``, which checks the whole image and would fail the slimmed one). A file
  larger than ``--keep-over-mib`` (NCCL: 241 MB for every GPU architecture) is left out and
  named in the manifest: ``kit.sh`` puts the host's library of that name in its place, and says so.
- what the image lacks for the GPU checks, built here with the image's own ``mpicc`` (in the
  image, else in ``--build-root`` with the image's install tree at its place): dedal's
  benchmarks from this checkout where the image's predate ``-d cuda`` or ``dedal_cuda_floor``,
  in ``/opt/dedal-verify/kit/bin``, first on the image's ``PATH`` (``92-dedal-kit.sh``);
- Spack's ``mpirun`` stub of ``openmpi schedulers=slurm ~legacylaunchers`` replaced by Open
  MPI 5's own ``prterun --personality ompi`` (the stub only says "use srun"; one GPU machine has
  no Slurm), recorded in ``/.dedal-kit.json`` inside the root;
- ``runtime/``: bubblewrap with the libraries and loader it runs with (``runtime/bwrap`` runs it
  through that loader, so it works on any glibc), for a machine without bwrap and Apptainer;
- ``dedal.tar.gz``: dedal's source (the package, ``pyproject.toml``, the benchmark sources) for a
  machine without this checkout (the device tool carries the checkout itself);
- ``manifest.json``: what went in, what was left out and why, the sizes.

Fails (exit 2, one line) when the bundle with this checkout would exceed ``--budget-mib``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import posixpath
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set, Tuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from dedal.adapters import runtime  # noqa: E402
from dedal.adapters.runtime.common import resolve_in_image  # noqa: E402
from dedal.errors import DedalError, UserError  # noqa: E402
from dedal.model.elf import read_elf  # noqa: E402
from dedal.model.image import ENV_TEST, TEST_FILE  # noqa: E402
from dedal.stages.assemble import elf_closure  # noqa: E402
from dedal.stages.assemble.closure import library_path_of  # noqa: E402
from dedal.stages.verify import image as img  # noqa: E402
from dedal.stages.verify.native import unpack_root  # noqa: E402

KIT_BIN = "/opt/dedal-verify/kit/bin"
#: programs of the image that verify, its launcher or kit.sh's optional steps run, besides img.PROGRAMS
LAUNCHER = ("prterun", "prted", "prte", "pterm", "orted", "mpiexec", "ucx_perftest", "nvidia-smi")
#: the GPU application benchmark of esd-gpu's environment file (busyring-gpu: the container paper's
#: Arbor ring on the GPU), where the image has it: kit.sh runs it with the env file's apps
APPS = ("busyring", "busyring-input")
#: what the image's environment scripts, dedal's wrappers (/bin/sh -c ...) and kit.sh use
SHELL_TOOLS = (
    "sh",
    "bash",
    "dash",
    "env",
    "cat",
    "hostname",
    "grep",
    "sed",
    "head",
    "tail",
    "mkdir",
    "rm",
    "ls",
    "id",
    "uname",
    "sleep",
    "mktemp",
    "tr",
    "cut",
    "sort",
    "uniq",
    "dirname",
    "basename",
    "readlink",
    "realpath",
    "date",
    "true",
    "false",
    "printf",
    "echo",
    "test",
    "[",
    "wc",
    "touch",
    "chmod",
    "ln",
    "cp",
    "mv",
    "which",
    "timeout",
    "tee",
    "nproc",
    "getconf",
    "stat",
    "du",
    "awk",
    "mawk",
    "xargs",
)
#: libraries whose packages open components at run time: their sibling plugin directories are kept
PLUGIN_LIBS = (
    "libmpi",
    "libopen-pal",
    "libopen-rte",
    "libpmix",
    "libprrte",
    "libucp",
    "libuct",
    "libucs",
    "libucm",
    "libhwloc",
    "libevent",
    "libfabric",
)
PLUGIN_DIRS = ("openmpi", "pmix", "prte", "prrte", "ucx", "hwloc", "libfabric")
#: components for other vendors' accelerators and graphics (ROCm/HIP, Level Zero, OpenCL, OpenGL): opened at
#: run time where present, passed over where not; they pull in HIP, LLVM and X11 (over 200 MB in Debian's Open MPI)
OTHER_VENDORS = ("rocm", "_hip", "hip_", "levelzero", "_ze", "opencl", "rsmi", "_gl.", "_gl_")
#: configuration and help texts of those packages (under their prefix, or / and /usr)
DATA_DIRS = ("share/openmpi", "share/pmix", "share/prte", "share/prrte", "share/ucx", "share/hwloc", "etc")
SYSTEM_DATA = (
    "/etc/openmpi",
    "/etc/pmix",
    "/etc/prte",
    "/etc/prrte",
    "/etc/ucx",
    "/etc/hwloc",
    "/usr/share/openmpi",
    "/usr/share/pmix",
    "/usr/share/prte",
    "/usr/share/prrte",
    "/usr/share/ucx",
    "/usr/share/hwloc",
)
ETC_FILES = (
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ld.so.cache",
    "/etc/os-release",
    "/etc/hostname",
    "/etc/shells",
    "/usr/lib/os-release",
)
#: what a kept directory tree leaves out: for building, not for running
SKIP_DIRS = ("include", "pkgconfig", "man", "doc", "cmake", "__pycache__")
SKIP_FILES = (".a", ".la", ".h", ".hpp", ".pc")
MIB = 1 << 20


def say(text: str) -> None:
    print(f"make_bundle: {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- what verify runs


class Slim:
    """The set of image paths to keep (files, symlinks, directories), found inside ``root``."""

    def __init__(self, root: Path, keep_over: int) -> None:
        self.root = root
        self.keep_over = keep_over
        self.paths: Dict[str, None] = {}
        self.left_out: Dict[str, int] = {}

    def real(self, cpath: str) -> Optional[str]:
        try:
            existing, missing = resolve_in_image(self.root, cpath)
        except UserError:
            return None
        return None if missing else existing

    def add(self, cpath: str, depth: int = 0) -> Optional[str]:
        """Keep ``cpath``: every symlink on the way (each component, each link of a chain such as
        mpirun -> /etc/alternatives/mpirun -> mpirun.openmpi), and the file or directory it leads
        to; returns that real image path (None: not in the image)."""
        parts = [p for p in cpath.split("/") if p]
        cur = ""
        for i, part in enumerate(parts):
            cur = f"{cur}/{part}"
            host = self.root / cur.lstrip("/")
            if host.is_symlink():
                self.paths[cur] = None
                if depth > 40:
                    return None
                target = os.readlink(host)
                nxt = target if target.startswith("/") else posixpath.join(posixpath.dirname(cur), target)
                rest = "/".join(parts[i + 1 :])
                return self.add(posixpath.normpath(nxt + ("/" + rest if rest else "")), depth + 1)
        host = self.root / cur.lstrip("/")
        if not host.exists():
            return None
        if host.is_file() and host.stat().st_size > self.keep_over:
            self.left_out[cur] = host.stat().st_size
            return None
        self.paths[cur] = None
        return cur

    def drop(self, *cpaths: str) -> List[str]:
        """Keep these paths out after all; returns those that were kept."""
        return [p for p in cpaths if self.paths.pop(p, False) is None]

    def add_tree(self, cpath: str) -> List[str]:
        """Keep a directory with everything in it; returns its regular files (image paths)."""
        real = self.add(cpath)
        if real is None or not (self.root / real.lstrip("/")).is_dir():
            return [real] if real else []
        files = []
        for dirpath, dirnames, filenames in os.walk(self.root / real.lstrip("/")):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
            rel = "/" + os.path.relpath(dirpath, self.root)
            for name in sorted(
                dirnames
                + [
                    f
                    for f in filenames
                    if not f.endswith(SKIP_FILES) and not any(v in f.lower() for v in OTHER_VENDORS)
                ]
            ):
                got = self.add(f"{rel}/{name}")
                if got and (self.root / got.lstrip("/")).is_file():
                    files.append(got)
        return files


def image_path_dirs(info: img.ImageInfo) -> List[str]:
    return [d for d in (info.image_path_var or "/usr/bin:/bin").split(":") if d.startswith("/")]


def find_programs(slim: Slim, info: img.ImageInfo, names: Iterable[str]) -> List[str]:
    """The image paths of ``names`` on the image's PATH (the first hit of each)."""
    out = []
    for name in names:
        for d in image_path_dirs(info) + ["/usr/sbin", "/sbin"]:
            # links resolved inside the image: Spack's /opt/view is an absolute link into it
            if slim.real(f"{d}/{name}") is not None:
                got = slim.add(f"{d}/{name}")
                if got:
                    out.append(got)
                break
    return out


def env_library_path(root: Path) -> List[str]:
    dirs: List[str] = []
    for script in sorted((root / ".singularity.d" / "env").glob("*.sh")):
        dirs += [d for d in library_path_of(script.read_text(errors="replace")) if d not in dirs]
    return dirs


def closure(slim: Slim, starts: List[str], library_path: List[str], arch: str) -> Tuple[List[str], Dict]:
    """Keep ``starts`` and their ELF closure, the loaders they ask for, and, for the libraries
    that open components at run time, those plugin directories and their closure in turn."""
    done: Set[str] = set()
    missing: Dict[str, List[str]] = {}
    todo = [s for s in starts if s]
    while todo:
        files, report = elf_closure(slim.root, todo, arch=arch, library_path=library_path)
        missing.update(report.missing)
        for opened in report.opened:  # libmpi.so.40 -> libmpi.so.40.40.7: the name the loader opens
            slim.add(posixpath.normpath(opened))
        todo = []
        for f in files:
            if f in done:
                continue
            done.add(f)
            slim.add(f)
            try:
                elf = read_elf(slim.root / f.lstrip("/"))
            except (OSError, ValueError):
                elf = None
            if elf is not None and elf.interp:
                slim.add(elf.interp)
            name = os.path.basename(f)
            if name.startswith(PLUGIN_LIBS):
                libdir = os.path.dirname(f)
                for sub in sorted(os.listdir(slim.root / libdir.lstrip("/"))):
                    if sub.startswith(PLUGIN_DIRS) and (slim.root / libdir.lstrip("/") / sub).is_dir():
                        todo += [p for p in slim.add_tree(f"{libdir}/{sub}") if p not in done and _is_elf(slim, p)]
                prefix = os.path.dirname(libdir) if os.path.basename(libdir) in ("lib", "lib64") else ""
                if prefix.startswith("/opt/"):
                    for d in DATA_DIRS:
                        if (slim.root / prefix.lstrip("/") / d).is_dir():
                            slim.add_tree(f"{prefix}/{d}")
        todo = list(dict.fromkeys(todo))
    return sorted(done), missing


def _is_elf(slim: Slim, cpath: str) -> bool:
    try:
        with open(slim.root / cpath.lstrip("/"), "rb") as fh:
            return fh.read(4) == b"\x7fELF"
    except OSError:
        return False


# ---------------------------------------------------------------------------- what the image lacks


def build_benchmarks(info: img.ImageInfo, root: Path, out: Path, build_root: Optional[Path]) -> Tuple[List[str], str]:
    """dedal's benchmarks the image lacks for the GPU checks, built with its mpicc into ``out``
    (in the image; else in ``build_root`` with the image's install tree bound at its place)."""
    names: List[str] = []
    if not any(p in info.programs for p in img.BUNDLED_MPI):
        names += list(img.BUNDLED_MPI)
    if img.CUDA_FLOOR not in info.programs:
        names.append(img.CUDA_FLOOR)
    if not info.dedal_cuda:
        names += [p for p in img.DEVICE_MPI if p not in names]
    if not names:
        return [], "the image carries every benchmark the GPU checks run"
    if "mpicc" not in info.programs:
        return [], f"the image has no mpicc: {', '.join(names)} not built"
    src = img.bundled_sources()
    out.mkdir(parents=True, exist_ok=True)
    script = " && ".join(
        f"mpicc -O2 -std=c11 -I/opt/dedal-verify/src -o /opt/dedal-verify/out/{n} /opt/dedal-verify/src/{n}.c -ldl"
        for n in names
    )
    binds = [runtime.Bind(src, "/opt/dedal-verify/src", readonly=True), runtime.Bind(out, "/opt/dedal-verify/out")]
    where = f"with the image's mpicc ({info.programs['mpicc']})"
    try:
        runtime.run_in(root, ["/bin/sh", "-c", script], binds=binds, what="mpicc in the image", timeout=600)
    except DedalError as exc:
        if build_root is None:
            raise UserError(
                f"the image cannot build {', '.join(names)} ({exc.one_line()[:300]}); give --build-root "
                "DIR, a root filesystem with a C compiler (the image's build base)"
            ) from None
        install = info.install_root or "/opt/esd/software"
        binds.append(runtime.Bind(root / install.lstrip("/"), install, readonly=True))
        env = {"PATH": f"{os.path.dirname(info.programs['mpicc'])}:/usr/bin:/bin"}
        runtime.run_in(
            build_root, ["/bin/sh", "-c", script], binds=binds, env=env, what="mpicc in --build-root", timeout=600
        )
        where = f"with the image's mpicc in {build_root}, the image's {install} bound at its place"
    return names, f"built {', '.join(names)} from dedal's sources {where}"


def launcher_fix(info: img.ImageInfo, root: Path) -> Optional[Tuple[str, str]]:
    """Spack's mpirun stub replaced by prterun --personality ompi: (path, script), or None."""
    if not info.mpirun_stub:
        return None
    prterun = os.path.join(os.path.dirname(info.mpirun_stub), "prterun")
    if runtime.host_path(root, prterun) is None:  # (/opt/view is a link into the image)
        raise UserError(f"the image's mpirun ({info.mpirun_stub}) is Spack's srun stub and it has no prterun beside it")
    script = (
        "#!/bin/sh\n# dedal GPU kit: Open MPI 5's own launcher in place of Spack's srun stub "
        "(~legacylaunchers); one GPU machine has no Slurm\n"
        "export PRTE_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-} "
        "PRTE_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-}\n"
        f'exec {prterun} --personality ompi "$@"\n'
    )
    return info.mpirun_stub, script


# ---------------------------------------------------------------------------- the bundle


def _tar_filter(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def write_root(slim: Slim, extra: Dict[str, Tuple[bytes, int]], out: Path) -> Tuple[int, int]:
    """root.tar.xz of the kept paths (directories as they are, then the kit's own files); returns
    (uncompressed bytes, files)."""
    tops = sorted(p for p in os.listdir(slim.root) if not p.startswith(".dedal-unpacked"))
    # every top-level directory (a mount point, maybe) and symlink (/bin -> usr/bin: dedal runs /bin/sh)
    keep = dict.fromkeys(f"/{t}" for t in tops if (slim.root / t).is_dir() or (slim.root / t).is_symlink())
    keep.update(slim.paths)
    for p in list(keep):  # every parent directory of what is kept
        parent = os.path.dirname(p)
        while parent not in ("/", "") and parent not in keep:
            keep[parent] = None
            parent = os.path.dirname(parent)
    total = files = 0
    raw = out.with_suffix("")  # root.tar
    with tarfile.open(raw, "w", format=tarfile.PAX_FORMAT) as tar:
        for cpath in sorted(keep):
            if cpath in extra:
                continue
            host = slim.root / cpath.lstrip("/")
            ti = tar.gettarinfo(str(host), arcname="." + cpath)
            if ti.isreg():
                total += ti.size
                files += 1
            with open(host, "rb") if ti.isreg() else io.BytesIO() as fh:
                tar.addfile(_tar_filter(ti), fh if ti.isreg() else None)
        for cpath, (data, mode) in sorted(extra.items()):
            ti = tarfile.TarInfo("." + cpath)
            ti.size, ti.mode = len(data), mode
            tar.addfile(_tar_filter(ti), io.BytesIO(data))
            total += len(data)
            files += 1
    if shutil.which("xz"):
        subprocess.run(["xz", "-9", "-T2", "-f", str(raw)], check=True)
    else:  # Python's own (one thread)
        import lzma

        with open(raw, "rb") as src, lzma.open(out, "wb", preset=9) as dst:
            shutil.copyfileobj(src, dst, 8 << 20)
        raw.unlink()
    return total, files


def write_runtime(out: Path) -> List[str]:
    """bubblewrap of this host with the libraries and loader it runs with (``ldd``)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return []
    rt = out / "runtime"
    shutil.rmtree(rt, ignore_errors=True)
    (rt / "lib").mkdir(parents=True)
    shutil.copy2(bwrap, rt / "bwrap.bin")
    loader = ""
    for line in subprocess.run(["ldd", bwrap], capture_output=True, text=True, check=True).stdout.splitlines():
        parts = line.split()
        path = (
            parts[2]
            if len(parts) >= 3 and parts[1] == "=>"
            else (parts[0] if parts and parts[0].startswith("/") else "")
        )
        if path.startswith("/"):
            shutil.copy2(os.path.realpath(path), rt / "lib" / os.path.basename(path))
            if "ld-linux" in path:
                loader = os.path.basename(path)
    (rt / "bwrap").write_text(
        f'#!/bin/sh\n# this host\'s bubblewrap, run by the loader it was built for\nhere=$(dirname "$0")\n'
        f'exec "$here/lib/{loader}" --library-path "$here/lib" "$here/bwrap.bin" "$@"\n'
    )
    (rt / "bwrap").chmod(0o755)
    return sorted(p.name for p in (rt / "lib").iterdir())


def write_dedal(out: Path) -> int:
    with tarfile.open(out / "dedal.tar.gz", "w:gz") as tar:

        def skip(ti: tarfile.TarInfo) -> Optional[tarfile.TarInfo]:
            return None if "__pycache__" in ti.name else _tar_filter(ti)

        for rel in ("dedal", "pyproject.toml", "recipes/repo/packages/dedal-benchmarks", "benchmarks/gpu"):
            tar.add(str(ROOT / rel), arcname=rel, filter=skip)
    return (out / "dedal.tar.gz").stat().st_size


def checkout_bytes() -> int:
    """What the device tool carries of this checkout (tracked and untracked files git does not ignore)."""
    res = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    )
    total = 0
    for rel in res.stdout.decode().split("\0"):
        p = ROOT / rel
        if rel and p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


def ignore_in_git(out: Path) -> None:
    """A bundle inside this checkout is git-ignored (``.git/info/exclude``): the device tool
    carries it as an ignored path named in ``carry``, not as part of the working tree."""
    try:
        rel = out.resolve().relative_to(ROOT)
    except ValueError:
        return
    exclude = ROOT / ".git" / "info" / "exclude"
    line = f"/{rel.as_posix()}/"
    if not exclude.parent.is_dir() or (exclude.exists() and line in exclude.read_text().splitlines()):
        return
    with open(exclude, "a") as fh:
        fh.write(line + "\n")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("image", type=Path, help="the image (a SIF or a squashfs of dedal's)")
    ap.add_argument("-o", "--output", type=Path, default=ROOT / ".gpu-kit", help="the bundle directory (.gpu-kit)")
    ap.add_argument(
        "--budget-mib",
        type=float,
        default=56.0,
        help="at most this much, this checkout included (the device tool carries 64 MiB in all)",
    )
    ap.add_argument("--keep-over-mib", type=float, default=64.0, help="files larger than this are left out")
    ap.add_argument("--build-root", type=Path, help="a root filesystem with a C compiler, where the image has none")
    ap.add_argument(
        "--cache",
        type=Path,
        default=Path.home() / ".cache" / "dedal" / "verify-native",
        help="where the image's root is unpacked (shared with dedal verify's native side)",
    )
    args = ap.parse_args(argv)
    try:
        return make(args)
    except DedalError as exc:
        print(f"make_bundle: error: {exc.one_line()}", file=sys.stderr)
        return 2


def make(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    if not args.image.is_file():
        raise UserError(f"{args.image}: no such image")
    info = img.inspect_image(args.image.resolve())
    root, _reused = unpack_root(info, args.cache, progress=say)
    arch = info.arch or "amd64"
    slim = Slim(root, int(args.keep_over_mib * MIB))
    out: Path = args.output
    out.mkdir(parents=True, exist_ok=True)
    ignore_in_git(out)
    # what verify runs, the launcher and the tools of the shell
    starts = [slim.add(p) for n, p in info.programs.items()]
    starts += find_programs(slim, info, LAUNCHER + APPS + SHELL_TOOLS)
    if info.mpirun_stub:
        slim.add(info.mpirun_stub)
    base = info.install_root or "/opt/esd/software"
    for spec in (
        sorted((root / base.lstrip("/")).glob("*/.spack/spec.json")) if (root / base.lstrip("/")).is_dir() else []
    ):
        slim.add("/" + str(spec.relative_to(root)))
    for p in (".singularity.d", *SYSTEM_DATA, *ETC_FILES, "/opt/dedal/sbom.cdx.json"):
        slim.add_tree(p if p.startswith("/") else "/" + p)
    # the image's own test checks the whole image (every library of its view): the slimmed root is
    # not that image, and dedal verify would run the test there and judge the image by it
    own_test = slim.drop(TEST_FILE, ENV_TEST)
    # what the image lacks, built here; the launcher stub
    extra: Dict[str, Tuple[bytes, int]] = {}
    built_dir = out / ".build"
    shutil.rmtree(built_dir, ignore_errors=True)
    built, built_note = build_benchmarks(info, root, built_dir, args.build_root)
    for name in built:
        extra[f"{KIT_BIN}/{name}"] = ((built_dir / name).read_bytes(), 0o755)
    if built:
        extra["/.singularity.d/env/92-dedal-kit.sh"] = (
            f"#!/bin/sh\n# dedal GPU kit: dedal's benchmarks built for this image, first on PATH\n"
            f"export PATH={KIT_BIN}:$PATH\n".encode(),
            0o755,
        )
    fix = launcher_fix(info, root)
    if fix:  # the stub's own file (mpirun may be a symlink into a prefix) gets the launcher
        real_stub = slim.add(fix[0]) or fix[0]
        extra[real_stub] = (fix[1].encode(), 0o755)
    kept, missing = closure(slim, [s for s in starts if s], env_library_path(root), arch)
    have = {os.path.basename(p) for p in slim.paths}
    for name in built:  # they link the image's MPI and C library, which the closure of its programs holds
        elf = read_elf(built_dir / name)
        lacking = [n for n in (elf.needed if elf else ()) if n not in have]
        if lacking:
            raise UserError(f"{name}, built for the image, needs {', '.join(lacking)}, which the slimmed root lacks")
    changes = {
        "image": str(args.image),
        "image_name": info.name,
        "built": built,
        "built_note": built_note,
        "mpirun": f"{fix[0]} -> prterun --personality ompi (Spack's srun stub replaced)" if fix else "",
        "left_out": {p: s for p, s in sorted(slim.left_out.items())},
        "own_test_left_out": own_test,
    }
    extra["/.dedal-kit.json"] = (json.dumps(changes, indent=1).encode() + b"\n", 0o644)
    say(
        f"{len(slim.paths)} paths kept of the image ({len(kept)} ELF files); left out for size: "
        f"{', '.join(f'{p} ({s / MIB:.0f} MiB)' for p, s in slim.left_out.items()) or 'nothing'}"
    )
    raw_bytes, files = write_root(slim, extra, out / "root.tar.xz")
    libs = write_runtime(out)
    dedal_bytes = write_dedal(out)
    shutil.rmtree(built_dir, ignore_errors=True)
    bundle = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and p.name != "manifest.json")
    checkout = checkout_bytes()
    manifest = {
        "image": str(args.image),
        "image_name": info.name,
        "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "root_files": files,
        "root_bytes": raw_bytes,
        "root_xz_bytes": (out / "root.tar.xz").stat().st_size,
        "elf_files": len(kept),
        "missing_libraries": missing,
        "left_out": changes["left_out"],
        "built": built,
        "built_note": built_note,
        "mpirun": changes["mpirun"],
        "runtime": libs,
        "dedal_bytes": dedal_bytes,
        "bundle_bytes": bundle,
        "checkout_bytes": checkout,
        "carried_bytes": bundle + checkout,
        "budget_bytes": int(args.budget_mib * MIB),
        "seconds": round(time.monotonic() - t0, 1),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    say(
        f"root.tar.xz {manifest['root_xz_bytes'] / MIB:.1f} MiB ({raw_bytes / MIB:.0f} MiB in {files} files); "
        f"bundle {bundle / MIB:.1f} MiB + checkout {checkout / MIB:.1f} MiB = {(bundle + checkout) / MIB:.1f} MiB "
        f"(budget {args.budget_mib:g} MiB) in {manifest['seconds']:.0f} s"
    )
    if missing:
        say(f"libraries missing in the image itself (as dedal assemble would say): {missing}")
    if bundle + checkout > manifest["budget_bytes"]:
        raise UserError(
            f"the bundle ({bundle / MIB:.1f} MiB) and this checkout ({checkout / MIB:.1f} MiB) exceed "
            f"{args.budget_mib:g} MiB: lower --keep-over-mib (left out so far: "
            f"{', '.join(slim.left_out) or 'nothing'})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
