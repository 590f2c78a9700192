"""`dedal verify` stopped by SIGTERM (scancel of the job dedal runs in, a CI job's timeout)
while a rank runs: dedal exits 143 with one line (a stop, not an error), and its ``srun`` or ``mpirun``, the
ranks, the Slurm job ``srun`` made and the image's mount are gone with it.

Before, SIGTERM ended dedal outright (no ``Signals`` block in verify): ``srun`` and its
ranks went on, and the image stayed mounted (``mpirun``'s sandbox died with dedal, as
bubblewrap's --die-with-parent has it). ``proc.run`` now also ends a step's ``srun`` with
SIGTERM rather than SIGKILL, which leaves the step for Slurm to find (about 3 s here; that
part is the unit test's, tests/adapters/test_proc.py). Real components: the local Slurm
test cluster, bubblewrap, Open MPI 5 in the bench image.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from tests.conftest import dedal_exe

pytestmark = [pytest.mark.slurm, pytest.mark.reliability]
RANK_WAIT_S = 600  # the first rank starts after the image is inspected and unpacked (slow on a loaded machine)
EXIT_WAIT_S = 60  # dedal's own grace for srun is a few seconds
QUEUE_WAIT_S = 30
WIDE = ["-t", "latency_overhead_us=1000000", "-t", "bandwidth_pct=100", "-t", "init_overhead_pct=1000000"]


def _processes(marker: str) -> List[Tuple[int, List[str]]]:
    """(pid, argv) of every process whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        except OSError:
            continue
        if any(marker in a for a in argv):
            found.append((int(entry.name), argv))
    return found


def _marked() -> List[Tuple[int, List[str]]]:
    """(pid, argv) of every process a rank script marked (DEDAL_STEPD in its environment): the
    rank script execs the runtime, so after a few milliseconds no rank has the script's folder
    on its command line; the mark stays with the runtime and what it starts outside the container."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        except OSError:
            continue
        if b"\0DEDAL_STEPD=" in b"\0" + environ and argv:
            found.append((int(entry.name), argv))
    return found


def _mounts_of(image: Path) -> List[str]:
    """Mount points of ``image`` (a kernel squashfs on a loop device, or squashfuse), as
    dedal mounts an image for the container runs; others' mounts are not counted."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        point, (fstype, source) = left.split()[4], right.split()[:2]
        if fstype == "squashfs" and source.startswith("/dev/loop"):
            backing = Path(f"/sys/block/{Path(source).name}/loop/backing_file")
            if backing.exists() and backing.read_text().strip() == str(image):
                found.append(point)
        elif fstype.startswith("fuse") and any(str(image) in argv and point in argv for _, argv in _processes(point)):
            found.append(point)
    return found


def _unmount(points: List[str]) -> None:
    """Lazily unmount what a failed test left mounted of ``points``."""
    for point in points:
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=60)


def _queue(env: Dict[str, str]) -> List[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], env=env, text=True, capture_output=True, timeout=30).stdout
    return [line for line in out.splitlines() if line.strip()]


def test_sigterm_stops_srun_its_ranks_and_its_job(
    slurm_cluster, bench_image, native_cache, isolated_env, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    marker = str(out / "raw" / ".launch")  # the rank script's folder: on srun's and every rank's command line
    env = dict(isolated_env, **slurm_cluster.facts, DEDAL_CACHE_DIR=str(native_cache))  # SLURM_CONF...
    assert not _queue(env), "the test cluster is busy before the test"
    assert not _marked(), f"rank processes run before the test: {_marked()}"
    # latency up to 64 MiB: each step runs for seconds, long enough to be caught running
    dedal = subprocess.Popen(
        [
            dedal_exe(),
            "verify",
            str(bench_image.sif),
            "--launcher",
            "srun",
            "-b",
            "latency",
            "-r",
            "3",
            "--max-size",
            "64M",
            "--timeout",
            "600",
            "-o",
            str(out),
            *WIDE,
        ],
        env=env,
        cwd=tmp_path,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    seen: List[Tuple[int, List[str]]] = []
    mounts: List[str] = []
    try:
        deadline = time.monotonic() + RANK_WAIT_S
        while True:
            ranks = _marked()
            if ranks:
                break
            assert dedal.poll() is None, f"dedal ended before a rank ran: {dedal.communicate()}"
            assert time.monotonic() < deadline, f"no rank within {RANK_WAIT_S} s"
            time.sleep(0.1)
        seen = _processes(marker)
        assert any(Path(a[0]).name == "srun" for _, a in seen), [a[:2] for _, a in seen]
        assert _queue(env), "srun runs but squeue shows no job"
        mounts = _mounts_of(bench_image.sif)

        dedal.send_signal(signal.SIGTERM)
        stdout, stderr = dedal.communicate(timeout=EXIT_WAIT_S)

        left = _processes(marker) + _marked()
        gone = time.monotonic() + QUEUE_WAIT_S
        while (left or _queue(env)) and time.monotonic() < gone:
            time.sleep(0.5)
            left = _processes(marker) + _marked()
        queue = _queue(env)
        assert not left, f"srun or ranks outlived dedal: {[(pid, ' '.join(argv[:2])) for pid, argv in left]}"
        assert not queue, f"the Slurm job outlived dedal: {queue}"
        assert dedal.returncode == 143, stdout + stderr
        said = [line for line in stderr.splitlines() if line.startswith(("dedal: error:", "dedal: verify"))]
        assert said == ["dedal: verify interrupted by signal SIGTERM"], stderr
        assert "Traceback" not in stderr, stderr
        assert not (out / "verify.json").exists()  # no report claims a verdict for an interrupted run
        assert not set(mounts) & set(_mounts_of(bench_image.sif)), f"the image stays mounted: {mounts}"
    finally:  # whatever failed above: nothing of this test stays for the next ones
        if dedal.poll() is None:
            dedal.kill()
            dedal.communicate()
        for pid, _ in _processes(marker) + _marked():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for line in _queue(env):
            subprocess.run(["scancel", line.split()[0]], env=env, timeout=30)
        _unmount(mounts)


def _descendants(root: int) -> Dict[int, Tuple[str, List[str]]]:
    """{pid: (start time, argv)} of every process below ``root``."""
    children: Dict[int, List[int]] = {}
    info: Dict[int, Tuple[str, List[str]]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        info[int(entry.name)] = (fields[19], argv)
    found: Dict[int, Tuple[str, List[str]]] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in info:
            found[pid] = info[pid]
        todo += children.get(pid, [])
    return found


def _alive(procs: Dict[int, Tuple[str, List[str]]]) -> List[Tuple[int, str]]:
    """Those of ``procs`` still running (the same process: same pid and start time, not a zombie)."""
    left = []
    for pid, (start, argv) in procs.items():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[19] == start and fields[0] != "Z":
            left.append((pid, " ".join(argv[:3])))
    return left


def test_sigterm_stops_mpirun_and_its_ranks(bench_image, native_cache, isolated_env, tmp_path: Path) -> None:
    """The same with the local launcher: ``mpirun`` of the image in its sandbox (and natively)."""
    out = tmp_path / "report"
    env = dict(isolated_env, DEDAL_CACHE_DIR=str(native_cache))
    dedal = subprocess.Popen(
        [
            dedal_exe(),
            "verify",
            str(bench_image.sif),
            "--launcher",
            "mpirun",
            "-b",
            "latency",
            "-r",
            "3",
            "--max-size",
            "64M",
            "--timeout",
            "600",
            "-o",
            str(out),
            *WIDE,
        ],
        env=env,
        cwd=tmp_path,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    below: Dict[int, Tuple[str, List[str]]] = {}
    mounts: List[str] = []
    try:
        deadline = time.monotonic() + RANK_WAIT_S
        while True:
            below = _descendants(dedal.pid)
            if sum(1 for _, argv in below.values() if argv and Path(argv[0]).name == "dedal_latency") == 2:
                break
            assert dedal.poll() is None, f"dedal ended before the ranks ran: {dedal.communicate()}"
            assert time.monotonic() < deadline, f"no ranks within {RANK_WAIT_S} s"
            time.sleep(0.1)
        mounts = _mounts_of(bench_image.sif)
        dedal.send_signal(signal.SIGTERM)
        stdout, stderr = dedal.communicate(timeout=EXIT_WAIT_S)
        gone = time.monotonic() + QUEUE_WAIT_S
        while _alive(below) and time.monotonic() < gone:
            time.sleep(0.1)
        assert not _alive(below), f"mpirun or ranks outlived dedal: {_alive(below)}"
        assert not set(mounts) & set(_mounts_of(bench_image.sif)), f"the image stays mounted: {mounts}"
        assert dedal.returncode == 143, stdout + stderr
        said = [line for line in stderr.splitlines() if line.startswith(("dedal: error:", "dedal: verify"))]
        assert said == ["dedal: verify interrupted by signal SIGTERM"], stderr
        assert "Traceback" not in stderr, stderr
        assert not (out / "verify.json").exists()
    finally:
        if dedal.poll() is None:
            dedal.kill()
            dedal.communicate()
        for pid, _ in _alive(below):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _unmount(mounts)
