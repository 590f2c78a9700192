"""With a real Spack (DEDAL_SPACK_ROOT): the ESD environments concretize on their default
bases (esd-cpu and esd-neuro on debian-trixie, esd-gpu on debian-trixie-cuda) through
`dedal fetch --lock-only`, offline, and the locks hold what the environments are for;
where Debian's archive and PyPI answer, `dedal fetch` of esd-neuro fills the mirror
with every source (the only test here that downloads: about 150 MB).

Concretization is CPU-heavy (about a minute each on an idle core, several on a shared
machine); the bases come from the shared base cache (built on first use: debian-trixie
in minutes, debian-trixie-cuda downloads ≈2.5 GB)."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Dict, List

import pytest

from dedal.adapters import pypi
from dedal.model.base import base_identity
from dedal.model.spack_lock import Node, SpackLock, load_lock
from tests.conftest import ROOT

pytestmark = pytest.mark.spack

ENVS = ROOT / "spack-envs"


@pytest.fixture
def concretize(run_dedal, real_spack, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root (the base image's root filesystem through bubblewrap)")

    def _concretize(name: str) -> SpackLock:
        env = {
            "DEDAL_DATA_DIR": str(tmp_path / "data"),
            "DEDAL_SPACK_ROOT": str(real_spack),
            "DEDAL_CACHE_DIR": os.environ.get("DEDAL_CACHE_DIR", str(Path.home() / ".cache" / "dedal")),
        }
        res = run_dedal("fetch", str(ENVS / name / "env.yaml"), "--lock-only", "--json", env=env, timeout=3600)
        assert res.returncode == 0, res.stdout + res.stderr
        result = json.loads(res.stdout)
        assert result["concretized"] is True and result["mirrored"] is False
        plan = json.loads(Path(result["plan"]).read_text())
        assert plan["base_id"] == base_identity(plan["base_image"])
        return load_lock(Path(result["lock"]))

    return _concretize


def by_name(lock: SpackLock) -> Dict[str, List[Node]]:
    found: Dict[str, List[Node]] = {}
    for node in lock.nodes.values():
        found.setdefault(node.name, []).append(node)
    return found


def one(lock: SpackLock, name: str) -> Node:
    nodes = by_name(lock).get(name, [])
    assert len(nodes) == 1, f"{name}: {[n.label for n in nodes]}"
    return nodes[0]


def params(node: Node) -> dict:
    return node.raw.get("parameters", {})


def deps(lock: SpackLock, node: Node) -> Dict[str, Node]:
    return {e.name: lock.nodes[e.child] for e in node.edges}


def compiler_majors(lock: SpackLock) -> set:
    """Major versions of the compilers the built (non-external) nodes use."""
    return {n.raw["compiler"]["version"].split(".")[0] for n in lock.nodes.values() if not n.external}


def check_mpi_stack(lock: SpackLock, os_id: str, internal_pmix: bool = True, osu: bool = False) -> None:
    """Open MPI 5 over UCX with Slurm support and PMIx (its bundled one, where the sources
    come from Debian, or a standalone node); UCX with its InfiniBand/RoCE transports over
    rdma-core; the OSU benchmarks against that Open MPI where the env has them; Slurm the site's."""
    ompi = one(lock, "openmpi")
    assert ompi.version.startswith("5.")
    p = params(ompi)
    assert "slurm" in p["schedulers"] and "ucx" in p["fabrics"] and p.get("internal-pmix") is internal_pmix
    d = deps(lock, ompi)
    assert d["ucx"] is one(lock, "ucx") and d["slurm"] is one(lock, "slurm")
    if internal_pmix:
        assert "pmix" not in by_name(lock)
    else:
        assert d["pmix"] is one(lock, "pmix")
    ucx = params(one(lock, "ucx"))
    for variant in ("verbs", "rdmacm", "rc", "ud", "dc", "mlx5_dv", "cma"):
        assert ucx[variant] is True, variant
    assert "rdma-core" in deps(lock, one(lock, "ucx"))
    if osu:
        bench = one(lock, "osu-micro-benchmarks")
        assert deps(lock, bench)["openmpi"] is ompi
        # the archived git source (recipes/repo/git-sources.json), not OSU's unreachable release tarball
        assert bench.namespace == "dedal" and bench.version == "7.4-bed60f5"
    slurm = one(lock, "slurm")
    assert slurm.external and slurm.external_path == "/usr"
    built = [n for n in lock.nodes.values() if not n.external]
    assert {n.target for n in built} == {"x86_64_v3"} and {n.platform_os for n in built} == {os_id}


def check_offline_sources(lock: SpackLock) -> None:
    """Everything Spack builds has its source in Debian's archive (debsrc, and debsrc-tools for
    the build tools a base lacks), in this repository (dedal-benchmarks) or archived from a
    git repository (recipes/gitsrc: OSU, nccl-tests): rdma-core is Debian's, an external."""
    rdma = one(lock, "rdma-core")
    assert rdma.external and rdma.external_path == "/usr"
    built = {n.name: n.namespace for n in lock.nodes.values() if not n.external}
    foreign = {
        name: ns
        for name, ns in built.items()
        if ns not in ("debsrc", "debsrc_tools", "dedal") and name != "gcc-runtime"
    }
    assert not foreign, f"built from upstream sources (unreachable here): {foreign}"


def test_esd_cpu_concretizes_on_trixie(concretize):
    lock = concretize("esd-cpu")
    check_mpi_stack(lock, "debian13", osu=True)
    check_offline_sources(lock)
    assert one(lock, "dedal-benchmarks").namespace == "dedal"
    assert compiler_majors(lock) == {"14"}


def check_neuro_sources(lock: SpackLock) -> None:
    """What Spack builds has its source in Debian's archive (debsrc), in this repository
    or on PyPI (arbor's sdist through recipes/repo, the builtin py-* recipes); the rest
    is the base's (build tools, OpenBLAS, SQLite, Expat)."""
    built = {n.name: n.namespace for n in lock.nodes.values() if not n.external}
    foreign = {
        name: ns
        for name, ns in built.items()
        if ns not in ("debsrc", "dedal") and not name.startswith("py-") and name not in ("gcc-runtime", "python-venv")
    }
    assert not foreign, f"built from upstream sources (unreachable here): {foreign}"
    for name in ("cmake", "bison", "flex", "meson", "ninja", "openblas", "sqlite", "expat"):
        node = one(lock, name)
        assert node.external and node.external_path == "/usr", name


def test_esd_neuro_concretizes_on_trixie(concretize):
    lock = concretize("esd-neuro")
    check_mpi_stack(lock, "debian13", osu=True)
    ompi = one(lock, "openmpi")
    for name in ("arbor", "neuron"):
        node = one(lock, name)
        assert params(node)["mpi"] is True and params(node)["python"] is True, name
        assert deps(lock, node)["openmpi"] is ompi, name
    assert one(lock, "arbor").namespace == "dedal" and one(lock, "arbor").version == "0.9.0"
    neuron = one(lock, "neuron")
    assert neuron.namespace == "debsrc" and neuron.version == "8.2.6" and params(neuron)["coreneuron"] is False
    python = one(lock, "python")
    assert python.version == "3.11.2" and python.namespace == "debsrc" and not python.external
    numpy = one(lock, "py-numpy")
    assert deps(lock, numpy)["python"] is python and deps(lock, numpy)["openblas"] is one(lock, "openblas")
    # the paper's application benchmarks (recipes/repo, archived git sources) on this NEURON and Arbor
    ringtest = one(lock, "neuron-ringtest")
    assert ringtest.namespace == "dedal" and ringtest.version == "2025.07.21-78b996a"
    assert deps(lock, ringtest)["neuron"] is neuron and deps(lock, ringtest)["openmpi"] is ompi
    busyring = one(lock, "arbor-busyring")
    assert busyring.namespace == "dedal" and busyring.version == "2024.09.19-0adb4ae" and params(busyring)["ipo"]
    assert deps(lock, busyring)["arbor"] is one(lock, "arbor") and deps(lock, busyring)["openmpi"] is ompi
    check_neuro_sources(lock)


def reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=15):
            return True
    except OSError:
        return False


def test_esd_neuro_fetch_fills_the_mirror_with_every_source(run_dedal, real_spack, tmp_path, git_sources_mirror):
    """`dedal fetch` (not --lock-only): Spack downloads what Debian's archive serves, dedal
    takes the PyPI sources from PyPI's simple index by sha256; nothing is missing. OSU's
    source, ringtest's and busyring's are recipes/gitsrc/archive.py's, from this machine's
    mirror (GitHub is not asked)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (the base image's root filesystem through bubblewrap)")
    for url in ("http://deb.debian.org/debian/", pypi.DEFAULT_INDEX + "/pip/"):
        if not reachable(url):
            pytest.skip(f"{url} is not reachable: this test downloads the sources")
    git_sources_mirror(tmp_path / "data" / "mirror", ["osu-micro-benchmarks", "neuron-ringtest", "arbor-busyring"])
    env = {
        "DEDAL_DATA_DIR": str(tmp_path / "data"),
        "DEDAL_SPACK_ROOT": str(real_spack),
        "DEDAL_CACHE_DIR": os.environ.get("DEDAL_CACHE_DIR", str(Path.home() / ".cache" / "dedal")),
    }
    res = run_dedal("fetch", str(ENVS / "esd-neuro" / "env.yaml"), "--json", env=env, timeout=3600)
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads(res.stdout)
    assert result["listed"] and result["missing"] == []
    mirror = tmp_path / "data" / "mirror"
    sources = json.loads((tmp_path / "data" / "work" / "esd-neuro" / "sources.json").read_text())
    files = [src for pkg in sources for kind in ("sources", "patches", "resources") for src in pkg[kind]]
    assert result["sources"] == len(files) and len(files) >= 30
    for src in files:
        assert (mirror / src["mirror_paths"][0]).is_file(), src["url"]
    # PyPI's aliases answer 404 here: the py-* sources came through dedal's PyPI step
    assert any(pypi.project_of(src["url"]) for src in files)


def test_esd_gpu_concretizes_on_trixie_cuda(concretize):
    lock = concretize("esd-gpu")
    check_mpi_stack(lock, "debian13", osu=True)
    check_offline_sources(lock)
    cuda = one(lock, "cuda")
    assert cuda.external and cuda.version == "12.4.131" and cuda.external_path == "/usr"
    nccl = one(lock, "nccl")
    assert nccl.external and nccl.version.startswith("2.22.")
    for name in ("openmpi", "ucx", "hwloc", "dedal-benchmarks"):
        node = one(lock, name)
        assert params(node)["cuda"] is True and deps(lock, node)["cuda"] is cuda, name
    assert deps(lock, one(lock, "dedal-benchmarks"))["nccl"] is nccl
    osu = one(lock, "osu-micro-benchmarks")
    assert params(osu)["cuda"] is True and deps(lock, osu)["cuda"] is cuda  # osu_latency -d cuda D D
    tests = one(lock, "nccl-tests")
    assert tests.namespace == "dedal" and tests.version == "2.13.6" and params(tests)["mpi"] is True
    assert deps(lock, tests)["nccl"] is nccl and deps(lock, tests)["cuda"] is cuda
    assert deps(lock, tests)["openmpi"] is one(lock, "openmpi")  # all_reduce_perf over MPI ranks
    # the paper's GPU case: Arbor's CUDA back end for the environment's cuda_arch, its ring against it
    arbor = one(lock, "arbor")
    assert arbor.namespace == "dedal" and arbor.version == "0.9.0" and params(arbor)["cuda"] is True
    assert set(params(arbor)["cuda_arch"]) == {"70", "80", "90"} and deps(lock, arbor)["cuda"] is cuda
    busyring = one(lock, "arbor-busyring")
    assert busyring.namespace == "dedal" and deps(lock, busyring)["arbor"] is arbor
    # this base has no cmake: built from Debian's source (recipes/debsrc-tools), with the curl it links
    cmake, curl = one(lock, "cmake"), one(lock, "curl")
    assert not cmake.external and (cmake.namespace, cmake.version) == ("debsrc_tools", "3.25.1")
    assert curl.namespace == "debsrc_tools" and params(curl)["nghttp2"] is False
    # CUDA 12.4's nvcc takes GCC up to 13: every compiled node is gcc 13's
    assert compiler_majors(lock) == {"13"}
