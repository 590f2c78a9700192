"""`dedal run IMAGE -- CMD` inside an allocation of the Slurm test cluster, typed in a terminal:
the ranks of a node in one container (the real Apptainer's --sharens), the output on the
terminal; Ctrl-C twice (srun's own way) stops the step and leaves nothing; --print gives the
equivalent srun command for a job script; outside an allocation, one line and exit 2."""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Dict, Iterator

import pytest

from tests.conftest import dedal_exe
from tests.fixtures.slurm import salloc_no_shell
from tests.fixtures.terminal import CTRL_C, Terminal, in_terminal

pytestmark = [pytest.mark.slurm, pytest.mark.apptainer]
SHOW = 'echo "rank=$SLURM_PROCID of $SLURM_NTASKS in $(readlink /proc/self/ns/mnt)"'
# Under --sharens the first rank of a node is the container the others join: a bare program
# that ends at once (no MPI_Init to wait in) made a later rank fail to join it, 8 times in 60
# runs of 2 ranks here ("Failed to restore current working directory: No such process"), until
# the ranks of a node met before the program (dedal.adapters.mpi.scripts._MEET). Repeated: a
# single run would pass before that about 7 times in 8.
BARE_RUNS = 8


@pytest.fixture
def allocation(slurm_cluster, isolated_env) -> Iterator[Dict[str, str]]:
    """An allocation of two tasks on one node (``salloc --no-shell``), as the environment of a
    command run inside it; cancelled afterwards."""
    jid = salloc_no_shell(slurm_cluster, nodes=1, tasks=2)
    env = dict(
        isolated_env,
        SLURM_CONF=slurm_cluster.env["SLURM_CONF"],
        SLURM_JOB_ID=jid,
        SLURM_JOBID=jid,
        SLURM_NTASKS="2",
        SLURM_NNODES="1",
    )
    yield env
    subprocess.run(["scancel", jid], env=slurm_cluster.env, timeout=60)


def test_the_ranks_of_a_node_share_one_container(allocation, base_sif, tmp_path, apptainer):
    for _ in range(BARE_RUNS):
        term = in_terminal(
            [dedal_exe(), "run", str(base_sif), "--", "/bin/sh", "-c", SHOW],
            allocation,
            timeout=180,
            cwd=tmp_path,
        )
        assert term.rc == 0, term.text[-3000:]
        ranks = re.findall(r"rank=(\d) of 2 in (mnt:\[\d+\])", term.text)
        assert sorted(r for r, _ in ranks) == ["0", "1"] and len({ns for _, ns in ranks}) == 1, term.text[-3000:]
    assert not list(Path("/tmp").glob(f"dedal-meet.{allocation['SLURM_JOB_ID']}.*"))  # where they met is gone

    # --per-rank: a container each, as plain `srun apptainer exec`
    term = in_terminal(
        [dedal_exe(), "run", "--per-rank", str(base_sif), "--", "/bin/sh", "-c", SHOW],
        allocation,
        timeout=180,
        cwd=tmp_path,
    )
    assert term.rc == 0 and len(set(re.findall(r"in (mnt:\[\d+\])", term.text))) == 2, term.text[-3000:]


def test_ctrl_c_twice_stops_the_step(allocation, base_sif, tmp_path, apptainer, slurm_cluster):
    term = Terminal(
        [dedal_exe(), "run", str(base_sif), "--", "/bin/sh", "-c", SHOW + "; exec sleep 600"],
        env=allocation,
        cwd=tmp_path,
    )
    deadline = time.monotonic() + 120
    while term.text.count("rank=") < 2:
        assert time.monotonic() < deadline and term.proc.poll() is None, term.text[-3000:]
        time.sleep(0.2)
    term.press(CTRL_C)
    time.sleep(0.3)
    term.press(CTRL_C)  # srun: a second Ctrl-C within a second aborts the step
    assert term.wait(90) != 0, term.text[-3000:]
    steps = subprocess.run(
        ["squeue", "-h", "-s", "-j", allocation["SLURM_JOB_ID"]],
        env=slurm_cluster.env,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    assert steps.strip() == "", steps
    left = subprocess.run(["pgrep", "-f", "exec sleep 600"], capture_output=True, text=True).stdout
    assert left.strip() == "", left


def test_print_gives_the_srun_command_for_a_job_script(allocation, base_sif, tmp_path, run_dedal):
    res = run_dedal(
        "run", "--nv", "-B", f"{tmp_path}:/data", "--print", str(base_sif), "--", "app", "-x", "1", env=allocation
    )
    assert res.returncode == 0, res.stderr
    assert shlex.split(res.stdout) == [
        "srun",
        "--mpi=pmix",
        "-N",
        "1",
        "-n",
        "2",
        "apptainer",
        "exec",
        "--sharens",
        "--nv",
        "--bind",
        f"{tmp_path}:/data",
        "--bind",
        f"{tmp_path}:{tmp_path}",
        str(base_sif),
        "setsid",
        "app",
        "-x",
        "1",
    ]


def test_outside_an_allocation_one_line_and_exit_2(run_dedal, base_sif):
    res = run_dedal("run", str(base_sif), "--", "hostname")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.splitlines() == [
        "dedal: error: dedal run launches with srun inside a Slurm allocation "
        "(SLURM_JOB_ID is not set): salloc or sbatch first; one process outside "
        "Slurm: dedal exec IMAGE -- CMD"
    ]
    # an option after the image is the command's, not dedal's: said so, not run
    res = run_dedal("run", str(base_sif), "-n", "4", "--", "hostname")
    assert res.returncode == 2 and res.stderr.splitlines() == [
        "dedal: error: -n: options go before IMAGE: dedal run [OPTIONS] IMAGE -- CMD [ARG...]"
    ]
