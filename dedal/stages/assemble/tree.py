"""The image tree in the stage directory: the base root filesystem as the lower layer of an
overlay mount (nothing copied; where no overlay can be mounted, the base's squashfs is
extracted instead), the layers extracted at the install root, and the two ways to write
into the tree (:func:`write_file` through a new inode, :func:`mkdirs` with fixed modes)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence, Union

from dedal.adapters import overlay, squashfs
from dedal.stages.layer_audit import LayerInfo, parallel, unpack_layer

if TYPE_CHECKING:
    from dedal.model.base import BaseImage
    from dedal.model.layers import LayerStore


BIG_LAYER = 64 << 20  # bytes of squashfs: extracted alone, with every core


def extract_layers(store: LayerStore, infos: Sequence[LayerInfo], dest: Path, log: Path, install_root: str) -> None:
    """Unpack the audited layers into ``dest`` (the install root in the tree), each through
    :func:`unpack_layer` (a fresh directory, audited as written, renamed into place): big
    layers one after the other with every core, the many small ones side by side, one core each."""

    def one(info: LayerInfo, processors: Optional[int]) -> None:
        unpack_layer(
            store.sqfs(info.key),
            info.prefix,
            dest,
            dest,
            install_root,
            f"layer {info.key} ({info.name}@{info.version})",
            log=log,
            processors=processors,
        )

    big = [i for i in infos if i.size >= BIG_LAYER]
    small = [i for i in infos if i.size < BIG_LAYER]
    for info in big:
        one(info, None)
    parallel(lambda i: one(i, 1), small)


def write_file(path: Path, text: Union[str, bytes], mode: int = 0o644) -> None:
    """Write through a new inode (never into a file shared with the base)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    data = text.encode("utf-8") if isinstance(text, str) else text
    with open(path, "wb") as fh:
        fh.write(data)
    os.chmod(path, mode)


def mkdirs(tree: Path, rel: str, mode: int = 0o755) -> Path:
    """Create ``rel`` and its missing parents with ``mode`` (not the umask's)."""
    cur = tree
    for part in [p for p in rel.strip("/").split("/") if p]:
        cur = cur / part
        if not cur.exists() and not cur.is_symlink():
            cur.mkdir()
            os.chmod(cur, mode)
    return cur


class ImageTree:
    """The image tree in the stage: an overlay of the base's unpacked root (nothing
    copied), else the base's squashfs extracted, else (host base) an empty root.

    ``fill(dir)`` puts the layers into ``dir`` (the install root): with an overlay it
    writes straight into the upper directory before the mount (plain tmpfs, not through
    overlayfs), with the base's parent directories' modes; otherwise into the tree."""

    def __init__(
        self,
        stage: Path,
        base: Optional[BaseImage],
        log: Path,
        say: Callable[[str], None],
        install_root: str,
        fill: Callable[[Path], None],
    ) -> None:
        self.stage = stage
        self.base = base
        self.log = log
        self.say = say
        self.install_root = install_root
        self.fill = fill
        self.path = stage / "root"
        self.method = "none"
        self.mounted: Optional[str] = None
        self.upper: Optional[Path] = None
        self.seconds = 0.0

    def _prefill_upper(self, lower: Path, upper: Path) -> bool:
        """Layers into ``upper`` before mounting; False where the base has a symlink on the
        way to the install root (a real directory in upper would hide it)."""
        parts = [p for p in self.install_root.strip("/").split("/") if p]
        cur_lower, cur_upper = lower, upper
        for part in parts:
            cur_lower, cur_upper = cur_lower / part, cur_upper / part
            if cur_lower.is_symlink():
                return False
        upper.mkdir(parents=True, exist_ok=True)
        cur_lower, cur_upper = lower, upper
        for part in parts:
            cur_lower, cur_upper = cur_lower / part, cur_upper / part
            cur_upper.mkdir(exist_ok=True)
            os.chmod(cur_upper, cur_lower.stat().st_mode & 0o7777 if cur_lower.is_dir() else 0o755)
        self.fill(cur_upper)
        return True

    def __enter__(self) -> "ImageTree":
        t0 = time.monotonic()
        filled = False
        if self.base is None:
            self.path.mkdir()
            os.chmod(self.path, 0o755)
            self.say("base host: the image carries no operating system, only the software (install root, view)")
        else:
            lower = Path(self.base.rootfs_dir)
            upper = self.stage / "upper"
            if lower.is_dir() and overlay.available():
                filled = self._prefill_upper(lower, upper)
                self.mounted = overlay.mount(lower, upper, self.stage / "work", self.path, log=self.log)
            if self.mounted:
                self.method = f"overlay ({self.mounted})"
                self.upper = upper
            else:
                if upper.exists():
                    shutil.rmtree(upper)
                filled = False
                self.path.mkdir(exist_ok=True)
                squashfs.extract(Path(self.base.squashfs), self.path, log=self.log)
                self.method = "extract"
        if not filled:
            self.fill(mkdirs(self.path, self.install_root))
        self.seconds = time.monotonic() - t0
        return self

    def changed_tops(self) -> Optional[List[str]]:
        """Top-level names of the tree that differ from the base (what the overlay's upper
        directory holds: new, changed, deleted or merely copied up), None where unknown."""
        if self.upper is None or not self.upper.is_dir():
            return None
        return sorted(os.listdir(self.upper))

    def __exit__(self, *exc: object) -> None:
        if self.mounted:
            overlay.unmount(self.path, self.mounted, log=self.log)
            self.mounted = None
