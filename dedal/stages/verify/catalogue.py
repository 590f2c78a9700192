"""The benchmarks ``dedal verify`` knows, and which of them a verification runs.

Each benchmark is a program in the image: dedal's own (``dedal_*``, from the
dedal-benchmarks package or built by ``dedal verify`` with the image's ``mpicc``), the OSU
micro-benchmarks (``osu_*``) and nccl-tests (``all_reduce_perf``). A benchmark is asked
for by its key (init, latency, bw, allreduce, nccl: dedal's program, plus the OSU or
nccl-tests counterpart with ``osu``) or by program name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Mapping, Sequence, Tuple


@dataclass(frozen=True)
class Bench:
    """One benchmark program: ``key`` (init, latency, bw, allreduce, nccl), the program
    name, how its output is parsed/compared (``osu`` tables or ``nccl`` tables)."""

    key: str
    program: str
    suite: str          # dedal | osu | nccl-tests
    pt2pt: bool = False
    gpu: bool = False

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
        return ["-m", str(max_size)]


CATALOGUE: Tuple[Bench, ...] = (
    Bench("init", "dedal_init", "dedal"),
    Bench("latency", "dedal_latency", "dedal", pt2pt=True),
    Bench("bw", "dedal_bw", "dedal", pt2pt=True),
    Bench("allreduce", "dedal_allreduce", "dedal"),
    Bench("nccl", "dedal_nccl_allreduce", "dedal", gpu=True),
    Bench("init", "osu_init", "osu"),
    Bench("latency", "osu_latency", "osu", pt2pt=True),
    Bench("bw", "osu_bw", "osu", pt2pt=True),
    Bench("allreduce", "osu_allreduce", "osu"),
    Bench("nccl", "all_reduce_perf", "nccl-tests", gpu=True),
)
KEYS = ("init", "latency", "bw", "allreduce", "nccl")


def select_benchmarks(wanted: Sequence[str], programs: Mapping[str, str], *, gpu: bool) -> Tuple[List[Bench], List[str]]:
    """The benchmarks to run (in catalogue order) and notes on what was asked for but is
    not in the image or not runnable here."""
    keys = {w for w in wanted if w in KEYS}
    explicit = {w for w in wanted if w not in KEYS and w != "osu"}
    with_osu = "osu" in wanted
    chosen: List[Bench] = []
    notes: List[str] = []
    for b in CATALOGUE:
        asked = b.program in explicit or (b.key in keys and (b.suite == "dedal" or with_osu))
        if not asked:
            continue
        if b.gpu and not gpu:
            if b.program in programs and (b.program in explicit or b.suite == "dedal"):
                notes.append(f"{b.program}: GPU benchmark skipped (no GPU verification on this host)")
            continue
        if b.program not in programs:
            if b.suite == "dedal" or b.program in explicit:
                notes.append(f"{b.program}: not in the image")
            continue
        chosen.append(b)
    return chosen, notes
