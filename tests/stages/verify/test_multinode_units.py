"""Multi-node verification without a cluster: one rank per node, the fabric a run log is
judged against, and the rank script that mounts the image on nodes that lack it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dedal.adapters import mpi
from dedal.cli import build_parser
from dedal.errors import UserError
from dedal.stages.verify import runner as R
from dedal.stages.verify.catalogue import CATALOGUE
from dedal.stages.verify.parsers import parse_file, parse_text
from dedal.stages.verify.transports import HostFacts
from dedal.stages.verify.plan import Plan


def options(tmp_path: Path, *args: str) -> R.Options:
    image = tmp_path / "x.sif"
    image.write_bytes(b"")
    return R.options_from_args(build_parser().parse_args(["verify", str(image), *args]))


def test_one_rank_per_node_on_one_node_or_more(tmp_path: Path) -> None:
    """1 rank per node is accepted on any number of nodes (the runs within a node use 2), as
    build-image accepts ``ranks: 1`` in the environment file; 0 is not."""
    assert options(tmp_path, "--ranks", "1", "--nodes", "2", "--launcher", "srun").ranks == 1
    assert options(tmp_path, "--ranks", "1").ranks == 1
    with pytest.raises(UserError, match="--ranks 0: at least 1"):
        options(tmp_path, "--ranks", "0", "--nodes", "2", "--launcher", "srun")


def test_runs_within_a_node_keep_two_ranks_at_one_rank_per_node() -> None:
    init = next(b for b in CATALOGUE if b.key == "init")
    lat = next(b for b in CATALOGUE if b.key == "latency")
    plan = Plan("srun", [("intra-node", 1), ("inter-node", 2)], [init, lat], 1, 1, 0)
    assert plan.ranks_for(init, 1) == 2 and plan.ranks_for(init, 2) == 2 and plan.ranks_for(lat, 2) == 2
    assert Plan("srun", [], [init], 1, 3, 0).ranks_for(init, 1) == 3


# an inter-node run's UCX selection over TCP and its OSU latency table (72 us: what TCP gives)
_TCP_RUN = (
    "[1.0] [n1:7:0] ucp_worker.c:1903 UCX  INFO    ucp_context_0 inter-node cfg#2 tag(tcp/eth0)\n"
    "# OSU MPI Latency Test v7.4\n# Size          Latency (us)\n0                      72.00\n"
    "1                      72.50\n"
)


def test_tcp_between_nodes_is_expected_without_rdma() -> None:
    judged = parse_text(_TCP_RUN, host=HostFacts(has_infiniband=False, multi_node=True), scope="inter-node")
    assert judged["verdict"] == "good"
    tcp = [f for f in judged["findings"] if f["code"] in ("ucx-tcp-inter-node", "latency-tcp-like")]
    assert {f["code"]: f["severity"] for f in tcp} == {"ucx-tcp-inter-node": "info", "latency-tcp-like": "info"}
    assert all("no RDMA network" in f["message"] and f["evidence"] for f in tcp)


def test_tcp_between_nodes_stays_a_fallback_with_infiniband_or_within_a_node() -> None:
    assert parse_text(_TCP_RUN, host=HostFacts(has_infiniband=True), scope="inter-node")["verdict"] == "bad"
    assert parse_text(_TCP_RUN, host=HostFacts(), scope="intra-node")["verdict"] == "bad"
    assert parse_text(_TCP_RUN)["verdict"] == "bad"  # the log alone: the host's network is not known
    failed = parse_text(_TCP_RUN + "Segmentation fault\n", host=HostFacts(), scope="inter-node")
    assert failed["verdict"] == "failed"  # what else the log says still counts


def test_ucx_1_13_tcp_of_unknown_placement_between_nodes_is_expected_without_rdma(local_data) -> None:
    """A real inter-node run of esd-cpu (UCX 1.13.1, one rank per node of the namespaced
    test cluster): UCX 1.13 logs its TCP endpoint without placement, so the parser alone
    says 'UCX uses TCP' (bad); judged as an inter-node run on nodes without RDMA it is the
    expected path between the nodes. TCP on lo, an intra-node run, or InfiniBand present
    keep it an error."""
    path = local_data / "ompi5_ucx1.13_tcp_eth0_internode_netns.log"
    parsed = parse_file(path)
    assert parsed["ucx_version"] == "1.13.1" and parsed["transports_by_scope"]["unknown"] == ["tcp/eth0"]
    assert parsed["verdict"] == "bad" and [f["code"] for f in parsed["findings"]] == ["ucx-tcp-transport"]
    judged = parse_file(path, host=HostFacts(has_infiniband=False, multi_node=True), scope="inter-node")
    assert judged["verdict"] == "good"
    assert [(f["code"], f["severity"]) for f in judged["findings"]] == [("ucx-tcp-transport", "info")]
    assert parse_file(path, host=HostFacts(has_infiniband=True), scope="inter-node")["verdict"] == "bad"
    assert parse_file(path, host=HostFacts(), scope="intra-node")["verdict"] == "bad"
    on_lo = path.read_text().replace("tcp/eth0", "tcp/lo")
    assert parse_text(on_lo, host=HostFacts(), scope="inter-node")["verdict"] == "bad"


def test_rank_script_mounts_the_image_where_it_is_missing(tmp_path: Path) -> None:
    """Where the mount directory holds the image (the node dedal runs on) the command runs as
    given; where it is empty (another node) the script mounts the image for this rank,
    rewrites every argument under the mount directory to its own mount, and unmounts it
    after; an image it cannot mount is one line naming it."""
    script = mpi.write_rank_script(tmp_path)
    mounted = tmp_path / "root"
    (mounted / "etc").mkdir(parents=True)
    (mounted / "etc" / "hello").write_text("from the mount\n")
    out = subprocess.run(
        [
            "/bin/sh",
            str(script),
            mpi.IMAGE_TOKEN,
            str(mounted),
            "/nonexistent.sif",
            "0",
            "/bin/sh",
            "-c",
            'cat "$1"; echo "$2"',
            "sh",
            f"{mounted}/etc/hello",
            "second",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["from the mount", "second"]

    if os.geteuid() != 0 or not shutil.which("mksquashfs"):
        pytest.skip("mounting a squashfs needs root and squashfs-tools")
    image = tmp_path / "image.sqfs"
    src = tmp_path / "src"
    (src / "etc").mkdir(parents=True)
    (src / "etc" / "hello").write_text("from the image\n")
    subprocess.run(["mksquashfs", str(src), str(image), "-quiet", "-noappend"], check=True, timeout=60)
    empty = tmp_path / "empty"
    empty.mkdir()
    before = set(Path("/tmp").glob("dedal-rank-root.*"))
    out = subprocess.run(
        [
            "/bin/sh",
            str(script),
            mpi.IMAGE_TOKEN,
            str(empty),
            str(image),
            "0",
            "/bin/sh",
            "-c",
            'cat "$1"; echo "$1"',
            "sh",
            f"{empty}/etc/hello",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    text, path = out.stdout.splitlines()
    assert text == "from the image" and path.startswith("/tmp/dedal-rank-root.") and path.endswith("/etc/hello")
    assert set(Path("/tmp").glob("dedal-rank-root.*")) == before  # unmounted and removed
    out = subprocess.run(
        ["/bin/sh", str(script), mpi.IMAGE_TOKEN, str(empty), str(tmp_path / "missing.sif"), "0", "/bin/true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1 and f"cannot mount the image {tmp_path / 'missing.sif'}" in out.stderr
    assert set(Path("/tmp").glob("dedal-rank-root.*")) == before


def _rank_mounts() -> set:
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        return {line.split()[1] for line in fh if line.split()[1].startswith("/tmp/dedal-rank-root.")}


def _rank_files() -> set:
    return set(Path("/tmp").glob("dedal-rank-root.*"))


def _step(script: Path, *ranks: list) -> subprocess.Popen:
    """A stand-in for one step of srun on one node: a parent process (the step daemon) that
    starts ``ranks`` (the rank script's arguments each) at once and waits for them."""
    body = " ".join(f"/bin/sh {script} {' '.join(r)} &" for r in ranks) + " wait; true"
    return subprocess.Popen(
        ["/bin/sh", "-c", body], start_new_session=True, stderr=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True
    )


def _wait_for(what, ok, procs, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), what
        time.sleep(0.05)


def test_the_ranks_of_a_step_share_one_mount_and_a_killed_steps_is_undone(tmp_path: Path) -> None:
    """On a node without the image mounted, the ranks of one step mount it once between them
    (named after their common parent, the step daemon) and the last one out unmounts it. srun
    stops a step with SIGKILL, so a step's mount can stay behind; the next step that mounts on
    that node unmounts and removes it (its step daemon is gone)."""
    if os.geteuid() != 0 or not shutil.which("mksquashfs"):
        pytest.skip("mounting a squashfs needs root and squashfs-tools")
    script = mpi.write_rank_script(tmp_path)
    src = tmp_path / "src"
    (src / "etc").mkdir(parents=True)
    (src / "etc" / "hello").write_text("from the image\n")
    image = tmp_path / "image.sqfs"
    subprocess.run(["mksquashfs", str(src), str(image), "-quiet", "-noappend"], check=True, timeout=60)
    empty = tmp_path / "empty"
    empty.mkdir()
    rank = [mpi.IMAGE_TOKEN, str(empty), str(image), "0"]
    before, files = _rank_mounts(), _rank_files()
    killed = _step(script, rank + ["sleep", "60"], rank + ["sleep", "60"])
    second = None
    try:
        _wait_for("the killed step never mounted the image", lambda: _rank_mounts() - before, [killed])
        time.sleep(0.5)  # both ranks are running
        (left,) = _rank_mounts() - before  # one mount for the two ranks of the step
        os.killpg(killed.pid, signal.SIGKILL)  # what srun does to its tasks when it is stopped
        killed.wait(timeout=30)
        assert left in _rank_mounts()  # no trap ran: the mount stays

        second = _step(script, rank + ["sleep", "60"], rank + ["cat", f"{empty}/etc/hello"])
        _wait_for(_rank_mounts(), lambda: left not in _rank_mounts() and len(_rank_mounts() - before) == 1, [second])
        (own,) = _rank_mounts() - before
        assert own != left and not Path(left).exists()  # the dead step's mount is gone, directory too
        _wait_for("the second rank never printed", lambda: second.stdout.readable(), [second])
        assert second.stdout.readline() == "from the image\n"  # the second rank read the step's one mount
        time.sleep(0.5)
        assert own in _rank_mounts()  # the first rank still runs: the mount is kept
        os.killpg(second.pid, signal.SIGTERM)  # scancel: the ranks end, the last one out unmounts
        second.wait(timeout=30)
        _wait_for("the step's mount stayed", lambda: own not in _rank_mounts() and _rank_files() <= files, [])
    finally:
        for p in (killed, second):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
        for path in _rank_mounts() - before:
            subprocess.run(["umount", "-l", path], check=False)
            subprocess.run(["rmdir", path], check=False)
    assert _rank_mounts() == before and _rank_files() <= files  # no mount, directory or lock file left
