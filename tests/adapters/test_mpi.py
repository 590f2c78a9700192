"""The MPI launcher adapter: command lines, and the per-rank hand-over of the launcher's
PMIx/Slurm variables into a sandbox that starts from a clean environment."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import List

import pytest

from dedal.adapters import mpi
from dedal.errors import Interrupted, Signals
from dedal.model.owner import process_start


def test_mpirun_command_forwards_the_run_environment() -> None:
    env = {"UCX_TLS": "tcp", "OMPI_MCA_pml": "ucx", "OMPI_ALLOW_RUN_AS_ROOT": "1", "PATH": "/x"}
    cmd = mpi.mpirun_command(["/opt/view/bin/dedal_latency", "-m", "65536"], 2, env=env)
    assert cmd == [
        "mpirun",
        "-np",
        "2",
        "-x",
        "UCX_TLS",
        "-x",
        "OMPI_MCA_pml",
        "/opt/view/bin/dedal_latency",
        "-m",
        "65536",
    ]
    assert "--oversubscribe" in mpi.mpirun_command(["p"], 8, oversubscribe=True)


def test_srun_command() -> None:
    assert mpi.srun_command(["p"], 2) == [
        "srun",
        "--mpi=pmix",
        "-N",
        "1",
        "-n",
        "2",
        "--kill-on-bad-exit=1",
        "--quiet",
        "p",
    ]
    two = mpi.srun_command(["p"], 2, nodes=2)
    assert "--ntasks-per-node=1" in two and two[:6] == ["srun", "--mpi=pmix", "-N", "2", "-n", "2"]
    # pinned (the nodes of an allocation that hold the instance): the step's first NODES of them
    one = mpi.srun_command(["p"], 2, nodes=1, nodelist=("node2", "node3"))
    assert one[:8] == ["srun", "--mpi=pmix", "-N", "1", "-n", "2", "-w", "node2"], one
    assert mpi.srun_command(["p"], 4, nodes=2, nodelist=("node2", "node3"))[6:8] == ["-w", "node2,node3"]


def test_rank_script_hands_over_launcher_variables(tmp_path: Path) -> None:
    """What srun does per rank: the script gives the PMIX_/PMI_/SLURM_ variables to the
    command inside (here under `env -i`, as clean as a sandbox), which loads them first. No
    file holds them, even while the rank runs: srun SIGKILLs its tasks when it is stopped,
    and a file that a rank meant to delete on its way out would stay in every node's /tmp."""
    script = mpi.write_rank_script(tmp_path)
    seen = tmp_path / "tmp-while-running"
    program = ["/bin/sh", "-c", f'ls -a /tmp > {seen}; read -r line && echo "stdin: $line"; exec /usr/bin/env']
    inner = ["env", "-i", "PATH=/usr/bin:/bin", *mpi.rank_command(program)]
    env = {
        "PATH": os.environ["PATH"],
        "PMIX_RANK": "1",
        "PMIX_SERVER_URI41": "pmix-server.42;tcp4://127.0.0.1:5",
        "SLURM_PROCID": "1",
        "PMI_FD": "7",
        "SECRET_HOST_VAR": "leak",
        "SLURM_JOB_NAME": 'it\'s "quoted" $HOME `x`',
    }
    before = set(os.listdir("/tmp"))
    out = subprocess.run(
        ["/bin/sh", str(script), *inner],
        env=env,
        input="not for the rank\n",
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    got = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    assert got["PMIX_RANK"] == "1" and got["SLURM_PROCID"] == "1" and got["PMI_FD"] == "7"
    assert got["PMIX_SERVER_URI41"] == "pmix-server.42;tcp4://127.0.0.1:5"
    assert got["SLURM_JOB_NAME"] == 'it\'s "quoted" $HOME `x`'
    assert "SECRET_HOST_VAR" not in got
    assert "stdin:" not in out.stdout  # the program's standard input is closed off, not the hand-over
    assert set(seen.read_text().split()) - before <= {".", ".."}  # nothing new in /tmp while it ran


def test_run_mpirun_reports_a_timeout_as_124(tmp_path: Path) -> None:
    """A run that outlives its limit is killed and comes back as exit code 124 (not an
    exception), with a note in its log."""
    log = tmp_path / "run.log"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "mpirun").write_text("#!/bin/sh\nexec sleep 30\n")
    (fake / "mpirun").chmod(0o755)
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{fake}:{old}"
    try:
        res = mpi.run_mpirun(None, ["true"], 2, env={}, log=log, timeout=0.5, note=["a note"])
    finally:
        os.environ["PATH"] = old
    assert res.returncode == 124 and res.timed_out
    text = log.read_text()
    assert text.startswith("#@ a note\n") and "did not finish within 0.5 s" in text


def test_run_mpirun_gives_prrte_a_session_directory_of_its_own(tmp_path: Path) -> None:
    """mpirun's session directory (prterun.<node>.<pid>.<uid>) goes under a directory made
    for the run and removed after it, also when the run is killed: one left in the shared
    /tmp by a killed mpirun made a later mpirun that got the same PID fail in prte_init."""
    fake = tmp_path / "bin"
    fake.mkdir()
    seen = tmp_path / "seen"
    (fake / "mpirun").write_text(
        f'#!/bin/sh\necho "$TMPDIR" > {seen}\nmkdir "$TMPDIR/prterun.vm.$$.0" || exit 3\n'
        'exec sleep "$DEDAL_TEST_SLEEP"\n'
    )
    (fake / "mpirun").chmod(0o755)
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{fake}:{old}"
    try:
        for sleep, timeout, code in (("0", 30.0, 0), ("30", 0.5, 124)):
            res = mpi.run_mpirun(
                None, ["true"], 2, env={"DEDAL_TEST_SLEEP": sleep}, log=tmp_path / "run.log", timeout=timeout
            )
            session = Path(seen.read_text().strip())
            assert res.returncode == code
            assert session.parent == Path("/tmp") and session.name.startswith("dedal-prte.")
            assert not session.exists()  # removed, with what mpirun left in it
            assert "TMPDIR" not in res.command  # the run's own, not forwarded with -x
    finally:
        os.environ["PATH"] = old


def test_a_killed_mpiruns_ranks_do_not_make_its_session_directory_again(tmp_path: Path) -> None:
    """A rank that outlives a killed mpirun (an orphan, outside the sandbox's process tree)
    and is still in MPI_Init makes the session directory again after its removal: one
    ``dedal-prte.*/ompi.vm.0/jf.0/...`` stayed in /tmp per interrupted run (72 here in a day
    of test runs). The stand-in rank waits for the removal, then makes the directory again;
    the run's processes are killed by the session in their environment before the removal."""
    fake = tmp_path / "bin"
    fake.mkdir()
    seen, rank = tmp_path / "seen", tmp_path / "rank"
    (fake / "mpirun").write_text(
        f'#!/bin/sh\necho "$TMPDIR" > {seen}\n'
        'setsid sh -c \'i=0; while [ -d "$TMPDIR" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; '
        f'mkdir -p "$TMPDIR/ompi.vm.0/jf.0/1/0"\' &\necho $! > {rank}\nexec sleep 30\n'
    )
    (fake / "mpirun").chmod(0o755)
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{fake}:{old}"
    try:
        res = mpi.run_mpirun(None, ["true"], 2, env={}, log=tmp_path / "run.log", timeout=1.0)
    finally:
        os.environ["PATH"] = old
    assert res.returncode == 124
    session, pid = Path(seen.read_text().strip()), int(rank.read_text())
    deadline = time.monotonic() + 60
    while process_start(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process_start(pid) is None, "the stand-in rank still runs"
    assert not session.exists(), sorted(str(p) for p in session.rglob("*"))


@pytest.mark.parametrize("step", ["mkdtemp", "rmtree"])
def test_a_stop_signal_as_the_session_directory_is_made_or_removed_leaves_none(
    step: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM (scancel, a stopped test) right after the run's session directory is made,
    before it has a name, or as its removal begins: the directory goes all the same, and the
    stop comes after (an empty ``dedal-prte.*`` stayed in /tmp after a full test run, from
    the test that stops a verification)."""
    made: List[str] = []
    real = getattr(tempfile if step == "mkdtemp" else shutil, step)

    def with_a_signal(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if step == "rmtree":
            made.append(str(args[0]))
            os.kill(os.getpid(), signal.SIGTERM)
        out = real(*args, **kwargs)
        if step == "mkdtemp":
            made.append(out)
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "mpirun").write_text("#!/bin/sh\nexit 0\n")
    (fake / "mpirun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    monkeypatch.setattr(tempfile if step == "mkdtemp" else shutil, step, with_a_signal)
    with pytest.raises(Interrupted), Signals("test"):
        mpi.run_mpirun(None, ["true"], 2, env={}, log=tmp_path / "run.log", timeout=30)
    assert made and made[0].startswith("/tmp/dedal-prte.")
    assert not Path(made[0]).exists()


def _rank_in_a_step(localid: int, nodeid: int, program: List[str], tmp_path: Path) -> subprocess.Popen:
    """One rank's loader as srun's task runs it in the shared container (``meet``), with the
    step's Slurm variables on its standard input, as the rank script gives them."""
    given = {
        "SLURM_JOB_ID": f"test{os.getpid()}",
        "SLURM_STEP_ID": "7",
        "SLURM_NODEID": str(nodeid),
        "SLURM_LOCALID": str(localid),
        "SLURM_STEP_TASKS_PER_NODE": "1,3(x2)",  # node 0: 1 task, nodes 1 and 2: 3 each
    }
    variables = tmp_path / f"rank-{nodeid}-{localid}.vars"
    variables.write_text("".join(f"export {k}='{v}'\n" for k, v in given.items()))
    with open(variables) as stdin:
        return subprocess.Popen(
            ["env", "-i", "PATH=/usr/bin:/bin", *mpi.rank_command(program, session=True, meet=True)],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )


def test_the_ranks_of_a_node_meet_before_the_program_starts(tmp_path: Path) -> None:
    """Under --sharens the first rank of a node is the container the others join: it must not
    end before they have (a bare `hostname` did, and a later rank failed to join or ran
    outside the image). Its program starts only once the node's other ranks have started; a
    node with one task of the step does not wait; where they met is removed."""
    meet = Path(f"/tmp/dedal-meet.test{os.getpid()}.7.1")
    first = _rank_in_a_step(0, 1, ["echo", "first"], tmp_path)
    time.sleep(0.5)
    assert first.poll() is None and sorted(os.listdir(meet)) == ["0"]  # waits for ranks 1 and 2
    others = [_rank_in_a_step(i, 1, ["echo", f"rank {i}"], tmp_path) for i in (1, 2)]
    assert [p.communicate(timeout=60)[0] for p in (first, *others)] == ["first\n", "rank 1\n", "rank 2\n"]
    assert [p.returncode for p in (first, *others)] == [0, 0, 0] and not meet.exists()

    alone = _rank_in_a_step(0, 0, ["echo", "alone"], tmp_path)  # node 0 has no other rank of the step
    assert alone.communicate(timeout=5)[0] == "alone\n" and alone.returncode == 0
    assert not Path(f"/tmp/dedal-meet.test{os.getpid()}.7.0").exists()
