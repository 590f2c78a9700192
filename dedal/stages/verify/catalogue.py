"""The benchmarks ``dedal verify`` knows, and which of them a verification runs.

Each benchmark is a program in the image: dedal's own (``dedal_*``, from the
dedal-benchmarks package or built by ``dedal verify`` with the image's ``mpicc``), the OSU
micro-benchmarks (``osu_*``) and nccl-tests (``all_reduce_perf``). A benchmark is asked
for by its key (init, latency, bw, allreduce, nccl: dedal's program, plus the OSU or
nccl-tests counterpart with ``osu``) or by program name.

A GPU image (one that carries CUDA) also plans the GPU checks: the NCCL all-reduce
(``nccl``), the platform's own floor for device-buffer messages (``dedal_cuda_floor``, with
``latency``: a CUDA IPC ping-pong between two processes, CUDA copy + synchronize, copy
bandwidth; within a node only), dedal's latency and bandwidth between device buffers
(``dedal_latency -d cuda``, ``dedal_bw -d cuda``: ``dedal_latency-cuda``, ``dedal_bw-cuda``;
plain C that finds the CUDA driver at run time, so any image's mpicc builds them), and, where
its OSU micro-benchmarks are built ``+cuda``, OSU
latency and bandwidth between device buffers (``osu_latency -d cuda D D``, ``osu_bw -d cuda
D D``, named ``osu_latency-cuda``, ``osu_bw-cuda``; with ``latency``/``bw`` and ``osu``),
which the expectations hold to that floor. On a host without GPU they are not run:
:func:`gpu_planned` names them for the report, which lists each as ``skipped: no GPU``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Bench:
    """One benchmark program: ``key`` (init, latency, bw, allreduce, nccl), the program
    name, how its output is parsed/compared (``osu`` tables or ``nccl`` tables);
    ``device``: the GPU API of OSU's device buffers (``cuda``: both sides' buffers on the GPU)."""

    key: str
    program: str
    suite: str  # dedal | osu | nccl-tests
    pt2pt: bool = False
    gpu: bool = False
    device: str = ""
    intra_only: bool = False  # measures something only one node has (CUDA IPC between two processes)

    @property
    def name(self) -> str:
        """What the runs, logs and checks are named: the program, with its device (``osu_bw-cuda``)."""
        return f"{self.program}-{self.device}" if self.device else self.program

    @property
    def parser(self) -> str:
        """The parser of its output: ``nccl-tests`` tables or ``osu`` tables."""
        return "nccl-tests" if self.suite == "nccl-tests" or self.program == "dedal_nccl_allreduce" else "osu"

    @property
    def table(self) -> str:
        """The benchmark name the parser gives its table (``osu_init`` for both inits:
        the checks read the init line, not a table)."""
        if self.key == "init":
            return "osu_init"
        return self.program

    def args(self, max_size: int, nccl_max: int) -> List[str]:
        if self.key == "init":
            return []
        if self.program == "dedal_nccl_allreduce":
            return [str(nccl_max)]
        if self.program == "all_reduce_perf":
            return ["-b", "8", "-e", str(nccl_max), "-f", "2", "-g", "1"]
        if self.key == "allreduce":
            return ["-m", str(min(max_size, 1 << 20))]
        if self.device:  # OSU: options, then the buffer of each side (D: device); dedal's: both on the device
            return ["-d", self.device, "-m", str(max_size)] + (["D", "D"] if self.suite == "osu" else [])
        return ["-m", str(max_size)]


CATALOGUE: Tuple[Bench, ...] = (
    Bench("init", "dedal_init", "dedal"),
    Bench("latency", "dedal_latency", "dedal", pt2pt=True),
    Bench("bw", "dedal_bw", "dedal", pt2pt=True),
    Bench("allreduce", "dedal_allreduce", "dedal"),
    Bench("nccl", "dedal_nccl_allreduce", "dedal", gpu=True),
    Bench("latency", "dedal_cuda_floor", "dedal", pt2pt=True, gpu=True, intra_only=True),
    Bench("latency", "dedal_latency", "dedal", pt2pt=True, gpu=True, device="cuda"),
    Bench("bw", "dedal_bw", "dedal", pt2pt=True, gpu=True, device="cuda"),
    Bench("init", "osu_init", "osu"),
    Bench("latency", "osu_latency", "osu", pt2pt=True),
    Bench("bw", "osu_bw", "osu", pt2pt=True),
    Bench("allreduce", "osu_allreduce", "osu"),
    Bench("nccl", "all_reduce_perf", "nccl-tests", gpu=True),
    Bench("latency", "osu_latency", "osu", pt2pt=True, gpu=True, device="cuda"),
    Bench("bw", "osu_bw", "osu", pt2pt=True, gpu=True, device="cuda"),
)
KEYS = ("init", "latency", "bw", "allreduce", "nccl")
#: what each key's check measures, and in what unit (a skipped check is named by it)
METRICS = {
    "init": ("init", "ms"),
    "latency": ("latency", "us"),
    "bw": ("bandwidth", "MB/s"),
    "allreduce": ("latency", "us"),
    "nccl": ("busbw", "GB/s"),
}


def needs_driver(bench: Bench, osu_cuda: Optional[bool]) -> bool:
    """Whether ``bench`` cannot start without the GPU driver: a GPU benchmark, or any of OSU's
    where the image's OSU is built with CUDA (its programs link libcuda, host buffers or not:
    on a host without driver they exit 127; with one they need it bound, ``--nv``)."""
    return bench.gpu or (bench.suite == "osu" and bool(osu_cuda))


def select_benchmarks(
    wanted: Sequence[str],
    programs: Mapping[str, str],
    *,
    gpu: bool,
    osu_cuda: Optional[bool] = None,
    dedal_cuda: Optional[bool] = None,
) -> Tuple[List[Bench], List[str]]:
    """The benchmarks to run (in catalogue order) and notes on what was asked for but is
    not in the image or not runnable here. GPU benchmarks only with ``gpu`` (the runner
    reports those left out as skipped checks, :func:`gpu_planned`); OSU's device-buffer
    runs only where the image's OSU is built with CUDA (``osu_cuda``), dedal's where its
    dedal-benchmarks know ``-d cuda`` (``dedal_cuda``; the runner builds them where not).
    ``programs`` may name a device-buffer benchmark's own build (``dedal_latency-cuda``)."""
    keys = {w for w in wanted if w in KEYS}
    explicit = {w for w in wanted if w not in KEYS and w != "osu"}
    with_osu = "osu" in wanted
    chosen: List[Bench] = []
    notes: List[str] = []
    for b in CATALOGUE:
        named = b.name in explicit or (b.program in explicit and not b.device)
        asked = named or (b.key in keys and (b.suite == "dedal" or with_osu))
        if not asked:
            continue
        if needs_driver(b, osu_cuda) and not gpu:
            continue
        if b.program not in programs and b.name not in programs:
            if (b.suite == "dedal" or named) and not b.device:
                notes.append(f"{b.program}: not in the image")
            continue
        if b.device and b.suite == "dedal":
            if not dedal_cuda and b.name not in programs:
                if gpu:
                    notes.append(f"{b.name}: the image's dedal-benchmarks predate device buffers (-d cuda)")
                continue
        elif b.device and not osu_cuda:
            if gpu:
                notes.append(
                    f"{b.name}: the image's OSU micro-benchmarks are "
                    f"{'not built with' if osu_cuda is False else 'not known to be built with'} CUDA "
                    f"(osu-micro-benchmarks +cuda): no device-buffer runs"
                )
            continue
        chosen.append(b)
    return chosen, notes


def gpu_planned(
    wanted: Sequence[str],
    programs: Mapping[str, str],
    *,
    osu_cuda: Optional[bool] = None,
    dedal_cuda: Optional[bool] = None,
) -> List[Bench]:
    """The benchmarks a verification of this image plans only where the host has a GPU (its
    driver): the GPU benchmarks, and OSU's where the image's OSU is built with CUDA."""
    return [
        b
        for b in select_benchmarks(wanted, programs, gpu=True, osu_cuda=osu_cuda, dedal_cuda=dedal_cuda)[0]
        if needs_driver(b, osu_cuda)
    ]
