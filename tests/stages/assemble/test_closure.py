"""The ELF closure check on image trees made of real ELF files (gcc here), without a
container runtime: what resolves, where, and the one error for what does not."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dedal.errors import UserError
from dedal.stages.assemble.closure import (
    check_closure,
    elf_closure,
    host_driver_library,
    ld_so_conf_dirs,
    library_path_of,
    require_closure,
)

TRIPLET = "usr/lib/x86_64-linux-gnu"


def gcc(*args: str) -> None:
    if shutil.which("gcc") is None:
        pytest.fail("gcc is not installed (run ./setup.sh)")
    subprocess.run(["gcc", *args], check=True, capture_output=True)


def make_lib(
    srcdir: Path, out: Path, name: str, *link: str, soname: str = "", rpath: str = "", new_dtags: bool = True
) -> Path:
    """A shared library ``out/name`` without libc (-nostdlib: only the DT_NEEDED we ask for),
    its source in ``srcdir`` (outside the image tree)."""
    srcdir.mkdir(parents=True, exist_ok=True)
    src = srcdir / f"{name}.c"
    src.write_text("int f(void) { return 0; }\n")
    out.mkdir(parents=True, exist_ok=True)
    args = ["-shared", "-fPIC", "-nostdlib", "-o", str(out / name), str(src), "-Wl,--no-as-needed"]
    if soname:
        args.append(f"-Wl,-soname,{soname}")
    if rpath:
        args.append(f"-Wl,{'--enable-new-dtags' if new_dtags else '--disable-new-dtags'},-rpath,{rpath}")
    gcc(*args, *link)
    return out / name


@pytest.fixture
def image(tmp_path) -> Path:
    """An image tree: a system library, an install root with two packages (one finds the
    other through $ORIGIN), a library needing the host driver's libcuda, one needing a
    library the image lacks, a view of symlinks, a directory from ld.so.conf.d."""
    root = tmp_path / "root"
    lib = functools.partial(make_lib, tmp_path / "src")
    stubs = tmp_path / "stubs"  # link-time only: never in the image
    cuda = lib(stubs, "libcuda.so.1", soname="libcuda.so.1")
    gone = lib(stubs, "libgone.so.2", soname="libgone.so.2")
    sysdep = lib(root / TRIPLET, "libsys.so.1", soname="libsys.so.1")
    sys_broken = lib(root / TRIPLET, "libsysbroken.so.1", str(gone), soname="libsysbroken.so.1")
    extra = lib(root / "opt/extra/lib", "libextra.so.1", soname="libextra.so.1")
    dep = lib(root / "opt/sw/dep-1.0-aaa/lib", "libdep.so.1", soname="libdep.so.1")
    lib(
        root / "opt/sw/app-1.0-bbb/lib",
        "libapp.so",
        str(dep),
        str(sysdep),
        str(cuda),
        str(extra),
        soname="libapp.so",
        rpath="$ORIGIN/../../dep-1.0-aaa/lib",
    )
    # DT_RPATH (Spack's default), the absolute install path of the image
    lib(
        root / "opt/sw/tool-1.0-ccc/lib",
        "libtool.so",
        str(dep),
        soname="libtool.so",
        rpath="/opt/sw/dep-1.0-aaa/lib",
        new_dtags=False,
    )
    lib(root / "opt/sw/bad-1.0-ddd/lib", "libbad.so", str(gone), str(sys_broken), soname="libbad.so")
    (root / "opt/view/lib").mkdir(parents=True)
    (root / "opt/view/lib/libapp.so").symlink_to("/opt/sw/app-1.0-bbb/lib/libapp.so")
    (root / "opt/sw/app-1.0-bbb/share").mkdir()
    (root / "opt/sw/app-1.0-bbb/share/readme").write_text("not ELF\n")
    (root / "etc/ld.so.conf.d").mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("# comment\ninclude /etc/ld.so.conf.d/*.conf\n")
    (root / "etc/ld.so.conf.d/extra.conf").write_text("/opt/extra/lib\n")
    return root


def test_closure_resolves_rpath_runpath_origin_ld_so_conf_and_reports_the_rest(image):
    report = check_closure(image, ["/opt/sw", "/opt/view"])
    # libbad misses libgone; the base's libsysbroken it loads misses it too (the chain is checked)
    assert report.missing == {
        "/opt/sw/bad-1.0-ddd/lib/libbad.so": ["libgone.so.2"],
        f"/{TRIPLET}/libsysbroken.so.1": ["libgone.so.2"],
    }
    assert report.host_driver == {"libcuda.so.1": 1}
    # app, dep, tool, bad under /opt/sw (the view's symlink is no second file), then the
    # system libraries they load: libsys, libextra, libsysbroken
    assert (report.elf_files, report.checked, report.foreign, report.unreadable) == (4, 7, 0, {})
    assert not report.ok
    with pytest.raises(UserError) as exc:
        require_closure(image, ["/opt/sw", "/opt/view"], arch="amd64", where="image t:latest")
    msg = exc.value.one_line()
    assert msg.startswith(
        "image t:latest: 2 ELF file(s) need libraries that are not in the image (libgone.so.2) "
        "and are not the host driver's: /opt/sw/bad-1.0-ddd/lib/libbad.so: libgone.so.2; "
    )
    assert "\n" not in msg


def test_the_closure_of_some_files_is_what_they_load(image):
    """What a slimmed copy of the image keeps for a program: it, then what it loads in turn,
    where the loader finds it (the view's symlink followed to the file)."""
    files, report = elf_closure(image, ["/opt/view/lib/libapp.so"])
    assert files == [
        "/opt/sw/app-1.0-bbb/lib/libapp.so",
        "/opt/sw/dep-1.0-aaa/lib/libdep.so.1",
        f"/{TRIPLET}/libsys.so.1",
        "/opt/extra/lib/libextra.so.1",
    ]
    assert report.ok and report.host_driver == {"libcuda.so.1": 1}
    assert report.opened == [
        "/opt/sw/dep-1.0-aaa/lib/libdep.so.1",
        f"/{TRIPLET}/libsys.so.1",
        "/opt/extra/lib/libextra.so.1",
    ]
    files, report = elf_closure(image, ["/opt/sw/bad-1.0-ddd/lib/libbad.so"])
    assert files == ["/opt/sw/bad-1.0-ddd/lib/libbad.so", f"/{TRIPLET}/libsysbroken.so.1"]
    assert sorted(report.missing) == ["/opt/sw/bad-1.0-ddd/lib/libbad.so", f"/{TRIPLET}/libsysbroken.so.1"]


def test_closure_of_a_complete_image_passes_and_is_logged(image, tmp_path):
    shutil.rmtree(image / "opt/sw/bad-1.0-ddd")
    log = tmp_path / "assemble.log"
    report = require_closure(image, ["/opt/sw", "/opt/view"], arch="amd64", where="image t", log=log)
    assert report.ok and report.checked == 5 and report.host_driver == {"libcuda.so.1": 1}
    assert "5 dynamically linked file(s) checked" in log.read_text() and "libcuda.so.1" in log.read_text()


def test_symlinks_resolve_inside_the_image_never_on_the_host(image):
    """An absolute symlink is the image's path: a library the host has (libc.so.6 here)
    does not count for the image."""
    (image / TRIPLET / "libsys.so.1").unlink()
    (image / TRIPLET / "libsys.so.1").symlink_to(f"/{TRIPLET}/libsys.so.1.0")  # dangling in the image
    assert os.path.exists(f"/{TRIPLET}/libc.so.6")
    (image / TRIPLET / "libc.so.6").symlink_to(f"/{TRIPLET}/libc.so.6.absent")
    report = check_closure(image, ["/opt/sw/app-1.0-bbb"])
    assert report.missing == {"/opt/sw/app-1.0-bbb/lib/libapp.so": ["libsys.so.1"]}


def test_a_library_of_another_class_does_not_count(image, tmp_path):
    """The loader passes over a library of another ELF class or machine: so does the check
    (here a 64-bit file's header rewritten as 32-bit)."""
    path = image / TRIPLET / "libsys.so.1"
    data = bytearray(path.read_bytes())
    data[4] = 1  # ELFCLASS32
    path.write_bytes(bytes(data))
    report = check_closure(image, ["/opt/sw/app-1.0-bbb"])
    assert report.missing == {"/opt/sw/app-1.0-bbb/lib/libapp.so": ["libsys.so.1"]}


def test_the_image_environments_library_path_counts(image):
    """A directory the image's environment puts on LD_LIBRARY_PATH is searched as the loader does."""
    shutil.move(str(image / "opt/sw/dep-1.0-aaa/lib/libdep.so.1"), str(image / "opt/extra/lib/libdep.so.1"))
    (image / "etc/ld.so.conf").unlink()
    assert check_closure(image, ["/opt/sw/app-1.0-bbb"]).missing == {
        "/opt/sw/app-1.0-bbb/lib/libapp.so": ["libdep.so.1", "libextra.so.1"]
    }
    script = (
        "#!/bin/sh\nexport PATH=/opt/view/bin\n"
        'export LD_LIBRARY_PATH=/opt/extra/lib"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n'
    )
    assert library_path_of(script) == ["/opt/extra/lib"]
    assert library_path_of("LD_LIBRARY_PATH=$HOME/x:/a//b:relative; export LD_LIBRARY_PATH\n") == ["/a/b"]
    assert check_closure(image, ["/opt/sw/app-1.0-bbb"], library_path=library_path_of(script)).ok


def test_files_of_another_machine_or_word_size_are_passed_over(image):
    """A 32-bit (multilib) or foreign-machine file in the install root is no program of the
    image: not checked, counted as foreign."""
    bad = image / "opt/sw/bad-1.0-ddd/lib/libbad.so"
    data = bytearray(bad.read_bytes())
    data[4] = 1  # ELFCLASS32
    bad.write_bytes(bytes(data))
    report = check_closure(image, ["/opt/sw/bad-1.0-ddd"])
    assert (report.foreign, report.checked, report.missing) == (1, 0, {})
    data[4], data[18:20] = 2, (190).to_bytes(2, "little")  # EM_CUDA: device code
    bad.write_bytes(bytes(data))
    assert check_closure(image, ["/opt/sw/bad-1.0-ddd"]).foreign == 1


def test_ld_so_conf_and_driver_names(tmp_path):
    (tmp_path / "etc/ld.so.conf.d").mkdir(parents=True)
    (tmp_path / "etc/ld.so.conf").write_text("include ld.so.conf.d/*.conf\n/opt/a/lib, /opt/b/lib=libc6\n")
    (tmp_path / "etc/ld.so.conf.d/x86_64-linux-gnu.conf").write_text(f"/usr/local/lib/x86_64-linux-gnu\n/{TRIPLET}\n")
    assert ld_so_conf_dirs(tmp_path) == ["/usr/local/lib/x86_64-linux-gnu", f"/{TRIPLET}", "/opt/a/lib", "/opt/b/lib"]
    assert ld_so_conf_dirs(tmp_path / "none") == []
    for name in ("libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1", "libEGL_nvidia.so.0"):
        assert host_driver_library(name), name
    for name in ("libcudart.so.12", "libnccl.so.2", "libc.so.6"):
        assert not host_driver_library(name), name


def test_the_cpu_base_is_closed(trixie_base):
    """The real debian-trixie base: every program and library of /usr finds its libraries."""
    report = check_closure(Path(trixie_base.rootfs_dir), ["/usr/bin", "/usr/lib/x86_64-linux-gnu/openmpi"])
    assert report.ok, report.missing
    assert report.checked > 100 and not report.host_driver
