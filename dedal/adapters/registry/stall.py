"""A transfer on the display only while it makes no progress.

An upload's byte count is on the display (:func:`dedal.ui.progress.meter`) while bytes
flow; when the registry stops taking them, or takes them all and does not answer, a
frozen bar says nothing. :class:`Stall` is an :class:`~dedal.ui.activity.Activity` whose
clock restarts at every byte (:meth:`Stall.progressed`): nothing is shown while the
transfer moves; after ``after`` seconds without a byte a line says so, with the request,
the attempt and the seconds left before the operation gives up (the client's deadline,
setting ``registry_deadline_s``)::

    ⠹ upload to registry.example.org stalled  25 s  (no byte taken for 25 s: PUT /v2/esd/x/blobs/...; gives up in 155 s)

In plain output (CI logs) the same as lines: ``upload to HOST stalled ...`` when a stall
begins, ``still ...`` every 30 s, ``... going on again`` when bytes flow again.
:class:`Counted` is the upload's body that tells them (and the byte count) each block.
"""

from __future__ import annotations

from typing import BinaryIO, Callable, Optional

from dedal.ui.activity import Activity, elapsed_text


class Stall(Activity):
    """See the module. ``left()``: seconds before the operation gives up."""

    def __init__(self, what: str, request: str, left: Callable[[], float], *, size: int = 0, **options: object) -> None:
        super().__init__(what, **options)  # type: ignore[arg-type]
        self.request = request
        self.left = left
        self.size = size
        self.sent = 0
        self.done = False  # every byte sent: waiting for the answer

    def progressed(self, n: int = 0) -> None:
        """Bytes went out (or came in): the stall clock starts again."""
        with self._lock:
            self.sent += n
            was = self._printed is not None and not self.live and not self.quiet
            took = self.elapsed
            self.started = self.clock()
            if was:
                self._say(f"{self.what}: going on again after {elapsed_text(took)} ({self.sent} of {self.size} bytes)")
                self._printed = None

    def finished_sending(self) -> None:
        self.done = True

    def detail(self) -> str:
        took = int(self.elapsed)
        state = (
            f"all {self.size} bytes sent, no answer for {took} s"
            if self.done
            else f"no byte taken for {took} s, {self.sent} of {self.size} sent"
        )
        return f"{state}: {self.request}; gives up in {max(0, int(self.left()))} s"

    def tick(self) -> None:
        """Plain lines, only while stalled (the base prints its 'still' lines regardless)."""
        if self.quiet or self.live or self.elapsed < self.after:
            return
        super().tick()


def stall(
    what: str, request: str, left: Callable[[], float], size: int = 0, after: float = 5.0, quiet: Optional[bool] = None
) -> Stall:
    return Stall(what, request, left, size=size, after=after, quiet=quiet)


class Counted:
    """A file to upload that tells ``seen`` how many bytes were read from it (the live
    display's byte count, the deadline's progress: a block is read when the one before
    was taken) and ``at_end`` when all were; its length is the blob's, so requests sends
    it as it is."""

    def __init__(
        self, fh: BinaryIO, size: int, seen: Callable[[int], None], at_end: Callable[[], None] = lambda: None
    ) -> None:
        self._fh, self._size, self._seen, self._at_end = fh, size, seen, at_end

    def __len__(self) -> int:
        return self._size

    def seek(self, *args: int) -> int:
        return self._fh.seek(*args)

    def read(self, n: int = -1) -> bytes:
        data = self._fh.read(n)
        if data:
            self._seen(len(data))
        else:
            self._at_end()
        return data
