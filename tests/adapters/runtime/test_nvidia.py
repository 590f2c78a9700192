"""GPU passthrough without a GPU: the host driver found (as Apptainer's --nv finds it) on a fake
driver tree, and bound by bwrap and Charliecloud into a tiny image.

The fake tree holds real shared libraries (built here with gcc, with the sonames of the
driver's: a ``libcuda.so.1`` whose ``cuDriverGetVersion`` answers 12040), ``/dev/nvidia*``
stand-ins, an ``nvidia-smi`` and an ICD file; its ld cache is made by the real ``ldconfig -r``
and read back with ``ldconfig -C ... -p``, as on a host. A program in the image dlopens
``libcuda.so.1`` the way the CUDA runtime does and prints the version it answers.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dedal.adapters.runtime import Bind, Request, bwrap, charliecloud, nvidia, run_in
from dedal.errors import UserError
from dedal.stages.assemble.apptainer_files import ENV_99_BASE
from tests.fixtures import base as helpers

X64 = "/usr/lib/x86_64-linux-gnu"
I386 = "/usr/lib/i386-linux-gnu"
DRIVER = "550.54.15"
CUDA_C = "int cuDriverGetVersion(int *v) { *v = 12040; return 0; }\n"
ML_C = "int nvmlInit_v2(void) { return 0; }\n"
PROBE_C = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { printf("dlopen failed: %s\n", dlerror()); return 1; }
    int (*get)(int *) = (int (*)(int *))dlsym(h, "cuDriverGetVersion");
    int v = 0;
    if (!get || get(&v) != 0) { printf("no cuDriverGetVersion\n"); return 1; }
    printf("cuDriverGetVersion %d\n", v);
    return 0;
}
"""
#: the device nodes of a driver host (regular files here: the tree is only read)
DEVICES = ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


def _gcc(src: str, out: Path, *args: str) -> None:
    c = out.parent / (out.name + ".c")
    c.write_text(src)
    subprocess.run(["gcc", *args, "-o", str(out), str(c)], check=True)
    c.unlink()


def _lib(dirpath: Path, stem: str, soname: str, src: str, *args: str) -> None:
    """``<stem>.so.<DRIVER>`` with ``soname``, and the symlinks a driver package installs."""
    dirpath.mkdir(parents=True, exist_ok=True)
    real = f"{stem}.so.{DRIVER}"
    _gcc(src, dirpath / real, "-shared", "-fPIC", f"-Wl,-soname,{soname}", *args)
    (dirpath / soname).symlink_to(real)


@pytest.fixture(scope="module")
def driver_tree(tmp_path_factory) -> Path:
    helpers.require_tools("gcc", "ldconfig")
    if os.geteuid() != 0:
        pytest.skip("ldconfig -r (the ld cache of the fake tree) chroots: needs root")
    root = tmp_path_factory.mktemp("nvhost")
    x64 = root / X64.lstrip("/")
    _lib(x64, "libcuda", "libcuda.so.1", CUDA_C)
    (x64 / "libcuda.so").symlink_to("libcuda.so.1")
    _lib(x64, "libnvidia-ml", "libnvidia-ml.so.1", ML_C)
    _lib(x64, "libnvidia-ptxjitcompiler", "libnvidia-ptxjitcompiler.so.1", ML_C)
    _lib(x64, "libnvidia-nvvm", "libnvidia-nvvm.so.4", ML_C)
    _lib(x64, "libz-not-nvidia", "libz-not-nvidia.so.1", ML_C)  # in the cache, not in nvliblist
    _lib(root / I386.lstrip("/"), "libcuda", "libcuda.so.1", CUDA_C, "-m32", "-nostdlib")
    (root / "etc").mkdir()
    (root / "etc/ld.so.conf").write_text(f"{I386}\n{X64}\n")
    subprocess.run(["ldconfig", "-r", str(root)], check=True)
    dev = root / "dev"
    dev.mkdir()
    for name in DEVICES:
        (dev / name).write_text("")
    (dev / "nvidia-caps").mkdir()
    (dev / "null").write_text("")
    smi = root / "usr/bin/nvidia-smi"
    smi.parent.mkdir(parents=True)
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI fake'\n")
    smi.chmod(0o755)
    icd = root / "usr/share/vulkan/icd.d/nvidia_icd.json"
    icd.parent.mkdir(parents=True)
    icd.write_text("{}\n")
    return root


@pytest.fixture(scope="module")
def tiny_image(tmp_path_factory) -> Path:
    """A directory image of /bin/sh, the C library, the probe and Apptainer's directories."""
    helpers.require_tools("gcc")
    root = tmp_path_factory.mktemp("tiny")
    for d in ("bin", "dev", "proc", "sys", "tmp", "run", "etc", "usr/bin", ".singularity.d/libs", ".singularity.d/env"):
        (root / d).mkdir(parents=True, exist_ok=True)
    _gcc(PROBE_C, root / "bin/probe")
    for exe in ("/bin/sh", str(root / "bin/probe")):
        out = subprocess.run(["ldd", exe], check=True, capture_output=True, text=True).stdout
        for lib in [w for w in out.split() if w.startswith("/")]:
            dst = root / lib.lstrip("/")
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(Path(lib).resolve(), dst)
    shutil.copy(Path("/bin/sh").resolve(), root / "bin/sh")
    (root / ".singularity.d/env/99-base.sh").write_text(ENV_99_BASE)
    for f in ("hosts", "resolv.conf", "passwd", "group"):
        (root / "etc" / f).write_text("")
    return root


def test_parse_ldconfig_as_apptainer_does():
    text = (
        "3 libs found in cache `/etc/ld.so.cache'\n"
        f"\tlibcuda.so.1 (libc6,x86-64) => {X64}/libcuda.so.1\n"
        f"\tlibcuda.so.1 (ELF) => {I386}/libcuda.so.1\n"
        f"\tlibnvidia-ml.so.1 (libc6,x86-64, OS ABI: Linux 3.2.0) => {X64}/libnvidia-ml.so.1\n"
        "Cache generated by: ldconfig (Debian GLIBC 2.36-9+deb12u14) stable release version 2.36\n"
    )
    assert nvidia.parse_ldconfig(text) == {
        "libcuda.so.1": [f"{X64}/libcuda.so.1", f"{I386}/libcuda.so.1"],
        "libnvidia-ml.so.1": [f"{X64}/libnvidia-ml.so.1"],
    }


def test_the_fake_tree_as_a_host(driver_tree):
    d = nvidia.find_driver(str(driver_tree), search_path="/usr/local/bin:/usr/bin")
    assert d.found and d.note == ""
    assert d.libraries == (
        (f"{X64}/libcuda.so.1", "libcuda.so.1"),
        (f"{X64}/libcuda.so", "libcuda.so"),
        (f"{X64}/libnvidia-ml.so.1", "libnvidia-ml.so.1"),
        (f"{X64}/libnvidia-nvvm.so.4", "libnvidia-nvvm.so.4"),
        (f"{X64}/libnvidia-ptxjitcompiler.so.1", "libnvidia-ptxjitcompiler.so.1"),
    )
    assert d.binaries == ("/usr/bin/nvidia-smi",)
    assert d.files == ("/usr/share/vulkan/icd.d/nvidia_icd.json",)
    assert d.devices == (
        "/dev/nvidia-caps",
        "/dev/nvidia-modeset",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidiactl",
    )
    binds = {b.target: (b.src, b.readonly) for b in d.binds()}
    assert binds["/.singularity.d/libs/libcuda.so.1"] == (f"{driver_tree}{X64}/libcuda.so.1", True)
    assert binds["/usr/bin/nvidia-smi"] == (f"{driver_tree}/usr/bin/nvidia-smi", True)
    assert (
        binds["/usr/share/vulkan/icd.d/nvidia_icd.json"][0] == f"{driver_tree}/usr/share/vulkan/icd.d/nvidia_icd.json"
    )
    assert len(binds) == 7


def test_the_library_of_another_architecture_is_passed_over(driver_tree):
    """A multiarch host lists a 32-bit libcuda.so.1 too: the first path of this process's ELF class and machine wins."""
    listing = f"\tlibcuda.so.1 (libc6) => {I386}/libcuda.so.1\n\tlibcuda.so.1 (libc6,x86-64) => {X64}/libcuda.so.1\n"
    cache = nvidia.parse_ldconfig(listing)
    assert nvidia.own_elf_id() == (2, 62)  # x86_64, as the fake tree's 64-bit libraries
    assert nvidia.resolve_libraries(cache, ["libcuda.so"], root=str(driver_tree)) == [
        (f"{X64}/libcuda.so.1", "libcuda.so.1")
    ]
    assert nvidia.resolve_libraries(cache, ["libcuda.so"], root=str(driver_tree), want=(1, 3)) == [
        (f"{I386}/libcuda.so.1", "libcuda.so.1")
    ]


def test_no_driver_binds_nothing_with_one_note(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/null").write_text("")
    d = nvidia.find_driver(str(tmp_path), ldconfig_text="")
    assert not d.found and d.binds() == [] and d.devices == ()
    assert d.note.startswith("no NVIDIA driver on this host")
    # without a cache file to read, the note says so too
    assert "ld.so.cache does not exist" in nvidia.find_driver(str(tmp_path)).note
    # bwrap's command line gains nothing from it
    plain = bwrap.command(tmp_path, Request(["true"]), devices=False, host_files=False)
    assert (
        bwrap.command(tmp_path, Request(["true"], nv=True), driver=d, devices=False, host_files=False).argv
        == plain.argv
    )


def test_vendor_neutral_libraries_alone_are_no_driver(driver_tree, tmp_path):
    """A desktop host without NVIDIA has GLVND's libGL and the OpenCL loader (from Mesa), which
    nvliblist.conf names too: no driver, nothing bound."""
    (tmp_path / X64.lstrip("/")).mkdir(parents=True)
    for name in ("libGL.so.1", "libOpenCL.so.1"):
        shutil.copy(driver_tree / X64.lstrip("/") / f"libnvidia-ml.so.{DRIVER}", tmp_path / X64.lstrip("/") / name)
    listing = "".join(f"\t{n} (libc6,x86-64) => {X64}/{n}\n" for n in ("libGL.so.1", "libOpenCL.so.1"))
    d = nvidia.find_driver(str(tmp_path), ldconfig_text=listing)
    assert not d.found and d.binds() == []
    assert "no NVIDIA driver" in d.note and "vendor-neutral libGL, libOpenCL" in d.note
    # next to the driver's own library they are bound, as Apptainer binds them
    with_cuda = listing + f"\tlibcuda.so.1 (libc6,x86-64) => {X64}/libcuda.so.1\n"
    shutil.copy(driver_tree / X64.lstrip("/") / f"libcuda.so.{DRIVER}", tmp_path / X64.lstrip("/") / "libcuda.so.1")
    names = [n for _, n in nvidia.find_driver(str(tmp_path), ldconfig_text=with_cuda).libraries]
    assert names == ["libcuda.so.1", "libGL.so.1", "libOpenCL.so.1"]


def test_half_a_driver_is_named(driver_tree, tmp_path):
    nodes = tmp_path / "nodes"
    (nodes / "dev").mkdir(parents=True)
    (nodes / "dev/nvidiactl").write_text("")
    only_nodes = nvidia.find_driver(str(nodes), ldconfig_text="")
    assert only_nodes.found and only_nodes.libraries == () and "no driver libraries" in only_nodes.note
    libs = tmp_path / "libs"
    (libs / X64.lstrip("/")).mkdir(parents=True)
    shutil.copy(driver_tree / X64.lstrip("/") / f"libcuda.so.{DRIVER}", libs / X64.lstrip("/") / "libcuda.so.1")
    only_libs = nvidia.find_driver(str(libs), ldconfig_text=f"\tlibcuda.so.1 (libc6,x86-64) => {X64}/libcuda.so.1\n")
    assert only_libs.libraries == ((f"{X64}/libcuda.so.1", "libcuda.so.1"),) and only_libs.devices == ()
    assert "no /dev/nvidia* device nodes" in only_libs.note


def test_host_driver_logs_its_note_once(monkeypatch, caplog, tmp_path):
    monkeypatch.setattr(nvidia, "find_driver", lambda root="/": nvidia.HostDriver(root, note="no NVIDIA driver here"))
    nvidia.host_driver.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="dedal.runtime"):
            assert nvidia.host_driver() is nvidia.host_driver()
        assert [r.getMessage() for r in caplog.records] == ["note: no NVIDIA driver here"]
    finally:
        nvidia.host_driver.cache_clear()


def test_bwrap_command_line(driver_tree, tiny_image, tmp_path):
    helpers.require_tools("bwrap")
    d = nvidia.find_driver(str(driver_tree), search_path="/usr/bin")
    argv = bwrap.command(tiny_image, Request(["true"], nv=True), driver=d, scripts=[]).argv
    pairs = list(zip(argv, argv[1:], argv[2:]))
    real_cuda = str((driver_tree / X64.lstrip("/") / f"libcuda.so.{DRIVER}"))
    assert ("--ro-bind", real_cuda, "/.singularity.d/libs/libcuda.so.1") in pairs
    assert ("--ro-bind", str(driver_tree / "usr/bin/nvidia-smi"), "/usr/bin/nvidia-smi") in pairs
    assert ("--dev-bind", str(driver_tree / "dev/nvidia0"), "/dev/nvidia0") in pairs
    assert ("--dev-bind", str(driver_tree / "dev/nvidia-uvm-tools"), "/dev/nvidia-uvm-tools") in pairs
    # an image without 99-base.sh gets the libraries' directory on LD_LIBRARY_PATH from bwrap itself
    assert ("--setenv", "LD_LIBRARY_PATH", "/.singularity.d/libs") in pairs
    with_base = bwrap.command(
        tiny_image, Request(["true"], nv=True), driver=d, scripts=["/.singularity.d/env/99-base.sh"]
    ).argv
    assert "LD_LIBRARY_PATH" not in with_base
    # a caller's own bind of a driver path wins
    mine = tmp_path / "my-smi"
    mine.write_text("")
    own = bwrap.command(tiny_image, Request(["true"], [Bind(mine, "/usr/bin/nvidia-smi")], nv=True), driver=d).argv
    assert [a for a in own if a == "/usr/bin/nvidia-smi"] == ["/usr/bin/nvidia-smi"]


@pytest.mark.parametrize("backend", ["bwrap", "charliecloud"])
def test_a_cuda_program_finds_the_driver_in_the_image(backend, driver_tree, tiny_image, monkeypatch):
    """The driver's libcuda.so.1 answers inside the image, through /.singularity.d/libs and 99-base.sh."""
    helpers.require_tools({"bwrap": "bwrap", "charliecloud": "ch-run"}[backend])
    d = nvidia.find_driver(str(driver_tree), search_path="/usr/bin")
    monkeypatch.setattr(nvidia, "host_driver", lambda: d)
    out = run_in(
        tiny_image, ["/bin/sh", "-c", "/bin/probe; echo LD_LIBRARY_PATH=$LD_LIBRARY_PATH"], runtime=backend, nv=True
    ).stdout
    assert "cuDriverGetVersion 12040" in out
    assert "LD_LIBRARY_PATH=/.singularity.d/libs" in out
    # without nv the same program finds no driver
    res = run_in(tiny_image, ["/bin/probe"], runtime=backend, check=False)
    assert res.returncode == 1 and "dlopen failed: libcuda.so.1" in res.stdout


def test_charliecloud_binds_copies_made_once(driver_tree, tiny_image, monkeypatch):
    """ch-run's binds are writable: it gets copies of the driver's files, made once per process and
    removed at its exit, never the host's own files."""
    helpers.require_tools("ch-run")
    d = nvidia.find_driver(str(driver_tree), search_path="/usr/bin")
    monkeypatch.setattr(nvidia, "host_driver", lambda: d)
    charliecloud.remove_staged()
    for _ in range(2):
        run_in(tiny_image, ["/bin/probe"], runtime="charliecloud", nv=True)
    assert len(charliecloud._STAGED) == 1
    stage = charliecloud._STAGED[d]
    host = driver_tree / X64.lstrip("/") / f"libcuda.so.{DRIVER}"
    copy = stage / "libs" / "libcuda.so.1"
    assert copy.read_bytes() == host.read_bytes() and copy.stat().st_ino != host.stat().st_ino
    # a write from inside lands in the copy
    run_in(
        tiny_image,
        ["/bin/sh", "-c", "echo x > /.singularity.d/libs/libnvidia-ml.so.1"],
        runtime="charliecloud",
        nv=True,
    )
    assert (stage / "libs/libnvidia-ml.so.1").read_text() == "x\n"
    assert (driver_tree / X64.lstrip("/") / f"libnvidia-ml.so.{DRIVER}").read_bytes()[:4] == b"\x7fELF"
    charliecloud.remove_staged()
    assert not stage.exists() and charliecloud._STAGED == {}


def test_charliecloud_needs_the_libs_directory(driver_tree, tmp_path, monkeypatch):
    helpers.require_tools("ch-run")
    bare = tmp_path / "bare"
    (bare / "bin").mkdir(parents=True)
    d = nvidia.find_driver(str(driver_tree), search_path="/usr/bin")
    monkeypatch.setattr(nvidia, "host_driver", lambda: d)
    with pytest.raises(UserError, match=r"has no /\.singularity\.d/libs .*use runtime bwrap"):
        run_in(bare, ["/bin/true"], runtime="charliecloud", nv=True)


def test_charliecloud_leaves_out_what_the_image_has_no_place_for(driver_tree, tiny_image, monkeypatch, caplog):
    """ch-run binds only onto existing files: nvidia-smi and the ICD file are named in one note."""
    helpers.require_tools("ch-run")
    d = nvidia.find_driver(str(driver_tree), search_path="/usr/bin")
    monkeypatch.setattr(nvidia, "host_driver", lambda: d)
    monkeypatch.setattr(charliecloud, "_NOTED", set())  # the note is logged once per process
    with caplog.at_level(logging.WARNING, logger="dedal.runtime"):
        for _ in range(2):
            out = run_in(
                tiny_image, ["/bin/sh", "-c", "echo /.singularity.d/libs/*"], runtime="charliecloud", nv=True
            ).stdout
    names = sorted(os.path.basename(p) for p in out.split())
    assert names == sorted(name for _, name in d.libraries)
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 1 and "/usr/bin/nvidia-smi" in notes[0] and "nvidia_icd.json" in notes[0]


def test_ldconfig_of_this_host_is_read():
    """The host's own cache through the same path (whatever it holds, the C library is in it)."""
    text, problem = nvidia.ldconfig_listing("/")
    assert problem == "" and "libc.so.6" in nvidia.parse_ldconfig(text)


def test_charliecloud_binds_a_copy_of_a_binary_where_the_image_has_a_place(
    driver_tree, tiny_image, tmp_path, monkeypatch
):
    helpers.require_tools("ch-run")
    image = tmp_path / "img"
    shutil.copytree(tiny_image, image, symlinks=True)
    (image / "usr/bin/nvidia-smi").write_text("")  # a mount point for it
    d = nvidia.find_driver(str(driver_tree), search_path="/usr/bin")
    monkeypatch.setattr(nvidia, "host_driver", lambda: d)
    out = run_in(
        image, ["/bin/sh", "-c", "/usr/bin/nvidia-smi; echo y > /usr/bin/nvidia-smi"], runtime="charliecloud", nv=True
    ).stdout
    assert out.strip() == "NVIDIA-SMI fake"
    assert (driver_tree / "usr/bin/nvidia-smi").read_text().startswith("#!/bin/sh")  # the host's own is untouched
    charliecloud.remove_staged()
