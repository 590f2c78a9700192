"""The runtime seam against the real debian-trixie base: directory, squashfs and SIF roots,
bwrap and Charliecloud, binds onto paths the image lacks, the image environment, MPI."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from dedal.adapters import runtime
from dedal.adapters.runtime import Bind
from dedal.errors import ToolError, UserError
from dedal.model.config import SETTINGS
from tests.base import helpers

UCX = ["--mca", "pml", "ucx", "--mca", "pml_ucx_tls", "any", "--mca", "pml_ucx_devices", "any"]


@pytest.fixture(params=["dir", "squashfs", "sif"])
def root(request, trixie_base, base_sif):
    return {"dir": trixie_base.rootfs_dir, "squashfs": trixie_base.squashfs, "sif": base_sif}[request.param]


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


def test_standard_environment(root, monkeypatch):
    monkeypatch.setenv("DEDAL_LEAK_CHECK", "secret")
    out = runtime.run_in(root, ["sh", "-c", "env; echo CWD=$(pwd); cat /etc/hosts; ls -ld /tmp; "
                                             "touch /tmp/x && echo tmp-writable; ls /sys/devices/system/cpu | head -1"],
                         env={"FOO": "a b $c"}, runtime="bwrap").stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line and not line.startswith("CWD"))
    assert "DEDAL_LEAK_CHECK" not in env  # clean environment
    assert env["FOO"] == "a b $c" and env["LANG"] == "C.UTF-8"
    assert env["PATH"].startswith("/usr/local/sbin")
    if os.geteuid() == 0:
        assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    assert "localhost" in out  # the host's /etc/hosts although minbase has none
    assert "drwxrwxrwt" in out and "tmp-writable" in out
    assert "cpu" in out  # /sys is there (hwloc needs it)


def test_bind_onto_missing_path_of_read_only_root(root, trixie_base, tmp_path):
    """The fixed install root /opt/esd/software does not exist in the base: it is created in
    the sandbox's own view, the root itself stays untouched."""
    store = tmp_path / "store"
    (store / "pkg").mkdir(parents=True)
    (store / "pkg" / "file").write_text("from the host\n")
    out = runtime.run_in(root, ["sh", "-c", "cat /opt/esd/software/pkg/file; ls -ld /opt/esd; "
                                             "echo new > /opt/esd/software/pkg/made-inside; ls /usr/bin/mpirun"],
                         binds=[Bind(store, "/opt/esd/software")], runtime="bwrap").stdout
    assert "from the host" in out and "drwxr-xr-x" in out and "/usr/bin/mpirun" in out
    assert (store / "pkg" / "made-inside").read_text() == "new\n"
    assert not (trixie_base.rootfs_dir / "opt" / "esd").exists()
    assert not (trixie_base.rootfs_dir / "etc" / "hosts").exists()


def test_readonly_bind_and_missing_source(trixie_base, tmp_path):
    (tmp_path / "f").write_text("x")
    r = runtime.run_in(trixie_base.rootfs_dir, ["sh", "-c", "echo y > /data/f"], binds=[Bind(tmp_path, "/data", True)],
                       runtime="bwrap", check=False)
    assert r.returncode != 0 and (tmp_path / "f").read_text() == "x"
    with pytest.raises(UserError, match="bind source .* does not exist"):
        runtime.run_in(trixie_base.rootfs_dir, ["true"], binds=[Bind(tmp_path / "nope", "/x")], runtime="bwrap")


def test_bind_under_dev_shm_and_tmp(trixie_base, tmp_path):
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "f").write_text("staged")
    out = runtime.run_in(trixie_base.rootfs_dir, ["sh", "-c", "cat /dev/shm/dedal-stage/f /tmp/s/f"],
                         binds=[Bind(stage, "/dev/shm/dedal-stage"), Bind(stage, "/tmp/s")], runtime="bwrap").stdout
    assert out == "stagedstaged"


def test_image_env_scripts_order(tmp_path):
    img = tmp_path / "img"
    envd = img / ".singularity.d" / "env"
    envd.mkdir(parents=True)
    for name in ("90-environment.sh", "10-early.sh", "99-runtimevars.sh", "README"):
        (envd / name).write_text("true\n")
    assert runtime.image_env_scripts(img) == ["/.singularity.d/env/10-early.sh",
                                              "/.singularity.d/env/90-environment.sh",
                                              "/.singularity.d/env/99-runtimevars.sh"]
    assert runtime.image_env_scripts(tmp_path) == [] and runtime.image_env_scripts(None) == []
    cmd = runtime.wrap_with_image_env(["printenv", "A B"], ["/.singularity.d/env/10-early.sh"], {"K": "it's"})
    assert cmd[:2] == ["/bin/sh", "-c"] and cmd[-2:] == ["printenv", "A B"]
    assert "export K='it'\"'\"'s'" in cmd[2]


def test_image_env_from_sif(trixie_base, tmp_path):
    """A SIF whose squashfs carries /.singularity.d/env scripts: they apply, the caller's env wins."""
    from dedal.model import sif

    extra = tmp_path / "extra"
    envd = extra / ".singularity.d" / "env"
    envd.mkdir(parents=True)
    (envd / "90-environment.sh").write_text("export IMG_A=image\nexport IMG_B=image\n"
                                            "export PATH=/opt/view/bin:$PATH\n")
    sq = tmp_path / "img.sqfs"
    shutil.copyfile(trixie_base.squashfs, sq)
    # append the env scripts to a copy of the base squashfs (mksquashfs appends when -noappend is absent)
    from dedal.adapters import proc

    proc.run(["mksquashfs", str(extra), str(sq), "-all-root", "-no-progress", "-quiet", "-mkfs-time", "0",
              "-all-time", "0"], what="mksquashfs append")
    img = tmp_path / "img.sif"
    sif.write_sif(img, sq, definition="x", labels={}, metadata={})
    out = runtime.run_in(img, ["sh", "-c", "echo $IMG_A $IMG_B $PATH"], env={"IMG_B": "caller"},
                         runtime="bwrap").stdout
    assert out.split() == ["image", "caller", "/opt/view/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]


def test_failure_is_a_tool_error_with_the_command(trixie_base, tmp_path):
    log = tmp_path / "run.log"
    with pytest.raises(ToolError) as exc:
        runtime.run_in(trixie_base.rootfs_dir, ["sh", "-c", "echo boom >&2; exit 7"], log=log, what="boom step",
                       runtime="bwrap")
    e = exc.value
    # the error names the command that ran inside; the log keeps the full sandbox command line
    assert e.returncode == 7 and e.what == "boom step" and e.log_path == log
    assert e.cmd == ["sh", "-c", "echo boom >&2; exit 7"] and e.detail == "boom"
    text = log.read_text()
    assert "boom" in text and text.startswith("$ ") and "bwrap" in text.splitlines()[0]
    r = runtime.run_in(trixie_base.rootfs_dir, ["sh", "-c", "exit 3"], runtime="bwrap", check=False)
    assert r.returncode == 3


def test_writable_root_rejected_for_images(trixie_base, base_sif):
    with pytest.raises(UserError, match="read-only"):
        runtime.run_in(base_sif, ["true"], writable=True)


def test_writable_directory_root_cleans_up_mount_points(trixie_base, tmp_path):
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
    runtime.run_in(root, ["sh", "-c", "echo made > /etc/made; test -f /etc/hosts; ls /opt/esd/software"],
                   binds=[Bind(store, "/opt/esd/software")], writable=True, runtime="bwrap")
    assert (root / "etc" / "made").read_text() == "made\n"
    assert not (root / "opt").exists() and not (root / "etc" / "hosts").exists()


def test_host_root_private_namespace(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / "marker").write_text("m")
    out = runtime.run_in(None, ["sh", "-c", "cat /opt/esd-test-only/software/marker; ls /usr/bin/bwrap"],
                         binds=[Bind(store, "/opt/esd-test-only/software")], runtime="bwrap").stdout
    assert out.startswith("m") and "/usr/bin/bwrap" in out
    assert not Path("/opt/esd-test-only").exists()  # the host was not touched


def test_mpirun_in_base_ucx_and_ob1(trixie_base, base_sif, mpi_hello):
    for root in (trixie_base.rootfs_dir, base_sif):
        for mca in (UCX, ["--mca", "pml", "ob1"]):
            out = runtime.run_in(root, ["mpirun", "-np", "2", *mca, "/work/hello"],
                                 binds=[Bind(mpi_hello, "/work")], runtime="bwrap", timeout=120).stdout
            lines = sorted(line for line in out.splitlines() if line.startswith("hello"))
            assert lines[0].startswith("hello 0/2 sum=1 Open MPI v5.0") and lines[1].startswith("hello 1/2 sum=1")


def test_start_in_runs_a_launcher_and_unmounts(base_sif, mpi_hello, tmp_path):
    log = tmp_path / "mpirun.log"
    with runtime.start_in(base_sif, ["mpirun", "-np", "2", *UCX, "/work/hello"], binds=[Bind(mpi_hello, "/work")],
                          log=log, runtime="bwrap") as running:
        assert running.wait(timeout=120) == 0
    assert log.read_text().count("hello ") == 2
    assert helpers.fuse_mounts() == []
    running = runtime.start_in(base_sif, ["sleep", "60"], runtime="bwrap")
    assert running.poll() is None
    assert running.stop(grace=5) != 0
    assert helpers.fuse_mounts() == []


@pytest.mark.parametrize("kind", ["dir", "squashfs", "sif"])
def test_charliecloud_backend(kind, trixie_base, base_sif, mpi_hello):
    helpers.require_tools("ch-run")
    root = {"dir": trixie_base.rootfs_dir, "squashfs": trixie_base.squashfs, "sif": base_sif}[kind]
    out = runtime.run_in(root, ["sh", "-c", "cat /etc/debian_version; echo $FOO; ls /mnt"],
                         binds=[Bind(mpi_hello, "/mnt")], env={"FOO": "b$r"}, runtime="charliecloud").stdout
    assert out.split() == [out.split()[0], "b$r", "hello", "hello.c"] and out.startswith("13.")
    out = runtime.run_in(root, ["mpirun", "-np", "2", *UCX, "/mnt/hello"], binds=[Bind(mpi_hello, "/mnt")],
                         runtime="charliecloud", timeout=120).stdout
    assert out.count("hello ") == 2
    with pytest.raises(UserError, match="ch-run cannot create bind mount points"):
        runtime.run_in(root, ["true"], binds=[Bind(mpi_hello, "/opt/esd/software")], runtime="charliecloud")
    assert helpers.fuse_mounts() == []


def test_apptainer_command_line(monkeypatch, tmp_path):
    """Apptainer is not installed here: the command line it would get."""
    monkeypatch.setattr(runtime.apptainer.proc, "which", lambda tool, hint="": f"/usr/bin/{tool}")
    prep = runtime.apptainer_command(Path("/img/x.sif"), ["mpirun", "-np", "2", "a.out"],
                                     binds=[Bind(tmp_path, "/opt/esd/software"), Bind(tmp_path, "/data", True)],
                                     env={"OMPI_MCA_pml": "ucx"}, cwd="/work", nv=True)
    argv = prep.argv
    assert argv[:4] == ["/usr/bin/apptainer", "exec", "--cleanenv", "--no-home"] and "--nv" in argv
    assert ["--bind", f"{tmp_path}:/opt/esd/software"] == argv[argv.index("--bind"):argv.index("--bind") + 2]
    assert f"{tmp_path}:/data:ro" in argv
    assert "OMPI_MCA_pml=ucx" in argv and "LANG=C.UTF-8" in argv
    assert not any(a.startswith("PATH=") for a in argv)  # the image's PATH applies
    assert argv[argv.index("--pwd") + 1] == "/work"
    assert argv[-4:] == ["/img/x.sif", "mpirun", "-np", "2", "a.out"][-4:] and "/img/x.sif" in argv
    monkeypatch.setattr(runtime.launch, "_have", lambda tool: tool == "apptainer")
    assert runtime.resolve_runtime("auto") == "apptainer"
    monkeypatch.setattr(runtime.launch, "_have", lambda tool: tool == "ch-run")
    assert runtime.resolve_runtime("auto") == "charliecloud"
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
    assert calls == [["/usr/bin/apptainer", "build", "--force", "--fakeroot", "--sandbox", str(tmp_path / "rootfs"),
                      "base-images/rocky9-build.def"]]
