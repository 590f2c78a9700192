"""ELF files as data: class, machine, type and the dynamic section's library entries
(``DT_NEEDED``, ``DT_RPATH``, ``DT_RUNPATH``, ``DT_SONAME``), read in pure Python.

What the image checks need (is every library an image's programs load inside it?) and
nothing more: the program headers locate ``PT_DYNAMIC`` and ``PT_INTERP``; the string
table's address is mapped to a file offset through the ``PT_LOAD`` segments, as the
dynamic loader sees it (so stripped files, which keep no section headers, read the
same). Only the header, the program headers, the dynamic section and the strings it
names are read: a 400 MB library costs a few kilobytes.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import BinaryIO, List, Optional, Tuple

MAGIC = b"\x7fELF"
ET_EXEC, ET_DYN = 2, 3
PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 5, 10, 14, 15, 29
#: e_machine of the architectures dedal's images are built for (SIF/Debian names)
MACHINES = {"amd64": 62, "arm64": 183, "ppc64le": 21, "386": 3}
_MAX_PHNUM = 4096
_MAX_DYN = 1 << 16
_MAX_STR = 1 << 16


class ElfError(ValueError):
    """A file that starts like ELF but whose headers cannot be read (truncated, corrupt)."""


@dataclass(frozen=True)
class ElfFile:
    elf_class: int  # 1: 32-bit, 2: 64-bit
    machine: int  # e_machine (62: x86-64)
    type: int  # e_type (2: executable, 3: shared object or PIE)
    interp: str = ""  # PT_INTERP (the dynamic loader a program asks for)
    needed: Tuple[str, ...] = ()
    rpath: Tuple[str, ...] = ()  # DT_RPATH entries (colon-separated in the file)
    runpath: Tuple[str, ...] = ()  # DT_RUNPATH entries
    soname: str = ""
    dynamic: bool = False  # has a PT_DYNAMIC segment (dynamically linked)

    @property
    def ident(self) -> Tuple[int, int]:
        """(class, machine): what a library must match to be loaded by this file."""
        return self.elf_class, self.machine


def elf_id(path: "os.PathLike[str] | str") -> Optional[Tuple[int, int]]:
    """(ELF class, machine) of a file (after symlinks), None when it is no ELF file."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != MAGIC or head[5] not in (1, 2):
        return None
    return head[4], int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")


def is_elf(path: "os.PathLike[str] | str") -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == MAGIC
    except OSError:
        return False


def _read(fh: BinaryIO, offset: int, size: int) -> bytes:
    fh.seek(offset)
    data = fh.read(size)
    if len(data) != size:
        raise ElfError(f"truncated: {size} bytes at offset {offset} are past the end of the file")
    return data


def _cstring(fh: BinaryIO, offset: int) -> str:
    fh.seek(offset)
    data = fh.read(_MAX_STR)
    end = data.find(b"\0")
    if end < 0:
        raise ElfError(f"unterminated string at offset {offset}")
    return data[:end].decode("utf-8", errors="surrogateescape")


def read_elf(path: "os.PathLike[str] | str") -> Optional[ElfFile]:
    """The ELF facts of ``path``, None when it is no ELF file; ElfError when it starts
    like one but its headers are broken."""
    with open(path, "rb") as fh:
        ident = fh.read(16)
        if len(ident) < 16 or ident[:4] != MAGIC:
            return None
        cls, data = ident[4], ident[5]
        if cls not in (1, 2) or data not in (1, 2):
            raise ElfError(f"unknown ELF class {cls} or byte order {data}")
        end = "<" if data == 1 else ">"
        wide = cls == 2
        head = _read(fh, 16, 48 if wide else 36)
        if wide:
            e_type, machine, _ver, _entry, phoff, _shoff, _flags, _ehsize, phentsize, phnum = struct.unpack(
                end + "HHIQQQIHHH", head[:42]
            )
            ph_fmt, dyn_fmt = end + "IIQQQQQQ", end + "qQ"
        else:
            e_type, machine, _ver, _entry, phoff, _shoff, _flags, _ehsize, phentsize, phnum = struct.unpack(
                end + "HHIIIIIHHH", head[:30]
            )
            ph_fmt, dyn_fmt = end + "IIIIIIII", end + "iI"
        ph_size, dyn_size = struct.calcsize(ph_fmt), struct.calcsize(dyn_fmt)
        if phnum == 0 or phoff == 0:
            return ElfFile(cls, machine, e_type)
        if phnum > _MAX_PHNUM or phentsize < ph_size:
            raise ElfError(f"implausible program header table ({phnum} entries of {phentsize} bytes)")
        raw = _read(fh, phoff, phnum * phentsize)
        loads: List[Tuple[int, int, int]] = []  # (vaddr, filesz, offset)
        dynamic: Optional[Tuple[int, int]] = None
        interp = ""
        for i in range(phnum):
            fields = struct.unpack(ph_fmt, raw[i * phentsize : i * phentsize + ph_size])
            if wide:
                p_type, _pflags, p_offset, p_vaddr, _paddr, p_filesz = fields[:6]
            else:
                p_type, p_offset, p_vaddr, _paddr, p_filesz = fields[:5]
            if p_type == PT_LOAD:
                loads.append((p_vaddr, p_filesz, p_offset))
            elif p_type == PT_DYNAMIC:
                dynamic = (p_offset, p_filesz)
            elif p_type == PT_INTERP and p_filesz:
                interp = _read(fh, p_offset, min(p_filesz, 4096)).split(b"\0", 1)[0].decode(errors="replace")
        if dynamic is None:
            return ElfFile(cls, machine, e_type, interp)
        count = min(dynamic[1] // dyn_size, _MAX_DYN)
        raw = _read(fh, dynamic[0], count * dyn_size)
        entries: List[Tuple[int, int]] = []
        for i in range(count):
            tag, val = struct.unpack(dyn_fmt, raw[i * dyn_size : (i + 1) * dyn_size])
            if tag == DT_NULL:
                break
            entries.append((tag, val))
        strtab = next((v for t, v in entries if t == DT_STRTAB), None)
        wanted = [(t, v) for t, v in entries if t in (DT_NEEDED, DT_RPATH, DT_RUNPATH, DT_SONAME)]
        if strtab is None:
            if wanted:
                raise ElfError("dynamic section without a string table (DT_STRTAB)")
            return ElfFile(cls, machine, e_type, interp, dynamic=True)
        base = next((off + strtab - vaddr for vaddr, size, off in loads if vaddr <= strtab < vaddr + size), None)
        if base is None:
            raise ElfError(f"string table address {strtab:#x} is in no loadable segment")
        found = {DT_NEEDED: [], DT_RPATH: [], DT_RUNPATH: [], DT_SONAME: []}  # type: dict
        for tag, val in wanted:
            found[tag].append(_cstring(fh, base + val))

        def paths(values: List[str]) -> Tuple[str, ...]:
            return tuple(p for v in values for p in v.split(":") if p)

        return ElfFile(
            cls,
            machine,
            e_type,
            interp,
            needed=tuple(found[DT_NEEDED]),
            rpath=paths(found[DT_RPATH]),
            runpath=paths(found[DT_RUNPATH]),
            soname=(found[DT_SONAME] or [""])[0],
            dynamic=True,
        )
