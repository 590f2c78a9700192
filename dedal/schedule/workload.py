"""The scheduler's data, and the model's numbers for one package or one job.

What every other module of the package works on: the packages to build
(:class:`Workload`), the jobs (:class:`Job`), a simulated run (:class:`Simulation`),
the jobs' time limits (:class:`TimeLimits`), the result (:class:`Schedule`); the
cores and seconds of the machine model (see :mod:`dedal.schedule`) for a package or
a job, and the jobs in an order that respects their dependencies. It imports nothing
from the package, so that everything else can import it.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, Hashable, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from dedal.model.cores import DEFAULT_MODEL, CoreModel


@dataclass
class Workload:
    """The packages to build, their durations and who needs whom (pure data)."""

    order: List[str]  # dependencies first
    duration: Dict[str, float]  # seconds at ref_cores
    requires: Dict[str, FrozenSet[str]]  # package -> packages of this workload it needs built first
    names: Dict[str, str] = field(default_factory=dict)
    title: str = ""

    @classmethod
    def from_plan(cls, plan, hashes: Optional[Iterable[str]] = None) -> "Workload":
        """The packages ``hashes`` (default: ``plan.to_build``) of a Plan; their requirements
        are their build requirements among those packages."""
        wanted = set(plan.to_build if hashes is None else hashes)
        order = [h for h in plan.to_build if h in wanted] + sorted(wanted - set(plan.to_build))
        return cls(
            order=order,
            duration={h: float(plan.nodes[h].estimate_s) for h in order},
            requires={h: _among(plan.build_requirements.get(h, ()), wanted, h) for h in order},
            names={h: plan.nodes[h].name for h in order},
            title=plan.env_name,
        )

    def name(self, h: str) -> str:
        got = self.names.get(h)
        return got if got is not None else h[:7]

    def _cached(self, what: Hashable, make: Callable[[], Any]) -> Any:
        """``make()``, once for this order and these requirements: every grouping, bound and
        search asks again, and a build of 10,000 packages pays for each (a workload is not
        changed in place once made; a new order or requirements dict makes it anew)."""
        cache = self.__dict__.setdefault("_cache", {})
        got = cache.get(what)
        if got is None or got[0] is not self.order or got[1] is not self.requires or got[2] != len(self.order):
            got = cache[what] = (self.order, self.requires, len(self.order), make())
        return got[3]

    def dependents(self) -> Mapping[str, FrozenSet[str]]:
        """For each package, the packages that require it (shared: not to be changed)."""
        return self._cached("dependents", self._dependents)

    def _dependents(self) -> Dict[str, FrozenSet[str]]:
        out: Dict[str, Set[str]] = {h: set() for h in self.order}
        for h in self.order:
            for r in self.requires[h]:
                out[r].add(h)
        return {h: frozenset(d) for h, d in out.items()}

    def direct_requires(self) -> Mapping[str, Tuple[str, ...]]:
        """For each package, its requirements that no other of its requirements needs in
        turn (the transitive reduction; shared: not to be changed). The same order as
        ``requires``, through fewer edges: a package of a facility stack requires the
        link/run closure of its dependencies (22 edges per package on the 10,000-spec lock
        of benchmarks/schedule/scale.md, 2 in the reduction), and every job graph made from
        packages is transitively reduced anyway (:func:`~dedal.schedule.grouping.reduce_after`)."""
        return self._cached("direct", self._direct)

    def _direct(self) -> Dict[str, Tuple[str, ...]]:
        order = self.topo()
        pos = {h: i for i, h in enumerate(order)}
        anc: Dict[str, int] = {}  # bit set of every package this one needs, directly or not
        out: Dict[str, Tuple[str, ...]] = {}
        for h in order:
            reqs = self.requires[h]
            through = 0
            half = 0  # half the bit length of ``through``
            kept = set()
            # latest first: one needed by another comes after it, so its bit is set by then
            # (and everything it needs too: only the kept ones need adding)
            for r in sorted(reqs, key=pos.__getitem__, reverse=True):
                p = pos[r]
                # bit p of ``through`` by the cheaper of two big-int operations, each costing
                # the size of its result: a low bit (the shared core) by a mask, a high one by a shift
                if (through & (1 << p)) if p < half else (through >> p) & 1:
                    continue
                kept.add(r)
                through |= anc[r]
                half = through.bit_length() >> 1
            out[h] = tuple(filter(kept.__contains__, reqs))
            for r in kept:
                through |= 1 << pos[r]
            anc[h] = through
        return out

    def direct_dependents(self) -> Mapping[str, Tuple[str, ...]]:
        """For each package, the packages that have it among their :meth:`direct_requires`
        (shared: not to be changed). A longest path (a bottom level, a tail) is the same
        over these as over every dependent: a dependent left out is reached through one kept."""
        return self._cached("direct_dependents", self._direct_dependents)

    def _direct_dependents(self) -> Dict[str, Tuple[str, ...]]:
        out: Dict[str, List[str]] = {h: [] for h in self.order}
        direct = self.direct_requires()
        for h in self.order:
            for r in direct[h]:
                out[r].append(h)
        return {h: tuple(d) for h, d in out.items()}

    def topo(self) -> List[str]:
        """``order`` checked (every requirement before its dependent), else a fresh one."""
        return list(self._cached("topo", self._topo))

    def _topo(self) -> List[str]:
        pos = {h: i for i, h in enumerate(self.order)}
        if all(pos[r] < pos[h] for h in self.order for r in self.requires[h]):
            return list(self.order)
        indeg = {h: len(self.requires[h]) for h in self.order}
        deps = self.dependents()
        queue = [h for h in self.order if indeg[h] == 0]
        out: List[str] = []
        while queue:
            h = queue.pop(0)
            out.append(h)
            for d in sorted(deps[h], key=pos.__getitem__):
                indeg[d] -= 1
                if indeg[d] == 0:
                    queue.append(d)
        if len(out) != len(self.order):
            raise ValueError("dependency cycle among the packages to build")
        return out


@dataclass
class Job:
    """One build job: ``hashes`` built in this order on one node with ``cores`` CPUs,
    after every job in ``after`` completed. ``priority``: estimated seconds from this
    job's start to the end of the build along its longest chain of dependent jobs
    (larger first)."""

    id: str
    hashes: List[str]
    after: List[str] = field(default_factory=list)
    est_s: float = 0.0
    priority: float = 0.0
    cores: int = 1
    names: List[str] = field(default_factory=list)
    # order hints (:func:`tighten`): job id -> seconds after submission. This job waits
    # for that one to end (Slurm ``afterany``: whatever its outcome) until then, and no
    # longer: a hint made from estimates must not hold cores idle once they proved wrong
    order: Dict[str, float] = field(default_factory=dict)

    def waits_for(self) -> List[str]:
        """Every job this one is submitted after: its ``after`` and its order hints."""
        return list(self.after) + [a for a in self.order if a not in self.after]

    @property
    def label(self) -> str:
        """The job's main package (longest estimate is not known here: the last one) plus a count."""
        main = self.names[-1] if self.names else self.hashes[-1][:7]
        return main + (f"+{len(self.hashes) - 1}" if len(self.hashes) > 1 else "")

    def to_json(self) -> dict:
        data = {
            "id": self.id,
            "hashes": list(self.hashes),
            "after": list(self.after),
            "est_s": round(self.est_s, 3),
            "priority": round(self.priority, 3),
            "cores": self.cores,
            "names": list(self.names),
        }
        if self.order:
            data["order"] = {a: round(t, 3) for a, t in self.order.items()}
        return data

    @classmethod
    def from_json(cls, data: Mapping) -> "Job":
        return cls(
            id=str(data["id"]),
            hashes=list(data["hashes"]),
            after=[str(a) for a in data.get("after", [])],
            est_s=float(data.get("est_s", 0.0)),
            priority=float(data.get("priority", 0.0)),
            cores=int(data.get("cores", 1)),
            names=list(data.get("names", [])),
            order={str(a): float(t) for a, t in dict(data.get("order") or {}).items()},
        )


@dataclass
class Simulation:
    makespan_s: float
    starts: Dict[str, Tuple[float, float, int]]  # job id -> (start, end, node index)
    busy_core_s: float  # core-seconds the jobs held (overhead included)


@dataclass(frozen=True)
class Machine:
    """The machine a schedule is made for: ``nodes`` build nodes of ``cores`` cores, every
    job paying ``overhead_s`` (setting ``job_overhead_s``), packages timed by ``model``;
    ``cpus_per_job`` (setting ``slurm.cpus_per_job``) fixes the cores of every job (0: each
    package gets as many as it can use). One value, so that every grouping, bound and
    search of one schedule takes the same machine."""

    nodes: int
    cores: int
    overhead_s: float
    model: CoreModel = DEFAULT_MODEL
    cpus_per_job: int = 0


@dataclass(frozen=True)
class TimeLimits:
    """The time limits the jobs are submitted with (``slurm.time_factor``,
    ``slurm.time``): a job's estimate times ``factor`` in whole minutes (rounded up), at
    most ``cap_min`` (None: no cap); with ``factor`` 0, ``cap_min`` for every job. Slurm's
    backfill plans with them (:func:`simulate_backfill`)."""

    factor: float = 2.0
    cap_min: Optional[int] = 240

    def minutes(self, est_s: float) -> Optional[int]:
        """The job's limit in minutes; None: no limit."""
        if self.factor <= 0:
            return self.cap_min
        minutes = max(1, math.ceil(self.factor * est_s / 60.0))
        return minutes if self.cap_min is None else min(minutes, self.cap_min)

    def seconds(self, jobs: Sequence["Job"]) -> Dict[str, float]:
        out = {}
        for j in jobs:
            m = self.minutes(j.est_s)
            out[j.id] = math.inf if m is None else 60.0 * m
        return out


@dataclass
class Schedule:
    jobs: List[Job]
    nodes: int
    cores: int
    overhead_s: float
    makespan_s: float
    lower_bound_s: float
    critical_path_s: float
    work_core_s: float
    utilization: float
    strategy: str = "dedal"
    model: CoreModel = DEFAULT_MODEL
    dag_bound_s: float = 0.0
    starts: Dict[str, Tuple[float, float, int]] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.makespan_s / self.lower_bound_s if self.lower_bound_s > 0 else 1.0

    def to_json(self, with_jobs: bool = True) -> dict:
        data = {
            "makespan_s": round(self.makespan_s, 3),
            "lower_bound_s": round(self.lower_bound_s, 3),
            "ratio": round(self.ratio, 4),
            "jobs": len(self.jobs),
            "packages": sum(len(j.hashes) for j in self.jobs),
            "utilization": round(self.utilization, 4),
            "nodes": self.nodes,
            "cores": self.cores,
            "overhead_s": self.overhead_s,
            "critical_path_s": round(self.critical_path_s, 3),
            "dag_bound_s": round(self.dag_bound_s, 3),
            "work_core_s": round(self.work_core_s, 3),
            "strategy": self.strategy,
            "model": self.model.to_json(),
        }
        if with_jobs:
            data["schedule"] = [
                dict(
                    j.to_json(),
                    start_s=round(self.starts[j.id][0], 3),
                    end_s=round(self.starts[j.id][1], 3),
                    node=self.starts[j.id][2],
                )
                if j.id in self.starts
                else j.to_json()
                for j in self.jobs
            ]
        return data


# -- the model's per-package numbers ---------------------------------------------------


def package_cores(wl: Workload, cores: int, model: CoreModel = DEFAULT_MODEL, cpus_per_job: int = 0) -> Dict[str, int]:
    if cpus_per_job:
        c = max(1, min(cpus_per_job, cores))
        return {h: c for h in wl.order}
    return {h: max(1, min(model.parallelism(wl.duration[h]), cores)) for h in wl.order}


def _among(reqs: Iterable[str], wanted: Set[str], h: str) -> FrozenSet[str]:
    """The requirements of ``h`` among ``wanted``, but ``h`` (filtered in C: 22 a package of
    a facility stack); the same set, made in the same order, as one filtered in Python."""
    got = frozenset(filter(wanted.__contains__, reqs))
    return got if h not in got else frozenset(r for r in reqs if r in wanted and r != h)


def package_seconds(
    wl: Workload, cores: int, model: CoreModel = DEFAULT_MODEL, cpus_per_job: int = 0
) -> Tuple[Mapping[str, int], Mapping[str, float]]:
    """(:func:`package_cores`, each package's seconds on those cores), made once per workload
    and node size (shared: not to be changed): both bounds and both groupings of a large
    build ask for the same numbers."""

    def make() -> Tuple[Dict[str, int], Dict[str, float]]:
        need = package_cores(wl, cores, model, cpus_per_job)
        return need, {h: model.seconds(wl.duration[h], need[h]) for h in wl.order}

    return wl._cached(("seconds", cores, model, cpus_per_job), make)


# model -> (duration, cores) -> seconds (a model's hash is computed in Python: once a job)
_SECONDS: Dict[CoreModel, Dict[Tuple[float, int], float]] = {}


def seconds_memo(model: CoreModel) -> Dict[Tuple[float, int], float]:
    """``model.seconds(duration, cores)`` remembered by (duration, cores), for the list
    schedulers and the searches, which ask again and again (bounded: started afresh when
    large)."""
    known = _SECONDS.get(model)
    if known is None or len(known) > 100_000:
        if len(_SECONDS) > 64:
            _SECONDS.clear()
        known = _SECONDS[model] = {}
    return known


def job_seconds(wl: Workload, hashes: Iterable[str], cores: int, model: CoreModel, overhead_s: float) -> float:
    """A job's estimate: its overhead, then its packages one after the other on ``cores``."""
    known = seconds_memo(model)
    total = overhead_s
    for h in hashes:
        d = wl.duration[h]
        s = known.get((d, cores))
        if s is None:
            s = known[(d, cores)] = model.seconds(d, cores)
        total += s
    return total


def top_cores(wl: Workload, hashes: Iterable[str], cores: int, model: CoreModel) -> int:
    """The most cores a job of these packages can use (never more than a node has)."""
    return max(1, min(cores, max(model.parallelism(wl.duration[h]) for h in hashes)))


def keyed_topo(ids: Sequence[str], waits: Mapping[str, Sequence[str]], key: Mapping[str, Any]) -> List[str]:
    """Every job after those it waits for; among the ready ones, smallest ``key`` first."""
    indeg = {k: len(waits[k]) for k in ids}
    feeds: Dict[str, List[str]] = {k: [] for k in ids}
    for k in ids:
        for a in waits[k]:
            if a not in feeds:
                raise ValueError(f"job {k} waits for an unknown job {a}")
            feeds[a].append(k)
    heap = [(key[k], k) for k in ids if indeg[k] == 0]
    heapq.heapify(heap)
    out: List[str] = []
    while heap:
        _, k = heapq.heappop(heap)
        out.append(k)
        for d in feeds[k]:
            indeg[d] -= 1
            if indeg[d] == 0:
                heapq.heappush(heap, (key[d], d))
    if len(out) != len(ids):
        raise ValueError("dependency cycle among the jobs")
    return out


def job_topo(jobs: Sequence[Job]) -> List[Job]:
    """Jobs with every job before the jobs that depend on it; among the ready ones,
    highest priority first (the submission order)."""
    by_id = {j.id: j for j in jobs}
    key = {j.id: (-j.priority, i) for i, j in enumerate(jobs)}
    return [by_id[k] for k in keyed_topo(list(by_id), {j.id: j.waits_for() for j in jobs}, key)]
