"""The pure-Python ELF reader on files gcc makes here: what `readelf -d` shows."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from dedal.model.elf import ET_DYN, ElfError, elf_id, is_elf, read_elf


def gcc(*args: str) -> None:
    if shutil.which("gcc") is None:
        pytest.fail("gcc is not installed (run ./setup.sh)")
    subprocess.run(["gcc", *args], check=True, capture_output=True)


def test_needed_runpath_rpath_soname(tmp_path):
    (tmp_path / "a.c").write_text('#include <stdio.h>\nint a(void) { return puts("a"); }\n')
    (tmp_path / "b.c").write_text("int a(void); int b(void) { return a() + 1; }\n")
    (tmp_path / "main.c").write_text("int b(void); int main(void) { return b(); }\n")
    gcc("-shared", "-fPIC", "-o", str(tmp_path / "liba.so.1"), "-Wl,-soname,liba.so.1", str(tmp_path / "a.c"))
    gcc(
        "-shared",
        "-fPIC",
        "-o",
        str(tmp_path / "libb.so"),
        str(tmp_path / "b.c"),
        str(tmp_path / "liba.so.1"),
        "-Wl,--enable-new-dtags,-rpath,$ORIGIN:/opt/x/lib",
    )
    gcc(
        "-o",
        str(tmp_path / "main"),
        str(tmp_path / "main.c"),
        str(tmp_path / "libb.so"),
        "-Wl,--disable-new-dtags,-rpath,/opt/y/lib",
    )
    a = read_elf(tmp_path / "liba.so.1")
    assert (a.elf_class, a.machine, a.type, a.soname, a.dynamic) == (2, 62, ET_DYN, "liba.so.1", True)
    assert "libc.so.6" in a.needed and not a.rpath and not a.runpath
    b = read_elf(tmp_path / "libb.so")
    assert b.needed[0] == "liba.so.1" and b.runpath == ("$ORIGIN", "/opt/x/lib") and b.rpath == () and b.soname == ""
    m = read_elf(tmp_path / "main")
    assert m.needed[0] == str(tmp_path / "libb.so") or m.needed[0] == "libb.so"
    assert m.rpath == ("/opt/y/lib",) and m.runpath == () and m.interp.startswith("/lib")
    assert elf_id(tmp_path / "main") == (2, 62) == m.ident and is_elf(tmp_path / "main")


def test_static_object_and_other_files(tmp_path):
    (tmp_path / "s.c").write_text("int main(void) { return 0; }\n")
    gcc("-c", "-o", str(tmp_path / "s.o"), str(tmp_path / "s.c"))
    obj = read_elf(tmp_path / "s.o")  # a relocatable object has no program headers
    assert obj is not None and not obj.dynamic and obj.needed == ()
    (tmp_path / "text").write_text("#!/bin/sh\n")
    assert read_elf(tmp_path / "text") is None and elf_id(tmp_path / "text") is None and not is_elf(tmp_path / "text")
    assert elf_id(tmp_path / "absent") is None


def test_truncated_elf_is_an_error(tmp_path):
    (tmp_path / "a.c").write_text("int a(void) { return 1; }\n")
    gcc("-shared", "-fPIC", "-o", str(tmp_path / "liba.so"), str(tmp_path / "a.c"))
    data = (tmp_path / "liba.so").read_bytes()
    (tmp_path / "cut.so").write_bytes(data[:100])
    with pytest.raises(ElfError, match="truncated"):
        read_elf(tmp_path / "cut.so")
