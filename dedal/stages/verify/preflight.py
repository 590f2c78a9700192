"""Preflight: what the host offers and whether the image can run well on it, checked
before any benchmark starts.

Each check gives a :class:`~dedal.stages.verify.findings.Finding` with a sentence a user can
act on; a *fatal* finding stops the verification (``dedal verify`` exits 2 with one
line) because nothing measured afterwards would mean anything:

- **pmix** (under Slurm): ``srun --mpi=list`` must list ``pmix``; with only Slurm's
  PMIx 4 server (``pmix_v4``) Open MPI 5's ob1 pml hangs, so UCX is used (note);
- **infiniband**: an RDMA fabric, ``/dev/infiniband`` (IB, RoCE, EFA) or Slingshot's ``/dev/cxi*``,
  present or not (``HostFacts.has_infiniband``): without one TCP between nodes is all there is,
  and the rules (:data:`dedal.stages.verify.rules.TCP_BETWEEN_NODES_WITHOUT_FABRIC`) do not call it
  a fallback;
- **gpu-driver**: the NVIDIA kernel driver version (``/proc/driver/nvidia/version``)
  against the image's CUDA (the minimum driver of each CUDA release, and CUDA's minor
  version compatibility within a major release); **gpu-passthrough**: the runtime can
  pass the driver's libraries into the container (:func:`check_passthrough`);
- **cpu-target**: the host CPU's flags (``/proc/cpuinfo``) against the image's Spack
  ``target`` (``x86_64_v3`` needs avx2, fma, bmi2 ...): binaries built for a newer CPU
  die with ``Illegal instruction``;
- **arch**: the SIF's architecture against the host's.

Everything here reads files (``/proc``, ``/dev``, ``/sys``); the one command is
``srun --mpi=list``, through the Slurm adapter. Paths are parameters so that tests can
point the checks at recorded files.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from dedal.errors import DedalError
from dedal.model import sif
from dedal.stages.verify import findings as F
from dedal.stages.verify import rules
from dedal.stages.verify.judge import graded
from dedal.stages.verify.load import check_load
from dedal.stages.verify.facts import HostFacts
from dedal.stages.verify.findings import Finding
from dedal.stages.verify.parsers import parse_text


class PreflightFailed(DedalError):
    """A fatal preflight finding: the run would measure nothing meaningful (exit 2)."""

    exit_code = 2


# ---------------------------------------------------------------------------- CPU targets

_V2 = ("cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3")
_V3 = _V2 + ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")
_V4 = _V3 + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
_ICELAKE = _V4 + (
    "avx512_vnni",
    "avx512vbmi",
    "avx512_vbmi2",
    "avx512_bitalg",
    "avx512_vpopcntdq",
    "vaes",
    "gfni",
    "vpclmulqdq",
    "sha_ni",
)
_ZEN = _V3 + ("adx", "rdseed", "clzero", "sha_ni", "clflushopt")
_ZEN4 = (
    _V4
    + ("adx", "rdseed", "clzero", "sha_ni", "clwb", "vaes", "vpclmulqdq", "gfni")
    + ("avx512_bf16", "avx512_vnni", "avx512vbmi", "avx512_vbmi2")
)

#: CPU flags (as /proc/cpuinfo names them) each Spack x86_64 target needs, after
#: archspec's microarchitecture table (generic levels exactly; named CPUs by their
#: level plus the distinctive extensions compilers use)
X86_TARGETS: Dict[str, Tuple[str, ...]] = {
    "x86_64": (),
    "x86_64_v2": _V2,
    "x86_64_v3": _V3,
    "x86_64_v4": _V4,
    "nehalem": _V2,
    "westmere": _V2 + ("aes", "pclmulqdq"),
    "sandybridge": _V2 + ("aes", "pclmulqdq", "avx"),
    "ivybridge": _V2 + ("aes", "pclmulqdq", "avx", "rdrand", "f16c"),
    "haswell": _V3,
    "broadwell": _V3 + ("adx", "rdseed"),
    "skylake": _V3 + ("adx", "rdseed", "clflushopt", "xsavec"),
    "skylake_avx512": _V4 + ("adx", "rdseed", "clflushopt", "clwb"),
    "cascadelake": _V4 + ("adx", "rdseed", "clwb", "avx512_vnni"),
    "cooperlake": _V4 + ("clwb", "avx512_vnni", "avx512_bf16"),
    "icelake": _ICELAKE,
    "sapphirerapids": _ICELAKE + ("avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"),
    "zen": _ZEN,
    "zen2": _ZEN + ("clwb",),
    "zen3": _ZEN + ("clwb", "vaes", "vpclmulqdq"),
    "zen4": _ZEN4,
    "zen5": _ZEN4 + ("avx_vnni",),
}
#: families of other targets: the target names (prefixes) and the machine names of hosts that run them
FAMILIES: Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...]]] = {
    "x86_64": (tuple(X86_TARGETS), ("x86_64", "amd64")),
    "aarch64": (
        ("aarch64", "armv8", "armv9", "neoverse", "a64fx", "graviton", "thunderx", "cortex", "m1", "m2", "m3", "m4"),
        ("aarch64", "arm64"),
    ),
    "ppc64le": (("ppc64le", "power8le", "power9le", "power10le"), ("ppc64le",)),
}
_FLAG_ALIASES = {"lzcnt": "abm", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "pni": "sse3"}


def target_family(target: str) -> Optional[str]:
    t = target.lower()
    for family, (names, _machines) in FAMILIES.items():
        if t in names or t.startswith(tuple(n for n in names if family != "x86_64")):
            return family
    return None


def machine_family(machine: str) -> Optional[str]:
    m = machine.lower()
    for family, (_names, machines) in FAMILIES.items():
        if m in machines:
            return family
    return None


def cpu_info(path: Path = Path("/proc/cpuinfo")) -> Dict[str, Any]:
    """Model name and flags of the first CPU (flags as a set, names normalised)."""
    model, flags = "", set()
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {"model": "", "flags": set(), "readable": False}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model", "cpu") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = {_FLAG_ALIASES.get(f, f) for f in value.split()}
    return {"model": model, "flags": flags, "readable": True}


def check_cpu_target(target: Optional[str], flags: set, machine: str) -> List[Finding]:
    """The image's Spack target against the host CPU (fatal when the host lacks
    instructions the image's binaries may use)."""
    if not target:
        return [
            F.info(
                "cpu-target-unknown",
                "the image records no Spack target (label dedal.target or "
                "spec.json): its binaries' CPU requirements were not checked",
            )
        ]
    fam, host_fam = target_family(target), machine_family(machine)
    if fam and host_fam and fam != host_fam:
        return [
            F.error(
                "cpu-arch-mismatch",
                f"the image is built for {target} ({fam}) but this host is {machine}: its programs cannot run here",
                [f"target: {target}", f"host machine: {machine}"],
            )
        ]
    need = X86_TARGETS.get(target.lower())
    if need is None:
        if fam and fam != "x86_64":
            return [
                F.info(
                    "cpu-target-unchecked",
                    f"image target {target} ({fam}): only the architecture was "
                    f"checked ({machine}), not the CPU's features",
                )
            ]
        return [
            F.warning(
                "cpu-target-unchecked",
                f"image target {target!r} is not in dedal's table of x86_64 "
                "targets: the host CPU was not checked against it",
            )
        ]
    if not flags:
        return [
            F.warning("cpu-flags-unknown", f"the host CPU's flags could not be read; image target {target} not checked")
        ]
    missing = [f for f in need if f not in flags]
    if missing:
        return [
            F.error(
                "cpu-target",
                f"the image is built for {target} but this CPU lacks "
                f"{', '.join(missing)}: its programs may die with 'Illegal instruction'; rebuild for an "
                "older target (e.g. x86_64_v2) or run on newer nodes",
                [f"target {target} needs: {' '.join(need)}", f"missing on this host: {' '.join(missing)}"],
            )
        ]
    return [F.info("cpu-target", f"the host CPU has every instruction set the image's target {target} needs")]


# ---------------------------------------------------------------------------- GPU driver vs CUDA

#: minimum Linux driver of each CUDA toolkit release (NVIDIA's CUDA release notes, table
#: "CUDA Toolkit and Corresponding Driver Versions", the GA driver of each minor release)
CUDA_MIN_DRIVER: Dict[Tuple[int, int], Tuple[int, ...]] = {
    (11, 0): (450, 36, 6),
    (11, 1): (455, 23),
    (11, 2): (460, 27, 3),
    (11, 3): (465, 19, 1),
    (11, 4): (470, 42, 1),
    (11, 5): (495, 29, 5),
    (11, 6): (510, 39, 1),
    (11, 7): (515, 43, 4),
    (11, 8): (520, 61, 5),
    (12, 0): (525, 60, 13),
    (12, 1): (530, 30, 2),
    (12, 2): (535, 54, 3),
    (12, 3): (545, 23, 6),
    (12, 4): (550, 54, 14),
    (12, 5): (555, 42, 2),
    (12, 6): (560, 28, 3),
    (12, 8): (570, 26),
    (12, 9): (575, 51, 3),
    (13, 0): (580, 65, 6),
}
#: minimum driver of CUDA's minor version compatibility within a major release
CUDA_MAJOR_MIN_DRIVER: Dict[int, Tuple[int, ...]] = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}
_NVRM = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(?P<v>\d+\.\d+(?:\.\d+)?)")


def _ver(text: str) -> Tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def gpu_driver(
    proc_version: Path = Path("/proc/driver/nvidia/version"), gpus_dir: Path = Path("/proc/driver/nvidia/gpus")
) -> Dict[str, Any]:
    """The NVIDIA kernel driver version and the GPUs it drives (empty when there is none)."""
    info: Dict[str, Any] = {"driver": None, "gpus": 0, "line": ""}
    try:
        text = proc_version.read_text(errors="replace")
    except OSError:
        return info
    m = _NVRM.search(text)
    info["line"] = text.splitlines()[0].strip() if text.strip() else ""
    info["driver"] = m.group("v") if m else None
    try:
        info["gpus"] = len([p for p in gpus_dir.iterdir() if p.is_dir()])
    except OSError:
        info["gpus"] = 0
    return info


def gpu_versions(facts: Dict[str, Any]) -> str:
    """The versions a GPU result is read against, ``host NVIDIA driver 550.54.15, image CUDA
    12.4.131`` ("" when the run uses no GPU): a gap between container and native on the GPU is
    first a question of the driver the container binds and the CUDA the image brings."""
    if not facts.get("gpu_benchmarks"):
        return ""
    return f"host NVIDIA driver {facts.get('nvidia_driver') or 'unknown'}, image CUDA {facts.get('image_cuda') or 'unknown'}"


def check_gpu(
    cuda: Optional[str], driver: Optional[str], gpus: int, *, want_gpu: bool, driver_line: str = ""
) -> List[Finding]:
    """The image's CUDA against the host driver. Fatal when GPU benchmarks are wanted and
    the driver is missing or older than the CUDA major release allows."""
    if not cuda:
        if want_gpu:
            return [
                F.error(
                    "gpu-no-cuda",
                    "GPU verification was asked for but the image carries no CUDA "
                    "(no dedal.version.cuda label, no cuda in its Spack specs)",
                )
            ]
        return []
    cv = _ver(cuda)[:2]
    if not driver:
        f = (F.error if want_gpu else F.info)(
            "gpu-driver-missing",
            f"the image carries CUDA {cuda} but this host has no NVIDIA driver "
            "(/proc/driver/nvidia/version): GPU benchmarks " + ("cannot run" if want_gpu else "are skipped"),
        )
        return [f]
    dv = _ver(driver)
    ev = [driver_line or f"driver {driver}", f"image CUDA {cuda}"]
    major_min = CUDA_MAJOR_MIN_DRIVER.get(cv[0]) if cv else None
    exact = CUDA_MIN_DRIVER.get((cv[0], cv[1])) if len(cv) == 2 else None
    if exact is None and cv:  # an unlisted minor release: the newest listed one below it
        below = sorted(k for k in CUDA_MIN_DRIVER if k[0] == cv[0] and k <= tuple(cv))
        exact = CUDA_MIN_DRIVER[below[-1]] if below else None
    fmt = lambda v: ".".join(str(x) for x in v)  # noqa: E731
    if major_min is not None and dv < major_min:
        return [
            (F.error if want_gpu else F.warning)(
                "gpu-driver-too-old",
                f"NVIDIA driver {driver} is too old for the image's CUDA {cuda} (CUDA {cv[0]}.x "
                f"needs at least {fmt(major_min)}): CUDA programs fail with 'CUDA driver version is insufficient'",
                ev,
            )
        ]
    if exact is not None and dv < exact:
        return [
            F.warning(
                "gpu-driver-minor-compat",
                f"NVIDIA driver {driver} is older than CUDA {cuda}'s own "
                f"({fmt(exact)}): it runs through CUDA's minor version compatibility, but PTX JIT of "
                "newer code and some new APIs fail",
                ev,
            )
        ]
    return [F.info("gpu-driver", f"NVIDIA driver {driver} supports the image's CUDA {cuda} ({gpus} GPU(s))", ev)]


def check_passthrough(backend: str, libraries: Sequence[str], note: str, *, use_gpu: bool) -> List[Finding]:
    """Whether the container runtime passes the host's driver into the image for the GPU
    runs: Apptainer's ``--nv`` does; bwrap and ch-run bind the ``libraries`` dedal found
    (their ld cache names; ``note``: what was missing). No libcuda: the GPU runs cannot work."""
    if not use_gpu:
        return []
    if backend == "apptainer":
        return [F.info("gpu-passthrough", "apptainer --nv binds the host's NVIDIA driver into the container")]
    if not any(name.startswith("libcuda.so") for name in libraries):
        return [
            F.error(
                "gpu-passthrough-missing",
                f"runtime {backend} finds no libcuda.so of the host's NVIDIA driver "
                f"to bind into the container ({note or 'none in the ld cache'}): the GPU runs cannot start",
                [f"driver libraries found: {', '.join(libraries) or 'none'}"],
            )
        ]
    return [
        F.info(
            "gpu-passthrough",
            f"runtime {backend} binds the host's NVIDIA driver into the container "
            f"({len(libraries)} libraries, e.g. {', '.join(libraries[:3])}, in /.singularity.d/libs)",
        )
    ]


# ---------------------------------------------------------------------------- network, PMIx


def check_mount(backend: str, image_kind: str, cannot_mount: bool) -> List[Finding]:
    """Where this user can mount no image (not root, /dev/fuse not open to it), Apptainer
    unpacks a SIF or squashfs at every start (``--unsquash``): measured here, 18.8 s per run of
    the demo against 0.27 s natively. Said before the runs, with its cause, for the
    start-up warning that follows."""
    if backend != "apptainer" or image_kind not in ("sif", "squashfs") or not cannot_mount:
        return []
    return [
        F.warning(
            "no-mount",
            "this user can mount no image (not root, and /dev/fuse is not open to it): Apptainer unpacks "
            "the image at every start, so each container run starts slowly; where users may open /dev/fuse "
            "(mode 0666, Debian's default) it is mounted instead",
        )
    ]


def infiniband(devdir: Path = Path("/dev/infiniband")) -> List[str]:
    try:
        return sorted(p.name for p in devdir.iterdir())
    except OSError:
        return []


def slingshot(devdir: Path = Path("/dev")) -> List[str]:
    """HPE Slingshot's CXI devices (``/dev/cxi0`` ...): an RDMA fabric without /dev/infiniband."""
    try:
        return sorted(p.name for p in devdir.glob("cxi[0-9]*"))
    except OSError:
        return []


def check_infiniband(
    devices: Sequence[str], *, multi_node: bool, rows: Sequence[rules.Rule] = rules.RULES
) -> List[Finding]:
    """The host's fabric, and how the rules grade TCP between nodes on it (the same row that
    judges the run logs: :func:`dedal.stages.verify.judge.graded`)."""
    fabric = bool(devices)
    ctx = graded("tcp", "inter-node", HostFacts(has_infiniband=fabric, multi_node=multi_node), rows)
    how = (
        "TCP between nodes is expected, not a fallback"
        if ctx is not None and ctx.severity == "info"
        else "a TCP transport between nodes is a fallback"
    )
    if fabric:
        return [
            F.info(
                "infiniband",
                f"RDMA devices {', '.join(devices[:6])}: RDMA transports are expected between nodes ({how})",
            )
        ]
    return [
        F.info(
            "no-infiniband",
            "no RDMA device on this host (/dev/infiniband, /dev/cxi*): between nodes only "
            "TCP is possible" + (f", so {how}" if multi_node else ""),
        )
    ]


def check_pmix(parsed: Mapping[str, Any]) -> List[Finding]:
    """From a parsed ``srun --mpi=list`` (kind ``srun-mpi-list``)."""
    plugins = list(parsed.get("plugins") or [])
    versions = list(parsed.get("pmix_versions") or [])
    if not parsed.get("has_pmix"):
        return [
            F.error(
                "pmix-missing",
                "Slurm offers no pmix MPI plugin (srun --mpi=list): `srun --mpi=pmix` "
                "cannot start the image's Open MPI 5; ask the site for Slurm built with PMIx",
                [f"plugins: {', '.join(plugins) or 'none'}"],
            )
        ]
    out = [
        F.info(
            "pmix",
            f"Slurm offers pmix ({', '.join(versions) or 'version not listed'})",
            [f"plugins: {', '.join(plugins)}"],
        )
    ]
    if versions and all(v in ("pmix_v2", "pmix_v3", "pmix_v4") for v in versions):
        out.append(
            F.info(
                "pmix-server-old",
                f"Slurm's PMIx server is {versions[-1]}, older than the image's PMIx 5 "
                "client: Open MPI 5's ob1 pml gets no locality from it and hangs, so the runs use the "
                "UCX pml",
            )
        )
    return out


# ---------------------------------------------------------------------------- the whole preflight


@dataclass
class Preflight:
    """The preflight's outcome: host facts for the transport rules, findings, and which
    of them are fatal."""

    host: HostFacts
    findings: List[Finding] = field(default_factory=list)
    fatal: List[Finding] = field(default_factory=list)
    facts: Dict[str, Any] = field(default_factory=dict)  # what was looked at (for the report)
    logs: List[Dict[str, Any]] = field(default_factory=list)  # parsed outputs (srun --mpi=list)

    def add(self, items: Sequence[Finding], *, fatal_codes: Sequence[str] = ()) -> None:
        for f in items:
            self.findings.append(f)
            if f.severity == "error" and (not fatal_codes or f.code in fatal_codes):
                self.fatal.append(f)

    def fatal_line(self) -> str:
        return "preflight: " + "; ".join(f"{f.message}" for f in self.fatal)


FATAL = (
    "cpu-arch-mismatch",
    "cpu-target",
    "gpu-driver-too-old",
    "gpu-driver-missing",
    "gpu-no-cuda",
    "gpu-passthrough-missing",
    "pmix-missing",
    "sif-arch",
    "runtime-missing",
    "nodes",
)


def run_preflight(
    *,
    image_target: Optional[str],
    image_cuda: Optional[str],
    image_arch: Optional[str],
    launcher: str,
    nodes: int,
    want_gpu: Optional[bool],
    srun_mpi_list: Optional[Callable[[], str]] = None,
    allocation_nodes: Optional[int] = None,
    cpuinfo: Path = Path("/proc/cpuinfo"),
    nvidia_version: Path = Path("/proc/driver/nvidia/version"),
    nvidia_gpus: Path = Path("/proc/driver/nvidia/gpus"),
    infiniband_dir: Path = Path("/dev/infiniband"),
    cxi_dir: Path = Path("/dev"),
    loadavg: Path = Path("/proc/loadavg"),
    machine: Optional[str] = None,
    stat: Path = Path("/proc/stat"),
) -> Preflight:
    """Every check; ``srun_mpi_list`` returns ``srun --mpi=list``'s output (called only
    under Slurm). ``want_gpu`` None means: GPU benchmarks if the host has GPUs."""
    machine = machine or os.uname().machine
    multi = nodes >= 2
    ib = infiniband(infiniband_dir) + slingshot(cxi_dir)
    drv = gpu_driver(nvidia_version, nvidia_gpus)
    use_gpu = bool(want_gpu) if want_gpu is not None else bool(drv["driver"] and drv["gpus"] and image_cuda)
    cpu = cpu_info(cpuinfo)
    pf = Preflight(HostFacts(has_infiniband=bool(ib), multi_node=multi, gpus=drv["gpus"] if use_gpu else 0))
    pf.facts = {
        "machine": machine,
        "cpu_model": cpu["model"],
        "infiniband": ib,
        "nvidia_driver": drv["driver"],
        "gpus": drv["gpus"],
        "gpu_benchmarks": use_gpu,
        "image_target": image_target,
        "image_cuda": image_cuda,
        "launcher": launcher,
        "nodes": nodes,
    }
    if image_arch:
        host_arch = sif.host_arch()
        if image_arch != host_arch:
            pf.add(
                [
                    F.error(
                        "sif-arch",
                        f"the image is for {image_arch} but this host is {host_arch}",
                        [f"SIF architecture: {image_arch}"],
                    )
                ],
                fatal_codes=FATAL,
            )
    pf.add(check_cpu_target(image_target, cpu["flags"], machine), fatal_codes=FATAL)
    pf.add(check_infiniband(ib, multi_node=multi))
    pf.add(check_load(loadavg, stat=stat))
    pf.add(
        check_gpu(image_cuda, drv["driver"], drv["gpus"], want_gpu=use_gpu, driver_line=drv["line"]), fatal_codes=FATAL
    )
    if launcher == "srun":
        if srun_mpi_list is None:
            raise ValueError("srun_mpi_list is needed with the srun launcher")
        text = srun_mpi_list()
        parsed = parse_text(text, "srun-mpi-list")
        parsed["source"] = "srun --mpi=list"
        pf.logs.append(parsed)
        pf.facts["pmix_versions"] = parsed.get("pmix_versions") or []
        pf.add(check_pmix(parsed), fatal_codes=FATAL)
        if allocation_nodes is not None and nodes > allocation_nodes:
            pf.add(
                [
                    F.error(
                        "nodes",
                        f"{nodes} nodes asked for but the Slurm allocation has {allocation_nodes} "
                        "(SLURM_JOB_NUM_NODES)",
                    )
                ],
                fatal_codes=FATAL,
            )
    return pf
