"""The layer audit's rules on real squashfs layers (issue 22, items 1 and 3): setuid and
setgid files, world-writable directories without the sticky bit, FIFOs, sockets, device
nodes and names that break the listing are refused, in one line naming the entry; the
unpacking of an audited layer cannot be redirected by what lies in the destination.
The same rules before a layer is stored (a build's, a cache's) and for a whole store
(issue 39, item 1)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Callable, Sequence

import pytest

from dedal.errors import UserError
from dedal.model.layers import LayerManifest, LayerStore
from dedal.model.plan import PlanNode
from dedal.stages.layer_audit import audit_layer, audit_store, check_packed, prefix_problem, tree_entries, unpack_layer

pytestmark = pytest.mark.reliability

IR = "/opt/esd/software"
NODE = PlanNode(
    hash="h" * 32,
    name="pkg",
    version="1.0",
    namespace="builtin",
    external=False,
    build_only=False,
    runtime=True,
    status="cached",
    key="pkg-1.0-hhhhhhh-0123456789abcdef",
)
PREFIX = NODE.prefix_name


def make_layer(tmp: Path, shape: Callable[[Path], None], pseudo: Sequence[str] = ()) -> LayerStore:
    """A store holding NODE's layer: a prefix with bin/tool, shaped further by ``shape``."""
    src = tmp / "src" / PREFIX
    (src / "bin").mkdir(parents=True)
    (src / "bin" / "tool").write_text("#!/bin/sh\n")
    shape(src)
    store = LayerStore(tmp / "layers")
    store.ensure_writable()
    packed = store.temp_path(NODE.key)
    cmd = [
        "mksquashfs",
        str(src),
        str(packed),
        "-keep-as-directory",
        "-noappend",
        "-all-root",
        "-quiet",
        "-no-progress",
    ]
    for p in pseudo:
        cmd += ["-p", p]
    subprocess.run(cmd, check=True, capture_output=True)
    man = LayerManifest(
        key=NODE.key,
        name=NODE.name,
        version=NODE.version,
        hash=NODE.hash,
        namespace="builtin",
        prefix=PREFIX,
        install_root=IR,
        base_id="b",
    )
    store.add(man, packed)
    return store


def refused(store: LayerStore) -> str:
    with pytest.raises(UserError) as err:
        audit_layer(NODE, store, IR)
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"layer {NODE.key} (pkg@1.0/hhhhhhh): refused: "), text
    return text


def _chmod(rel: str, mode: int, make_dir: bool = False) -> Callable[[Path], None]:
    def shape(src: Path) -> None:
        p = src / rel
        if make_dir:
            p.mkdir()
        else:
            p.write_text("x")
        os.chmod(p, mode)

    return shape


@pytest.mark.parametrize(
    "shape,expect",
    [
        (_chmod("bin/su", 0o4755), "is setuid"),
        (_chmod("bin/sg", 0o2755), "is setgid"),
        (_chmod("shared", 0o777, make_dir=True), "world-writable without the sticky bit"),
        (lambda src: os.mkfifo(src / "fifo"), "is a FIFO"),
    ],
)
def test_refused_entries(tmp_path: Path, shape: Callable[[Path], None], expect: str) -> None:
    assert expect in refused(make_layer(tmp_path, shape))


def test_socket_is_refused(tmp_path: Path) -> None:
    def shape(src: Path) -> None:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(src / "sock"))
        s.close()

    assert "is a socket" in refused(make_layer(tmp_path, shape))


def test_device_node_is_refused(tmp_path: Path) -> None:
    store = make_layer(tmp_path, lambda src: None, pseudo=[f"{PREFIX}/null c 666 root root 1 3"])
    assert "is a device node" in refused(store)


def test_sticky_world_writable_dir_and_setgid_dir_pass(tmp_path: Path) -> None:
    def shape(src: Path) -> None:
        (src / "tmp").mkdir()
        os.chmod(src / "tmp", 0o1777)
        (src / "share").mkdir()
        os.chmod(src / "share", 0o2755)  # group inheritance, as a setgid build directory gives

    store = make_layer(tmp_path, shape)
    info = audit_layer(NODE, store, IR)
    assert info.files >= 5 and info.sha256 == store.manifest(NODE.key).sha256


def test_a_name_with_a_line_break_cannot_hide_an_entry(tmp_path: Path) -> None:
    """``unsquashfs -lls`` prints one line per entry: a name holding a line break would leave
    its second half unparsed (and its symlink target hidden); the audit refuses it."""
    store = make_layer(tmp_path, lambda src: os.symlink("/etc", src / "bin" / "n -> ok\nrest"))
    assert "line break" in refused(store)


def test_a_swapped_squashfs_is_corrupt(tmp_path: Path) -> None:
    store = make_layer(tmp_path, lambda src: None)
    sqfs = store.sqfs(NODE.key)
    data = bytearray(sqfs.read_bytes())
    data[-1] ^= 0xFF
    sqfs.write_bytes(bytes(data))
    with pytest.raises(UserError, match="corrupt: sha256"):
        audit_layer(NODE, store, IR)


# ----------------------------------------------------------------------------- before a layer is stored


@pytest.mark.parametrize(
    "shape,expect",
    [
        (_chmod("bin/su", 0o4755), "is setuid"),
        (
            lambda src: os.symlink("/etc/shadow", src / "shadow"),
            "shadow -> /etc/shadow points outside the install root",
        ),
        (lambda src: os.symlink("../../../../../etc", src / "up"), "escapes the install root"),
        (_chmod("shared", 0o777, make_dir=True), "world-writable without the sticky bit"),
    ],
)
def test_check_packed_refuses_what_the_assembly_refuses(tmp_path: Path, shape, expect: str) -> None:
    store = make_layer(tmp_path, shape)
    with pytest.raises(UserError) as err:
        check_packed(store.sqfs(NODE.key), PREFIX, IR, "layer x (from somewhere)")
    assert str(err.value).startswith("layer x (from somewhere): refused: ") and expect in str(err.value)
    assert "\n" not in str(err.value)


def test_check_packed_refuses_an_entry_outside_the_prefix(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / PREFIX / "bin").mkdir(parents=True)
    (src / "evil").mkdir()
    sqfs = tmp_path / "two-tops.sqfs"
    subprocess.run(
        ["mksquashfs", str(src), str(sqfs), "-noappend", "-all-root", "-quiet", "-no-progress"],
        check=True,
        capture_output=True,
    )
    with pytest.raises(UserError, match=r"refused: path 'evil' is outside its prefix"):
        check_packed(sqfs, PREFIX, IR, "layer x")


@pytest.mark.parametrize("prefix", ["../../../../tmp/x", "..", ".", "a/b", "", "x\ny"])
def test_a_prefix_that_is_not_one_directory_name_is_refused(tmp_path: Path, prefix: str) -> None:
    assert prefix_problem(prefix) and prefix_problem(PREFIX) is None
    store = make_layer(tmp_path, lambda src: None)
    with pytest.raises(UserError, match="not one directory name"):
        check_packed(store.sqfs(NODE.key), prefix, IR, "layer x")


def test_check_packed_counts_a_good_layers_entries(tmp_path: Path) -> None:
    store = make_layer(tmp_path, lambda src: os.symlink(f"{IR}/{PREFIX}/bin/tool", src / "bin" / "abs"))
    assert check_packed(store.sqfs(NODE.key), PREFIX, IR, "layer x") == 4  # prefix, bin, bin/tool, bin/abs


def test_audit_store_lists_a_refused_layer_and_remembers_good_ones(tmp_path: Path) -> None:
    """`dedal layers verify`: a layer stored before the audit ran where it came in (a
    registry cache of an older dedal, a copy by hand) is refused there, not called ok."""
    bad = audit_store(make_layer(tmp_path / "bad", _chmod("bin/su", 0o4755)))
    assert bad.ok == [] and not bad.clean and len(bad.refused) == 1
    assert bad.refused[0].startswith(f"layer {NODE.key} (pkg@1.0): refused: ") and "is setuid" in bad.refused[0]
    good = make_layer(tmp_path / "good", lambda src: None)
    memo = tmp_path / "memo"
    assert audit_store(good, memo=memo).ok == [NODE.key] and len(list(memo.iterdir())) == 1
    man = good.manifest(NODE.key)  # a manifest edited to climb out of the install root
    man.prefix = "../../../../tmp/x"
    good.manifest_path(NODE.key).write_text(__import__("json").dumps(man.to_json()))
    check = audit_store(good, memo=memo)
    assert check.ok == [] and "not one directory name" in check.refused[0]


# ----------------------------------------------------------------------------- unpacking


def test_unpack_cannot_be_redirected_by_a_symlink_in_place(tmp_path: Path) -> None:
    """An earlier layer (or anything) left ``<prefix> -> elsewhere`` in the destination:
    ``unsquashfs -f`` wrote through it; the unpacking refuses and writes nothing there."""
    store = make_layer(tmp_path, lambda src: None)
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    os.symlink(elsewhere, root / PREFIX)
    with pytest.raises(UserError, match="exists already"):
        unpack_layer(store.sqfs(NODE.key), PREFIX, root, tmp_path, IR, "layer x")
    assert list(elsewhere.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".unpack")) == []


def test_unpack_writes_the_prefix_and_leaves_the_rest(tmp_path: Path) -> None:
    store = make_layer(tmp_path, lambda src: os.symlink("tool", src / "bin" / "alias"))
    root = tmp_path / "root"
    (root / "other-1-x").mkdir(parents=True)
    os.chmod(root, 0o755)
    unpack_layer(store.sqfs(NODE.key), PREFIX, root, root, IR, "layer x")
    assert sorted(os.listdir(root)) == sorted(["other-1-x", PREFIX])
    assert oct(root.stat().st_mode & 0o777) == "0o755", "the destination's mode is not the image root's 0777"
    assert os.readlink(root / PREFIX / "bin" / "alias") == "tool"
    assert {e["path"] for e in tree_entries(root / PREFIX)} == {"bin", "bin/tool", "bin/alias"}


def test_unpack_audits_what_was_written(tmp_path: Path) -> None:
    """The tree is audited as the filesystem has it, whatever a listing showed."""
    store = make_layer(tmp_path, _chmod("bin/su", 0o4755))
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(UserError, match="refused after unpacking: .*setuid"):
        unpack_layer(store.sqfs(NODE.key), PREFIX, root, tmp_path, IR, "layer x")
    assert list(root.iterdir()) == []


# ----------------------------------------------------------------------------- temporaries


def test_a_killed_assemblys_temporaries_are_reaped(tmp_path: Path) -> None:
    """kill -9 during an assembly leaves .<image>.tmp~<owner>~...; the next assembly of
    that image removes the files of owners that are gone, not those of live ones."""
    import sys

    from dedal.model.artifacts import temp_path
    from dedal.stages.assemble.stage import reap_temporaries

    sif = tmp_path / "images" / "env" / "latest.sif"
    sif.parent.mkdir(parents=True)
    code = "import sys; from dedal.model.artifacts import temp_path; print(temp_path(sys.argv[1]).name)"
    child = subprocess.run(
        [sys.executable, "-c", code, str(sif)], capture_output=True, text=True, check=True
    ).stdout.strip()
    dead = [sif.with_name(f"{child}{ext}") for ext in (".sqfs", ".image.json")]
    live = sif.with_name(temp_path(sif).name + ".sif")
    other = sif.with_name(f".{sif.name}.assemble-12345.sqfs")  # an older dedal's name: no owner
    for p in (*dead, live, other):
        p.write_bytes(b"partial")
    assert sorted(reap_temporaries(sif)) == sorted(p.name for p in dead)
    assert not any(p.exists() for p in dead) and live.exists() and other.exists()
