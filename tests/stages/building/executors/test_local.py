"""The build stage with the local executor: real process pool, real mksquashfs, real
signals, the Spack stand-in compiling real binaries linked by RPATH."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dedal.adapters import runtime as rt
from dedal.adapters import squashfs
from dedal.model.layers import LayerStore
from tests.fixtures.tiny import TINY_PACKAGES, make_env, node_builds_of, stage_leftovers
from tests.conftest import dedal_exe, interruptible

pytestmark = pytest.mark.usefixtures("as_root")


def build(run_dedal, tiny, *args, timeout=300):
    return run_dedal("build", str(tiny.env_file), "--json", *args, env=tiny.env, timeout=timeout)


def test_build_then_rerun_does_nothing(run_dedal, tiny):
    res = build(run_dedal, tiny)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert sorted(x.split("@")[0] for x in summary["built"]) == TINY_PACKAGES
    store = LayerStore(tiny.store)
    manifests = store.manifests()
    assert len(manifests) == 5
    for m in manifests:
        assert m.sha256 and m.size > 0 and m.files > 1 and m.install_root == "/opt/esd/software"
        assert Path(m.log).is_file() and m.build_seconds > 0 and m.host and m.dedal_version
        # build_jobs unset: Spack's make -j, its default 16 at most the CPUs this process may use
        assert m.build_cores == min(16, len(os.sched_getaffinity(0)))
        names = {e["path"].split("/")[0] for e in squashfs.entries(store.sqfs(m.key))}
        assert names == {m.prefix}, "a layer holds exactly its prefix"
        paths = {e["path"] for e in squashfs.entries(store.sqfs(m.key))}
        assert f"{m.prefix}/.spack/spec.json" in paths
    assert stage_leftovers(tiny.stage) == [], "stages are removed"
    verify = run_dedal("layers", "verify", "--json", env=tiny.env)
    assert verify.returncode == 0 and json.loads(verify.stdout)["clean"]

    again = build(run_dedal, tiny)
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert second["built"] == [] and second["jobs"] == 0 and len(second["reused"]) == 5


def test_layers_hold_working_binaries_at_the_install_root(run_dedal, tiny, tmp_path):
    assert build(run_dedal, tiny).returncode == 0
    store = LayerStore(tiny.store)
    by_name = {m.name: m for m in store.manifests()}
    tree = tmp_path / "tree"
    for name in ("gcc-runtime", "libdedal", "dedal-app"):  # the runtime closure only
        squashfs.extract(store.sqfs(by_name[name].key), tree)
    app = f"/opt/esd/software/{by_name['dedal-app'].prefix}/bin/dedal-app"
    out = rt.run_in(None, [app], binds=[rt.Bind(tree, "/opt/esd/software")]).stdout
    assert "dedal-app 1.0 ok" in out
    # a missing layer makes the binary fail to load: RPATHs point into the install root
    import shutil

    shutil.rmtree(tree / by_name["libdedal"].prefix)
    res = rt.run_in(None, [app], binds=[rt.Bind(tree, "/opt/esd/software")], check=False)
    assert res.returncode != 0 and "libstandin_libdedal" in (res.stderr + res.stdout)


def test_failing_package_stops_only_its_dependents(run_dedal, tmp_path):
    tiny = make_env(tmp_path, fail=["libdedal"])
    res = build(run_dedal, tiny, "--keep-going")
    assert res.returncode == 1
    summary = json.loads(res.stdout)
    assert list(summary["failed"]) == [k for k in summary["failed"] if k.startswith("libdedal@")] and summary["failed"]
    error = next(iter(summary["failed"].values()))
    assert "libdedal" in error and "exited with code 1" in error and ".log" in error and "spack" in error
    # Spack's own report (stand-in: its ProcessError and the log line it marked), before the log path
    assert error.index("==> Error: ProcessError: Command exited with status 2") < error.index("; log: ")
    assert ">> " in error and "fails on request" in error
    assert [b.split("@")[0] for b in summary["blocked"]] == ["dedal-app"]
    assert sorted(b.split("@")[0] for b in summary["built"]) == ["dedal-bootstrap", "dedal-tool", "gcc-runtime"]
    assert {m.name for m in LayerStore(tiny.store).manifests()} == {"dedal-bootstrap", "dedal-tool", "gcc-runtime"}
    assert stage_leftovers(tiny.stage) == []
    # the human output names the package and the log
    res2 = run_dedal("build", str(tiny.env_file), env=tiny.env)
    assert res2.returncode == 1 and "FAILED libdedal" in res2.stdout and ".log" in res2.stdout


def test_each_attempt_has_its_record_and_status_shows_the_last_success(run_dedal, tmp_path):
    """A failed build never overwrites how the last one ended: one record per attempt under
    <env dir>/builds/, and `dedal status` shows the last attempt and the last success."""
    tiny = make_env(tmp_path, fail=["libdedal"])
    assert build(run_dedal, tiny, "--keep-going").returncode == 1
    status = json.loads(run_dedal("status", str(tiny.env_file), "--json", env=tiny.env).stdout)
    first = status["last_attempt"]
    assert first["status"] == "failed" and first["executor"] == "local" and status["last_success"] is None
    assert list(first["summary"]["failed"]) and first["summary"]["failed"][next(iter(first["summary"]["failed"]))]
    tiny.reconfigure(fail=[])
    assert build(run_dedal, tiny).returncode == 0
    status = json.loads(run_dedal("status", str(tiny.env_file), "--json", env=tiny.env).stdout)
    ok = status["last_attempt"]
    assert ok["status"] == "ok" and status["last_success"]["id"] == ok["id"] and ok["id"] != first["id"]
    assert sorted(b.split("@")[0] for b in ok["summary"]["built"]) == ["dedal-app", "libdedal"]
    # a layer lost, the package failing again: the failure is the last attempt, the success stays
    store = LayerStore(tiny.store)
    store.remove(next(m.key for m in store.manifests() if m.name == "libdedal"))
    tiny.reconfigure(fail=["libdedal"])
    assert build(run_dedal, tiny).returncode == 1
    status = json.loads(run_dedal("status", str(tiny.env_file), "--json", env=tiny.env).stdout)
    assert status["last_attempt"]["status"] == "failed" and status["last_success"]["id"] == ok["id"]
    assert len(list((Path(status["env_dir"]) / "builds").glob("*.json"))) == 3
    text = run_dedal("status", str(tiny.env_file), env=tiny.env).stdout
    lines = [ln for ln in text.splitlines() if ln.startswith(("last attempt", "last success"))]
    assert len(lines) == 2 and "local: failed" in lines[0] and "1 failed" in lines[0]
    assert "local: ok" in lines[1] and "2 built" in lines[1]


def test_interrupted_build_leaves_no_partial_layer_and_resumes(isolated_env, tmp_path):
    tiny = make_env(tmp_path, sleep={"dedal-tool": 60})
    env = dict(isolated_env, **tiny.env)
    proc = subprocess.Popen(
        [dedal_exe(), "build", str(tiny.env_file), "-j", "2"],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=interruptible,
    )
    store = LayerStore(tiny.store)
    deadline = time.monotonic() + 120
    # wait until dedal-tool is building: its dependencies are layers and a stage exists
    while time.monotonic() < deadline:
        names = {m.name for m in store.manifests()} if tiny.store.is_dir() else set()
        if "dedal-bootstrap" in names and "gcc-runtime" in names and stage_leftovers(tiny.stage):
            break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("dedal-tool never started: " + proc.communicate()[1])
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, err
    names = {m.name for m in store.manifests()}
    assert "dedal-tool" not in names and "dedal-app" not in names
    check = store.verify()
    assert check.clean, check.to_json()
    assert stage_leftovers(tiny.stage) == [], "the interrupted build removed its stage"
    # rerun: only what is missing is built
    tiny.reconfigure()
    res = subprocess.run(
        [dedal_exe(), "build", str(tiny.env_file), "--json"], env=env, text=True, capture_output=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert sorted(b.split("@")[0] for b in summary["built"]) == sorted(
        {"dedal-tool", "dedal-app"} | ({"libdedal"} - names)
    )
    assert len(store.manifests()) == 5


def start_slow_build(isolated_env, tiny):
    proc = subprocess.Popen(
        [dedal_exe(), "build", str(tiny.env_file)],
        env=dict(isolated_env, **tiny.env),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (stage_leftovers(tiny.stage) and node_builds_of(tiny)):
        time.sleep(0.2)
    time.sleep(1.0)
    assert stage_leftovers(tiny.stage) and node_builds_of(tiny), proc.communicate(timeout=120)
    return proc


def test_a_killed_build_leaves_no_node_build_running(isolated_env, tmp_path):
    """dedal build killed outright (SIGKILL: it cannot stop its children): its node builds
    get SIGTERM from the kernel as their parent dies, and remove their stages."""
    tiny = make_env(tmp_path, sleep={"gcc-runtime": 60})
    proc = start_slow_build(isolated_env, tiny)
    proc.kill()
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (node_builds_of(tiny) or stage_leftovers(tiny.stage)):
        time.sleep(0.2)
    orphans = node_builds_of(tiny)
    for pid in orphans:  # a failing test leaves nothing running
        os.kill(pid, signal.SIGKILL)
    assert orphans == [] and stage_leftovers(tiny.stage) == []
    assert LayerStore(tiny.store).verify().clean


def test_stage_of_a_killed_node_build_is_removed_by_the_next_build(isolated_env, tmp_path):
    """A node build killed outright (SIGKILL: the OOM killer) cannot clean up: the build
    reports it, its stage stays (in /dev/shm it holds the node's memory) until the next
    build on this host removes it and says so in its log."""
    tiny = make_env(tmp_path, sleep={"gcc-runtime": 60})
    proc = start_slow_build(isolated_env, tiny)
    for pid in node_builds_of(tiny):
        os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    left = stage_leftovers(tiny.stage)
    assert left, "the killed node build's stage is still there"
    tiny.reconfigure()
    res = subprocess.run(
        [dedal_exe(), "build", str(tiny.env_file), "--json"],
        env=dict(isolated_env, **tiny.env),
        text=True,
        capture_output=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert stage_leftovers(tiny.stage) == []
    said = "".join(p.read_text() for p in tiny.data.rglob("job-*.log"))
    assert all(
        f"removed {tiny.stage / name}, the stage of a dedal process on this host that was killed" in said
        for name in left
    ), said[-2000:]


def test_sigterm_to_the_build_stops_children(isolated_env, tmp_path):
    tiny = make_env(tmp_path, sleep={"gcc-runtime": 60})
    proc = start_slow_build(isolated_env, tiny)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 143, err  # 128 + SIGTERM, as a shell reports it; Ctrl-C is 130
    assert "dedal: build interrupted by signal SIGTERM" in err.splitlines(), err
    assert stage_leftovers(tiny.stage) == []
    assert LayerStore(tiny.store).manifests() == []
    assert LayerStore(tiny.store).verify().clean


def test_missing_mirror_is_a_clear_error(run_dedal, tiny, tmp_path):
    env = dict(tiny.env, DEDAL_MIRROR=str(tmp_path / "no-such-mirror"))
    res = run_dedal("build", str(tiny.env_file), env=env)
    assert res.returncode == 2
    assert "source mirror" in res.stderr and "does not exist" in res.stderr and "Traceback" not in res.stderr
    assert not (tiny.store).exists() or LayerStore(tiny.store).manifests() == []


def test_unwritable_store_is_a_clear_error(run_dedal, tiny, tmp_path):
    blocker = tmp_path / "store-is-a-file"
    blocker.write_text("x")
    res = run_dedal("build", str(tiny.env_file), env=dict(tiny.env, DEDAL_LAYER_STORE=str(blocker)))
    assert res.returncode == 2 and "layer store" in res.stderr and "not writable" in res.stderr
    assert blocker.read_text() == "x"


def test_lock_that_does_not_match_the_environment_is_refused(run_dedal, tiny):
    text = tiny.env_file.read_text().replace("dedal-app", "dedal-prefixed")
    tiny.env_file.write_text(text)
    res = run_dedal("build", str(tiny.env_file), env=tiny.env)
    assert res.returncode == 2
    assert "does not match" in res.stderr and "dedal-prefixed" in res.stderr
    assert not tiny.store.exists() or LayerStore(tiny.store).manifests() == []


def test_full_stage_filesystem_fails_cleanly(run_dedal, tiny, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)], check=True)
    try:
        (small / "filler").write_bytes(b"\0" * (2 * 1024 * 1024 - 64 * 1024))  # leave almost nothing
        res = run_dedal("build", str(tiny.env_file), "--json", env=dict(tiny.env, DEDAL_STAGE_DIR=str(small)))
        assert res.returncode == 1
        summary = json.loads(res.stdout)
        assert summary["failed"]
        assert any("full" in e or "No space left" in e for e in summary["failed"].values()), summary["failed"]
        check = LayerStore(tiny.store).verify()
        assert check.clean, check.to_json()
        assert [p.name for p in small.iterdir()] == ["filler"]
    finally:
        subprocess.run(["umount", str(small)], check=False)
