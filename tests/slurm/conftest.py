"""The local Slurm test cluster (slurm/testcluster), started once per test session.

``slurm_cluster`` starts munge, slurmctld and three slurmd "nodes" under a temporary
directory with ``start.sh`` and always stops them with ``stop.sh`` (by PID). Tests talk
to it through ``cluster.env`` (the process environment plus ``SLURM_CONF``), e.g.
``Slurm(cluster.env)`` or ``run_dedal(..., env=cluster.env)``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional

import pytest

from tests.conftest import ROOT

TESTCLUSTER = ROOT / "slurm" / "testcluster"
NODES = 3
START_TIMEOUT_S = 120
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sacct", "scancel", "sinfo", "srun", "scontrol")


@dataclass
class SlurmCluster:
    state_dir: Path
    env: Dict[str, str]  # os.environ + SLURM_CONF and the DEDAL_TC_* facts
    nodes: List[str]
    partition: str = "debug"
    cpus_per_node: int = 2
    start_seconds: float = 0.0
    facts: Dict[str, str] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return Path(self.env["SLURM_CONF"])

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of every daemon log, for assertion messages."""
        out = []
        for log in sorted((self.state_dir / "log").glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(out)

    def scontrol(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """Administrative commands a test needs (e.g. setting a node DOWN)."""
        return subprocess.run(["scontrol", *args], env=self.env, text=True, capture_output=True,
                              timeout=30, check=check)

    def wait_nodes_usable(self, names: Iterable[str], timeout: float = 60) -> None:
        names = set(names)
        deadline = time.monotonic() + timeout
        while True:
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.env, text=True,
                                 capture_output=True, timeout=30).stdout
            states = dict(line.split()[:2] for line in out.splitlines() if line.strip())
            if all(states.get(n, "").rstrip("*") in ("idle", "mixed", "allocated") and
                   not states.get(n, "").endswith("*") for n in names):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"nodes {sorted(names)} not usable after {timeout} s: {states}\n{self.log_tail()}")
            time.sleep(0.3)


def _read_env_file(path: Path) -> Dict[str, str]:
    facts = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            facts[key.strip()] = value.strip()
    return facts


def _cluster(tmp_path_factory: pytest.TempPathFactory, name: str, nodes: int,
             extra: Optional[Dict[str, str]] = None) -> Iterator[SlurmCluster]:
    """start.sh under a fresh temporary directory, and stop.sh after, whatever happened."""
    if os.geteuid() != 0:
        pytest.skip("the Slurm test cluster needs root (slurmd launches jobs as their users)")
    missing = [t for t in TOOLS if not shutil.which(t)]
    if missing:
        pytest.skip(f"Slurm/munge not installed ({', '.join(missing)} missing); run ./setup.sh")
    state_dir = tmp_path_factory.mktemp(name)
    started = time.monotonic()
    env = dict(os.environ, **(extra or {}))
    try:
        proc = subprocess.run([str(TESTCLUSTER / "start.sh"), str(state_dir), str(nodes)], text=True,
                              capture_output=True, timeout=START_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as exc:
        subprocess.run([str(TESTCLUSTER / "stop.sh"), str(state_dir)], timeout=60)
        pytest.fail(f"start.sh did not finish within {START_TIMEOUT_S} s: {exc.stderr}")
    try:
        if proc.returncode != 0:
            pytest.fail(f"start.sh failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        facts = _read_env_file(state_dir / "cluster.env")
        env = dict(os.environ)
        env.update(facts)
        yield SlurmCluster(
            state_dir=state_dir,
            env=env,
            nodes=facts["DEDAL_TC_NODES"].split(),
            partition=facts.get("DEDAL_TC_PARTITION", "debug"),
            cpus_per_node=int(facts.get("DEDAL_TC_CPUS", "2")),
            start_seconds=time.monotonic() - started,
            facts=facts,
        )
    finally:
        stop = subprocess.run([str(TESTCLUSTER / "stop.sh"), str(state_dir)], text=True,
                              capture_output=True, timeout=120)
        if stop.returncode != 0:  # daemons left behind: say so loudly
            raise RuntimeError(f"stop.sh {state_dir} failed (exit {stop.returncode}): {stop.stdout}{stop.stderr}")


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    yield from _cluster(tmp_path_factory, "slurm", NODES)


@pytest.fixture(scope="session")
def netns_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """Three nodes, each in its own network, mount and UTS namespace (start.sh with
    DEDAL_TC_NETNS=1): private /dev/shm, /tmp and /run, own address and hostname. The
    session's temporary directory is shared by all, as a parallel file system would be."""
    for tool in ("ip", "unshare", "nsenter"):
        if not shutil.which(tool):
            pytest.skip(f"the namespaced test cluster needs {tool} (iproute2, util-linux)")
    shared = str(tmp_path_factory.getbasetemp())
    yield from _cluster(tmp_path_factory, "netns", NODES, {"DEDAL_TC_NETNS": "1", "DEDAL_TC_SHARED": shared})
