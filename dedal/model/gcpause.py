"""Bulk work without Python's cyclic garbage collector.

Reading a lock of thousands of specs, planning it and scheduling it each make millions of
small objects and no reference cycles worth collecting; the collector still walks every
live object now and then, and the live objects are what grows: 20,000 specs spent a third
of their time there. :func:`collector_paused` turns it off around such work.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off inside, back as it was after (nesting is fine)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            # what was made meanwhile is old now: into the oldest generation (a list splice),
            # else the first collection after this walks every object made here
            gc.freeze()
            gc.unfreeze()
            gc.enable()
