"""Multi-node for real: the namespaced test cluster (start.sh with DEDAL_TC_NETNS=1), whose
nodes are separate as far as Slurm, PMIx, UCX and Open MPI can tell (own network, address,
hostname, /dev/shm, /tmp, /run), with the session's temporary directory shared like a
parallel file system.

On the plain test cluster (slurmds side by side on one host) a two-node PMIx step fails with
"File exists" (Slurm's PMIx plugin gives every node of a step the same /tmp directory) and
every build job lands on node1; here neither happens.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import pytest

from tests.fixtures.tiny import make_env
from tests.conftest import dedal_exe, interruptible
from tests.fixtures.slurm import SlurmCluster, allocation

pytestmark = [pytest.mark.multinode, pytest.mark.slurm]
NODE_STAGE = "/dev/shm/dedal-multinode"  # on each node its own (private /dev/shm)
MPI_CUDA_SPECS = [
    "openmpi@5 fabrics=ucx schedulers=slurm +cuda",
    "ucx +cuda",
    "pmix",
    "osu-micro-benchmarks +cuda",
    "nccl-tests",
    "hwloc +cuda",
    "cuda@12.2",
]
WIDE = [
    "-t",
    "latency_overhead_us=1000000",
    "-t",
    "bandwidth_pct=100",
    "-t",
    "init_overhead_pct=1000000",
    "-t",
    "busbw_pct=100",
]


def srun(cluster: SlurmCluster, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["srun", "--quiet", *args], env=cluster.env, text=True, capture_output=True, timeout=timeout)


def test_nodes_are_separate_machines(netns_cluster: SlurmCluster, tmp_path: Path) -> None:
    """Own hostname and address per node; /tmp and /dev/shm private to the node; the shared
    directory the same everywhere."""
    shared = tmp_path / "shared"
    shared.mkdir()
    script = (
        f'echo "$(hostname) $SLURMD_NODENAME $(ip -4 -o addr show eth0 | awk "{{print \\$4}}")"; '
        f"echo mine > /tmp/only-$SLURMD_NODENAME; echo mine > /dev/shm/only-$SLURMD_NODENAME; "
        f'echo "$(ls /tmp/only-* /dev/shm/only-* | tr "\\n" " ")"; touch {shared}/$SLURMD_NODENAME'
    )
    p = srun(netns_cluster, "-N3", "-n3", "-l", "bash", "-c", script)
    assert p.returncode == 0, p.stderr + netns_cluster.log_tail()
    lines = sorted(p.stdout.splitlines())
    ids = [line.split(": ", 1)[1].split() for line in lines if line.split(": ", 1)[1].startswith("node")]
    assert sorted(i[0] for i in ids) == ["node1", "node2", "node3"]
    assert all(i[0] == i[1] for i in ids)  # the hostname is the node's name
    assert len({i[2] for i in ids}) == 3  # three addresses
    seen = [line.split(": ", 1)[1] for line in lines if "/tmp/only-" in line]
    assert len(seen) == 3
    for listing in seen:  # each node sees its own two files only
        assert len(listing.split()) == 2 and len({f.rsplit("-", 1)[1] for f in listing.split()}) == 1, listing
    assert not list(Path("/tmp").glob("only-node*")) and not list(Path("/dev/shm").glob("only-node*"))
    assert sorted(f.name for f in shared.iterdir()) == ["node1", "node2", "node3"]


def test_pmix_step_across_two_nodes(netns_cluster: SlurmCluster) -> None:
    """The step that fails with "File exists" on the plain cluster."""
    p = srun(
        netns_cluster,
        "--mpi=pmix",
        "-N2",
        "-n4",
        "-l",
        "bash",
        "-c",
        'echo "$PMIX_RANK $SLURMD_NODENAME $PMIX_NAMESPACE"',
    )
    assert p.returncode == 0, p.stderr + netns_cluster.log_tail()
    rows = [line.split(": ", 1)[1].split() for line in p.stdout.splitlines()]
    assert sorted(int(r[0]) for r in rows) == [0, 1, 2, 3]
    assert len({r[1] for r in rows}) == 2 and len({r[2] for r in rows}) == 1


@pytest.mark.parametrize("ranks", [1, 2])
def test_verify_across_two_nodes(
    run_dedal,
    netns_cluster: SlurmCluster,
    bench_image,
    native_cache,  # noqa: F811
    tmp_path: Path,
    ranks: int,
) -> None:
    """`dedal verify --launcher srun --nodes 2`: native and container runs inter-node, the
    transport named from UCX's own log (tcp over the veth pairs), and judged against the
    fabric: tcp between nodes of a cluster without InfiniBand is what it should be.

    2 x 2 runs init and latency only: four busy-polling ranks on this 2-core machine make
    an all-reduce take ~60 ms per call (native and container alike), minutes per run."""
    out = tmp_path / "verify"
    env = dict(netns_cluster.env, DEDAL_CACHE_DIR=str(native_cache))
    benches = "init,latency,bw,allreduce" if ranks == 1 else "init,latency"
    p = run_dedal(
        "verify",
        str(bench_image.sif),
        "--launcher",
        "srun",
        "--nodes",
        "2",
        "--ranks",
        str(ranks),
        "-b",
        benches,
        "-r",
        "1",
        "--max-size",
        "64K",
        "--timeout",
        "180",
        "-o",
        str(out),
        *WIDE,
        env=env,
        timeout=900,
    )
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}\n{netns_cluster.log_tail()}"
    data = json.loads((out / "verify.json").read_text())
    assert data["meta"]["nodes"] == 2 and "inter-node" in data["meta"]["scopes"]
    runs = [e for e in data["logs"] if e.get("side") in ("native", "container") and e.get("scope") == "inter-node"]
    progs = {(e["side"], e["program"]) for e in runs}
    assert {(s, "dedal_" + b) for s in ("native", "container") for b in benches.split(",")} <= progs
    for e in runs:
        assert e["returncode"] == 0, e["source"]
        assert e["verdict"] == "good", (e["source"], e["findings"])
    init = next(e for e in runs if e["program"] == "dedal_init" and e["side"] == "container")
    assert init["init"]["nprocs"] == 2 * ranks
    lat = next(e for e in runs if e["program"] == "dedal_latency" and e["side"] == "container")
    inter = lat["transports_by_scope"].get("inter-node", [])
    assert inter and all(t.split("/")[0] == "tcp" for t in inter), lat["transports_by_scope"]
    codes = {f["code"] for f in data["findings"]}
    assert "ucx-tcp-inter-node" in codes  # named, as information: no InfiniBand on this cluster
    assert not [f for f in data["findings"] if f["code"] == "ucx-tcp-inter-node" and f["severity"] == "error"]
    names = {c["name"] for c in data["checks"]}
    assert {f"dedal_{b} inter-node" for b in benches.split(",")} <= names, names


@pytest.mark.reliability
def test_a_report_directory_the_nodes_cannot_see_is_one_line(
    run_dedal, netns_cluster: SlurmCluster, bench_image, native_cache
) -> None:  # noqa: F811
    """The nodes have a /tmp of their own: a report directory there would fail every run
    (the ranks cannot read the rank script in it). dedal stops first, naming the node and
    the directory, and the report already there is left as it was."""
    out = Path(tempfile.mkdtemp(prefix="dedal-unshared-", dir="/tmp"))
    try:
        (out / "verify.json").write_text('{"earlier": true}\n')
        env = dict(netns_cluster.env, DEDAL_CACHE_DIR=str(native_cache))
        p = run_dedal(
            "verify",
            str(bench_image.sif),
            "--launcher",
            "srun",
            "--nodes",
            "2",
            "--ranks",
            "1",
            "-b",
            "init",
            "-r",
            "1",
            "-o",
            str(out),
            *WIDE,
            env=env,
            timeout=600,
        )
        errors = [line for line in p.stderr.splitlines() if line.startswith("dedal: error:")]
        assert p.returncode == 2 and len(errors) == 1, p.stdout + p.stderr
        assert "would not see" in errors[0], errors
        assert len(set(re.findall(rf"(node\d): {re.escape(str(out))}\b", errors[0]))) == 2, errors  # both nodes
        assert str(bench_image.sif) not in errors[0]  # the image and the cache are shared: only the folder is named
        assert sorted(x.name for x in out.iterdir()) == ["verify.json"]  # the earlier report is untouched
        assert (out / "verify.json").read_text() == '{"earlier": true}\n'
    finally:
        shutil.rmtree(out, ignore_errors=True)
        out.with_name(f".{out.name}.lock").unlink(missing_ok=True)  # dedal's lock beside the report


def _nodes_of_jobs(cluster: SlurmCluster, prefix: str) -> Dict[str, str]:
    """job name -> node, from Slurm's job completion log (sacct -c)."""
    p = subprocess.run(
        ["sacct", "-c", "-n", "-P", "-o", "JobName,NodeList,State"],
        env=cluster.env,
        text=True,
        capture_output=True,
        timeout=30,
    )
    assert p.returncode == 0, p.stderr
    out = {}
    for line in p.stdout.splitlines():
        name, nodes, state = (line.split("|") + ["", ""])[:3]
        if name.startswith(prefix) and state.startswith("COMPLETED"):
            out[name] = nodes
    return out


def _build(env, cluster: SlurmCluster, *args: str, **extra: str) -> subprocess.Popen:
    full = dict(os.environ)
    full.update(env.env)
    full.update(
        SLURM_CONF=cluster.env["SLURM_CONF"],
        DEDAL_SLURM_POLL_S="0.3",
        DEDAL_EXECUTOR="slurm",
        DEDAL_STAGE_DIR=NODE_STAGE,
        **extra,
    )
    return subprocess.Popen(
        [dedal_exe(), "build", str(env.env_file), "--json", *args],
        env=full,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=interruptible,
    )


def _layers(env) -> List[str]:
    return sorted(p.name for p in (env.data / "layers").glob("*.sqfs")) if (env.data / "layers").is_dir() else []


def test_build_spreads_over_the_nodes(netns_cluster: SlurmCluster, tmp_path: Path) -> None:
    """A real 32-package lock (Open MPI, UCX, PMIx, CUDA, OSU) built by the stand-in on 3
    nodes: the jobs run on all three (Slurm's own record says so), each stages in its node's
    private /dev/shm, and layers reach the jobs that need them only through the shared store."""
    env = make_env(tmp_path, lock="mpi-cuda", specs=MPI_CUDA_SPECS, name="mn")
    proc = _build(env, netns_cluster, DEDAL_SLURM_NODES="3")
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err + netns_cluster.log_tail()
    summary = json.loads(out)
    assert len(summary["built"]) == 32 and not summary["failed"], summary
    nodes = _nodes_of_jobs(netns_cluster, "dedal:mn:")
    assert len(nodes) == summary["jobs"] and set(nodes.values()) == {"node1", "node2", "node3"}, nodes
    assert len(_layers(env)) == 32
    assert not list(Path(NODE_STAGE).glob("*"))  # the host's /dev/shm saw no stage


def test_node_killed_mid_build_is_built_elsewhere(netns_cluster: SlurmCluster, tmp_path: Path) -> None:
    """The node running a job is killed (its slurmd, its namespace's processes and so its
    /dev/shm stage gone): Slurm fails the job (NODE_FAIL), dedal resubmits it, it runs on
    another node, and the layers are the same as from an undisturbed build."""
    tiny = make_env(tmp_path, sleep={"gcc-runtime": 30})
    proc = _build(tiny, netns_cluster)
    rec_path = tiny.data / "work" / "tiny" / "slurm-jobs.json"
    deadline = time.monotonic() + 120
    victim = None
    while victim is None:
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "gcc-runtime never started"
        try:
            jobs = json.loads(rec_path.read_text())["jobs"]
        except (OSError, ValueError):
            jobs = []
        victim = next(
            (
                j
                for j in jobs
                if j["status"] == "running"
                and j.get("node")
                and any(p.startswith("gcc-runtime@") for p in j["packages"])
            ),
            None,
        )
        time.sleep(0.3)
    node = victim["node"]
    ns = f"dtc{netns_cluster.facts['DEDAL_TC_PORT']}-{node}"
    pids = subprocess.run(["ip", "netns", "pids", ns], text=True, capture_output=True, timeout=10).stdout.split()
    assert pids, f"nothing runs in {ns}"
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        out, err = proc.communicate(timeout=400)
    finally:
        _restart_node(netns_cluster, node)
    assert proc.returncode == 0, err + netns_cluster.log_tail()
    rec = json.loads(rec_path.read_text())
    job = next(j for j in rec["jobs"] if j["id"] == victim["id"])
    assert job["status"] == "done" and job["attempt"] >= 2, job
    assert job["history"][0]["slurm_id"] == victim["slurm_id"] != job["slurm_id"], job
    assert job["node"] != node, job
    state = subprocess.run(
        ["sacct", "-c", "-n", "-P", "-j", victim["slurm_id"], "-o", "State"],
        env=netns_cluster.env,
        text=True,
        capture_output=True,
        timeout=30,
    ).stdout
    assert "NODE_FAIL" in state, state
    assert len(json.loads(out)["built"]) == 5
    assert len(_layers(tiny)) == 5
    # the same lock built undisturbed (locally, another store): the same layers, byte for byte
    clean = make_env(tmp_path / "clean")
    env = dict(os.environ, **clean.env)
    p = subprocess.run(
        [dedal_exe(), "build", str(clean.env_file), "--json", "--executor", "local"],
        env=env,
        text=True,
        capture_output=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert _digests(tiny) == _digests(clean) and len(_digests(clean)) == 5


def _digests(env) -> Dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (env.data / "layers").glob("*.sqfs")}


def _restart_node(cluster: SlurmCluster, node: str) -> None:
    """Bring a killed node back the way start.sh started it, so later tests have three."""
    state = cluster.state_dir
    port = cluster.facts["DEDAL_TC_PORT"]
    here = Path(__file__).resolve().parents[2] / "slurm" / "testcluster"
    env = dict(
        os.environ,
        SLURM_CONF=cluster.env["SLURM_CONF"],
        DEDAL_TC_SHARED=cluster.facts["DEDAL_TC_SHARED"],
        DEDAL_TC_HOSTS=str(state / "hosts"),
    )
    log = open(state / "log" / f"slurmd-{node}.out", "ab")
    p = subprocess.Popen(
        [
            "setsid",
            "nsenter",
            f"--net=/run/netns/dtc{port}-{node}",
            "unshare",
            "--mount",
            "--uts",
            "--propagation",
            "private",
            "--",
            str(here / "node-ns.sh"),
            node,
            "--",
            "slurmd",
            "-D",
            "-N",
            node,
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    with open(state / "pids", "a") as f:
        f.write(f"slurmd {p.pid}\n")
    cluster.scontrol("update", f"nodename={node}", "state=resume", check=False)
    cluster.wait_nodes_usable([node], timeout=90)


@pytest.mark.apptainer
def test_verify_with_apptainer_in_an_allocation_one_instance_per_node(
    run_dedal, netns_cluster: SlurmCluster, bench_image, native_cache, apptainer, tmp_path: Path
) -> None:
    """`dedal verify` inside an allocation of two nodes with Apptainer: every container run, on
    both nodes, joins the one instance of its node (its ranks in one mount namespace, the same
    in every run), and afterwards neither node has an instance, a step or a process of it left."""
    jid, env = allocation(netns_cluster, native_cache, nodes=2, tasks=4)
    out = tmp_path / "verify"
    try:
        p = run_dedal(
            "verify",
            str(bench_image.sif),
            "--runtime",
            "apptainer",
            "--launcher",
            "srun",
            "--nodes",
            "2",
            "--ranks",
            "2",
            "-b",
            "init",
            "-r",
            "1",
            "--timeout",
            "180",
            "-o",
            str(out),
            *WIDE,
            env=env,
            timeout=900,
        )
        assert p.returncode == 0, f"{p.stdout}\n{p.stderr}\n{netns_cluster.log_tail()}"
        meta = json.loads((out / "verify.json").read_text())["meta"]
        assert (
            meta["runtime"] == "apptainer (shared per node)" and "one Apptainer instance per node" in meta["container"]
        )
        logs = sorted((out / "raw" / "inter-node" / "dedal_init").glob("container-*.log"))
        per_node: Dict[str, set] = {}
        for log in logs:
            for host, ns in re.findall(r"^#@ dedal-container: host=(\S+) mntns=(\S+)", log.read_text(), re.M):
                per_node.setdefault(host, set()).add(ns)
        assert sorted(per_node) == ["node1", "node2"] and all(len(v) == 1 for v in per_node.values()), per_node
        steps = subprocess.run(
            ["squeue", "-h", "-s", "-j", jid], env=netns_cluster.env, capture_output=True, text=True, timeout=30
        ).stdout
        assert steps.strip() == "", steps
        left = srun(
            netns_cluster,
            "--jobid",
            jid,
            "-N2",
            "-n2",
            "--overlap",
            "sh",
            "-c",
            "apptainer instance list 2>/dev/null | grep -c dedal- || true",
        )
        assert [line.strip() for line in left.stdout.splitlines()] == ["0", "0"], left.stdout + left.stderr
    finally:
        subprocess.run(["scancel", jid], env=netns_cluster.env, timeout=60)


@pytest.mark.apptainer
def test_dedal_run_on_two_nodes_one_container_each(
    run_dedal, netns_cluster: SlurmCluster, bench_image, native_cache, apptainer, tmp_path: Path
) -> None:
    """`dedal run IMAGE -- CMD` in an allocation of two nodes and four tasks, a program that is
    no MPI program and ends at once: every run, all four ranks answer, the two of a node from one
    container of the image (one mount namespace per node, the image's /bin/sh, not the host's),
    the ranks of each node having met in that node's own /tmp before the program, which they
    leave as they found it."""
    jid, env = allocation(netns_cluster, native_cache, nodes=2, tasks=4)
    show = 'echo "rank=$SLURM_PROCID node=$SLURM_NODEID ns=$(readlink /proc/self/ns/mnt) dev=$(stat -Lc %d /bin/sh)"'
    try:
        for _ in range(4):
            p = run_dedal("run", str(bench_image.sif), "--", "/bin/sh", "-c", show, env=env, cwd=tmp_path, timeout=300)
            assert p.returncode == 0, f"{p.stdout}\n{p.stderr}\n{netns_cluster.log_tail()}"
            ranks = re.findall(r"^rank=(\d) node=(\d) ns=(\S+) dev=(\d+)$", p.stdout, re.M)
            assert sorted(r for r, *_ in ranks) == ["0", "1", "2", "3"], p.stdout + p.stderr
            per_node: Dict[str, set] = {}
            for _rank, node, ns, _dev in ranks:
                per_node.setdefault(node, set()).add(ns)
            assert sorted(per_node) == ["0", "1"] and all(len(v) == 1 for v in per_node.values()), per_node
            assert str(os.stat("/bin/sh").st_dev) not in {dev for *_, dev in ranks}, ranks  # all in the image
        left = srun(
            netns_cluster, "--jobid", jid, "-N2", "-n2", "--overlap", "sh", "-c", "ls -d /tmp/dedal-meet.* | wc -l"
        )
        assert [line.strip() for line in left.stdout.splitlines()] == ["0", "0"], left.stdout + left.stderr
    finally:
        subprocess.run(["scancel", jid], env=netns_cluster.env, timeout=60)


@pytest.mark.apptainer
def test_verify_on_fewer_nodes_than_the_allocation_runs_where_the_instance_is(
    run_dedal, netns_cluster: SlurmCluster, bench_image, native_cache, apptainer, tmp_path: Path
) -> None:
    """`dedal verify --nodes 1` inside an allocation of three nodes (as benchmarks/apps/scaling.py
    measures 1 node of a larger allocation): Slurm sends a step to the least busy node, which
    is not the one whose step keeps the Apptainer instance busy; every step, native and
    container, must run on the instance's node (it failed with "no instance found" before)."""
    jid, env = allocation(netns_cluster, native_cache, nodes=3, tasks=6)
    out = tmp_path / "verify"
    try:
        p = run_dedal(
            "verify",
            str(bench_image.sif),
            "--runtime",
            "apptainer",
            "--launcher",
            "srun",
            "--nodes",
            "1",
            "--ranks",
            "2",
            "-b",
            "init",
            "-r",
            "2",
            "--timeout",
            "180",
            "-o",
            str(out),
            *WIDE,
            env=env,
            timeout=900,
        )
        assert p.returncode == 0, f"{p.stdout}\n{p.stderr}\n{netns_cluster.log_tail()}"
        ready = re.findall(r"^#@ dedal-instance: ready on (\S+)$", (out / "raw" / "instances.log").read_text(), re.M)
        assert len(ready) == 1, ready
        hosts = {}
        for log in sorted((out / "raw" / "intra-node" / "dedal_init").glob("*.log")):
            hosts[log.name] = set(re.findall(r"^#@ dedal-rank: host=(\S+)", log.read_text(), re.M))
        assert len(hosts) == 6 and all(h == set(ready) for h in hosts.values()), (ready, hosts)
        left = srun(
            netns_cluster,
            "--jobid",
            jid,
            "-N3",
            "-n3",
            "--overlap",
            "sh",
            "-c",
            "apptainer instance list 2>/dev/null | grep -c dedal- || true",
        )
        assert [line.strip() for line in left.stdout.splitlines()] == ["0", "0", "0"], left.stdout + left.stderr
    finally:
        subprocess.run(["scancel", jid], env=netns_cluster.env, timeout=60)
