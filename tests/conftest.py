"""Shared test helpers: where the real data lies and how to run the installed CLI."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("DEDAL_SHARED_DIR", ROOT.parent / "shared"))
SHARED_DATA = SHARED / "data"
SPACK_DATA = SHARED_DATA / "spack"
LOGS_DATA = SHARED_DATA / "logs"

# The suite starts dedal as a subprocess some 400 times. Where the environment says
# PYTHONDONTWRITEBYTECODE (this sandbox does), each start compiled every module it imports
# again (about 0.2 s of 0.7 s on 2 cores): the children write their bytecode to a cache
# outside the repository instead. dedal sets PYTHONDONTWRITEBYTECODE itself where Python
# runs over an image's tree (assemble/spack_run.py), so no image takes bytecode from this.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    os.environ.setdefault(
        "PYTHONPYCACHEPREFIX",
        str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dedal" / "test-pycache"),
    )

# shared fixtures, one module per subject (helpers in them are imported from there)
pytest_plugins = [
    "tests.fixtures.base",  # the debian-trixie base, a SIF and an MPI program from it, as_root
    "tests.fixtures.bench",  # bench_image: the base with dedal's microbenchmarks, as a SIF
    "tests.fixtures.disk",  # small_disk: a small real file system (tmpfs), to meet a full disk
    "tests.fixtures.gitsrc",  # git_sources_mirror: OSU/nccl-tests sources (recipes/gitsrc) into a test's mirror
    "tests.fixtures.images",  # host_env, trixie_env, trixie_image: environments built for assembly
    "tests.fixtures.pypi",  # pypi_index: a PyPI simple index on loopback (recorded page, real sdist)
    "tests.fixtures.recorded",  # logs, local_data: recorded outputs for the parsers
    "tests.fixtures.registry",  # local docker-registry servers, a fault proxy, real SIF files
    "tests.fixtures.slurm",  # slurm_cluster: the local Slurm test cluster
    "tests.fixtures.stop",  # SIGTERM ends the run as Ctrl-C does: fixtures torn down
    "tests.fixtures.tiny",  # tiny: the recorded tiny lock with the Spack stand-in
]


def dedal_exe() -> str:
    """The installed console script (next to the running interpreter), else on PATH."""
    cand = Path(sys.executable).parent / "dedal"
    if cand.exists():
        return str(cand)
    found = shutil.which("dedal")
    if not found:
        pytest.fail("the dedal console script is not installed (run ./setup.sh)")
    return found


def interruptible() -> None:
    """``preexec_fn`` for a dedal started to be sent Ctrl-C: SIGINT back to its default, as in
    a terminal. A shell without job control starts background commands with SIGINT
    ignored, and Python then keeps it ignored (no KeyboardInterrupt): a suite started
    that way would otherwise fail the Ctrl-C tests for a reason of its own."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def is_real_spack(root: Optional[Path]) -> bool:
    """A Spack checkout that is not the test stand-in (tests/standin)."""
    exe = Path(root) / "bin" / "spack" if root else None
    if exe is None or not exe.is_file():
        return False
    return not (Path(root) / "standin.json").exists() and "stand-in" not in exe.read_text(errors="replace")[:4000]


@pytest.fixture
def real_spack() -> Path:
    """DEDAL_SPACK_ROOT when it holds a real Spack; the test is skipped otherwise."""
    root = os.environ.get("DEDAL_SPACK_ROOT", "")
    if not root or not (Path(root) / "bin" / "spack").is_file():
        pytest.skip("needs a real Spack checkout: set DEDAL_SPACK_ROOT (Spack develop e8f8cf85, June 2024)")
    if not is_real_spack(Path(root)):
        pytest.skip(f"DEDAL_SPACK_ROOT={root} is the test stand-in, not Spack")
    return Path(root)


def fill_tiny_mirror(mirror: Path) -> Path:
    """A source mirror with the recorded tiny repository's tarballs (by sha256, as Spack's
    _source-cache lays them out): what a real Spack needs to build it offline."""
    for tarball in sorted((SPACK_DATA / "tiny-repo" / "src").glob("*.tar.gz")):
        digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
        dest = mirror / "_source-cache" / "archive" / digest[:2] / f"{digest}.tar.gz"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tarball, dest)
    return mirror


@pytest.fixture
def isolated_env(tmp_path: Path) -> Dict[str, str]:
    """Environment for CLI subprocesses: no user config, data and cache under tmp_path.
    No DEDAL_* of the caller's either, DEDAL_SPACK_ROOT included: it would outrank the
    Spack a test provides (a stand-in, a clone from DEDAL_SPACK_URL); the tests that use a
    real Spack pass it themselves (``real_spack``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEDAL_")}
    env["HOME"] = str(tmp_path / "home")
    env["XDG_CONFIG_HOME"] = str(tmp_path / "home" / ".config")
    env["XDG_DATA_HOME"] = str(tmp_path / "home" / ".local" / "share")
    env["XDG_CACHE_HOME"] = str(tmp_path / "home" / ".cache")
    # the expensive base root filesystem may be shared between tests and runs
    env["DEDAL_BASE_CACHE"] = os.environ.get("DEDAL_BASE_CACHE", str(Path.home() / ".cache" / "dedal" / "base"))
    (tmp_path / "home").mkdir(exist_ok=True)
    return env


@pytest.fixture
def run_dedal(isolated_env: Dict[str, str], tmp_path: Path):
    """Run the installed ``dedal`` command; returns CompletedProcess (text)."""

    def _run(
        *args: str,
        cwd: Optional[Path] = None,
        env: Optional[Dict[str, str]] = None,
        input: Optional[str] = None,
        timeout: float = 600,
    ) -> subprocess.CompletedProcess:
        full_env = dict(isolated_env)
        if env:
            full_env.update(env)
        proc = subprocess.Popen(
            [dedal_exe(), *args],
            cwd=cwd or tmp_path,
            env=full_env,
            text=True,
            stdin=subprocess.PIPE if input is not None else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            out, err = proc.communicate(input=input, timeout=timeout)
        except BaseException:  # our timeout, pytest-timeout's, Ctrl-C: stop dedal as scancel would
            # SIGTERM first: dedal then ends its jobs and steps and unmounts its images
            # (subprocess.run's SIGKILL left a verify's image mounted under /tmp)
            proc.terminate()
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    return _run


APPTAINER_MISSING = (
    "apptainer is not on PATH (no Debian package: build it from source with "
    "DEDAL_APPTAINER_SRC=GITDIR ./setup.sh, see the README)"
)


@pytest.fixture
def apptainer(isolated_env: Dict[str, str], tmp_path: Path):
    """Run the real ``apptainer`` (from PATH; the test is skipped without one) with the same
    HOME as ``run_dedal`` (keys, registry logins, cache under tmp_path) and the environment
    dedal's runtime adapter gives it (APPTAINER_DROP_CAPS as root without CAP_SYS_RESOURCE)."""
    exe = shutil.which("apptainer")
    if exe is None:
        pytest.skip(APPTAINER_MISSING)
    from dedal.adapters.runtime.apptainer import process_env

    env = process_env(isolated_env)
    env["APPTAINER_CACHEDIR"] = str(tmp_path / "apptainer-cache")

    def _run(
        *args: str, input: Optional[str] = None, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess:
        r = subprocess.run(
            [exe, *args], env=env, text=True, capture_output=True, input=input, timeout=timeout, cwd=tmp_path
        )
        if check and r.returncode != 0:
            pytest.fail(f"apptainer {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
        return r

    return _run


def _free_disk_places() -> Dict[str, Path]:
    """Where a run writes: its temporary directories and dedal's cache (the nearest existing
    directory of each)."""
    places = {
        "tmp": Path(os.environ.get("PYTEST_DEBUG_TEMPROOT") or tempfile.gettempdir()),
        "cache": Path(os.environ.get("DEDAL_CACHE_DIR") or Path.home() / ".cache" / "dedal"),
    }
    for name, place in places.items():
        while not place.exists() and place != place.parent:
            place = place.parent
        places[name] = place
    if os.stat(places["cache"]).st_dev == os.stat(places["tmp"]).st_dev:
        del places["cache"]  # one file system: one count
    return places


_LEAST_FREE: Dict[str, tuple] = {}  # place name -> (bytes free, the place, the test just finished)


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    """The least free space each place had after a test: a run needs a few GiB at once, and a
    full disk shows up as some test's "No space left on device", which reads like that test's
    fault (a CI run on a shared disk failed so)."""
    for name, place in _free_disk_places().items():
        free = shutil.disk_usage(place).free
        if name not in _LEAST_FREE or free < _LEAST_FREE[name][0]:
            _LEAST_FREE[name] = (free, place, nodeid)


def pytest_terminal_summary(terminalreporter: object, exitstatus: int, config: pytest.Config) -> None:
    """One line, also under ``-q``: the least free disk seen during the run, and after which test."""
    seen = [
        f"{name} {place} {free / 2**30:.1f} GiB (after {nodeid})" for name, (free, place, nodeid) in _LEAST_FREE.items()
    ]
    if seen:
        terminalreporter.write_line("least free disk during the run: " + "; ".join(seen))


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """Long real builds (marker ``slow``) stay out of every run whose ``-m`` expression does
    not name ``slow``: the default CI run, and the marker sets run on their own (``-m
    slurm``, ``-m spack``, ``-m e2e``...), which would otherwise grow by the hour that the
    ESD builds take. ``-m slow`` or ``-m "spack and slow"`` runs them."""
    if re.search(r"\bslow\b", config.getoption("markexpr", "") or ""):
        return
    skip = pytest.mark.skip(reason="slow: a long real build, out of the default run (select it with -m slow)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
