"""A synthetic Spack DAG of ESD size, with a fixed seed.

About 800 packages and 80 roots, shaped like a software-stack environment (the EBRAINS
Software Distribution): a toolchain and build tools at the bottom, a few hundred base
and mid-level libraries, the MPI/CUDA stack, a Python ecosystem, and applications on
top. Build times (seconds on 2 cores, like ``dedal.model.durations``) follow a log-normal
distribution of median 60 s for ordinary packages, with the few very long builds real
stacks have: compilers (gcc, llvm), MPI, CUDA-aware libraries (nccl, py-torch, kokkos),
big numerical libraries (trilinos, petsc, boost). Edges are ``link`` or ``build``;
a package's requirements are computed as Spack's installer needs them (direct
dependencies plus the link/run closure of each), like ``SpackLock.build_requirements``.
"""

from __future__ import annotations

import math
import random
from typing import Dict, FrozenSet, List, Set

from dedal.schedule import Workload

SEED = 20240606

TOOLS = [
    ("gcc-runtime", 5),
    ("gmake", 60),
    ("pkgconf", 30),
    ("m4", 30),
    ("autoconf", 20),
    ("automake", 20),
    ("libtool", 25),
    ("perl", 300),
    ("cmake", 480),
    ("ninja", 60),
    ("python", 420),
    ("meson", 20),
    ("bison", 90),
    ("flex", 60),
    ("gettext", 240),
    ("texinfo", 60),
]
LONG = {  # very long builds, on 2 cores
    "gcc": 3600,
    "llvm": 5400,
    "openmpi": 780,
    "nccl": 1500,
    "cuda": 300,
    "ucx": 170,
    "pmix": 230,
    "boost": 1200,
    "trilinos": 3600,
    "petsc": 900,
    "openblas": 600,
    "hdf5": 400,
    "fftw": 300,
    "kokkos": 600,
    "py-torch": 7200,
    "py-scipy": 900,
    "py-numpy": 240,
    "arbor": 600,
    "neuron": 900,
    "nest": 700,
    "vtk": 2400,
    "qt": 3600,
    "rust": 3000,
    "py-tensorflow": 5400,
}


def generate(seed: int = SEED, base: int = 180, mid: int = 300, py: int = 220, roots: int = 80) -> Workload:
    rng = random.Random(seed)
    names: List[str] = []
    dur: Dict[str, float] = {}
    link: Dict[str, Set[str]] = {}
    build: Dict[str, Set[str]] = {}
    popularity: Dict[str, float] = {}

    def add(name: str, seconds: float, links: Set[str], builds: Set[str], pop: float = 1.0) -> str:
        h = f"{len(names):04d}{name}"
        names.append(h)
        dur[h] = float(round(seconds, 1))
        link[h] = set(links)
        build[h] = set(builds)
        popularity[h] = pop
        return h

    def draw(pool: List[str], k: int) -> Set[str]:
        """k distinct packages of ``pool``, popular ones (preferential attachment) more often."""
        k = min(k, len(pool))
        chosen: Set[str] = set()
        weights = [popularity[p] for p in pool]
        while len(chosen) < k:
            chosen.add(rng.choices(pool, weights)[0])
        for p in chosen:
            popularity[p] += 1.0
        return chosen

    def ordinary(median: float = 60.0, sigma: float = 1.0, lo: float = 3.0, hi: float = 1500.0) -> float:
        return min(hi, max(lo, rng.lognormvariate(math.log(median), sigma)))

    runtime = add("gcc-runtime", 5, set(), set(), pop=5)
    tools: Dict[str, str] = {"gcc-runtime": runtime}
    for name, secs in TOOLS[1:]:
        deps = {runtime}
        if name in ("autoconf", "automake", "libtool", "bison", "flex", "texinfo", "gettext"):
            deps |= {tools["m4"]} if "m4" in tools else set()
            if "perl" in tools:
                deps.add(tools["perl"])
        if name in ("meson",) and "python" in tools:
            deps.add(tools["python"])
        tools[name] = add(name, secs, deps, {tools["gmake"]} if "gmake" in tools and name != "gmake" else set())
    build_tools = [tools[n] for n in ("gmake", "pkgconf", "cmake", "ninja", "autoconf", "automake", "libtool", "meson")]
    gcc = add("gcc", LONG["gcc"], {runtime}, {tools["gmake"], tools["perl"]})
    llvm = add("llvm", LONG["llvm"], {runtime, tools["python"]}, {tools["cmake"], tools["ninja"]})

    base_pool: List[str] = [runtime]
    for i in range(base):
        n_link = rng.choice([0, 1, 1, 2, 2, 3])
        deps = {runtime} | draw(base_pool, n_link)
        bdeps = set(rng.sample(build_tools, rng.choice([1, 1, 2])))
        if rng.random() < 0.1:
            bdeps.add(tools["perl"])
        base_pool.append(add(f"lib{i}", ordinary(45, 0.9), deps, bdeps, pop=2.0))

    # the MPI / CUDA stack
    hwloc = add("hwloc", 40, draw(base_pool, 2) | {runtime}, {tools["pkgconf"]}, pop=3)
    libevent = add("libevent", 50, draw(base_pool, 1) | {runtime}, set(), pop=1)
    pmix = add("pmix", LONG["pmix"], {hwloc, libevent}, {tools["perl"], tools["autoconf"]}, pop=1)
    cuda = add("cuda", LONG["cuda"], draw(base_pool, 1) | {runtime}, set(), pop=4)
    ucx = add("ucx", LONG["ucx"], {cuda} | draw(base_pool, 2), {tools["pkgconf"]}, pop=1)
    openmpi = add(
        "openmpi", LONG["openmpi"], {hwloc, pmix, ucx, libevent, cuda}, {tools["perl"], tools["pkgconf"]}, pop=8
    )
    nccl = add("nccl", LONG["nccl"], {cuda}, {tools["gmake"]}, pop=2)
    mid_pool = list(base_pool) + [hwloc, cuda, openmpi, nccl]
    for name in ("openblas", "fftw", "hdf5", "boost", "kokkos", "petsc", "trilinos", "vtk", "qt"):
        deps = draw(mid_pool, rng.randint(2, 5)) | {runtime}
        if name in ("hdf5", "petsc", "trilinos", "fftw"):
            deps.add(openmpi)
        if name in ("kokkos", "petsc", "trilinos"):
            deps.add(cuda)
        h = add(name, LONG[name], deps, {tools["cmake"], tools["gmake"]}, pop=6)
        mid_pool.append(h)
    for i in range(mid - 9):
        deps = draw(mid_pool, rng.randint(1, 6)) | {runtime}
        if rng.random() < 0.25:
            deps.add(openmpi)
        secs = ordinary(75, 1.1) if rng.random() > 0.03 else rng.uniform(900, 2400)
        mid_pool.append(add(f"mid{i}", secs, deps, set(rng.sample(build_tools, 2)), pop=1.5))

    # Python ecosystem
    python = tools["python"]
    setuptools = add("py-setuptools", 60, {python}, set(), pop=30)
    pip = add("py-pip", 30, {python}, set(), pop=30)
    wheel = add("py-wheel", 20, {python}, {setuptools, pip}, pop=10)
    numpy = add(
        "py-numpy",
        LONG["py-numpy"],
        {python, mid_pool[rng.randrange(len(base_pool), len(mid_pool))]},
        {setuptools, pip, tools["meson"]},
        pop=20,
    )
    py_pool = [setuptools, pip, wheel, numpy]
    scipy = add("py-scipy", LONG["py-scipy"], {numpy, python}, {setuptools, pip, tools["meson"]}, pop=6)
    torch = add(
        "py-torch",
        LONG["py-torch"],
        {numpy, python, cuda, nccl, openmpi},
        {tools["cmake"], tools["ninja"], setuptools},
        pop=3,
    )
    tf = add("py-tensorflow", LONG["py-tensorflow"], {numpy, python, cuda}, {setuptools, pip}, pop=1)
    py_pool += [scipy, torch, tf]
    for i in range(py - 7):
        deps = {python} | draw(py_pool, rng.randint(0, 4))
        if rng.random() < 0.1:
            deps |= draw(mid_pool, 1)
        py_pool.append(add(f"py-pkg{i}", ordinary(25, 0.8, 3, 600), deps, {setuptools, pip, wheel}, pop=1.0))

    # applications: the roots
    for name in ("arbor", "neuron", "nest"):
        add(name, LONG[name], draw(mid_pool, 3) | draw(py_pool, 3) | {openmpi, python}, {tools["cmake"]})
    for i in range(roots - 3):
        deps = draw(mid_pool, rng.randint(1, 5)) | draw(py_pool, rng.randint(0, 4))
        if rng.random() < 0.2:
            deps.add(gcc if rng.random() < 0.5 else llvm)
        add(f"app{i}", ordinary(90, 1.0, 10, 1800), deps | {runtime}, {rng.choice(build_tools)})

    # an environment's only leaves are its roots: whatever nobody needs goes to an application
    apps = [h for h in names if h[4:] in ("arbor", "neuron", "nest") or h[4:].startswith("app")]
    used = {d for h in names for d in link[h] | build[h]}
    for h in names:
        if h not in used and h not in apps:
            link[rng.choice(apps)].add(h)

    # requirements as Spack's installer needs them: direct deps + link closure of each
    closure: Dict[str, FrozenSet[str]] = {}
    for h in names:  # names are in dependency order
        acc: Set[str] = set()
        for d in link[h]:
            acc.add(d)
            acc |= closure[d]
        closure[h] = frozenset(acc)
    requires = {}
    for h in names:
        req: Set[str] = set()
        for d in link[h] | build[h]:
            req.add(d)
            req |= closure[d]
        requires[h] = frozenset(req)
    return Workload(
        order=list(names), duration=dur, requires=requires, names={h: h[4:] for h in names}, title="synthetic-esd"
    )


def describe(wl: Workload) -> Dict[str, float]:
    deps = wl.dependents()
    roots = [h for h in wl.order if not deps[h]]
    durs = sorted(wl.duration.values())
    return {
        "packages": len(wl.order),
        "roots": len(roots),
        "edges": sum(len(r) for r in wl.requires.values()),
        "total_s": round(sum(durs), 1),
        "median_s": durs[len(durs) // 2],
        "max_s": durs[-1],
        "over_600_s": sum(1 for d in durs if d > 600),
    }
