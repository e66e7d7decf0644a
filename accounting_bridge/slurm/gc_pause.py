"""Pause Python's cyclic garbage collector while building many acyclic records.

Parsing a window of sacct rows and reconciling it build ~10 containers per run and
no reference cycles, so reference counting frees all of it. The cyclic collector
still runs every 700 allocations and, as the records pile up, re-scans them: on
50,000 rows it took half of the parse time (measured: 63,000 rows/s with it,
133,000 without). Pausing it for the duration is safe (nothing cyclic is lost,
only collected later) and it is resumed on the way out, also on error.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["cycle_collection_paused"]


@contextmanager
def cycle_collection_paused() -> Iterator[None]:
    """Disable the cyclic collector inside the block, if it was enabled; nest freely."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
