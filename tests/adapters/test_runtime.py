"""The runtime seam against the real debian-trixie base: directory, squashfs and SIF roots,
bwrap and Charliecloud, binds onto paths the image lacks, the image environment, MPI."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from dedal.adapters import runtime, squashfs
from dedal.adapters.runtime import Bind, Request
from dedal.errors import ToolError, UserError
from dedal.model.config import SETTINGS
from tests.fixtures import base as helpers

UCX = ["--mca", "pml", "ucx", "--mca", "pml_ucx_tls", "any", "--mca", "pml_ucx_devices", "any"]


@pytest.fixture(params=["dir", "squashfs", "sif"])
def root(request, trixie_base, base_sif):
    return {"dir": trixie_base.rootfs_dir, "squashfs": trixie_base.squashfs, "sif": base_sif}[request.param]


@pytest.fixture(params=["bwrap", "charliecloud", pytest.param("apptainer", marks=pytest.mark.apptainer)])
def backend(request) -> str:
    """Every backend: the same test against each, so that a difference between them fails.
    bwrap and ch-run are installed by setup.sh (missing: a failure); Apptainer is optional
    (skipped where it is not on PATH)."""
    if request.param == "apptainer":
        if shutil.which("apptainer") is None:
            pytest.skip(
                "apptainer is not on PATH (no Debian package: build it with DEDAL_APPTAINER_SRC=GITDIR "
                "./setup.sh, see the README)"
            )
    else:
        helpers.require_tools(runtime.BACKENDS[request.param].TOOL)
    return request.param


def _refuses_missing_mount_points(backend: str) -> bool:
    """ch-run cannot create a mount point in a read-only image: it refuses, clearly, up front."""
    return backend == "charliecloud"


def test_true_and_debian_version_in_every_root_kind(root):
    runtime.run_in(root, ["/bin/true"], runtime="bwrap")
    out = runtime.run_in(root, ["cat", "/etc/debian_version"], runtime="bwrap").stdout
    assert out.strip().startswith("13.")
    assert helpers.fuse_mounts() == []  # squashfs / SIF unmounted afterwards


def test_root_kinds(trixie_base, base_sif, tmp_path):
    assert runtime.root_kind(None) == "host"
    assert runtime.root_kind(trixie_base.rootfs_dir) == "dir"
    assert runtime.root_kind(trixie_base.squashfs) == "squashfs"
    assert runtime.root_kind(base_sif) == "sif"
    junk = tmp_path / "junk"
    junk.write_text("x" * 100)
    with pytest.raises(UserError, match="not an image"):
        runtime.root_kind(junk)
    with pytest.raises(UserError, match="no such image"):
        runtime.root_kind(tmp_path / "nope")


def test_standard_environment(root, backend, monkeypatch, tmp_path):
    """The same environment, HOME, /tmp and working directory with every backend and root kind."""
    monkeypatch.setenv("DEDAL_LEAK_CHECK", "secret")
    monkeypatch.setenv("APPTAINERENV_LEAK_CHECK", "secret")
    host_marker = Path(tempfile.mkstemp(prefix="dedal-host-marker-", dir="/tmp")[1])
    try:
        out = runtime.run_in(
            root,
            [
                "sh",
                "-c",
                "env; echo CWD=$(pwd); cat /etc/hosts; ls -ld /tmp; ls -a /tmp; "
                "touch /tmp/made-inside && echo tmp-writable; "
                "ls /sys/devices/system/cpu | head -1",
            ],
            env={"FOO": "a b $c", "QUOTED": 'it\'s "q" `x` \\n'},
            runtime=backend,
            cwd="/usr",
        ).stdout
    finally:
        host_marker.unlink()
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line and not line.startswith("CWD"))
    assert "DEDAL_LEAK_CHECK" not in env and "LEAK_CHECK" not in env  # clean environment
    assert env["FOO"] == "a b $c" and env["QUOTED"] == 'it\'s "q" `x` \\n'  # verbatim, never expanded
    assert env["LANG"] == "C.UTF-8"
    assert env["PATH"].startswith("/usr/local/sbin")
    assert env["HOME"] == ("/root" if os.geteuid() == 0 else "/tmp")
    if os.geteuid() == 0:
        assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    assert "CWD=/usr" in out
    if not _refuses_missing_mount_points(backend):  # ch-run binds /etc/hosts only where the image has one
        assert "localhost" in out  # the host's /etc/hosts although minbase has none
    assert "drwxrwxrwt" in out and "tmp-writable" in out
    assert host_marker.name not in out  # /tmp is private ...
    assert not Path("/tmp/made-inside").exists()  # ... both ways
    assert "cpu" in out  # /sys is there (hwloc needs it)
    assert "WARNING" not in out


def test_same_environment_and_home_with_every_backend(trixie_base, tmp_path, monkeypatch):
    """What differs between the backends' environments is only the runtime's own additions;
    without ``cwd`` each starts where the caller is if the image has that directory, else in
    HOME."""
    seen = {}
    for name in runtime.BACKENDS:
        if name == "apptainer" and shutil.which("apptainer") is None:
            continue
        monkeypatch.chdir(tmp_path)  # not in the image
        out = runtime.run_in(
            trixie_base.rootfs_dir, ["sh", "-c", "env; echo CWD=$(pwd)"], env={"X": "$HOME ${PATH}"}, runtime=name
        ).stdout
        env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        seen[name] = {
            k: v
            for k, v in env.items()
            if not k.startswith(("APPTAINER", "SINGULARITY", "CH_"))
            and k not in ("LD_LIBRARY_PATH", "PS1", "PWD", "SHLVL", "_", "PROMPT_COMMAND", "TZ")
        }
        monkeypatch.chdir("/usr/share")  # in the image
        seen[name]["CWD-in-image"] = runtime.run_in(trixie_base.rootfs_dir, ["pwd"], runtime=name).stdout.strip()
    first = seen.pop("bwrap")
    for name, env in seen.items():
        assert env == first, name
    assert first["X"] == "$HOME ${PATH}"
    assert first["CWD"] == first["HOME"] and first["CWD-in-image"] == "/usr/share"


def test_bind_onto_missing_path_of_read_only_root(root, backend, trixie_base, tmp_path):
    """The fixed install root /opt/esd/software does not exist in the base: it is created in
    the sandbox's own view, the root itself stays untouched."""
    store = tmp_path / "store"
    (store / "pkg").mkdir(parents=True)
    (store / "pkg" / "file").write_text("from the host\n")
    binds = [Bind(store, "/opt/esd/software")]
    cmd = [
        "sh",
        "-c",
        "cat /opt/esd/software/pkg/file; ls -ld /opt/esd; "
        "echo new > /opt/esd/software/pkg/made-inside; ls /usr/bin/mpirun",
    ]
    if _refuses_missing_mount_points(backend):
        with pytest.raises(UserError, match="ch-run cannot create bind mount points"):
            runtime.run_in(root, cmd, binds=binds, runtime=backend)
        return
    out = runtime.run_in(root, cmd, binds=binds, runtime=backend).stdout
    assert "from the host" in out and "drwxr-xr-x" in out and "/usr/bin/mpirun" in out
    assert (store / "pkg" / "made-inside").read_text() == "new\n"
    assert not (trixie_base.rootfs_dir / "opt" / "esd").exists()
    assert not (trixie_base.rootfs_dir / "etc" / "hosts").exists()


def test_readonly_bind_and_missing_source(trixie_base, backend, tmp_path):
    with pytest.raises(UserError, match="bind source .* does not exist"):
        runtime.run_in(trixie_base.rootfs_dir, ["true"], binds=[Bind(tmp_path / "nope", "/x")], runtime=backend)
    if backend == "charliecloud":
        pytest.skip("ch-run 0.31 has no read-only binds (documented in dedal/adapters/runtime/charliecloud.py)")
    (tmp_path / "f").write_text("x")
    r = runtime.run_in(
        trixie_base.rootfs_dir,
        ["sh", "-c", "cat /mnt/f; echo y > /mnt/f"],
        binds=[Bind(tmp_path, "/mnt", True)],
        runtime=backend,
        check=False,
    )
    assert r.returncode != 0 and r.stdout == "x" and (tmp_path / "f").read_text() == "x"


def test_bind_under_dev_shm_and_tmp(trixie_base, backend, tmp_path):
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "f").write_text("staged")
    binds = [Bind(stage, "/dev/shm/dedal-stage"), Bind(stage, "/tmp/s")]
    cmd = ["sh", "-c", "cat /dev/shm/dedal-stage/f /tmp/s/f; echo more > /tmp/s/g"]
    if _refuses_missing_mount_points(backend):
        with pytest.raises(UserError, match="ch-run cannot create bind mount points"):
            runtime.run_in(trixie_base.rootfs_dir, cmd, binds=binds, runtime=backend)
        return
    out = runtime.run_in(trixie_base.rootfs_dir, cmd, binds=binds, runtime=backend).stdout
    assert out == "stagedstaged" and (stage / "g").read_text() == "more\n"
    assert not Path("/dev/shm/dedal-stage").exists()  # made in the sandbox's view, not on the host


def test_no_device_node_reaches_the_host(trixie_base, backend, tmp_path):
    """A device node made in the container (as NVIDIA's libcuda.so makes /dev/nvidiactl when
    root loads it, in a build's CMake CUDA detection) never appears in the host's /dev: bwrap
    has a /dev of its own, Apptainer shows the host's and its root runs drop CAP_MKNOD."""
    node = Path(f"/dev/dedal-test-node-{os.getpid()}")
    try:
        runtime.run_in(trixie_base.rootfs_dir, ["sh", "-c", f"mknod {node} c 1 3 || true"], runtime=backend)
        assert not node.exists()
    finally:
        if node.exists() or node.is_symlink():
            node.unlink()


def test_apptainer_drops_mknod_for_root_runs_but_not_gpu_runs(monkeypatch):
    monkeypatch.setattr(runtime.apptainer, "lacks_capability", lambda bit: True)
    monkeypatch.setattr(runtime.apptainer.os, "geteuid", lambda: 0)
    caps = runtime.apptainer.dropped_caps
    assert caps(False, {}) == ["CAP_SYS_RESOURCE", "CAP_MKNOD"]
    assert caps(True, {}) == ["CAP_SYS_RESOURCE"]  # --nv: the driver may make /dev/nvidia-uvm
    # the caller's APPTAINER_DROP_CAPS is named again (the flag replaces it), each cap once
    assert caps(False, {"APPTAINER_DROP_CAPS": "sys_resource,CAP_NET_RAW"}) == [
        "sys_resource",
        "CAP_NET_RAW",
        "CAP_MKNOD",
    ]
    monkeypatch.setattr(runtime.apptainer, "lacks_capability", lambda bit: False)
    assert caps(True, {}) == []
    monkeypatch.setattr(runtime.apptainer.os, "geteuid", lambda: 1000)
    assert caps(False, {"APPTAINER_DROP_CAPS": "CAP_NET_RAW"}) == []  # a user holds none


def test_host_tmp_and_shm_shared_when_bound(trixie_base, backend, tmp_path):
    """A caller's bind of /tmp (PMIx rendezvous of srun-launched ranks, native runs) replaces
    the private one."""
    marker = Path(tempfile.mkstemp(prefix="dedal-shared-", dir="/tmp")[1])
    try:
        out = runtime.run_in(
            trixie_base.rootfs_dir, ["ls", "/tmp"], binds=[Bind("/tmp", "/tmp")], runtime=backend
        ).stdout
    finally:
        marker.unlink()
    assert marker.name in out.split()


def test_image_env_scripts_order(tmp_path):
    img = tmp_path / "img"
    envd = img / ".singularity.d" / "env"
    envd.mkdir(parents=True)
    for name in ("90-environment.sh", "10-early.sh", "99-runtimevars.sh", "README"):
        (envd / name).write_text("true\n")
    assert runtime.image_env_scripts(img) == [
        "/.singularity.d/env/10-early.sh",
        "/.singularity.d/env/90-environment.sh",
        "/.singularity.d/env/99-runtimevars.sh",
    ]
    assert runtime.image_env_scripts(tmp_path) == [] and runtime.image_env_scripts(None) == []
    cmd = runtime.wrap_with_image_env(["printenv", "A B"], ["/.singularity.d/env/10-early.sh"], {"K": "it's"})
    assert cmd[:2] == ["/bin/sh", "-c"] and cmd[-2:] == ["printenv", "A B"]
    assert "export K='it'\"'\"'s'" in cmd[2]


def test_image_env_from_sif(trixie_base, backend, tmp_path):
    """A SIF whose squashfs carries /.singularity.d/env scripts: they apply, the caller's env wins."""
    from dedal.model import sif

    extra = tmp_path / "extra"
    envd = extra / ".singularity.d" / "env"
    envd.mkdir(parents=True)
    (envd / "90-environment.sh").write_text("export IMG_A=image\nexport IMG_B=image\nexport PATH=/opt/view/bin:$PATH\n")
    sq = tmp_path / "img.sqfs"
    shutil.copyfile(trixie_base.squashfs, sq)
    # append the env scripts to a copy of the base squashfs (mksquashfs appends when -noappend is absent)
    from dedal.adapters import proc

    proc.run(
        ["mksquashfs", str(extra), str(sq), "-all-root", "-no-progress", "-quiet", "-mkfs-time", "0", "-all-time", "0"],
        what="mksquashfs append",
    )
    img = tmp_path / "img.sif"
    sif.write_sif(img, sq, definition="x", labels={}, metadata={})
    out = runtime.run_in(
        img, ["sh", "-c", "echo $IMG_A $IMG_B $PATH"], env={"IMG_B": "caller", "OTHER": "x"}, runtime=backend
    ).stdout
    # no 99-base.sh in this image: the caller's variables still arrive, last word theirs
    assert out.split() == [
        "image",
        "caller",
        "/opt/view/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ]


def test_failure_is_a_tool_error_with_the_command(trixie_base, backend, tmp_path):
    log = tmp_path / "run.log"
    with pytest.raises(ToolError) as exc:
        runtime.run_in(
            trixie_base.rootfs_dir, ["sh", "-c", "echo boom >&2; exit 7"], log=log, what="boom step", runtime=backend
        )
    e = exc.value
    # the error names the command that ran inside; the log keeps the full sandbox command line
    assert e.returncode == 7 and e.what == "boom step" and e.log_path == log
    assert e.cmd == ["sh", "-c", "echo boom >&2; exit 7"] and e.detail == "boom"
    text = log.read_text()
    assert "boom" in text and text.startswith("$ ") and runtime.BACKENDS[backend].TOOL in text.splitlines()[0]
    assert "WARNING" not in text
    r = runtime.run_in(trixie_base.rootfs_dir, ["sh", "-c", "exit 3"], runtime=backend, check=False)
    assert r.returncode == 3 and r.stderr == ""


def test_writable_root_rejected_for_images(trixie_base, base_sif):
    with pytest.raises(UserError, match="read-only"):
        runtime.run_in(base_sif, ["true"], writable=True)


@pytest.mark.parametrize("backend", ["bwrap", pytest.param("apptainer", marks=pytest.mark.apptainer)], indirect=True)
def test_writable_directory_root_cleans_up_mount_points(trixie_base, backend, tmp_path):
    """Writable runs (base builds) create missing mount points in the root and remove them after."""
    root = tmp_path / "root"
    root.mkdir()
    shutil.copytree(trixie_base.rootfs_dir / "usr", root / "usr", symlinks=True, copy_function=os.link)
    for entry in trixie_base.rootfs_dir.iterdir():
        if entry.is_symlink():
            (root / entry.name).symlink_to(os.readlink(entry))
    for d in ("etc", "tmp", "proc", "sys", "dev", "run"):
        (root / d).mkdir()
    store = tmp_path / "store"
    store.mkdir()
    runtime.run_in(
        root,
        ["sh", "-c", "echo made > /etc/made; test -f /etc/hosts; ls /opt/esd/software; echo own > /tmp/own"],
        binds=[Bind(store, "/opt/esd/software")],
        writable=True,
        runtime=backend,
    )
    assert (root / "etc" / "made").read_text() == "made\n"
    assert (root / "tmp" / "own").read_text() == "own\n"  # a writable root keeps its own /tmp
    assert not (root / "opt").exists() and not (root / "etc" / "hosts").exists()


def test_host_root_private_namespace(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / "marker").write_text("m")
    out = runtime.run_in(
        None,
        ["sh", "-c", "cat /opt/esd-test-only/software/marker; ls /usr/bin/bwrap"],
        binds=[Bind(store, "/opt/esd-test-only/software")],
        runtime="bwrap",
    ).stdout
    assert out.startswith("m") and "/usr/bin/bwrap" in out
    assert not Path("/opt/esd-test-only").exists()  # the host was not touched


def test_mpirun_in_base_ucx_and_ob1(trixie_base, base_sif, mpi_hello, backend):
    for root in (trixie_base.rootfs_dir, base_sif):
        for mca in (UCX, ["--mca", "pml", "ob1"]):
            out = runtime.run_in(
                root,
                ["mpirun", "-np", "2", *mca, "/mnt/hello"],
                binds=[Bind(mpi_hello, "/mnt")],
                runtime=backend,
                timeout=120,
            ).stdout
            lines = sorted(line for line in out.splitlines() if line.startswith("hello"))
            assert lines[0].startswith("hello 0/2 sum=1 Open MPI v5.0") and lines[1].startswith("hello 1/2 sum=1")


def test_start_in_runs_a_launcher_and_unmounts(base_sif, mpi_hello, backend, tmp_path):
    log = tmp_path / "mpirun.log"
    with runtime.start_in(
        base_sif, ["mpirun", "-np", "2", *UCX, "/mnt/hello"], binds=[Bind(mpi_hello, "/mnt")], log=log, runtime=backend
    ) as running:
        assert running.wait(timeout=120) == 0
    assert log.read_text().count("hello ") == 2
    assert helpers.fuse_mounts() == []
    running = runtime.start_in(base_sif, ["sleep", "60"], runtime=backend)
    assert running.poll() is None
    assert running.stop(grace=5) != 0
    assert helpers.fuse_mounts() == []


def _signal_after_mkdtemp(monkeypatch: pytest.MonkeyPatch) -> list:
    """``tempfile.mkdtemp`` sends this process SIGTERM right after it made its directory;
    the list it returns gets the directories made."""
    import signal

    made: list = []
    real = tempfile.mkdtemp

    def with_a_signal(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        made.append(real(*args, **kwargs))
        os.kill(os.getpid(), signal.SIGTERM)
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", with_a_signal)
    return made


def test_a_stop_signal_as_a_private_dir_is_made_leaves_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM right after Apptainer's private /tmp is made, before it is known to its
    removal: it goes all the same (as mpirun's session directory, whose empty leftover a
    full test run showed), and the stop comes after."""
    from dedal.adapters.runtime import apptainer
    from dedal.errors import Interrupted, Signals

    made = _signal_after_mkdtemp(monkeypatch)
    with pytest.raises(Interrupted), Signals("test"):
        with apptainer._private_dirs(["/tmp"], []):
            pass
    assert made and "dedal-tmp-" in made[0] and not Path(made[0]).exists()


@pytest.mark.apptainer
def test_apptainer_private_dirs_removed(trixie_base, tmp_path):
    """The private /tmp (and /dev/shm, where a bind below it names a path the host lacks)
    live as long as the command, mount points of binds below them included; the host's
    /dev/shm is kept otherwise (srun's ranks, one container each, share memory there)."""
    if shutil.which("apptainer") is None:
        pytest.skip("apptainer is not on PATH")

    def private(argv):
        return {a.split(":")[1]: Path(a.split(":")[0]) for a in argv if a.endswith((":/tmp", ":/dev/shm"))}

    with runtime.prepared(trixie_base.rootfs_dir, ["true"], runtime="apptainer") as prep:
        assert list(private(prep.argv)) == ["/tmp"]
    with runtime.prepared(
        trixie_base.rootfs_dir,
        ["true"],
        binds=[Bind(tmp_path, "/tmp/deep/s"), Bind(tmp_path, "/dev/shm/dedal-missing/x")],
        runtime="apptainer",
    ) as prep:
        dirs = private(prep.argv)
        assert sorted(dirs) == ["/dev/shm", "/tmp"] and all(p.is_dir() for p in dirs.values())
        assert (dirs["/tmp"] / "deep" / "s").is_dir() and (dirs["/dev/shm"] / "dedal-missing" / "x").is_dir()
        assert oct(dirs["/tmp"].stat().st_mode)[-4:] == "1777"
    assert not any(p.exists() for p in dirs.values())
    with pytest.raises(UserError, match="only onto itself"):
        runtime.run_in(trixie_base.rootfs_dir, ["true"], binds=[Bind("/dev/null", "/dev/zero2")], runtime="apptainer")


def test_apptainer_command_line(monkeypatch, tmp_path):
    """The command line Apptainer gets (the real one runs in tests/adapters/runtime)."""
    monkeypatch.setattr(runtime.apptainer.proc, "which", lambda tool, hint="": f"/usr/bin/{tool}")
    prep = runtime.apptainer_command(
        Path("/img/x.sif"),
        Request(
            ["mpirun", "-np", "2", "a.out"],
            [Bind(tmp_path, "/opt/esd/software"), Bind(tmp_path, "/data", True)],
            {"OMPI_MCA_pml": "ucx", "FOO": "a b $c"},
            "/work",
            nv=True,
        ),
        private={"/tmp": tmp_path / "t"},
    )
    argv = prep.argv
    assert argv[:6] == ["/usr/bin/apptainer", "exec", "--cleanenv", "--no-home", "--no-mount", "tmp,cwd"]
    assert "--nv" in argv and "--env" not in argv and "--writable" not in argv
    binds = [argv[i + 1] for i, a in enumerate(argv) if a == "--bind"]
    assert binds == [f"{tmp_path / 't'}:/tmp", f"{tmp_path}:/opt/esd/software", f"{tmp_path}:/data:ro"]
    assert argv[argv.index("--pwd") + 1] == "/work"
    i = argv.index("/img/x.sif")
    assert argv[i + 1 : i + 3] == ["/bin/sh", "-c"] and argv[-4:] == ["mpirun", "-np", "2", "a.out"]
    script = argv[i + 3]
    # the clean environment first, then the image's scripts, then the caller's values, single-quoted
    assert (
        script.index("export LANG=C.UTF-8")
        < script.index("/.singularity.d/env/*.sh")
        < script.rindex("export FOO='a b $c'")
    )
    assert "export PATH=/usr/local/sbin" in script


def test_runtime_choice_says_why(monkeypatch):
    found = {"apptainer": "/opt/apptainer/bin/apptainer", "bwrap": "/usr/bin/bwrap", "ch-run": "/usr/bin/ch-run"}

    def which(tool, hint=""):
        if tool not in found:
            raise runtime.launch.ToolMissing(tool)
        return found[tool]

    monkeypatch.setattr(runtime.launch.proc, "which", which)
    monkeypatch.setattr(runtime.launch, "apptainer_probe", lambda path: ("1.5.3", ""))
    assert runtime.choose_runtime("auto") == ("apptainer", "auto: apptainer 1.5.3 at /opt/apptainer/bin/apptainer")
    monkeypatch.setattr(runtime.launch, "apptainer_probe", lambda path: ("1.5.3", "user namespaces are disabled"))
    name, why = runtime.choose_runtime("auto")
    assert name == "bwrap" and why.startswith("auto: bwrap at /usr/bin/bwrap; apptainer at ")
    assert "user namespaces are disabled" in why
    del found["apptainer"], found["bwrap"]
    assert runtime.choose_runtime("auto") == (
        "charliecloud",
        "auto: ch-run at /usr/bin/ch-run; apptainer is not on PATH; bwrap is not on PATH",
    )
    assert runtime.choose_runtime("bwrap") == ("bwrap", "runtime bwrap was asked for")
    found.clear()
    with pytest.raises(runtime.launch.ToolMissing, match="no container runtime found"):
        runtime.resolve_runtime("auto")
    with pytest.raises(UserError, match="runtime: expected one of"):
        runtime.resolve_runtime("docker")


def test_the_runtime_names_the_settings_accept_are_the_backends():
    """model.config.RUNTIMES is the one list of runtimes (the setting, `dedal exec --runtime`,
    `dedal verify --runtime`); it must name every backend, in the order auto tries them."""
    assert runtime.RUNTIMES == ("auto", *runtime.BACKENDS)
    assert next(s for s in SETTINGS if s.key == "runtime").choices == runtime.RUNTIMES


def test_apptainer_build_sandbox_command(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(runtime.apptainer.proc, "which", lambda tool, hint="": f"/usr/bin/{tool}")
    monkeypatch.setattr(runtime.apptainer.proc, "run", lambda cmd, **kw: calls.append(cmd))
    runtime.apptainer_build_sandbox(Path("base-images/rocky9-build.def"), tmp_path / "rootfs", fakeroot=True)
    assert calls == [
        [
            "/usr/bin/apptainer",
            "build",
            "--force",
            "--fakeroot",
            "--sandbox",
            str(tmp_path / "rootfs"),
            "base-images/rocky9-build.def",
        ]
    ]


def test_where_nothing_can_be_mounted_the_image_is_unpacked_for_the_block(base_sif, monkeypatch):
    """A user who is not root and may not open /dev/fuse (this machine's /dev/fuse is
    root's alone): squashfuse failed and so did `dedal verify` ("looking for the benchmarks").
    The image (here a SIF, its partition at an offset) is unpacked instead, as Apptainer's
    --unsquash does, without device nodes, and removed after the block."""
    from dedal.adapters.runtime import common

    monkeypatch.setattr(common, "cannot_mount", lambda: True)
    with runtime.mounted(base_sif) as root:
        assert root is not None and (root / "etc" / "debian_version").read_text().startswith("13.")
        assert (root / "dev").is_dir() and not os.path.lexists(root / "dev" / "null")
        assert helpers.fuse_mounts() == []
    assert not root.exists()


def _tiny_squashfs(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "os-release").write_text("ID=tiny\n")
    image = tmp_path / "tiny.squashfs"
    squashfs.pack([tree], image)
    return image


def test_a_stop_signal_as_the_image_mount_dir_is_made_leaves_none(tmp_path: Path, monkeypatch) -> None:
    """SIGTERM right after `mounted`'s directory is made, before it is known to its removal
    (as Apptainer's private dirs): it goes all the same, and the stop comes after."""
    from dedal.errors import Interrupted, Signals

    image = _tiny_squashfs(tmp_path)
    made = _signal_after_mkdtemp(monkeypatch)
    with pytest.raises(Interrupted), Signals("test"):
        with runtime.mounted(image):
            pass
    assert made and "dedal-root-" in made[0] and not Path(made[0]).exists()


@pytest.mark.parametrize("kernel", [False, True], ids=["squashfuse", "kernel"])
def test_a_stop_signal_as_the_image_is_mounted_leaves_no_mount(tmp_path: Path, monkeypatch, kernel: bool) -> None:
    """SIGTERM after squashfuse (or mount) made the mount, before its caller heard which
    method: the mount was left, its directory could not be removed, and the error of that
    removal hid the stop. The kernel's mount table tells what is mounted there."""
    import signal

    from dedal.adapters.runtime import common
    from dedal.errors import Interrupted, Signals

    if kernel and os.geteuid() != 0:
        pytest.skip("a kernel squashfs mount needs root")
    image = _tiny_squashfs(tmp_path)
    points = []
    real = squashfs.mount

    def with_a_signal(image: Path, mountpoint: Path, **kwargs) -> str:  # noqa: ANN003
        points.append(mountpoint)
        real(image, mountpoint, kernel=kernel, **kwargs)
        assert common.mounted_under(mountpoint)
        os.kill(os.getpid(), signal.SIGTERM)
        return "never returned"

    monkeypatch.setattr(squashfs, "mount", with_a_signal)
    with pytest.raises(Interrupted), Signals("test"):
        with runtime.mounted(image):
            pass
    assert points and not common.mounted_under(points[0]) and not points[0].exists()
    assert helpers.fuse_mounts() == []
