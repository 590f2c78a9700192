"""How one package build uses the cores of its node: the model durations and the scheduler share.

A package has an amount of work ``W`` (core-seconds) and a parallelism cap ``p``
(``make -j`` stops helping beyond ``p`` cores: configure steps, linking and test suites
are serial); on ``c`` cores it takes ``W / min(c, p)`` seconds. Durations are wall times
at ``ref_cores`` (the machine the model table was measured on), and ``p`` grows with the
size of the build: ``p = clamp(floor(d / unit_s), 1, p_max)``. The scheduler
(:mod:`dedal.schedule`) explains what follows from it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Tuple

REF_CORES = 2
PAR_UNIT_S = 60.0
P_MAX = 16


@dataclass(frozen=True)
class CoreModel:
    """How one package build uses the cores of its node (see the module doc)."""

    ref_cores: int = REF_CORES
    unit_s: float = PAR_UNIT_S
    p_max: int = P_MAX

    def parallelism(self, d: float) -> int:
        return max(1, min(self.p_max, int(d // self.unit_s)))

    def work(self, d: float) -> float:
        """Core-seconds of a package that takes ``d`` seconds on ``ref_cores`` cores."""
        return d * min(self.ref_cores, self.parallelism(d))

    def seconds(self, d: float, cores: int) -> float:
        return self.work(d) / min(max(1, cores), self.parallelism(d))

    def reference_seconds(self, wall_s: float, cores: int) -> float:
        """The duration on ``ref_cores`` of a package measured at ``wall_s`` with ``make -j
        cores``: ``d`` with ``seconds(d, cores) == wall_s``. A wall time alone does not say
        how well the build scaled (120 s on 8 cores fits a 120 s package that uses 2 cores
        and a 480 s one that uses 8), so the largest such ``d`` is taken: on as many cores
        again it is estimated at the time it took, and it is given those cores. Where no
        ``d`` matches exactly (the parallelism steps), the one closest to ``wall_s``."""
        cores = max(1, int(cores))
        if wall_s <= 0 or cores == self.ref_cores:
            return max(0.0, wall_s)
        best: Optional[Tuple[float, float]] = None  # (miss, -d)
        for k in range(1, self.p_max + 1):  # the band of durations where the parallelism is k
            low = 0.0 if k == 1 else k * self.unit_s
            high = math.inf if k == self.p_max else (k + 1) * self.unit_s
            d = max(low, wall_s * min(cores, k) / min(self.ref_cores, k))  # seconds() is linear in the band
            if high < math.inf:
                d = min(d, math.nextafter(high, 0.0))
            cand = (abs(self.seconds(d, cores) - wall_s), -d)
            if best is None or cand < best:
                best = cand
        assert best is not None
        return -best[1]

    def to_json(self) -> dict:
        return asdict(self)


DEFAULT_MODEL = CoreModel()
