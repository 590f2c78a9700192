"""Per-package build durations for scheduling: measured when known, modelled otherwise.

Measured: ``build_seconds`` of an earlier layer manifest of the same package name and
version (any base or root: the work is the same), else of the same name. A build ran
with ``make -j build_cores``; the scheduler takes durations on its reference cores
(``dedal.model.cores.CoreModel``), so a recorded core count converts the wall time
(:meth:`~dedal.model.cores.CoreModel.reference_seconds`); without one (older manifests) the
wall time is taken as it is. Taken as it is, 120 s of a build on 13 cores would be planned
as a 2-core package: its next job would get 2 cores and run far past its estimate. Modelled: a
small table of notoriously long builds (compilers, MPI, CUDA-aware libraries, big
numerical libraries), measured on 2 cores (../shared/notes/spack-debian-sources.md
§3.4 for the MPI stack) and scaled from published Spack CI timings for the rest; every
other package is assumed to take DEFAULT_S. Externals take no time.
"""

from __future__ import annotations

from typing import Dict, Iterable, Mapping, Optional

from dedal.model.cores import DEFAULT_MODEL

DEFAULT_S = 60.0

MODEL_S: Dict[str, float] = {
    "gcc": 3600,
    "llvm": 5400,
    "nvhpc": 600,
    "cuda": 300,
    "openmpi": 780,
    "mpich": 600,
    "ucx": 170,
    "pmix": 230,
    "prrte": 180,
    "hwloc": 40,
    "libevent": 50,
    "numactl": 12,
    "ncurses": 150,
    "libpciaccess": 10,
    "zlib": 5,
    "zlib-ng": 10,
    "gcc-runtime": 5,
    "python": 420,
    "perl": 300,
    "cmake": 480,
    "boost": 1200,
    "openblas": 600,
    "netlib-lapack": 300,
    "hdf5": 400,
    "netcdf-c": 180,
    "netcdf-fortran": 90,
    "fftw": 300,
    "petsc": 900,
    "trilinos": 3600,
    "arbor": 600,
    "neuron": 900,
    "nest": 700,
    "py-numpy": 240,
    "py-scipy": 900,
    "nccl": 1500,
    "nccl-tests": 60,
    "osu-micro-benchmarks": 50,
    "openssl": 240,
    "libxml2": 60,
    "binutils": 300,
    "qt": 3600,
    "vtk": 2400,
    "rust": 3000,
    "go": 400,
    "openjdk": 60,
    "autoconf": 20,
    "automake": 20,
    "libtool": 25,
    "m4": 30,
    "gettext": 240,
    "tar": 60,
    "xz": 40,
    "bzip2": 5,
    "readline": 20,
    "sqlite": 60,
    # dedal's own microbenchmarks (recipes/): 2.1 s measured on 2 cores; at DEFAULT_S a cold
    # first `dedal build-image` of the demo said "about 1 min 5 s" for a build of 6 s
    "dedal-benchmarks": 5,
}


def model(name: str) -> float:
    return MODEL_S.get(name, DEFAULT_S)


def estimate(
    nodes: Iterable[tuple],  # (hash, name, version, external)
    measured: Optional[Mapping[tuple, float]] = None,  # {(name, version) or (name, None): seconds}
) -> Dict[str, float]:
    measured = measured or {}
    result: Dict[str, float] = {}
    for h, name, version, external in nodes:
        if external:
            result[h] = 0.0
        elif (name, version) in measured:
            result[h] = measured[(name, version)]
        elif (name, None) in measured:
            result[h] = measured[(name, None)]
        else:
            result[h] = model(name)
    return result


def from_manifests(manifests: Iterable) -> Dict[tuple, float]:
    """Measured durations from layer manifests (latest wins), on the scheduler's reference cores."""
    out: Dict[tuple, float] = {}
    for m in sorted(manifests, key=lambda m: m.built_at):
        if m.build_seconds > 0:
            seconds = m.build_seconds
            if m.build_cores > 0:
                seconds = DEFAULT_MODEL.reference_seconds(m.build_seconds, m.build_cores)
            out[(m.name, m.version)] = seconds
            out[(m.name, None)] = seconds
    return out
