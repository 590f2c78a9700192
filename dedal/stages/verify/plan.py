"""The run plan of a verification: which runs, in which order, with which launcher and
environment, and the record of each run.

Every benchmark runs intra-node (always) and inter-node (``srun`` with 2+ nodes), natively
and in the container, **interleaved** in one allocation: each repetition runs native and
container back to back, alternating which goes first (N C, C N, N C ...), so that drift
of the machine hits both sides alike; one unmeasured warm-up per side first. UCX
(``UCX_LOG_LEVEL=info UCX_PROTO_INFO=y``), Open MPI (``pml_base_verbose``) and NCCL
(``NCCL_DEBUG=INFO``) debug output is on for every run.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, TypeVar

from dedal.stages.verify.catalogue import Bench
from dedal.stages.verify.options import Options

SIDES = ("native", "container")
T = TypeVar("T")

#: the MPI stack every run uses, the applications' too (the caller's --env and an app's own env
#: override each): without these Open MPI 5 takes the ob1 pml where UCX finds no Mellanox
#: device, and ob1 hangs under Slurm's PMIx 4 server, or crashes in MPI_Init
#: (mca_pml_ob1_recv_frag_callback_match, ringtest on 3 nodes of the test cluster)
MPI_ENV = {
    "OMPI_MCA_pml": "ucx",  # the UCX pml
    "OMPI_MCA_pml_ucx_tls": "any",  # Open MPI 5 defaults to Mellanox transports only
    "OMPI_MCA_pml_ucx_devices": "any",
}
#: and the debug output every benchmark run has on (the applications' output stays theirs)
DEBUG_ENV = {
    "UCX_LOG_LEVEL": "info",  # UCX: version, selected transports per endpoint configuration
    "UCX_PROTO_INFO": "y",  # UCX: protocol table per message size range
    **MPI_ENV,
    "OMPI_MCA_pml_base_verbose": "10",  # which pml was selected
}
NCCL_ENV = {"NCCL_DEBUG": "INFO"}


@dataclass
class Run:
    side: str
    scope: str
    bench: Bench
    rep: int  # 0: warm-up
    ranks: int
    nodes: int
    log: Path
    rel: str
    returncode: Optional[int] = None
    seconds: float = 0.0
    timed_out: bool = False
    parsed: Optional[Dict[str, Any]] = None
    skipped: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


@dataclass
class Plan:
    launcher: str
    scopes: List[Tuple[str, int]]  # (scope, nodes)
    benches: List[Bench]
    repetitions: int
    ranks: int
    gpus: int

    def ranks_for(self, bench: Bench, nodes: int) -> int:
        if bench.pt2pt:
            return 2
        if bench.gpu:
            return max(1, self.gpus) * nodes
        if nodes == 1:  # within one node communication needs two ranks, also at 1 rank per node
            return max(2, self.ranks)
        return self.ranks * nodes

    def pairs(self) -> List[Tuple[str, Bench]]:
        """(scope, bench) of every check: each benchmark in each scope, those that measure
        something only one node has (``intra_only``) within a node only."""
        return [
            (scope, bench)
            for scope, _nodes in self.scopes
            for bench in self.benches
            if not (bench.intra_only and scope != "intra-node")
        ]

    def order(self) -> List[Tuple[str, Bench, int, str]]:
        """(scope, bench, repetition, side) in run order: warm-up first, then each
        repetition with native and container back to back, alternating who goes first."""
        out: List[Tuple[str, Bench, int, str]] = []
        warm = next((b for b in self.benches if b.key == "init"), self.benches[0] if self.benches else None)
        for scope, _nodes in self.scopes:
            if warm is not None:
                for side in SIDES:
                    out.append((scope, warm, 0, side))
        return out + self.again(self.pairs(), 1)

    def again(self, pairs: Sequence[Tuple[str, Bench]], first: int) -> List[Tuple[str, Bench, int, str]]:
        """(scope, bench, repetition, side): ``repetitions`` repetitions of the (scope, bench)
        pairs from repetition ``first`` on, each covering every pair before the next, native
        and container back to back, alternating who goes first (odd: native)."""
        return [(scope, bench, rep, side) for (scope, bench), rep, side in interleaved(pairs, first, self.repetitions)]


def interleaved(items: Sequence[T], first: int, count: int) -> List[Tuple[T, int, str]]:
    """(item, repetition, side): ``count`` repetitions from ``first`` on, each covering every
    item before the next, native and container back to back, alternating who goes first
    (odd repetitions: native), so that drift of the machine hits both sides alike. The one
    order of every comparison: the benchmarks' (:meth:`Plan.again`) and the application
    benchmarks' (:mod:`dedal.stages.verify.appbench`)."""
    out: List[Tuple[T, int, str]] = []
    for rep in range(first, first + count):
        sides = SIDES if rep % 2 == 1 else tuple(reversed(SIDES))
        for item in items:
            for side in sides:
                out.append((item, rep, side))
    return out


def choose_launcher(choice: str) -> str:
    """``auto``: srun inside a Slurm allocation (where srun is on PATH), else mpirun."""
    if choice != "auto":
        return choice
    return "srun" if os.environ.get("SLURM_JOB_ID") and shutil.which("srun") else "mpirun"


def allocation_nodes() -> Optional[int]:
    """The nodes of the Slurm allocation this runs in (``SLURM_JOB_NUM_NODES``), if any."""
    try:
        return int(os.environ["SLURM_JOB_NUM_NODES"]) if os.environ.get("SLURM_JOB_ID") else None
    except (KeyError, ValueError):
        return None


def run_env(opts: Options, bench: Bench) -> Dict[str, str]:
    """The environment of one run: the debug output, NCCL's for GPU benchmarks, the caller's."""
    env = dict(DEBUG_ENV)
    if bench.gpu:
        env.update(NCCL_ENV)
    env.update(opts.env)
    if env.get("OMPI_MCA_pml") == "ob1":
        env.setdefault("OMPI_MCA_btl_base_verbose", "100")  # which BTL each peer uses
    return env
