"""The image under verification: what it is and what it carries.

:func:`inspect_image` reads a SIF, squashfs file or root directory: labels (SIF
``JSON.Labels`` or ``/.singularity.d/labels.json``), architecture, the Spack target and
CUDA version (labels, else the ``.spack/spec.json`` of the prefixes under the install
root), and where the benchmarks are: ``dedal_*`` (the bundled ``dedal-benchmarks``),
OSU's ``osu_*`` and nccl-tests' ``all_reduce_perf``, looked up on the image's own
``PATH`` (its ``/.singularity.d/env`` scripts applied) and, for OSU, in the Spack
prefix's ``libexec``; :func:`compile_bundled` builds dedal's benchmarks with the image's
own ``mpicc`` for an image that lacks them.

Its "native" twin (the host's own MPI stack, or the image's root filesystem unpacked) is
:mod:`dedal.stages.verify.native`'s.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

from dedal import CHECKOUT
from dedal.adapters import runtime
from dedal.errors import UserError
from dedal.model.artifacts import atomic_path, sha256_file
from dedal.model.env_defaults import DEFAULT_TAG
from dedal.model.image import TEST_FILE
from dedal.model.names import name_problem
from dedal.model import sif

if TYPE_CHECKING:
    from dedal.model.config import Settings


#: programs looked for in the image (and, for native host runs, on the host)
PROGRAMS = (
    "dedal_init",
    "dedal_latency",
    "dedal_bw",
    "dedal_allreduce",
    "dedal_nccl_allreduce",
    "dedal_cuda_floor",
    "osu_init",
    "osu_latency",
    "osu_bw",
    "osu_allreduce",
    "all_reduce_perf",
    "mpirun",
    "ompi_info",
    "ucx_info",
    "mpicc",
)
#: the MPI benchmarks of dedal-benchmarks, and where dedal verify puts its own build of them
BUNDLED_MPI = ("dedal_init", "dedal_latency", "dedal_bw", "dedal_allreduce")
#: the CUDA floor of device-buffer messages: plain C that finds the driver at run time, built like the others
CUDA_FLOOR = "dedal_cuda_floor"
#: dedal's benchmarks that run between GPU buffers with -d cuda, and what such a build prints
DEVICE_MPI = ("dedal_latency", "dedal_bw")
DEVICE_TITLE = b"MPI-CUDA Latency Test"
BUNDLED_DIR = "/opt/dedal-verify/bin"
OSU_LIBEXEC = "libexec/osu-micro-benchmarks/mpi"
Progress = Optional[Callable[[str], None]]


@dataclass
class ImageInfo:
    path: Path
    kind: str  # sif | squashfs | dir
    name: str  # for reports/<name>/
    labels: Dict[str, Any] = field(default_factory=dict)
    arch: Optional[str] = None  # SIF architecture (amd64 ...)
    view: str = "/opt/view"
    install_root: str = ""
    target: Optional[str] = None
    target_source: str = ""
    cuda: Optional[str] = None
    osu_cuda: Optional[bool] = None  # the image's osu-micro-benchmarks built +cuda (None: unknown)
    versions: Dict[str, str] = field(default_factory=dict)
    programs: Dict[str, str] = field(default_factory=dict)  # name -> path inside the image
    digests: Dict[str, str] = field(default_factory=dict)  # name -> sha256 of the program file
    image_path_var: str = ""  # PATH inside the image
    identity: str = ""  # cache key of the native root
    mpirun_stub: str = ""  # the image's mpirun is a stub that only says to use srun (its path)
    dedal_cuda: Optional[bool] = None  # the image's dedal_latency knows -d cuda (None: no dedal_latency)
    own_test: bool = False  # the image has a test (`apptainer test`): dedal's images since image format 2


def resolve_image(image: str, settings: Settings) -> Path:
    """A path as given, or ``ENV[:TAG]`` of this workspace (``<images_dir>/ENV/TAG.sif``)."""
    p = Path(image)
    try:
        if p.exists():
            return p
    except (OSError, ValueError):  # a name too long, a NUL
        pass
    if "/" not in image:
        env, _, tag = image.partition(":")
        tag = tag or DEFAULT_TAG
        if not name_problem(env) and not name_problem(tag):  # "..:x" is not an environment
            cand = Path(settings.images_dir) / env / f"{tag}.sif"
            if cand.is_file():
                return cand
    raise UserError(
        f"{image}: no such image (a SIF, squashfs file or root directory, or ENV[:TAG] of {settings.images_dir})"
    )


def _labels_from_dir(root: Path) -> Dict[str, Any]:
    p = root / ".singularity.d" / "labels.json"
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def is_launcher_stub(path: Path) -> bool:
    """Spack's ``openmpi schedulers=slurm ~legacylaunchers`` installs ``mpirun``/``mpiexec``
    as a few-line script (its ``nolegacylaunchers.sh``) that says it is "installed without the
    mpiexec/mpirun commands", to use srun, and exits 2: no launcher at all. Told by those
    words: a script that only names the stub is not it (the GPU kit's launcher in its place,
    whose comment says "srun stub (~legacylaunchers)", was taken for it)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    return head.startswith(b"#!") and b"legacylaunchers" in head and b"without the mpiexec/mpirun commands" in head


def _spec_facts(root: Path, install_root: str) -> Dict[str, Any]:
    """Target and CUDA version from the Spack metadata of the prefixes in the image."""
    base = root / install_root.lstrip("/") if install_root else None
    out: Dict[str, Any] = {}
    if base is None or not base.is_dir():
        return out
    specs: List[Path] = []
    for depth in ("*/.spack/spec.json", "*/*/.spack/spec.json", "*/*/*/.spack/spec.json"):
        specs += sorted(base.glob(depth))
        if len(specs) > 400:
            break
    specs.sort(key=lambda p: (0 if "dedal-benchmarks" in str(p) else 1, str(p)))
    for path in specs[:400]:
        try:
            nodes = json.loads(path.read_text()).get("spec", {}).get("nodes", [])
        except (OSError, ValueError, AttributeError):
            continue
        for node in nodes:
            if not isinstance(node, dict):
                continue
            arch = node.get("arch") or {}
            target = arch.get("target") if isinstance(arch, dict) else None
            if isinstance(target, dict):
                target = target.get("name")
            if target and "target" not in out and not node.get("external"):
                out["target"] = str(target)
                out["target_source"] = f"{path.parent.parent.name} spec.json"
            if node.get("name") == "cuda" and node.get("version") and "cuda" not in out:
                out["cuda"] = str(node["version"])
        if "target" in out and ("cuda" in out or len(out) > 3):
            break
    return out


def _osu_cuda(root: Path, install_root: str) -> Optional[bool]:
    """Whether the image's osu-micro-benchmarks were built ``+cuda`` (their Spack spec.json),
    None when the image has no OSU from Spack."""
    base = root / install_root.lstrip("/") if install_root else None
    if base is None or not base.is_dir():
        return None
    for depth in ("osu-micro-benchmarks-*", "*/osu-micro-benchmarks-*", "*/*/osu-micro-benchmarks-*"):
        for prefix in sorted(base.glob(depth)):
            try:
                nodes = json.loads((prefix / ".spack/spec.json").read_text()).get("spec", {}).get("nodes", [])
            except (OSError, ValueError, AttributeError):
                continue
            for node in nodes:
                if isinstance(node, dict) and node.get("name") == "osu-micro-benchmarks":
                    return bool((node.get("parameters") or {}).get("cuda"))
    return None


_DISCOVER = 'for p in "$@"; do c=$(command -v "$p" 2>/dev/null) && echo "found $p $c"; done; echo "path $PATH"'


def inspect_image(path: Path, *, runtime_name: str = "auto", progress: Progress = None) -> ImageInfo:
    """Read everything the runner needs to know about an image (see the module notes)."""
    kind = runtime.root_kind(path)
    if kind == "host":
        raise UserError("no image given")
    labels: Dict[str, Any] = {}
    arch: Optional[str] = None
    identity = ""
    if kind == "sif":
        summary = sif.summarize(path)
        labels = dict(summary.get("labels") or {})
        arch = summary.get("primary_arch") or None
        part = sif.primary_partition(sif.read_sif(path))
        identity = f"sif-{summary['header'].get('id', '')}-{part.size}"
    else:
        st = path.stat()
        identity = f"{kind}-{st.st_size}-{int(st.st_mtime)}-{st.st_ino}"
    info = ImageInfo(path=path, kind=kind, name="", labels=labels, arch=arch, identity=identity)
    with runtime.mounted(path) as root:
        assert root is not None
        if not info.labels:
            info.labels = _labels_from_dir(root)
        lab = info.labels
        info.view = str(lab.get("dedal.view") or "/opt/view")
        info.install_root = str(lab.get("dedal.install_root") or "")
        for key in ("dedal.target", "dedal.spack.target"):
            if lab.get(key):
                info.target, info.target_source = str(lab[key]), f"label {key}"
                break
        info.cuda = str(lab["dedal.version.cuda"]) if lab.get("dedal.version.cuda") else None
        info.versions = {
            k[len("dedal.version.") :]: str(v)
            for k, v in lab.items()
            if k.startswith("dedal.version.") and not k.endswith(".source")
        }
        if info.target is None or info.cuda is None:
            facts = _spec_facts(root, info.install_root or "/opt/esd/software")
            if info.target is None and facts.get("target"):
                info.target, info.target_source = facts["target"], facts["target_source"]
            if info.cuda is None and facts.get("cuda"):
                info.cuda = facts["cuda"]
        info.osu_cuda = _osu_cuda(root, info.install_root or "/opt/esd/software")
        own_test = runtime.host_path(root, TEST_FILE)
        info.own_test = own_test is not None and own_test.is_file()
        res = runtime.run_in(
            path,
            ["/bin/sh", "-c", _DISCOVER, "dedal-find", *PROGRAMS],
            what="find the benchmarks in the image",
            runtime=runtime_name,
            timeout=120,
        )
        for line in res.stdout.splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3 and parts[0] == "found" and parts[2].startswith("/"):
                info.programs[parts[1]] = parts[2]
            elif line.startswith("path "):
                info.image_path_var = line[5:]
        stub = runtime.host_path(root, info.programs["mpirun"]) if "mpirun" in info.programs else None
        if stub is not None and is_launcher_stub(stub):
            info.mpirun_stub = info.programs.pop("mpirun")
        for name in ("osu_init", "osu_latency", "osu_bw", "osu_allreduce"):
            if name in info.programs:
                continue
            sub = "startup" if name == "osu_init" else ("collective" if name == "osu_allreduce" else "pt2pt")
            cands = [f"{info.view}/{OSU_LIBEXEC}/{sub}/{name}"]
            base = root / (info.install_root or "/opt/esd/software").lstrip("/")
            if base.is_dir():
                for hit in sorted(base.glob(f"*/*/osu-micro-benchmarks-*/{OSU_LIBEXEC}/{sub}/{name}"))[:1]:
                    cands.append("/" + str(hit.relative_to(root)))
            for cand in cands:
                host = runtime.host_path(root, cand)
                if host is not None and host.is_file():
                    info.programs[name] = cand
                    break
        for name, cpath in info.programs.items():
            if name.startswith(("dedal_", "osu_")) or name == "all_reduce_perf":
                host = runtime.host_path(root, cpath)
                if host is not None and host.is_file():
                    info.digests[name] = sha256_file(host)
                    if name == "dedal_latency":  # built from sources that know -d cuda (its title says so)
                        info.dedal_cuda = DEVICE_TITLE in host.read_bytes()
    env, tag = lab.get("dedal.env"), lab.get("dedal.tag")
    if env:
        info.name = f"{env}-{tag}" if tag else str(env)
    else:
        info.name = path.name[:-4] if path.name.endswith(".sif") else (path.stem if kind == "squashfs" else path.name)
    info.name = info.name or "image"
    return info


def read_image_files(path: Path, cpaths: Sequence[str]) -> Dict[str, Optional[bytes]]:
    """The bytes of files of the image (``cpaths``, absolute inside it; links resolved inside
    the image), None for each it lacks: the reference data an application benchmark's runs are
    held to, read once, before the runs."""
    out: Dict[str, Optional[bytes]] = {}
    with runtime.mounted(path) as root:
        assert root is not None
        for cpath in cpaths:
            host = runtime.host_path(root, cpath)
            out[cpath] = host.read_bytes() if host is not None and host.is_file() else None
    return out


# ---------------------------------------------------------------------------- bundled benchmarks


def bundled_sources() -> Path:
    """The sources of the dedal-benchmarks recipe (recipes/ next to the dedal package)."""
    src = CHECKOUT / "recipes" / "repo" / "packages" / "dedal-benchmarks" / "src"
    if not (src / "dedal_latency.c").is_file():
        raise UserError(f"the bundled benchmark sources are not at {src} (a dedal checkout is needed to build them)")
    return src


def compile_bundled(
    info: ImageInfo,
    cache: Path,
    *,
    runtime_name: str = "auto",
    progress: Progress = None,
    names: Sequence[str] = BUNDLED_MPI,
) -> Path:
    """Build dedal's MPI benchmarks ``names`` with the image's own ``mpicc``, for an image that
    does not carry them (no dedal-benchmarks package, or one from before ``dedal_cuda_floor``):
    the same binaries then run natively and in the container (bound at BUNDLED_DIR on both
    sides). Cached per image, sources and names."""
    src = bundled_sources()
    digest = hashlib.sha256(info.identity.encode() + " ".join(names).encode())
    for f in sorted(src.iterdir()):
        digest.update(f.name.encode() + f.read_bytes())
    out = cache / "verify-bench" / digest.hexdigest()[:16]
    if all((out / name).is_file() for name in names):
        return out
    if progress:
        progress(f"building {', '.join(names)} with the image's own mpicc into {out}")
    script = " && ".join(
        f"mpicc -O2 -std=c11 -I/opt/dedal-verify/src -o {BUNDLED_DIR}/{name} /opt/dedal-verify/src/{name}.c -ldl"
        for name in names
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:  # replaces an incomplete ``out`` whole
        tmp.mkdir()
        runtime.run_in(
            info.path,
            ["/bin/sh", "-c", script],
            what="mpicc of the bundled benchmarks in the image",
            runtime=runtime_name,
            timeout=600,
            binds=[runtime.Bind(src, "/opt/dedal-verify/src", readonly=True), runtime.Bind(tmp, BUNDLED_DIR)],
        )
    return out
