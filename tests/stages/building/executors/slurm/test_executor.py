"""The Slurm executor against the real local test cluster (3 nodes) with the Spack stand-in.

Every build goes through real ``sbatch`` jobs ordered by ``afterok``; the stand-in
compiles real binaries into the layer store on this machine's (shared) filesystem.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import pytest

from dedal import cli
from dedal.adapters.slurm import Slurm, State
from dedal.stages.building.executors.slurm import record as slurm_record, run as slurm_run
from dedal.model.layers import LayerStore
from dedal.stages.stage_dir import stage_owner
from dedal.model.owner import ALIVE, Owner
from tests.fixtures.tiny import TINY_PACKAGES, TinyEnv, make_env, node_builds_of, stage_leftovers
from tests.conftest import ROOT, dedal_exe, interruptible
from tests.fixtures.slurm import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("as_root")]

MPI_CUDA_SPECS = [
    "openmpi@5 fabrics=ucx schedulers=slurm +cuda",
    "ucx +cuda",
    "pmix",
    "osu-micro-benchmarks +cuda",
    "nccl-tests",
    "hwloc +cuda",
    "cuda@12.2",
]


def build_env(env: TinyEnv, cluster: SlurmCluster, **extra: str) -> Dict[str, str]:
    full = dict(env.env)
    full.update(SLURM_CONF=cluster.env["SLURM_CONF"], DEDAL_SLURM_POLL_S="0.3", DEDAL_EXECUTOR="slurm")
    full.update(extra)
    return full


def workdir(env: TinyEnv, name: str = "tiny") -> Path:
    return env.data / "work" / name


def record(env: TinyEnv, name: str = "tiny") -> dict:
    return json.loads((workdir(env, name) / "slurm-jobs.json").read_text())


def record_date(offset_s: float = 0.0) -> str:
    """A date as the Slurm job record writes it (UTC), now plus ``offset_s``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() + offset_s))


def names(labels: List[str]) -> List[str]:
    return sorted(x.split("@")[0] for x in labels)


def start_build(
    isolated_env: Dict[str, str], env: TinyEnv, cluster: SlurmCluster, *args: str, as_json: bool = True, **extra: str
) -> subprocess.Popen:
    """``dedal build`` in the background; with ``as_json=False`` progress lines go to stderr."""
    full = dict(isolated_env)
    full.update(build_env(env, cluster, **extra))
    opts = ["--json"] if as_json else []
    return subprocess.Popen(
        [dedal_exe(), "build", str(env.env_file), *opts, *args],
        env=full,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=interruptible,
    )


def wait_for(what: str, cond: Callable[[], object], timeout: float = 60, proc: Optional[subprocess.Popen] = None):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = cond()
        except (OSError, ValueError, KeyError):
            value = None
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the build ended (exit {proc.returncode}) before {what}: {proc.stderr.read()}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def running_job_of(env: TinyEnv, package: str, name: str = "tiny") -> Optional[dict]:
    for job in record(env, name)["jobs"]:
        if any(p.startswith(package + "@") for p in job["packages"]) and job["status"] == "running":
            return job
    return None


def test_builds_through_real_jobs_in_dependency_order_and_rerun_submits_nothing(
    slurm_cluster: SlurmCluster, run_dedal, isolated_env, tmp_path: Path
) -> None:
    tiny = make_env(tmp_path, sleep={"gcc-runtime": 3})
    proc = start_build(isolated_env, tiny, slurm_cluster, "--executor", "slurm", as_json=False)
    # while gcc-runtime builds, every other job waits in the queue for its dependencies
    job = wait_for("gcc-runtime running", lambda: running_job_of(tiny, "gcc-runtime"), proc=proc)
    queue = subprocess.run(
        ["squeue", "-h", "-o", "%i|%j|%T|%r|%E"], env=slurm_cluster.env, text=True, capture_output=True, check=True
    ).stdout
    ours = [line.split("|") for line in queue.splitlines() if "|dedal:tiny:" in line]
    waiting = [row for row in ours if row[0] != job["slurm_id"]]
    assert waiting and all(
        row[2] == "PENDING" and row[3] == "Dependency" and "afterok:" in row[4] for row in waiting
    ), queue
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert "tiny: 5 built, 0 reused, 0 failed" in out
    # progress like the local executor: per package, with the node
    assert "start   gcc-runtime@" in err and f"on {job['node']}" in err and "built   dedal-app@" in err
    assert "[5/5]" in err and "submitted" in err

    rec = record(tiny)
    assert rec["finished"] and not rec["interrupted"] and rec["simulated"]["ratio"] >= 1.0
    assert 1 <= len(rec["jobs"]) <= 5
    assert names([p for j in rec["jobs"] for p in j["packages"]]) == TINY_PACKAGES
    ids = {j["id"]: j for j in rec["jobs"]}
    for j in rec["jobs"]:
        assert j["status"] == "done" and j["state"] == "COMPLETED" and j["node"] in slurm_cluster.nodes
        assert j["name"].startswith("dedal:tiny:") and j["slurm_id"].isdigit()
        log = Path(j["log"])
        assert log.is_file() and log.name.startswith(f"slurm-{j['slurm_id']}-")
        text = log.read_text()
        assert f"dedal: job {j['slurm_id']} {j['name']}" in text and "exit=0" in text
        assert all(a in ids for a in j["after"])
    # the plan's requirements hold between jobs: dedal-app's job waited for libdedal's
    job_of = {p.split("@")[0]: j["id"] for j in rec["jobs"] for p in j["packages"]}
    if job_of["dedal-app"] != job_of["libdedal"]:
        assert job_of["libdedal"] in ids[job_of["dedal-app"]]["after"]
    states = Slurm(slurm_cluster.env).states([j["slurm_id"] for j in rec["jobs"]])
    assert {s.state for s in states.values()} == {State.COMPLETED}
    # each package was built with make -j its job's CPUs, and its manifest says so (the
    # next plan converts its duration with that core count)
    cores_of = {p.split("@")[0]: j["cores"] for j in rec["jobs"] for p in j["packages"]}
    assert {m.name: m.build_cores for m in LayerStore(tiny.store).manifests()} == cores_of
    assert stage_leftovers(tiny.stage) == []

    status = run_dedal("status", str(tiny.env_file), "--json", env=build_env(tiny, slurm_cluster))
    assert status.returncode == 0, status.stderr
    st = json.loads(status.stdout)
    assert st["executor"] == "slurm" and st["finished"] and st["counts"] == {"built": 5}
    assert all(Path(j["log"]).is_file() for j in st["jobs"])

    again = run_dedal("build", str(tiny.env_file), "--json", env=build_env(tiny, slurm_cluster))
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert second["jobs"] == 0 and second["built"] == [] and len(second["reused"]) == 5
    assert record(tiny)["jobs"] == rec["jobs"], "nothing was submitted"


def test_failing_package_stops_only_its_dependents(slurm_cluster: SlurmCluster, run_dedal, tmp_path: Path) -> None:
    tiny = make_env(tmp_path, fail=["libdedal"])
    res = run_dedal("build", str(tiny.env_file), "--json", "--keep-going", env=build_env(tiny, slurm_cluster))
    assert res.returncode == 1, res.stderr
    summary = json.loads(res.stdout)
    assert names(list(summary["failed"])) == ["libdedal"]
    error = next(iter(summary["failed"].values()))
    assert "libdedal" in error and "exited with code 1" in error and ".log" in error
    assert names(summary["blocked"]) == ["dedal-app"]
    assert names(summary["built"]) == ["dedal-bootstrap", "dedal-tool", "gcc-runtime"]
    assert {m.name for m in LayerStore(tiny.store).manifests()} == {"dedal-bootstrap", "dedal-tool", "gcc-runtime"}
    failed_log = summary["logs"][next(iter(summary["failed"]))]
    assert Path(failed_log).is_file()
    rec = record(tiny)
    by_pkg = {p.split("@")[0]: j for j in rec["jobs"] for p in j["packages"]}
    assert by_pkg["libdedal"]["status"] == "failed" and by_pkg["libdedal"]["error"]
    assert by_pkg["dedal-app"]["status"] in ("cancelled", "blocked")
    assert by_pkg["gcc-runtime"]["status"] == "done"
    status = run_dedal("status", str(workdir(tiny)), env=build_env(tiny, slurm_cluster))
    assert status.returncode == 0, status.stderr
    assert "FAILED libdedal@" in status.stdout and "failed" in status.stdout

    # the failure is genuine: no retry, and a rerun without the failure builds the rest
    assert by_pkg["libdedal"]["attempt"] == 1 and by_pkg["libdedal"]["history"] == []
    tiny.reconfigure()
    res = run_dedal("build", str(tiny.env_file), "--json", env=build_env(tiny, slurm_cluster))
    assert res.returncode == 0, res.stderr
    assert names(json.loads(res.stdout)["built"]) == ["dedal-app", "libdedal"]


def test_without_keep_going_unstarted_jobs_are_cancelled(
    slurm_cluster: SlurmCluster, run_dedal, tmp_path: Path
) -> None:
    tiny = make_env(tmp_path, fail=["gcc-runtime"])
    res = run_dedal("build", str(tiny.env_file), "--json", env=build_env(tiny, slurm_cluster))
    assert res.returncode == 1, res.stderr
    summary = json.loads(res.stdout)
    assert names(list(summary["failed"])) == ["gcc-runtime"]
    assert names(summary["blocked"]) == [n for n in TINY_PACKAGES if n != "gcc-runtime"]
    rec = record(tiny)
    ids = [j["slurm_id"] for j in rec["jobs"]]
    states = Slurm(slurm_cluster.env).states(ids)
    assert all(s.state.is_finished for s in states.values()), states
    assert not any(s.state is State.COMPLETED for s in states.values())


def test_killed_job_is_detected(slurm_cluster: SlurmCluster, isolated_env, run_dedal, tmp_path: Path) -> None:
    """A job killed with SIGKILL (as the OOM killer or an admin would) is a build failure:
    reported with the signal and the job's log, not retried. Its stage, which nothing
    could remove, goes with the next job on that node."""
    tiny = make_env(tmp_path, sleep={"libdedal": 60})
    piddir = tmp_path / "pids"
    piddir.mkdir()
    template = tmp_path / "job.sh.in"
    default = (ROOT / "slurm" / "build-job.sh.in").read_text()
    # a site template (slurm.template) that records the batch script's PID
    template.write_text(
        default.replace(
            "set -euo pipefail\n", 'set -euo pipefail\necho $$ > "$DEDAL_TEST_PIDDIR/$SLURM_JOB_ID.pid"\n', 1
        )
    )
    proc = start_build(
        isolated_env,
        tiny,
        slurm_cluster,
        "--keep-going",
        DEDAL_SLURM_TEMPLATE=str(template),
        DEDAL_TEST_PIDDIR=str(piddir),
    )
    job = wait_for("libdedal running", lambda: running_job_of(tiny, "libdedal"), proc=proc)
    pidfile = piddir / f"{job['slurm_id']}.pid"
    wait_for("the batch script's pid", pidfile.exists, proc=proc)
    builder = wait_for("libdedal's node build", lambda: node_builds_of(tiny, "libdedal"), proc=proc)[0]
    stage = wait_for(
        "its stage",
        lambda: next(
            (
                tiny.stage / n
                for n in stage_leftovers(tiny.stage)
                if getattr(stage_owner(tiny.stage / n), "pid", None) == builder
            ),
            None,
        ),
        proc=proc,
    )
    # the whole job, as a cgroup is killed (the test cluster's proctrack/linuxproc would
    # let the node build outlive its batch script)
    os.kill(int(pidfile.read_text()), signal.SIGKILL)
    os.kill(builder, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    summary = json.loads(out)
    assert names(list(summary["failed"])) == ["libdedal"]
    error = next(iter(summary["failed"].values()))
    assert "signal 9" in error and job["slurm_id"] in error and "slurm-" in error, error
    assert names(summary["blocked"]) == ["dedal-app"]
    rec = record(tiny)
    victim = next(j for j in rec["jobs"] if j["id"] == job["id"])
    assert victim["state"] == "FAILED" and victim["attempt"] == 1
    assert all(int(p.stem) > 0 for p in piddir.glob("*.pid"))  # the site template was used
    assert "template" not in err
    # the stage nothing could remove: gone with the next job that made a stage on this
    # host (of this build, or else of the rerun), which says so in its log
    tiny.reconfigure()
    res = run_dedal("build", str(tiny.env_file), env=build_env(tiny, slurm_cluster))
    assert res.returncode == 0, res.stderr
    assert stage_leftovers(tiny.stage) == []
    said = "".join(p.read_text() for p in tiny.data.rglob("job-*.log"))
    assert f"removed {stage}, the stage of a dedal process on this host that was killed" in said, said[-2000:]


def _stage_makers(stage_dir: Path) -> Dict[str, str]:
    """For a failure message: each stage's owner record, whether its process still runs (the
    reaper's judgement, :meth:`Owner.state`) and, if so, its command line: tells a node build
    that skipped its clean-up from one still at it."""
    makers = {}
    for d in stage_dir.iterdir():
        owner = stage_owner(d)
        if owner is None:
            makers[d.name] = "no owner record"
            continue
        state = owner.state()
        if state == ALIVE:
            with contextlib.suppress(OSError):
                state += ": " + Path(f"/proc/{owner.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
        makers[d.name] = f"{owner} {state}"
    return makers


def test_ctrl_c_cancels_the_jobs_and_the_build_resumes(
    slurm_cluster: SlurmCluster, isolated_env, run_dedal, tmp_path: Path
) -> None:
    tiny = make_env(tmp_path, sleep={"dedal-bootstrap": 60, "libdedal": 60})
    proc = start_build(isolated_env, tiny, slurm_cluster)
    job = wait_for("dedal-bootstrap running", lambda: running_job_of(tiny, "dedal-bootstrap"), proc=proc)
    # dedal status sees the build live: what runs where, what waits, with log paths
    st = run_dedal("status", str(tiny.env_file), "--json", env=build_env(tiny, slurm_cluster))
    assert st.returncode == 0, st.stderr
    live = json.loads(st.stdout)
    assert not live["finished"]
    mine = next(j for j in live["jobs"] if j["id"] == job["id"])
    assert mine["status"] == "running" and mine["node"] in slurm_cluster.nodes and mine["log"].endswith(".out")
    assert live["counts"].get("running", 0) >= 1
    text = run_dedal("status", str(tiny.env_file), env=build_env(tiny, slurm_cluster)).stdout
    assert "in progress" in text and "running" in text and job["slurm_id"] in text
    # a second build of the same environment while jobs are queued would build twice
    twice = run_dedal("build", str(tiny.env_file), env=build_env(tiny, slurm_cluster))
    assert twice.returncode == 2 and "still queued or running" in twice.stderr
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    summary = json.loads(out)
    assert summary["interrupted"]
    rec = record(tiny)
    assert rec["interrupted"]
    ids = [j["slurm_id"] for j in rec["jobs"]]
    client = Slurm(slurm_cluster.env)
    states = wait_for(
        "every job gone",
        lambda: (lambda s: s if all(x.state.is_finished for x in s.values()) else None)(client.states(ids)),
        timeout=30,
    )
    assert not any(s.state is State.COMPLETED and j["status"] != "done" for j, s in zip(rec["jobs"], states.values()))
    assert any(s.state is State.CANCELLED for s in states.values())
    # the node builds removed their stages on scancel's SIGTERM
    try:
        wait_for("stages removed", lambda: stage_leftovers(tiny.stage) == [], timeout=30)
    except AssertionError:
        logs = {
            Path(j["log"]).name: Path(j["log"]).read_text()[-1500:] for j in rec["jobs"] if Path(j["log"]).is_file()
        }
        left = {d.name: sorted(str(f.relative_to(d)) for f in d.rglob("*"))[:20] for d in tiny.stage.iterdir()}
        log_dirs = {Path(j["log"]).parent for j in rec["jobs"]}  # one for all the jobs
        node_logs = {f.name: f.read_text()[-1500:] for d in log_dirs for f in d.glob("job-*.log")}
        raise AssertionError(
            f"stages left 30 s after scancel: {left}; their makers: {_stage_makers(tiny.stage)}; job states "
            f"{[(j['id'], s.state.value) for j, s in zip(rec['jobs'], states.values())]}; "
            f"job logs: {logs}; node build logs: {node_logs}"
        ) from None
    # the batch script outlived its node build (else Slurm SIGKILLs the node build mid-clean-up)
    started = [
        Path(j["log"]).read_text()
        for j, s in zip(rec["jobs"], states.values())
        if s.state is State.CANCELLED and Path(j["log"]).is_file() and "dedal: start" in Path(j["log"]).read_text()
    ]
    assert started and all(re.search(r"dedal: end \S+ exit=143 ", text) for text in started), started
    built = names(summary["built"])
    assert "dedal-bootstrap" not in built and "dedal-app" not in built

    tiny.reconfigure()
    res = run_dedal("build", str(tiny.env_file), "--json", env=build_env(tiny, slurm_cluster))
    assert res.returncode == 0, res.stderr
    again = json.loads(res.stdout)
    assert sorted(names(again["built"]) + names(again["reused"])) == TINY_PACKAGES
    assert names(again["reused"]) == built


def test_jobs_of_a_killed_dedal_are_followed_by_the_next_build(
    slurm_cluster: SlurmCluster, isolated_env, run_dedal, tmp_path: Path
) -> None:
    """A dedal killed outright (the OOM killer on a login node, a reboot) leaves its jobs
    queued and running: the next `dedal build` follows them to their end instead of
    refusing or submitting them again; while their dedal may still be alive on another
    host (its record is fresh), it refuses."""
    tiny = make_env(tmp_path, sleep={"dedal-bootstrap": 12})
    proc = start_build(isolated_env, tiny, slurm_cluster)
    wait_for("dedal-bootstrap running", lambda: running_job_of(tiny, "dedal-bootstrap"), proc=proc)
    before = record(tiny)
    proc.kill()
    proc.communicate(timeout=30)
    env = build_env(tiny, slurm_cluster)
    text = run_dedal("status", str(tiny.env_file), env=env).stdout
    assert "in progress" in text and "that dedal is gone" in text, text

    # the same record as if its dedal ran on another login node and wrote it just now
    path = workdir(tiny) / "slurm-jobs.json"
    elsewhere = dict(before, driver=dict(before["driver"], host="login-elsewhere"))
    path.write_text(json.dumps(dict(elsewhere, updated_at=record_date())))
    fresh = run_dedal("build", str(tiny.env_file), env=env)
    assert fresh.returncode == 2 and "still queued or running" in fresh.stderr, fresh.stderr
    assert "login-elsewhere" in fresh.stderr and "s ago" in fresh.stderr
    assert json.loads(path.read_text())["driver"]["host"] == "login-elsewhere", "a refused build changed the record"
    path.write_text(json.dumps(dict(elsewhere, updated_at="2026-01-01T00:00:00+00:00")))  # stale: that dedal is gone

    res = run_dedal("build", str(tiny.env_file), "--json", env=env)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["jobs"] == 0 and summary["adopted"] >= 2, summary  # dedal-bootstrap's job, dedal-app's
    assert names(summary["built"] + summary["reused"]) == TINY_PACKAGES and not summary["failed"]
    after = record(tiny)
    assert [j["slurm_id"] for j in after["jobs"]] == [j["slurm_id"] for j in before["jobs"]]
    assert after["finished"] and all(j["status"] == "done" for j in after["jobs"])
    assert after["driver"]["pid"] != before["driver"]["pid"]
    states = Slurm(slurm_cluster.env).states([j["slurm_id"] for j in after["jobs"]])
    assert {s.state for s in states.values()} == {State.COMPLETED}
    assert sorted(m.name for m in LayerStore(tiny.store).manifests()) == TINY_PACKAGES
    assert stage_leftovers(tiny.stage) == []


def test_a_dedal_killed_while_submitting_leaves_the_rest_to_the_next_build(
    slurm_cluster: SlurmCluster, isolated_env, run_dedal, tmp_path: Path
) -> None:
    """Killed before it submitted its last job: the next build follows the jobs that were
    submitted, then submits what they left."""
    tiny = make_env(tmp_path, sleep={"dedal-bootstrap": 12})
    proc = start_build(isolated_env, tiny, slurm_cluster)
    wait_for("dedal-bootstrap running", lambda: running_job_of(tiny, "dedal-bootstrap"), proc=proc)
    proc.kill()
    proc.communicate(timeout=30)
    rec = record(tiny)
    last = next(j for j in rec["jobs"] if any(p.startswith("dedal-app@") for p in j["packages"]))
    Slurm(slurm_cluster.env).cancel([last["slurm_id"]])  # as if never submitted, nor recorded
    rec["jobs"].remove(last)
    (workdir(tiny) / "slurm-jobs.json").write_text(json.dumps(rec))

    res = run_dedal("build", str(tiny.env_file), "--json", env=build_env(tiny, slurm_cluster))
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["adopted"] >= 1 and summary["jobs"] >= 1, summary
    assert names(summary["built"] + summary["reused"]) == TINY_PACKAGES and not summary["failed"]
    after = record(tiny)  # the jobs this build submitted: those of the packages the lost job held
    assert names([p for j in after["jobs"] for p in j["packages"]]) == names(last["packages"]) and after["finished"]
    assert sorted(m.name for m in LayerStore(tiny.store).manifests()) == TINY_PACKAGES


def test_a_detached_build_leaves_its_jobs_to_slurm_and_the_next_build_follows_them(
    slurm_cluster: SlurmCluster, run_dedal, tmp_path: Path
) -> None:
    tiny = make_env(tmp_path, sleep={"dedal-bootstrap": 12})
    env = build_env(tiny, slurm_cluster)
    res = run_dedal("build", str(tiny.env_file), "--detach", "--json", env=env)
    assert res.returncode == 0, res.stderr
    first = json.loads(res.stdout)
    assert first["detached"] and first["jobs"] >= 2 and first["built"] == [] and first["ok"]
    rec = record(tiny)
    assert rec["detached"] and not rec["finished"] and len(rec["jobs"]) == first["jobs"]
    text = run_dedal("status", str(tiny.env_file), env=env).stdout
    assert "in progress" in text and "detached: no dedal follows these jobs" in text, text
    # detached on another login node a moment ago: no one to wait for
    path = workdir(tiny) / "slurm-jobs.json"
    path.write_text(json.dumps(dict(rec, driver=dict(rec["driver"], host="login-elsewhere"), updated_at=record_date())))
    again = run_dedal("build", str(tiny.env_file), "--detach", "--json", env=env)
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert second["detached"] and second["jobs"] == 0 and second["adopted"] >= 1, second
    done = run_dedal("build", str(tiny.env_file), "--json", env=env)
    assert done.returncode == 0, done.stderr
    last = json.loads(done.stdout)
    assert not last["detached"] and last["jobs"] == 0 and last["adopted"] >= 1
    assert names(last["built"] + last["reused"]) == TINY_PACKAGES and not last["failed"]
    after = record(tiny)
    assert after["finished"] and not after["detached"]
    assert [j["slurm_id"] for j in after["jobs"]] == [j["slurm_id"] for j in rec["jobs"]]
    local = run_dedal("build", str(tiny.env_file), "--detach", env=dict(env, DEDAL_EXECUTOR="local"))
    assert local.returncode == 2 and "needs the Slurm executor" in local.stderr


def test_a_layer_that_appears_while_the_next_build_starts_is_reported_built(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch, capsys
) -> None:
    """The race CI hit once: a detached job finished a layer after the next build saw it
    missing but before it adopted the jobs, and that package was then in neither ``built``
    nor ``reused``. Here the adoption waits for such a layer, every time."""
    tiny = make_env(tmp_path, sleep={"dedal-bootstrap": 6})
    for key, value in build_env(tiny, slurm_cluster).items():
        monkeypatch.setenv(key, value)
    assert cli.main(["build", str(tiny.env_file), "--detach"]) == 0
    adopt = slurm_run._Build.adopt
    appeared: List[str] = []

    def late(self, todo: List[str]) -> bool:
        appeared.extend(
            wait_for(
                "a layer built after this build looked",
                lambda: [self.label(h) for h in todo if self.has_layer(h)],
                timeout=120,
            )
        )
        return adopt(self, todo)

    monkeypatch.setattr(slurm_run._Build, "adopt", late)
    capsys.readouterr()
    assert cli.main(["build", str(tiny.env_file), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert appeared and summary["adopted"] >= 1, summary
    assert set(appeared) <= set(summary["built"]), (appeared, summary)
    assert names(summary["built"] + summary["reused"]) == TINY_PACKAGES and not summary["failed"]


def test_build_image_with_slurm_detach_stops_after_submitting(
    slurm_cluster: SlurmCluster, run_dedal, tmp_path: Path
) -> None:
    """The image needs the layers: with ``slurm.detach`` set (say, site-wide) build-image
    ends after submitting, with one clear line, instead of assembling from nothing."""
    tiny = make_env(tmp_path)
    env = build_env(tiny, slurm_cluster)
    res = run_dedal("build-image", str(tiny.env_file), env=dict(env, DEDAL_SLURM_DETACH="true"), timeout=300)
    assert res.returncode == 1 and re.search(
        r"slurm.detach: \d+ Slurm job\(s\) left to build the layers", res.stderr
    ), res.stderr
    assert "not run: build failed" in res.stdout and record(tiny)["detached"]
    done = run_dedal("build", str(tiny.env_file), env=env)  # follows them to their end
    assert done.returncode == 0, done.stderr
    assert record(tiny)["finished"]


def test_a_build_being_submitted_claims_the_environment(slurm_cluster: SlurmCluster, run_dedal, tmp_path: Path) -> None:
    """From before it plans until its jobs are recorded, a build's record claims the
    environment: a second build refuses while the first dedal lives, and goes ahead once
    it is gone (killed while planning or submitting)."""
    tiny = make_env(tmp_path)
    env = build_env(tiny, slurm_cluster)
    path = workdir(tiny) / "slurm-jobs.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    claim = {
        "format": 1,
        "executor": "slurm",
        "env": "tiny",
        "finished": False,
        "submitting": True,
        "jobs": [],
        "updated_at": record_date(),
        "driver": Owner.me().to_json(),
    }  # this test's process: alive
    path.write_text(json.dumps(claim))
    refused = run_dedal("build", str(tiny.env_file), env=env)
    assert refused.returncode == 2 and "is submitting its jobs" in refused.stderr, refused.stderr
    assert json.loads(path.read_text()) == claim
    text = run_dedal("status", str(tiny.env_file), env=env).stdout
    assert "planning and submitting its jobs" in text and f"pid {os.getpid()}" in text, text
    exited = subprocess.Popen(["true"])
    exited.wait()
    dead = dict(claim["driver"], pid=exited.pid)  # a dedal that was killed while it planned
    path.write_text(json.dumps(dict(claim, driver=dead)))
    res = run_dedal("build", str(tiny.env_file), "--json", env=env)
    assert res.returncode == 0, res.stderr
    assert names(json.loads(res.stdout)["built"]) == TINY_PACKAGES
    after = json.loads(path.read_text())
    assert after["finished"] and not after["submitting"] and after["driver"]["pid"] != dead["pid"]


def test_the_record_is_rewritten_while_jobs_are_submitted(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch
) -> None:
    """The heartbeat (here at every chance): a slow sbatch never lets the claim look
    abandoned, and each job submitted is on record with its Slurm id for a dedal that
    has to follow them."""
    tiny = make_env(tmp_path)
    for key, value in build_env(tiny, slurm_cluster).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(slurm_record, "HEARTBEAT_S", 0.0)
    seen = []
    write = slurm_run._Build.write_record

    def watched(self) -> None:
        write(self)
        rec = record(tiny)
        seen.append((rec["submitting"], [j["slurm_id"] for j in rec["jobs"]]))

    monkeypatch.setattr(slurm_run._Build, "write_record", watched)
    assert cli.main(["build", str(tiny.env_file)]) == 0
    during = [ids for submitting, ids in seen if submitting]
    assert during[0] == [], "claimed before the first sbatch"
    assert [len(ids) for ids in during[1:]] == list(range(1, len(record(tiny)["jobs"]) + 1))
    assert all(i.isdigit() for ids in during for i in ids)


def test_a_build_that_cannot_plan_releases_its_claim(slurm_cluster: SlurmCluster, run_dedal, tmp_path: Path) -> None:
    tiny = make_env(tmp_path)
    bad = run_dedal("build", str(tiny.env_file), env=build_env(tiny, slurm_cluster, DEDAL_SLURM_PARTITION="nosuch"))
    assert bad.returncode == 2 and "no usable Slurm nodes in partition nosuch" in bad.stderr, bad.stderr
    # nothing was submitted and no build came before: no record is left claiming the environment
    # (with an earlier build's record, that one is put back: tests/stages/building/executors/slurm)
    assert not (workdir(tiny) / "slurm-jobs.json").exists()
    ok = run_dedal("build", str(tiny.env_file), env=build_env(tiny, slurm_cluster))
    assert ok.returncode == 0, ok.stderr


def lose_node_until_resubmitted(
    cluster: SlurmCluster, tiny: TinyEnv, job: dict, node: str, proc: subprocess.Popen
) -> tuple:
    """Set ``node`` (running ``job``, slowed by the stand-in) DOWN until the build resubmits
    the job, then let the stand-in go quickly; the build's (stdout, stderr), after checking
    it succeeded with the job on its second attempt under a new Slurm id."""
    try:
        cluster.scontrol("update", f"nodename={node}", "state=down", "reason=dedal-executor-test")
        wait_for(
            "resubmission",
            lambda: any(j["history"] and j["history"][0]["state"] == "NODE_FAIL" for j in record(tiny)["jobs"]),
            proc=proc,
        )
        tiny.reconfigure()
        out, err = proc.communicate(timeout=120)
    finally:
        cluster.scontrol("update", f"nodename={node}", "state=resume", check=False)
        cluster.wait_nodes_usable([node])
    assert proc.returncode == 0, err
    victim = next(j for j in record(tiny)["jobs"] if j["id"] == job["id"])
    assert victim["attempt"] == 2 and victim["history"][0]["slurm_id"] == job["slurm_id"]
    assert victim["slurm_id"] != job["slurm_id"] and victim["status"] == "done"
    return out, err


def test_node_failure_is_retried(slurm_cluster: SlurmCluster, isolated_env, tmp_path: Path) -> None:
    tiny = make_env(tmp_path, sleep={"libdedal": 60})
    proc = start_build(isolated_env, tiny, slurm_cluster, as_json=False, DEDAL_SLURM_RETRIES="2")
    job = wait_for("libdedal running", lambda: running_job_of(tiny, "libdedal"), proc=proc)
    out, err = lose_node_until_resubmitted(slurm_cluster, tiny, job, job["node"], proc)
    assert "tiny: 5 built, 0 reused, 0 failed, 0 not built" in out
    assert "NODE_FAIL" in err and "resubmitting (attempt 2 of 3)" in err


def test_a_followed_job_lost_to_its_node_is_resubmitted(
    slurm_cluster: SlurmCluster, isolated_env, run_dedal, tmp_path: Path
) -> None:
    """The dedal that follows a detached build's jobs retries a node failure like the one
    that submitted them: the job and those waiting for it, against the new job id."""
    tiny = make_env(tmp_path, sleep={"libdedal": 60})
    res = run_dedal("build", str(tiny.env_file), "--detach", env=build_env(tiny, slurm_cluster))
    assert res.returncode == 0, res.stderr
    job = next(j for j in record(tiny)["jobs"] if any(p.startswith("libdedal@") for p in j["packages"]))
    client = Slurm(slurm_cluster.env)
    node = wait_for(
        "libdedal running",
        lambda: (lambda st: st.node if st.state is State.RUNNING else None)(
            client.states([job["slurm_id"]])[job["slurm_id"]]
        ),
    )
    proc = start_build(isolated_env, tiny, slurm_cluster, as_json=False, DEDAL_SLURM_RETRIES="2")
    wait_for("the jobs followed", lambda: not record(tiny)["detached"], proc=proc)
    _, err = lose_node_until_resubmitted(slurm_cluster, tiny, job, node, proc)
    assert "following" in err and "NODE_FAIL" in err and "resubmitting (attempt 2 of 3)" in err, err
    assert record(tiny)["finished"] and sorted(m.name for m in LayerStore(tiny.store).manifests()) == TINY_PACKAGES


def test_job_past_its_estimated_limit_is_resubmitted_with_slurm_time(
    slurm_cluster: SlurmCluster, isolated_env, tmp_path: Path
) -> None:
    """Each job's --time comes from its estimate (here 1 minute); a build running longer is
    killed by Slurm (TIMEOUT), which is no build failure: the job goes again with slurm.time."""
    tiny = make_env(tmp_path, sleep={"libdedal": 600})
    proc = start_build(
        isolated_env, tiny, slurm_cluster, as_json=False, DEDAL_SLURM_TIME_FACTOR="0.01", DEDAL_SLURM_TIME="0:30:00"
    )
    job = wait_for("libdedal running", lambda: running_job_of(tiny, "libdedal"), proc=proc)
    limits = {j["id"]: j["time"] for j in record(tiny)["jobs"]}
    assert set(limits.values()) == {"0:01:00"}, limits
    wait_for(
        "the resubmission after TIMEOUT",
        lambda: any(j["history"] and j["history"][0]["state"] == "TIMEOUT" for j in record(tiny)["jobs"]),
        timeout=150,
        proc=proc,
    )
    tiny.reconfigure()  # libdedal builds quickly from now on
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "tiny: 5 built, 0 reused, 0 failed, 0 not built" in out
    assert "ran past its time limit of 0:01:00" in err and "resubmitting with slurm.time (0:30:00)" in err
    victim = next(j for j in record(tiny)["jobs"] if j["id"] == job["id"])
    assert victim["status"] == "done" and victim["time"] == "0:30:00" and victim["attempt"] == 2
    assert victim["history"][0]["slurm_id"] == job["slurm_id"] != victim["slurm_id"]


def test_multi_node_build_of_a_real_mpi_cuda_lock(slurm_cluster: SlurmCluster, run_dedal, tmp_path: Path) -> None:
    env = make_env(tmp_path, lock="mpi-cuda", specs=MPI_CUDA_SPECS, name="mc")
    res = run_dedal("build", str(env.env_file), "--json", env=build_env(env, slurm_cluster), timeout=240)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert len(summary["built"]) == 32 and not summary["failed"]
    rec = record(env, "mc")
    assert len({j["node"] for j in rec["jobs"]}) >= 2, "the jobs spread over the nodes"
    assert summary["jobs"] == len(rec["jobs"]) <= 32
    # a second environment sharing the store reuses every layer without a job
    again = run_dedal("build", str(env.env_file), "--json", env=build_env(env, slurm_cluster))
    assert json.loads(again.stdout)["jobs"] == 0


def test_order_hints_reach_slurm_as_afterany(slurm_cluster: SlurmCluster, run_dedal, tmp_path: Path) -> None:
    """With ``slurm.order_hints`` on, the schedule of the mpi-cuda lock on one node of 2 CPUs
    has order hints (fixed start times): they are submitted as ``afterany``, so each hinted job starts only once
    the job whose cores it takes over has ended (the stand-in builds far quicker than
    planned, so no hint expires), and the build completes."""
    env = make_env(tmp_path, lock="mpi-cuda", specs=MPI_CUDA_SPECS, name="mc1")
    res = run_dedal(
        "build",
        str(env.env_file),
        "--json",
        env=build_env(env, slurm_cluster, DEDAL_SLURM_NODES="1", DEDAL_SLURM_ORDER_HINTS="true"),
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert len(json.loads(res.stdout)["built"]) == 32
    rec = record(env, "mc1")
    by_id = {j["id"]: j for j in rec["jobs"]}
    hinted = [j for j in rec["jobs"] if j["order"]]
    assert hinted, "the 1-node schedule has order hints"
    times = Slurm(slurm_cluster.env).times(j["slurm_id"] for j in rec["jobs"])
    assert len(times) == len(rec["jobs"])
    for j in hinted:
        for a in j["order"]:
            before = by_id[a]["slurm_id"]
            assert times[j["slurm_id"]][0] >= times[before][1], (j["id"], a, times[j["slurm_id"]], times[before])


def test_a_build_that_follows_detached_jobs_drops_their_expired_order_hints(
    slurm_cluster: SlurmCluster, run_dedal, tmp_path: Path
) -> None:
    """Order hints count from the first submission, also for the dedal that follows the
    jobs later: submitted (as recorded) two hours ago, every hint is past its planned time,
    so the follower drops each one Slurm still holds a queued job to."""
    env = make_env(tmp_path, lock="mpi-cuda", specs=MPI_CUDA_SPECS, name="mc2")
    benv = build_env(env, slurm_cluster, DEDAL_SLURM_NODES="1", DEDAL_SLURM_ORDER_HINTS="true")
    res = run_dedal("build", str(env.env_file), "--detach", "--json", env=benv, timeout=300)
    assert res.returncode == 0, res.stderr
    path = workdir(env, "mc2") / "slurm-jobs.json"
    rec = json.loads(path.read_text())
    assert any(j["hints"] for j in rec["jobs"]) and not any(j["hints_dropped"] for j in rec["jobs"])
    two_hours_ago = record_date(-7200)
    path.write_text(json.dumps(dict(rec, submitted_at=two_hours_ago)))
    res = run_dedal("build", str(env.env_file), "--json", env=benv, timeout=300)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["adopted"] >= 1
    after = record(env, "mc2")
    assert after["finished"] and all(j["status"] == "done" for j in after["jobs"])
    dropped = [j for j in after["jobs"] if j["hints_dropped"]]
    assert dropped, "the follower dropped expired hints"
    assert all(set(j["hints_dropped"]) <= set(j["order"]) and not j["hints"] for j in dropped)


def test_status_of_a_local_build(run_dedal, tmp_path: Path) -> None:
    tiny = make_env(tmp_path, fail=["libdedal"])
    res = run_dedal("build", str(tiny.env_file), "--keep-going", "--executor", "local", env=tiny.env)
    assert res.returncode == 1
    st = run_dedal("status", str(tiny.env_file), "--json", env=tiny.env)
    assert st.returncode == 0, st.stderr
    data = json.loads(st.stdout)
    assert data["executor"] == "local" and data["counts"] == {"built": 3, "failed": 1}
    ((label, err),) = data["errors"].items()
    assert label.startswith("libdedal@") and Path(err["log"]).is_file()
    text = run_dedal("status", str(tiny.env_file), env=tiny.env).stdout
    assert "FAILED libdedal@" in text and "3 of 5" in text
    none = run_dedal("status", str(make_env(tmp_path / "other", name="other").env_file), env=tiny.env)
    assert none.returncode == 0 and "no build recorded" in none.stdout
