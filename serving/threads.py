"""Background threads of the scoring service at a lower CPU priority than the threads that answer requests.

The write-through to the online store, the scoring log's writer and the shadow model do their work in
bursts (a flush every fraction of a second), mostly in C code that releases the GIL (SQLite, Parquet,
ONNX). On a machine with few cores such a burst takes a core from the event loop, and each one showed as a
cluster of slow answers every flush interval (docs/benchmarks.md, "Scoring service"). A nicer thread
still runs whenever a core is free, so nothing it does is lost, only deferred behind request work.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger(__name__)

BACKGROUND_NICENESS = 10


def lower_priority(niceness: int = BACKGROUND_NICENESS) -> bool:
    """Raise the calling thread's nice value by `niceness` (Linux: a thread's own scheduling priority);
    False, and nothing changed, where the platform has no per-thread priority or refuses it."""
    if sys.platform != "linux":
        return False
    thread = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + niceness))
    except OSError as exc:
        log.debug("thread %s keeps its priority: %s", threading.current_thread().name, exc)
        return False
    return True
