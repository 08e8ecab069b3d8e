"""The live state's memory: the sizing check at start (`BYTES_PER_TRANSACTION`, `StateTooLargeError`), what
its columns hold (`nbytes`), and giving what a load or a fold freed back to the system."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from features.live.state import LiveState

# Memory per transaction read at the load's peak (benchmarks/serving.py --state-footprint: 100 bytes at 4
# million; the state itself keeps 55-60 after it): what the sizing check at start multiplies the rows to
# read by.
BYTES_PER_TRANSACTION = 100


class StateTooLargeError(RuntimeError):
    """The history the live state would hold does not fit the memory it may use; the message says what to
    do."""


def nbytes(state: LiveState) -> int:
    """Bytes the state's columns hold: the history, what was observed since, the merchants' arrays (not
    Python's overhead per object, nor the ids' map of chargebacks reported)."""
    total = 0
    history = state._history
    if history is not None:
        total += history.window_ids.array.nbytes + sum(
            values.nbytes
            for values in (
                history.us,
                history.usd,
                history.flags,
                history.arrival,
                history.merchant,
                history.hashes,
                history.index_rows,
                history.starts,
                history.window_start,
                history.window_base,
            )
        )
    for c in state._customers.values():
        total += sum(
            len(values) * values.itemsize for values in (c.us, c.usd, c.foreign, c.merchant, c.arrival)
        )
        total += sum(8 + len(tid) for tid in c.ids)
    for m in state.merchants.values():
        total += (len(m.us) + len(m.cum) + len(m.chargebacks)) * 8
    return total


def memory_returnable() -> bool:
    """Whether Arrow allocates from the C library, which `release_freed_memory` can give back to the system.
    Its default, mimalloc, keeps what a load freed (about as much again as the state, by `benchmarks.serving
    --state-footprint`). Arrow reads ARROW_DEFAULT_MEMORY_POOL once, when it loads: `mlops serve` sets it to
    "system" before anything imports pyarrow."""
    import pyarrow as pa

    return pa.default_memory_pool().backend_name == "system"


def map_large_allocations() -> None:
    """Have glibc serve every allocation of a mebibyte or more by its own mapping, returned to the system
    when freed: by default the threshold grows (up to 32 MiB) after such a free, and the load's numpy
    temporaries below it then stay in the heap until `release_freed_memory`. Linux (glibc) only; once per
    process, before a load."""
    import ctypes
    import ctypes.util

    libc = ctypes.util.find_library("c")
    if libc is not None and hasattr(ctypes.CDLL(libc), "mallopt"):
        ctypes.CDLL(libc).mallopt(_M_MMAP_THRESHOLD, 1 << 20)


_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def release_freed_memory() -> None:
    """Give the memory a load freed back to the system: Arrow's pool keeps what it freed, and glibc keeps
    large freed blocks once its mmap threshold has grown (numpy's temporaries). Without it the process
    stays at the load's peak. Linux (glibc) only for the second; elsewhere Arrow's part alone."""
    import ctypes
    import ctypes.util

    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    libc = ctypes.util.find_library("c")  # malloc_trim: glibc only
    if libc is not None and hasattr(ctypes.CDLL(libc), "malloc_trim"):
        ctypes.CDLL(libc).malloc_trim(0)
