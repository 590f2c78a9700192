"""A pulled image's root file system gets the entry audit before it is stored (issue 39,
Deliver: "the same entry audit as assemble ... whatever its source (... a pulled image)").

Hand-made SIFs, each a small Debian-like root (setuid ``/usr/bin/su``, sticky ``/tmp``,
``/dev/null``, a layer under the install root its labels name, the view's absolute
symlink into it) with one hostile entry, are published to the test registry and pulled
with ``dedal pull``: the plain one is stored, each hostile one is refused with one line
naming the entry, exit 2, and nothing is left in the output directory."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable, Optional, Sequence, Tuple

import pytest

from dedal.model import sif
from dedal.stages import publish as pub
from dedal.stages.publish import Access
from dedal.stages.layer_audit import image_entry_problem

IR = "/opt/esd/software"
LABELS = {"dedal.env": "hostile", "dedal.tag": "v1", "dedal.install_root": IR}
PKG = "opt/esd/software/pkg-1.0-abcdefg"


def _root(tmp: Path, name: str, shape: Callable[[Path], None]) -> Path:
    root = tmp / f"{name}-root"
    (root / "usr" / "bin").mkdir(parents=True)
    su = root / "usr" / "bin" / "su"
    su.write_bytes(b"\x7fELF su")
    os.chmod(su, 0o4755)
    (root / "tmp").mkdir()
    os.chmod(root / "tmp", 0o1777)
    (root / "dev").mkdir()
    (root / PKG / "bin").mkdir(parents=True)
    (root / PKG / "bin" / "tool").write_text("#!/bin/sh\n")
    (root / PKG / "lib").symlink_to("bin")
    (root / "opt" / "view").symlink_to("/" + PKG)
    (root / "etc").mkdir()
    (root / "etc" / "localtime").symlink_to("../usr/share/zoneinfo/UTC")
    shape(root)
    os.chmod(root, 0o755)
    return root


def _image(
    tmp: Path,
    name: str,
    shape: Callable[[Path], None] = lambda root: None,
    pseudo: Sequence[str] = (),
    patch: Optional[Tuple[bytes, bytes]] = None,
    labels: Optional[dict] = None,
) -> Path:
    """A SIF of :func:`_root` shaped by ``shape``, mksquashfs pseudo entries (device
    nodes) added, and the bytes ``patch[0]`` (one name, once) replaced by ``patch[1]``."""
    part = tmp / f"{name}.sqfs"
    cmd = [
        "mksquashfs",
        str(_root(tmp, name, shape)),
        str(part),
        "-noappend",
        "-all-root",
        "-quiet",
        "-no-progress",
        "-noI",
        "-noD",
        "-noF",
        "-noX",
        "-p",
        "dev/null c 666 root root 1 3",
    ]
    for p in pseudo:
        cmd += ["-p", p]
    subprocess.run(cmd, check=True, capture_output=True)
    if patch:
        raw = part.read_bytes()
        assert raw.count(patch[0]) == 1
        part.write_bytes(raw.replace(patch[0], patch[1]))
    out = tmp / f"{name}.sif"
    lab = LABELS if labels is None else labels
    sif.write_sif(
        out,
        part,
        definition="Bootstrap: dedal\n",
        labels=lab,
        metadata={"data": {"attributes": {"labels": lab}}},
        created=1700000000,
    )
    return out


def _setuid(rel: str, mode: int = 0o4755) -> Callable[[Path], None]:
    def shape(root: Path) -> None:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"\x7fELF")
        os.chmod(p, mode)

    return shape


def _world_writable(root: Path) -> None:
    (root / "var" / "drop").mkdir(parents=True)
    os.chmod(root / "var" / "drop", 0o777)


def _symlink(rel: str, target: str) -> Callable[[Path], None]:
    def shape(root: Path) -> None:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).symlink_to(target)

    return shape


HOSTILE = [
    (
        "setuid-opt",
        dict(shape=_setuid("opt/tools/rootme")),
        "'/opt/tools/rootme' is setuid (-rwsr-xr-x), outside the system's program directories",
    ),
    ("setuid-pkg", dict(shape=_setuid(f"{PKG}/bin/sh")), f"'/{PKG}/bin/sh' is setuid"),
    ("setgid-home", dict(shape=_setuid("home/x/g", 0o2755)), "'/home/x/g' is setgid (-rwxr-sr-x)"),
    ("blockdev", dict(pseudo=["dev/sda b 660 root root 8 0"]), "'/dev/sda' is a device node"),
    ("memdev", dict(pseudo=["dev/mem c 640 root root 1 1"]), "'/dev/mem' is a device node other than /dev's harmless"),
    ("fakenull", dict(pseudo=["opt/null c 666 root root 1 3"]), "'/opt/null' is a device node"),
    ("fifo", dict(shape=lambda root: os.mkfifo(root / "tmp" / "pipe")), "'/tmp/pipe' is a FIFO"),
    ("wwdir", dict(shape=_world_writable), "directory '/var/drop' is world-writable without the sticky bit"),
    (
        "shadowlink",
        dict(shape=_symlink(f"{PKG}/etc-shadow", "/etc/shadow")),
        f"symlink /{PKG}/etc-shadow -> /etc/shadow points outside the install root {IR}",
    ),
    (
        "climb-ir",
        dict(shape=_symlink(f"{PKG}/up", "../../../../etc")),
        f"symlink /{PKG}/up -> ../../../../etc escapes the install root {IR}",
    ),
    (
        "climb-root",
        dict(shape=_symlink("etc/host", "../../../../etc/passwd")),
        "symlink /etc/host -> ../../../../etc/passwd climbs out of the image's root",
    ),
    # unsquashfs refuses to list a name '..' (image_entry_rules covers the listing that shows one)
    (
        "dotdot",
        dict(shape=lambda root: (root / "etc" / "Q7").write_text("x"), patch=(b"Q7", b"..")),
        "unreadable root file system (unsquashfs -lls exited with code 1: ",
    ),
    ("linebreak", dict(shape=lambda root: (root / "etc" / "a\nb").write_text("x")), "line break"),
    ("badroot", dict(labels={**LABELS, "dedal.install_root": "/"}), "its labels name install root '/'"),
]


@pytest.mark.reliability
@pytest.mark.parametrize(
    "entry,install_root,problem",
    [
        ({"path": "usr/bin/su", "mode": "-rwsr-xr-x"}, IR, None),
        ({"path": "usr/lib/openssh/ssh-keysign", "mode": "-rwsr-xr-x"}, IR, None),
        ({"path": "usr/sbin/unix_chkpwd", "mode": "-rwxr-sr-x"}, None, None),
        ({"path": "usr/local/bin/su", "mode": "-rwsr-xr-x"}, IR, "setuid"),
        ({"path": "usr/binx/su", "mode": "-rwsr-xr-x"}, IR, "setuid"),
        ({"path": "opt/esd/software/p/bin/su", "mode": "-rwsr-xr-x"}, IR, "setuid"),
        ({"path": "usr/bin/su", "mode": "-rwsr-xr-xx"}, IR, "unreadable mode"),
        ({"path": "dev/null", "mode": "crw-rw-rw-", "size": "1,3"}, IR, None),
        ({"path": "dev/null", "mode": "crw-rw-rw-", "size": "1,1"}, IR, "device node"),
        ({"path": "dev/ttyS0", "mode": "crw-rw----", "size": "4,64"}, IR, "device node"),
        ({"path": "tmp", "mode": "drwxrwxrwt"}, IR, None),
        ({"path": "tmp", "mode": "drwxrwxrwx"}, IR, "world-writable"),
        ({"path": "var/mail", "mode": "drwxrwsr-x"}, IR, None),
        ({"path": "etc/alternatives/awk", "mode": "lrwxrwxrwx", "target": "/usr/bin/mawk"}, IR, None),
        ({"path": "lib64", "mode": "lrwxrwxrwx", "target": "usr/lib64"}, IR, None),
        ({"path": "a/b", "mode": "lrwxrwxrwx", "target": "../x"}, IR, None),
        ({"path": "a/b", "mode": "lrwxrwxrwx", "target": "../../x"}, IR, "climbs out"),
        ({"path": "a/b", "mode": "lrwxrwxrwx", "target": "./../c/../../x"}, IR, "climbs out"),
        ({"path": "opt/view", "mode": "lrwxrwxrwx", "target": "/opt/._view/abc"}, IR, None),
        ({"path": "opt/esd/software/p/lib", "mode": "lrwxrwxrwx", "target": "/opt/esd/software/q/lib"}, IR, None),
        (
            {"path": "opt/esd/software/p/py", "mode": "lrwxrwxrwx", "target": "/usr/bin/python3"},
            IR,
            "outside the install",
        ),
        ({"path": "opt/esd/software/p/py", "mode": "lrwxrwxrwx", "target": "/usr/bin/python3"}, None, None),
        ({"path": "etc/..", "mode": "-rw-r--r--"}, IR, "outside the image's root"),
        ({"path": "etc/x\ny", "mode": "-rw-r--r--"}, IR, "line break"),
    ],
)
def test_image_entry_rules(entry: dict, install_root: Optional[str], problem: Optional[str]) -> None:
    found = image_entry_problem(entry, install_root)
    assert (found is None) if problem is None else (found is not None and problem in found), found


@pytest.mark.registry
@pytest.mark.reliability
def test_a_debian_like_root_is_pulled_and_its_entries_counted(run_dedal, registry, tmp_path):
    image = _image(tmp_path, "plain")
    ref = registry.ref("esd/audit:plain")
    pub.publish(image, [ref], access=Access(insecure=True))
    out = tmp_path / "pulled"
    out.mkdir()
    r = run_dedal("pull", ref, "-o", str(out / "plain.sif"))
    assert r.returncode == 0, r.stderr
    assert "), verified; 16 entries audited" in r.stdout.splitlines()[1], r.stdout  # 16: _root's entries
    assert (out / "plain.sif").read_bytes() == image.read_bytes()


@pytest.mark.registry
@pytest.mark.reliability
def test_hostile_images_are_refused_and_nothing_is_left(run_dedal, registry, tmp_path):
    for name, how, expect in HOSTILE:
        ref = registry.ref(f"esd/audit:{name}")
        pub.publish(_image(tmp_path, name, **how), [ref], access=Access(insecure=True))
        out = tmp_path / f"out-{name}"
        out.mkdir()
        r = run_dedal("pull", ref, "-o", str(out / "image.sif"))
        lines = [line for line in r.stderr.strip().splitlines() if not line.startswith("[")]  # not progress
        assert r.returncode == 2 and len(lines) == 1, (name, r.stderr)
        assert lines[0].startswith(f"dedal: error: {ref}: ") and expect in lines[0], (name, lines[0])
        assert "refused: " in lines[0] or "invalid characters in name" in lines[0], lines[0]
        assert lines[0].endswith("; nothing written") and ".tmp~" not in lines[0], lines[0]
        assert list(out.iterdir()) == [], name


@pytest.mark.registry
@pytest.mark.reliability
def test_a_corrupt_root_file_system_is_one_line(run_dedal, registry, tmp_path):
    image = _image(tmp_path, "corrupt")
    data = bytearray(image.read_bytes())
    part = sif.primary_partition(sif.read_sif(image))
    data[part.offset + 96 : part.offset + part.size] = b"\xff" * (part.size - 96)  # all but the superblock
    image.write_bytes(bytes(data))
    ref = registry.ref("esd/audit:corrupt")
    pub.publish(image, [ref], access=Access(insecure=True))
    out = tmp_path / "out"
    out.mkdir()
    r = run_dedal("pull", ref, "-o", str(out / "image.sif"))
    lines = [line for line in r.stderr.strip().splitlines() if not line.startswith("[")]  # not progress
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith(
        f"dedal: error: {ref}: unreadable root file system (unsquashfs -lls exited with code "
    ), lines[0]
    assert str(out) not in lines[0] and list(out.iterdir()) == []
