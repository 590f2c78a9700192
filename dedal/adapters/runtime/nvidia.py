"""The host's NVIDIA driver, found for GPU passthrough (``nv``) with bwrap and Charliecloud.

Apptainer's ``--nv`` binds the host driver into the container; the other backends do the
same, found the same way (Apptainer's legacy ``--nv`` path, ``internal/pkg/util/paths``
``Resolve`` and ``gpu.NvidiaDevices``):

* the names come from Apptainer's ``etc/nvliblist.conf`` (:data:`NV_BINARIES`,
  :data:`NV_LIBRARIES`, :data:`NV_FILES`);
* a library name (``libcuda.so``) matches every entry of the ld cache (``ldconfig -p``)
  that starts with it (``libcuda.so.1``, ``libcuda.so``), each taken once, at the first
  path the cache lists for it whose ELF class and machine are this process's (a 32-bit
  ``libcuda.so.1`` on a multiarch host is passed over); each is bound read-only at
  ``/.singularity.d/libs/<name>``, which the image's ``99-base.sh`` puts on
  ``LD_LIBRARY_PATH``;
* a binary (``nvidia-smi``) is looked up on ``PATH`` and bound at ``/usr/bin/<name>``;
  an absolute path (the Vulkan/EGL ICD files) and the persistenced socket are bound where
  they are when they exist;
* the device nodes are every ``/dev/nvidia*`` (``nvidia0``.., ``nvidiactl``,
  ``nvidia-uvm``, ``nvidia-uvm-tools``, ``nvidia-modeset``, ``nvidia-caps``).

One departure: nvliblist.conf also names vendor-neutral libraries (GLVND's ``libGL``,
``libEGL``, ``libGLX``, ``libOpenGL``, the ``libOpenCL`` loader) that hosts without NVIDIA
have from Mesa. Apptainer binds those anyway; here they count as a driver only next to
the driver's own libraries or device nodes (:func:`nvidia_own`), so that a host without
GPU binds nothing.

Everything is found below a ``root`` (``/`` for the host), so that tests run it on a fake
driver tree: the ld cache read is ``<root>/etc/ld.so.cache`` (``ldconfig -C``), or a given
``ldconfig -p`` text. A host without driver gets nothing bound and one note (not an error),
logged once per process.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from dedal.adapters import proc
from dedal.adapters.runtime.common import Bind
from dedal.errors import ToolMissing
from dedal.model.elf import elf_id
from dedal.model.image import STD_PATH

#: binaries of Apptainer's etc/nvliblist.conf, bound at /usr/bin/<name>
NV_BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
#: libraries of Apptainer's etc/nvliblist.conf (prefixes of the ld cache's names)
NV_LIBRARIES = (
    "libcuda.so",
    "libcudadebugger.so",
    "libEGL_installertest.so",
    "libEGL_nvidia.so",
    "libEGL.so",
    "libGLdispatch.so",
    "libGLESv1_CM_nvidia.so",
    "libGLESv1_CM.so",
    "libGLESv2_nvidia.so",
    "libGLESv2.so",
    "libGL.so",
    "libGLX_installertest.so",
    "libGLX_nvidia.so",
    "libglx.so",
    "libGLX.so",
    "libnvcuvid.so",
    "libnvcucompat.so",
    "libnvcudla.so",
    "libnvcuextend.so",
    "libnvidia-cbl.so",
    "libnvidia-cfg.so",
    "libnvidia-compiler.so",
    "libnvidia-eglcore.so",
    "libnvidia-egl-wayland.so",
    "libnvidia-encode.so",
    "libnvidia-fatbinaryloader.so",
    "libnvidia-fbc.so",
    "libnvidia-glcore.so",
    "libnvidia-glsi.so",
    "libnvidia-glvkspirv.so",
    "libnvidia-gpucomp.so",
    "libnvidia-gtk2.so",
    "libnvidia-gtk3.so",
    "libnvidia-ifr.so",
    "libnvidia-ml.so",
    "libnvidia-nvvm.so",
    "libnvidia-opencl.so",
    "libnvidia-opticalflow.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-rmapi-tegra.so",
    "libnvidia-rtcore.so",
    "libnvidia-tls.so",
    "libnvidia-wfb.so",
    "libnvoptix.so",
    "libnvos.so",
    "libnvosd.so",
    "libnvrm_chip.so",
    "libnvrm_gpu.so",
    "libnvrm_host1x.so",
    "libnvrm_mem.so",
    "libnvrm_stream.so",
    "libnvrm_surface.so",
    "libnvrm_sync.so",
    "libnvsciipc.so",
    "libnvsocsys.so",
    "libnvtegrahv.so",
    "libOpenCL.so",
    "libOpenGL.so",
    "libvdpau_nvidia.so",
    "nvidia_drv.so",
    "tls_test_.so",
)
#: other files of Apptainer's etc/nvliblist.conf, bound where they are
NV_FILES = (
    "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
    "/usr/share/vulkan/icd.d/nvidia_icd.json",
    "/usr/share/vulkan/icd.d/nvidia_layers.json",
    "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
    "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
    "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
    "/usr/share/nvidia/nvoptix.bin",
)
PERSISTENCED_SOCKET = "/var/run/nvidia-persistenced/socket"
#: where the libraries are bound inside (Apptainer's ContainerLibsDir; on LD_LIBRARY_PATH by 99-base.sh)
LIBS_DIR = "/.singularity.d/libs"
#: the ld cache line, as Apptainer matches it: "libnvidia-ml.so.1 (libc6,x86-64) => /usr/lib64/libnvidia-ml.so.1"
_LDCACHE_LINE = re.compile(r"^(.*)\s*\(.*\)\s*=>\s*(.*)$", re.M)
log = logging.getLogger("dedal.runtime")


@dataclass(frozen=True)
class HostDriver:
    """What ``nv`` binds: ``libraries`` as (host path, name in :data:`LIBS_DIR`), ``binaries``
    (host paths, seen at ``/usr/bin/<name>``), ``files`` (seen where they are), ``devices``
    (``/dev/nvidia*``); host paths are below ``root``. ``note`` says what is missing."""

    root: str = "/"
    libraries: Tuple[Tuple[str, str], ...] = ()
    binaries: Tuple[str, ...] = ()
    files: Tuple[str, ...] = ()
    devices: Tuple[str, ...] = ()
    note: str = ""

    @property
    def found(self) -> bool:
        return bool(self.libraries or self.devices)

    def host(self, path: str) -> str:
        """The host path of ``path`` as the driver's host sees it (below ``root``)."""
        return os.path.join(self.root, path.lstrip("/")) if self.root != "/" else path

    def binds(self) -> List[Bind]:
        """Read-only binds of the libraries (into :data:`LIBS_DIR`), the binaries (into
        ``/usr/bin``) and the other files (where they are); device nodes are the backend's."""
        out = [Bind(self.host(src), f"{LIBS_DIR}/{name}", readonly=True) for src, name in self.libraries]
        out += [Bind(self.host(b), f"/usr/bin/{os.path.basename(b)}", readonly=True) for b in self.binaries]
        out += [Bind(self.host(f), f, readonly=True) for f in self.files]
        return out

    def to_json(self) -> Dict[str, Any]:
        return {
            "root": self.root,
            "libraries": [list(x) for x in self.libraries],
            "binaries": list(self.binaries),
            "files": list(self.files),
            "devices": list(self.devices),
            "note": self.note,
        }


def parse_ldconfig(text: str) -> Dict[str, List[str]]:
    """``ldconfig -p`` as Apptainer reads it: library name -> its paths, in the cache's order."""
    cache: Dict[str, List[str]] = {}
    for m in _LDCACHE_LINE.finditer(text):
        name, path = m.group(1).strip(), m.group(2).strip()
        paths = cache.setdefault(name, [])
        if path not in paths:
            paths.append(path)
    return cache


@functools.lru_cache(maxsize=None)
def own_elf_id() -> Optional[Tuple[int, int]]:
    """This process's ELF class and machine (the libraries must match them), as Apptainer
    reads them from /proc/self/exe."""
    return elf_id(Path("/proc/self/exe"))


def resolve_libraries(
    cache: Dict[str, List[str]], names: Sequence[str], *, root: str = "/", want: Optional[Tuple[int, int]] = None
) -> List[Tuple[str, str]]:
    """(path, cache name) of every cache entry that starts with one of ``names``, at the first
    of its paths whose ELF class and machine are ``want`` (Apptainer's ``resolveLibs``)."""
    want = want or own_elf_id()
    seen = set()
    out: List[Tuple[str, str]] = []
    for prefix in names:
        for name, paths in cache.items():
            if not name.startswith(prefix) or name in seen:
                continue
            for path in paths:
                if elf_id(Path(root) / path.lstrip("/")) == want:
                    seen.add(name)
                    out.append((path, name))
                    break
    return out


def nvidia_own(name: str) -> bool:
    """Whether a library of nvliblist.conf is the NVIDIA driver's own: the list also names
    vendor-neutral ones (GLVND's libGL/libEGL/libGLX/libOpenGL, the libOpenCL loader) that a
    host without NVIDIA has from Mesa, and those alone are no driver."""
    return name.startswith(("libcuda", "libnv")) or "nvidia" in name


def find_binaries(names: Sequence[str], *, root: str = "/", search_path: Optional[str] = None) -> List[str]:
    """The first executable of each name on ``search_path`` (default: this process's PATH)
    below ``root``, as paths of the driver's host."""
    dirs = [d for d in (search_path if search_path is not None else os.environ.get("PATH", STD_PATH)).split(":") if d]
    out: List[str] = []
    for name in names:
        for d in dirs:
            path = os.path.join(d, name)
            host = Path(root) / path.lstrip("/")
            if host.is_file() and os.access(host, os.X_OK):
                if path not in out:
                    out.append(path)
                break
    return out


def device_nodes(root: str = "/") -> List[str]:
    """Every ``/dev/nvidia*`` below ``root`` (GPUs ``nvidia0``.., ``nvidiactl``, ``nvidia-uvm``,
    ``nvidia-uvm-tools``, ``nvidia-modeset``, the ``nvidia-caps`` directory), sorted."""
    try:
        names = os.listdir(Path(root) / "dev")
    except OSError:
        return []
    return sorted(f"/dev/{n}" for n in names if n.startswith("nvidia"))


def ldconfig_listing(root: str = "/") -> Tuple[str, str]:
    """(``ldconfig -p`` output, problem): the host's cache, or ``<root>/etc/ld.so.cache``."""
    ldconfig = None
    for d in (os.environ.get("PATH", "") + ":/sbin:/usr/sbin").split(":"):
        if d and os.access(os.path.join(d, "ldconfig"), os.X_OK):
            ldconfig = os.path.join(d, "ldconfig")
            break
    if ldconfig is None:
        return "", "ldconfig is not on PATH (nor in /sbin, /usr/sbin): the ld cache could not be read"
    cmd = [ldconfig, "-p"]
    if root != "/":
        cache = Path(root) / "etc/ld.so.cache"
        if not cache.is_file():
            return "", f"{cache} does not exist"
        cmd = [ldconfig, "-C", os.fspath(cache), "-p"]
    try:
        res = proc.run(cmd, what="ldconfig -p", check=False, timeout=60)
    except ToolMissing:
        return "", "ldconfig could not be started"
    if res.returncode != 0:
        return "", f"`{' '.join(cmd)}` failed (exit {res.returncode}): {proc.output_tail(res.stderr, 1)}"
    return res.stdout, ""


def find_driver(
    root: str = "/",
    *,
    ldconfig_text: Optional[str] = None,
    search_path: Optional[str] = None,
    want: Optional[Tuple[int, int]] = None,
) -> HostDriver:
    """The NVIDIA driver below ``root`` (see the module notes); ``ldconfig_text``: an
    ``ldconfig -p`` output to use instead of reading the cache."""
    root = os.fspath(root)
    problems: List[str] = []
    if ldconfig_text is None:
        ldconfig_text, problem = ldconfig_listing(root)
        if problem:
            problems.append(problem)
    libs = resolve_libraries(parse_ldconfig(ldconfig_text), NV_LIBRARIES, root=root, want=want)
    devices = device_nodes(root)
    if not any(nvidia_own(name) for _, name in libs) and not devices:
        note = (
            "no NVIDIA driver on this host (no /dev/nvidia* device nodes, no NVIDIA library such as libcuda.so "
            "in the ld cache): GPU passthrough binds nothing"
        )
        if libs:
            note += (
                f" (the vendor-neutral {', '.join(sorted({n.split('.so')[0] for _, n in libs}))} of "
                "nvliblist.conf are no driver)"
            )
        if problems:
            note += f" ({'; '.join(problems)})"
        return HostDriver(root, note=note)
    binaries = find_binaries(NV_BINARIES, root=root, search_path=search_path)
    files = [f for f in NV_FILES if (Path(root) / f.lstrip("/")).exists()]
    if (Path(root) / PERSISTENCED_SOCKET.lstrip("/")).exists():
        files.insert(0, PERSISTENCED_SOCKET)
    note = ""
    if not libs:
        note = (
            "NVIDIA device nodes but no driver libraries in the ld cache (no libcuda.so): CUDA programs in the "
            "container will not find the driver" + (f" ({'; '.join(problems)})" if problems else "")
        )
    elif not devices:
        note = "NVIDIA driver libraries but no /dev/nvidia* device nodes (is the kernel module loaded?): no GPU usable"
    elif not any(name.startswith("libcuda.so") for _, name in libs):  # e.g. a display-only driver
        note = "NVIDIA driver libraries without libcuda.so in the ld cache: CUDA programs will not find the driver"
    return HostDriver(root, tuple(libs), tuple(binaries), tuple(files), tuple(devices), note)


@functools.lru_cache(maxsize=None)
def host_driver() -> HostDriver:
    """The host's driver (found once per process), its note logged once."""
    driver = find_driver("/")
    if driver.note:
        log.warning("note: %s", driver.note)
    return driver
