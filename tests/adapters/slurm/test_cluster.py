"""The Slurm adapter against the real local test cluster (slurm/testcluster).

Every wait is bounded; on a timeout the assertion message carries the job states and
the daemon logs.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, Iterable, List

import pytest

from dedal.adapters import slurm
from dedal.adapters.slurm import JobState, Slurm, State
from dedal.errors import ToolError

from tests.fixtures.slurm import TESTCLUSTER, SlurmCluster

pytestmark = pytest.mark.slurm

WAIT_S = 90


def wait_states(
    client: Slurm,
    cluster: SlurmCluster,
    ids: Iterable[str],
    *,
    until=lambda st: st.state.is_finished,
    timeout: float = WAIT_S,
) -> Dict[str, JobState]:
    ids = list(ids)
    deadline = time.monotonic() + timeout
    while True:
        states = client.states(ids)
        if all(until(states[j]) for j in ids):
            return states
        if time.monotonic() > deadline:
            raise AssertionError(f"jobs not there after {timeout} s: {states}\n{cluster.log_tail()}")
        time.sleep(0.3)


def script(body: str) -> str:
    return "#!/bin/bash\nset -euo pipefail\n" + body + "\n"


@pytest.fixture
def client(slurm_cluster: SlurmCluster) -> Slurm:
    return Slurm(slurm_cluster.env, timeout=60)


@pytest.fixture
def jobdir(tmp_path: Path) -> Path:
    # job scripts run as root on the same machine, so tmp_path is shared "storage"
    return tmp_path


def test_cluster_is_up(slurm_cluster: SlurmCluster, client: Slurm) -> None:
    nodes = client.nodes()
    assert sorted(n.name for n in nodes) == sorted(slurm_cluster.nodes)
    assert len(nodes) == 3
    assert all(n.cpus == slurm_cluster.cpus_per_node and n.usable for n in nodes), nodes
    assert all(n.partitions == ("debug",) for n in nodes)
    assert "none" in client.mpi_plugins()
    assert client.version().startswith("slurm")
    assert slurm_cluster.conf.is_file() and str(slurm_cluster.state_dir) in slurm_cluster.conf.read_text()


def test_start_refuses_a_running_cluster(slurm_cluster: SlurmCluster) -> None:
    proc = subprocess.run(
        [str(TESTCLUSTER / "start.sh"), str(slurm_cluster.state_dir)], text=True, capture_output=True, timeout=60
    )
    assert proc.returncode == 1
    assert "already running" in proc.stderr


def test_dependency_graph_runs_in_order_on_several_nodes(
    slurm_cluster: SlurmCluster, client: Slurm, jobdir: Path
) -> None:
    """a -> (b1, b2, b3) -> c, every job rendered from the default build-job template."""
    template = slurm.default_template().read_text()

    def submit(name: str, deps: List[str], seconds: float) -> str:
        record = jobdir / f"{name}.rec"
        command = f"bash -c {shlex.quote(f'echo start $(date +%s.%N) $SLURMD_NODENAME $DEDAL_STAGE_DIR > {record}.tmp; sleep {seconds}; echo end $(date +%s.%N) >> {record}.tmp; mv {record}.tmp {record}')}"
        log = jobdir / f"{name}.log"
        text = slurm.render_job_script(
            template,
            {
                "job_name": f"dedal-{name}",
                "packages": f"{name}@1.0",
                "command": command,
                "log": shlex.quote(str(log)),
                "stage_dir": "/dev/shm",
            },
        )
        path = jobdir / f"{name}.sh"
        path.write_text(text)
        return client.submit(
            path,
            name=f"dedal-{name}",
            dependencies=deps,
            output=log,
            cpus=1,
            partition=slurm_cluster.partition,
            time="00:05:00",
        )

    t0 = time.monotonic()
    t0_wall = time.time()
    a = submit("a", [], 0.5)
    bs = [submit(f"b{i}", [a], 2.0) for i in (1, 2, 3)]
    c = submit("c", bs, 0.1)
    submit_s = time.monotonic() - t0

    pending = client.states([c])[c]
    assert pending.state is State.PENDING and pending.reason.startswith("Dependency"), pending
    states = wait_states(client, slurm_cluster, [a, *bs, c])
    assert all(st.state is State.COMPLETED and st.exit_code == 0 for st in states.values()), states

    rec = {}
    for name in ("a", "b1", "b2", "b3", "c"):
        start, end = (jobdir / f"{name}.rec").read_text().splitlines()
        _, t_start, node, stage = start.split()
        rec[name] = (float(t_start), float(end.split()[1]), node)
        assert stage == "/dev/shm"
    for b in ("b1", "b2", "b3"):
        assert rec["a"][1] <= rec[b][0], rec
        assert rec[b][1] <= rec["c"][0], rec
    # the three b jobs (1 CPU each, 2 CPUs per node) ran side by side on more than one node
    assert len({rec[b][2] for b in ("b1", "b2", "b3")}) >= 2, rec
    assert max(rec[b][0] for b in ("b1", "b2", "b3")) < min(rec[b][1] for b in ("b1", "b2", "b3")), rec
    # job state names the node it ran on; the log says which package the job built
    assert {states[j].node for j in bs} == {rec[b][2] for b in ("b1", "b2", "b3")}
    log = (jobdir / "b2.log").read_text()
    assert "dedal: packages: b2@1.0" in log and "exit=0" in log and f"job {bs[1]} dedal-b2" in log
    print(
        f"\nsubmit of 5 jobs {submit_s:.2f} s; first job started {rec['a'][0] - t0_wall:.2f} s after its submit; "
        f"graph from first start to last end {rec['c'][1] - rec['a'][0]:.2f} s (cluster start {slurm_cluster.start_seconds:.2f} s)"
    )


def test_failure_cancels_only_dependents(slurm_cluster: SlurmCluster, client: Slurm, jobdir: Path) -> None:
    bad = client.submit(script("echo building; exit 3"), name="dedal-bad", output=jobdir / "bad.log")
    child = client.submit(script("echo never"), name="dedal-child", dependencies=[bad], output=jobdir / "child.log")
    grandchild = client.submit(
        script("echo never"), name="dedal-grandchild", dependencies=[child], output=jobdir / "grandchild.log"
    )
    other = client.submit(script("sleep 1; echo fine"), name="dedal-other", output=jobdir / "other.log")

    states = wait_states(client, slurm_cluster, [bad, child, grandchild, other])
    assert states[bad].state is State.FAILED and states[bad].exit_code == 3, states[bad]
    assert not states[bad].is_node_failure
    assert states[child].state is State.CANCELLED, states[child]
    assert states[child].reason == "DependencyNeverSatisfied"
    assert states[grandchild].state is State.CANCELLED, states[grandchild]
    assert states[other].state is State.COMPLETED and states[other].exit_code == 0
    assert not (jobdir / "child.log").exists()
    assert (jobdir / "other.log").read_text().strip() == "fine"


def test_afterany_hint_and_dropping_it(slurm_cluster: SlurmCluster, client: Slurm, jobdir: Path) -> None:
    """Order hints are ``afterany``: a failed job releases the job waiting on it (where
    ``afterok`` cancels it); ``scontrol update Dependency=`` drops a hint from a pending job,
    which then runs while the hinted job is still running; a job that ended can no longer
    be changed, which is not an error."""
    bad = client.submit(script("exit 3"), name="dedal-hint-bad", output=jobdir / "bad.log")
    after_bad = client.submit(
        script("echo ran"), name="dedal-hint-after-bad", after_any=[bad], output=jobdir / "after-bad.log"
    )
    long = client.submit(script("sleep 120"), name="dedal-hint-long", output=jobdir / "long.log")
    held = client.submit(
        script("echo ran"),
        name="dedal-hint-held",
        dependencies=[bad],
        after_any=[long],
        kill_on_invalid_dep=False,
        output=jobdir / "held.log",
    )
    free = client.submit(script("echo ran"), name="dedal-hint-free", after_any=[long], output=jobdir / "free.log")
    states = wait_states(client, slurm_cluster, [bad, after_bad])
    assert states[bad].state is State.FAILED and states[after_bad].state is State.COMPLETED, states
    wait_states(client, slurm_cluster, [long], until=lambda st: st.state is State.RUNNING)
    pending = client.states([held, free])
    assert pending[free].state is State.PENDING and pending[free].reason == "Dependency", pending
    assert pending[held].state is State.PENDING and pending[held].reason == "DependencyNeverSatisfied", pending
    assert client.set_dependencies(free) is True  # no dependency left: it runs beside "long"
    assert wait_states(client, slurm_cluster, [free])[free].state is State.COMPLETED
    assert client.states([long])[long].state is State.RUNNING
    assert (jobdir / "free.log").read_text().strip() == "ran"
    # "held" keeps its afterok on the failed job when its hint goes: still never runs
    assert client.set_dependencies(held, [bad]) is True
    time.sleep(2)
    assert client.states([held])[held].state is State.PENDING
    assert "afterok" in slurm_cluster.scontrol("show", "job", held).stdout
    client.cancel([long, held])
    wait_states(client, slurm_cluster, [long, held])
    assert client.set_dependencies(free) is False and client.set_dependencies(long, [], [free]) is False


def test_scancel_running_job(slurm_cluster: SlurmCluster, client: Slurm, jobdir: Path) -> None:
    job = client.submit(script("sleep 120"), name="dedal-long", output=jobdir / "long.log")
    waiting = client.submit(script("true"), name="dedal-after-long", dependencies=[job], output=jobdir / "after.log")
    running = wait_states(client, slurm_cluster, [job], until=lambda st: st.state is State.RUNNING)
    assert running[job].node in slurm_cluster.nodes
    client.cancel([job, waiting])
    states = wait_states(client, slurm_cluster, [job, waiting])
    assert states[job].state is State.CANCELLED, states[job]
    assert states[waiting].state is State.CANCELLED, states[waiting]
    client.cancel([job, waiting])  # already gone: not an error
    client.cancel([])


def test_killed_job_is_seen_as_failed(slurm_cluster: SlurmCluster, client: Slurm, jobdir: Path) -> None:
    pidfile = jobdir / "victim.pid"
    job = client.submit(
        script(f"echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; sleep 120"),
        name="dedal-victim",
        output=jobdir / "victim.log",
    )
    wait_states(client, slurm_cluster, [job], until=lambda st: st.state is State.RUNNING)
    deadline = time.monotonic() + 30
    while not pidfile.exists():
        assert time.monotonic() < deadline, f"job {job} never wrote its pid"
        time.sleep(0.1)
    os.kill(int(pidfile.read_text()), signal.SIGKILL)  # the job's batch script, started by this test
    st = wait_states(client, slurm_cluster, [job])[job]
    assert st.state is State.FAILED, st
    assert st.signal == signal.SIGKILL and st.exit_code is None, st
    assert not st.is_node_failure


def test_node_down_is_a_node_failure(slurm_cluster: SlurmCluster, client: Slurm, jobdir: Path) -> None:
    node = slurm_cluster.nodes[-1]
    job = client.submit(
        script("sleep 120"),
        name="dedal-on-doomed-node",
        output=jobdir / "doomed.log",
        extra_args=[f"--nodelist={node}"],
    )
    try:
        st = wait_states(client, slurm_cluster, [job], until=lambda s: s.state is State.RUNNING)[job]
        assert st.node == node
        slurm_cluster.scontrol("update", f"nodename={node}", "state=down", "reason=dedal-test")
        st = wait_states(client, slurm_cluster, [job])[job]
        assert st.state is State.NODE_FAIL, st
        assert st.is_node_failure
        # --no-requeue (the default of submit) keeps it failed: dedal decides about retries
        time.sleep(1)
        assert client.states([job])[job].state is State.NODE_FAIL
    finally:
        client.cancel([job])
        # ReturnToService=2 brings the node back when its slurmd registers again
        slurm_cluster.scontrol("update", f"nodename={node}", "state=resume", check=False)
        slurm_cluster.wait_nodes_usable([node])


def test_sacct_completion_log_after_slurmctld_forgot(slurm_cluster: SlurmCluster, client: Slurm, jobdir: Path) -> None:
    ok = client.submit(script("true"), name="dedal-acct-ok", output=jobdir / "ok.log")
    bad = client.submit(script("exit 7"), name="dedal-acct-bad", output=jobdir / "bad.log")
    wait_states(client, slurm_cluster, [ok, bad])
    # what states() falls back to once a job has left slurmctld (MinJobAge): accounting
    # storage is disabled on the test cluster, so this is `sacct -c`
    fresh = Slurm(slurm_cluster.env)
    acct = fresh._sacct([ok, bad])
    assert fresh._sacct_mode == ["sacct", "-c"]
    assert acct[ok].state is State.COMPLETED and acct[ok].exit_code == 0 and acct[ok].source == "sacct -c"
    assert acct[bad].state is State.FAILED and acct[bad].exit_code == 7
    assert acct[ok].node in slurm_cluster.nodes
    # plain `squeue -o` output (the default) gets its exit codes from there too; --json has them itself
    for client_ in (Slurm(slurm_cluster.env), Slurm(slurm_cluster.env, squeue_json=True)):
        st = client_.states([ok, bad, "999999"])
        assert st[bad].state is State.FAILED and st[bad].exit_code == 7, st
        assert st[ok].state is State.COMPLETED and st[ok].exit_code == 0, st
        assert st[ok].source == "squeue" and st[ok].node in slurm_cluster.nodes
        assert st["999999"].state is State.UNKNOWN
    assert client_._squeue_json is True


def test_submit_options_and_environment(slurm_cluster: SlurmCluster, client: Slurm, jobdir: Path) -> None:
    out = jobdir / "opts.log"
    job = client.submit(
        script('echo "$DEDAL_X|$SLURM_JOB_NAME|$SLURM_CPUS_PER_TASK|$SLURM_JOB_PARTITION"; pwd'),
        name="dedal-opts",
        output=out,
        cpus=2,
        mem="100M",
        time="1:00",
        nice=10,
        env={"DEDAL_X": "a,b c"},
        workdir=jobdir,
        partition=slurm_cluster.partition,
    )
    st = wait_states(client, slurm_cluster, [job])[job]
    assert st.state is State.COMPLETED, (st, out.read_text() if out.exists() else "")
    assert out.read_text().splitlines() == ["a,b c|dedal-opts|2|debug", str(jobdir)]


def test_submit_error_is_a_tool_error(slurm_cluster: SlurmCluster, client: Slurm, jobdir: Path) -> None:
    with pytest.raises(ToolError) as err:
        client.submit(script("true"), name="dedal-nowhere", partition="no-such-partition", output=jobdir / "x.log")
    assert err.value.cmd[0] == "sbatch" and err.value.returncode != 0
    assert "--partition=no-such-partition" in err.value.cmd
    assert "invalid partition" in str(err.value).lower()
