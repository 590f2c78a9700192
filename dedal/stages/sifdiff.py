"""What differs between two SIF images: header, objects, labels, and the files of the root
file system, so that a rebuild that does not give the same sha256 says why.

The primary partitions are mounted read-only (:func:`dedal.adapters.squashfs.mount`, at
their offset in the SIF: nothing is copied) and walked side by side; an entry differs by
type, mode, owner, time, symlink target, or content. Text content (also inside ``.gz``)
comes with a unified diff, JSON with the paths of the values that differ. A directory
only one image has is one difference, with the number of entries below it.
"""

from __future__ import annotations

import difflib
import json
import os
import stat
import tempfile
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from dedal.adapters import squashfs
from dedal.errors import DedalError, UserError
from dedal.model.inputs import open_regular
from dedal.model import sif as sif_mod
from dedal.model.artifacts import sha256_stream
from dedal.stages.image_files import raw_names, shown

TEXT_LIMIT = 1 << 20  # bytes of a file or object shown as a text diff (larger: "content" only)
HEADER_FIELDS = ("id", "created", "modified", "primary_arch", "launch_script", "version")


@dataclass
class Difference:
    where: str  # header | object | label | file
    name: str  # header field, object name, label key, path in the image
    what: str  # changed | only in A | only in B | content | mode | owner | time | target | type | size
    a: str = ""
    b: str = ""
    detail: List[str] = field(default_factory=list)  # diff lines (text or JSON paths)

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass
class DiffResult:
    a: str
    b: str
    sha256_a: str
    sha256_b: str
    differences: List[Difference] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return self.sha256_a == self.sha256_b

    def counts(self) -> Dict[str, int]:
        found: Dict[str, int] = {}
        for d in self.differences:
            found[d.where] = found.get(d.where, 0) + 1
        return found

    def summary(self) -> str:
        if self.identical:
            return f"identical: {self.a} and {self.b} (sha256 {self.sha256_a})"
        parts = [f"{n} {w}{'' if n == 1 else 's'}" for w, n in sorted(self.counts().items())]
        return (
            f"differ: {self.a} and {self.b}: "
            + (", ".join(parts) or "only in bytes no part accounts for")
            + f" (sha256 {self.sha256_a[:12]}... / {self.sha256_b[:12]}...)"
        )

    def to_json(self) -> Dict[str, Any]:
        return {
            "identical": self.identical,
            "summary": self.summary(),
            "a": self.a,
            "b": self.b,
            "sha256": {"a": self.sha256_a, "b": self.sha256_b},
            "counts": self.counts(),
            "differences": [d.to_json() for d in self.differences],
        }


def _sha256(path: Path, start: int = 0, size: Optional[int] = None) -> str:
    with open_regular(path) as fh:  # a regular file only, not what a link points at
        return sha256_stream(fh, start, size, chunk=8 << 20)


# ---------------------------------------------------------------------------- content


def _flatten(obj: Any, prefix: str = "") -> Dict[str, str]:
    if isinstance(obj, dict):
        out: Dict[str, str] = {}
        for k in sorted(obj):
            out.update(_flatten(obj[k], f"{prefix}.{k}" if prefix else str(k)))
        return out or {prefix: "{}"}
    if isinstance(obj, list):
        out = {}
        for i, v in enumerate(obj):
            out.update(_flatten(v, f"{prefix}[{i}]"))
        return out or {prefix: "[]"}
    return {prefix: json.dumps(obj)}


def _short(value: str, width: int = 100) -> str:
    return value if len(value) <= width else value[: width - 3] + "..."


def json_diff(a: Any, b: Any, prefix: str = "") -> List[str]:
    """One line per value that differs: ``path: A -> B`` (absent: ``-``). A string value
    that holds JSON (a label of JSON) is compared inside; one of several lines (a
    definition file) as a unified diff below its path."""
    fa, fb = _flatten(a, prefix), _flatten(b, prefix)
    lines = []
    for k in sorted(set(fa) | set(fb)):
        va, vb = fa.get(k), fb.get(k)
        if va == vb:
            continue
        if va is not None and vb is not None:
            sa, sb = json.loads(va), json.loads(vb)
            if isinstance(sa, str) and isinstance(sb, str):
                try:
                    ja, jb = json.loads(sa), json.loads(sb)
                    if isinstance(ja, (dict, list)) and isinstance(jb, (dict, list)):
                        lines += json_diff(ja, jb, k)
                        continue
                except ValueError:
                    pass
                if "\n" in sa or "\n" in sb:
                    lines.append(f"{k}:")
                    lines += [
                        "  " + x.rstrip("\n")
                        for x in difflib.unified_diff(sa.splitlines(True), sb.splitlines(True), "A", "B", n=1)
                    ][2:]
                    continue
        lines.append(f"{k or '(top)'}: {_short(va or '-')} -> {_short(vb or '-')}")
    return lines


def _text(data: bytes) -> Optional[str]:
    if len(data) > TEXT_LIMIT or b"\x00" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _gunzip(data: bytes, limit: int = TEXT_LIMIT) -> Optional[bytes]:
    """``data`` decompressed, unless that passes ``limit`` bytes (a small .gz may expand to
    gigabytes) or it is no gzip data: None then."""
    d = zlib.decompressobj(wbits=31)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error:
        return None
    return out if len(out) <= limit and d.eof else None


def content_diff(name: str, a: bytes, b: bytes) -> List[str]:
    """Lines that show how ``a`` and ``b`` differ: JSON paths, a unified diff of text (a
    ``.gz`` decompressed first, its header compared too), else nothing (binary)."""
    if name.endswith(".gz"):
        da, db = _gunzip(a), _gunzip(b)
        if da is None or db is None:
            return []
        lines = content_diff(name[:-3], da, db)
        if da == db:
            lines.append("(same text; the gzip headers differ: time stamp or file name)")
        return lines
    ta, tb = _text(a), _text(b)
    if ta is None or tb is None:
        return []
    if name.endswith(".json"):
        try:
            return json_diff(json.loads(ta), json.loads(tb))
        except ValueError:
            pass
    return [
        line.rstrip("\n")
        for line in difflib.unified_diff(ta.splitlines(True), tb.splitlines(True), "A" + name, "B" + name, n=1)
    ]


# ---------------------------------------------------------------------------- trees


def _unreadable(root: Path, exc: OSError) -> UserError:
    where = getattr(exc, "filename", None) or root
    return UserError(
        f"cannot read {shown(str(where))} in a mounted root file system ({exc.strerror or exc}); the image is corrupt"
    )


def _entries(root: Path) -> Tuple[Dict[str, os.stat_result], Dict[str, str]]:
    """Every entry under ``root`` (lstat, nothing followed), by its path in the image; and
    the entries no path can reach (a second ``.`` or ``..``, a name with a ``/``: what a
    crafted squashfs can hold and ``os.scandir`` never shows), path: type."""
    found: Dict[str, os.stat_result] = {}
    odd: Dict[str, str] = {}

    def fail(exc: OSError) -> None:
        raise _unreadable(root, exc)

    for dirpath, dirs, files in os.walk(root, onerror=fail):
        rel = os.path.relpath(dirpath, root)
        base = "" if rel == "." else "/" + rel
        try:
            for name in dirs + files:
                found[f"{base}/{name}"] = os.lstat(os.path.join(dirpath, name))
            fd = os.open(dirpath, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                raw = raw_names(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise _unreadable(root, exc) from None
        listed = set(dirs) | set(files)
        for name, kind in raw or []:
            if name not in listed:
                odd[f"{base}/{name}"] = kind
    try:
        found["/"] = os.lstat(root)
    except OSError as exc:
        raise _unreadable(root, exc) from None
    return found, odd


def _kind(st: os.stat_result) -> str:
    return {
        stat.S_IFDIR: "directory",
        stat.S_IFREG: "file",
        stat.S_IFLNK: "symlink",
        stat.S_IFCHR: "char device",
        stat.S_IFBLK: "block device",
        stat.S_IFIFO: "fifo",
        stat.S_IFSOCK: "socket",
    }.get(stat.S_IFMT(st.st_mode), "?")


def _read(path: Path, limit: int) -> bytes:
    """At most ``limit`` bytes of a regular file of a mounted image (not followed)."""
    with open_regular(path, follow=False) as fh:
        return fh.read(limit)


def _same_bytes(a: Path, b: Path) -> bool:
    with open_regular(a, follow=False) as fa, open_regular(b, follow=False) as fb:
        while True:
            ca, cb = fa.read(1 << 20), fb.read(1 << 20)
            if ca != cb:
                return False
            if not ca:
                return True


def tree_diff(a: Path, b: Path) -> Iterator[Difference]:
    """Differences between two directory trees (paths as in the image, from ``/``)."""
    (ea, odd_a), (eb, odd_b) = _entries(a), _entries(b)
    only: List[Tuple[str, str]] = [(p, "only in A") for p in ea if p not in eb] + [
        (p, "only in B") for p in eb if p not in ea
    ]
    reported: List[str] = []
    for path, what in sorted(only):
        if any(path.startswith(r + "/") for r in reported):
            continue
        st = (ea if what == "only in A" else eb)[path]
        below = sum(1 for p in (ea if what == "only in A" else eb) if p.startswith(path + "/"))
        yield Difference("file", path, what, _kind(st) + (f" with {below} entries" if below else ""))
        if stat.S_ISDIR(st.st_mode):
            reported.append(path)
    for path in sorted(set(odd_a) | set(odd_b)):  # never hidden: listed, by name
        kinds = f"a {odd_a.get(path) or odd_b.get(path)} named {path.rsplit('/', 1)[1]!r} that no path reaches"
        if path in odd_a and path in odd_b:
            yield Difference(
                "file", path, "unreachable", kinds, kinds, ["(in both images: its content is not compared)"]
            )
        else:
            yield Difference("file", path, "only in A" if path in odd_a else "only in B", kinds)
    try:
        yield from _common(a, b, ea, eb)
    except OSError as exc:
        raise _unreadable(a, exc) from None


def _common(a: Path, b: Path, ea: Dict[str, os.stat_result], eb: Dict[str, os.stat_result]) -> Iterator[Difference]:
    for path in sorted(set(ea) & set(eb)):
        sa, sb = ea[path], eb[path]
        if _kind(sa) != _kind(sb):
            yield Difference("file", path, "type", _kind(sa), _kind(sb))
            continue
        if stat.S_IMODE(sa.st_mode) != stat.S_IMODE(sb.st_mode):
            yield Difference("file", path, "mode", oct(stat.S_IMODE(sa.st_mode)), oct(stat.S_IMODE(sb.st_mode)))
        if (sa.st_uid, sa.st_gid) != (sb.st_uid, sb.st_gid):
            yield Difference("file", path, "owner", f"{sa.st_uid}:{sa.st_gid}", f"{sb.st_uid}:{sb.st_gid}")
        if int(sa.st_mtime) != int(sb.st_mtime):
            yield Difference("file", path, "time", str(int(sa.st_mtime)), str(int(sb.st_mtime)))
        pa, pb = a / path.lstrip("/"), b / path.lstrip("/")
        if stat.S_ISLNK(sa.st_mode):
            ta, tb = os.readlink(pa), os.readlink(pb)
            if ta != tb:
                yield Difference("file", path, "target", ta, tb)
        elif stat.S_ISREG(sa.st_mode):
            if sa.st_size != sb.st_size or not _same_bytes(pa, pb):
                detail = (
                    content_diff(path, _read(pa, TEXT_LIMIT), _read(pb, TEXT_LIMIT))
                    if max(sa.st_size, sb.st_size) <= TEXT_LIMIT
                    else []
                )
                yield Difference("file", path, "content", f"{sa.st_size} bytes", f"{sb.st_size} bytes", detail)


# ---------------------------------------------------------------------------- images


def _objects(info: sif_mod.SifInfo) -> Dict[str, sif_mod.Descriptor]:
    found: Dict[str, sif_mod.Descriptor] = {}
    for d in info.descriptors:
        key = f"{d.name} ({d.type_label})" if d.name else d.type_label
        n, k = 2, key
        while k in found:
            k, n = f"{key} #{n}", n + 1
        found[k] = d
    return found


def _content_differs(key: str, size_a: int, size_b: int, note: str) -> Difference:
    """An object whose bytes differ between the two images, with its sizes and how it was compared."""
    return Difference("object", key, "content", f"{size_a} bytes", f"{size_b} bytes", [note])


def diff_images(a: Path, b: Path, *, files: bool = True) -> DiffResult:
    """Compare two SIF files; ``files``: walk the root file systems when they differ."""
    infos = []
    for p in (a, b):
        info = sif_mod.read_sif(p)  # UserError: missing, a directory, not a SIF, truncated
        sif_mod.primary_partition(info)
        infos.append(info)
    result = DiffResult(str(a), str(b), _sha256(a), _sha256(b))
    if result.identical:
        return result
    ia, ib = infos
    for f in HEADER_FIELDS:
        va, vb = getattr(ia, f), getattr(ib, f)
        if va != vb:
            result.differences.append(Difference("header", f, "changed", str(va), str(vb)))
    oa, ob = _objects(ia), _objects(ib)
    for key in sorted(set(oa) | set(ob)):
        if key not in ob or key not in oa:
            result.differences.append(Difference("object", key, "only in A" if key in oa else "only in B"))
            continue
        da, db = oa[key], ob[key]
        if da.created != db.created or da.modified != db.modified:
            result.differences.append(Difference("object", key, "time", str(da.created), str(db.created)))
        if da.datatype == sif_mod.DATA_PARTITION:
            if _sha256(a, da.offset, da.size) != _sha256(b, db.offset, db.size):
                note = "the file differences follow" if files else "(files not compared)"
                result.differences.append(_content_differs(key, da.size, db.size, note))
                if files and da.is_primary_partition:
                    result.differences += list(_partition_diff(a, da, b, db))
            continue
        if max(da.size, db.size) > TEXT_LIMIT:  # hashed in chunks: memory stays bounded
            if da.size != db.size or _sha256(a, da.offset, da.size) != _sha256(b, db.offset, db.size):
                note = f"(larger than {TEXT_LIMIT >> 20} MiB: compared by sha256)"
                result.differences.append(_content_differs(key, da.size, db.size, note))
            continue
        ra, rb = sif_mod.read_object(a, da), sif_mod.read_object(b, db)
        if ra == rb:
            continue
        if da.datatype == sif_mod.DATA_LABELS:
            result.differences += _label_diff(ra, rb)
        result.differences.append(
            Difference(
                "object",
                key,
                "content",
                f"{len(ra)} bytes",
                f"{len(rb)} bytes",
                content_diff(da.name if da.name.endswith(".json") else da.name or "", ra, rb),
            )
        )
    order = {"header": 0, "label": 1, "object": 2, "file": 3}
    result.differences.sort(key=lambda d: order.get(d.where, 9))  # stable: files stay in path order
    return result


def _label_diff(ra: bytes, rb: bytes) -> List[Difference]:
    try:
        la, lb = json.loads(ra), json.loads(rb)
    except ValueError:
        return []
    if not isinstance(la, dict) or not isinstance(lb, dict):
        return []
    found = []
    for k in sorted(set(la) | set(lb)):
        if k not in lb:
            found.append(Difference("label", k, "only in A", str(la[k])))
        elif k not in la:
            found.append(Difference("label", k, "only in B", "", str(lb[k])))
        elif la[k] != lb[k]:
            found.append(
                Difference(
                    "label",
                    k,
                    "changed",
                    _short(str(la[k])),
                    _short(str(lb[k])),
                    json_diff({k: la[k]}, {k: lb[k]}) if len(str(la[k])) > 100 else [],
                )
            )
    return found


def _partition_diff(a: Path, da: sif_mod.Descriptor, b: Path, db: sif_mod.Descriptor) -> Iterator[Difference]:
    with tempfile.TemporaryDirectory(prefix="dedal-diff-") as tmp:
        mounted: List[Tuple[Path, str]] = []
        try:
            for name, path, d in (("a", a, da), ("b", b, db)):
                point = Path(tmp) / name
                try:
                    method = squashfs.mount(path, point, offset=d.offset)
                except DedalError as exc:
                    raise UserError(
                        f"cannot mount the root file system of {path} to compare it ({exc.one_line()}); "
                        "is the image corrupt?"
                    ) from None
                mounted.append((point, method))
            yield from tree_diff(mounted[0][0], mounted[1][0])
        finally:
            for point, method in reversed(mounted):
                squashfs.unmount(point, method, lazy=True)


def render(result: DiffResult, max_lines: int = 40) -> str:
    """The human form: the summary line, then one line per difference, its detail indented."""
    lines = [shown(result.summary())]
    for d in result.differences:
        values = (
            f": {d.a!r} -> {d.b!r}"
            if (d.a or d.b) and d.what not in ("only in A", "only in B")
            else (f" ({shown(d.a or d.b)})" if d.a or d.b else "")
        )
        lines.append(shown(f"{d.where} {shown(d.name)}: {d.what}{values}", backslash=False))
        part = d.detail[:max_lines] if max_lines > 0 else d.detail
        lines += [f"    {shown(x, backslash=False)}" for x in part]
        if len(d.detail) > len(part):
            lines.append(f"    ... {len(d.detail) - len(part)} more line(s) (--max-lines 0 shows all)")
    return "\n".join(lines)
