"""Process memory housekeeping: give freed heap back to the operating system.

glibc keeps memory freed by a forward pass in its heap when a live block sits above it, and raises its mmap threshold
after large frees, so after one 2,048-token run a process can hold a few hundred MB of free heap that ``ps`` still
counts. ``malloc_trim(0)`` returns those pages (``madvise``) without moving live data.
"""
from __future__ import annotations

import ctypes
import ctypes.util

_libc = None


def _glibc():
    """The C library if it is glibc (has ``malloc_trim`` and ``mallopt``), else False (macOS, Windows, musl)."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc.malloc_trim, _libc.mallopt  # noqa: B018 (AttributeError without glibc)
        except (OSError, AttributeError):
            _libc = False
    return _libc


def release_freed_heap() -> bool:
    """glibc ``malloc_trim(0)``; False where there is no glibc: nothing to do there."""
    if not _glibc():
        return False
    return bool(_libc.malloc_trim(0))


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
MMAP_THRESHOLD_BYTES = 1 << 20


def use_fixed_mmap_threshold(nbytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Serve allocations of ``nbytes`` or more that the heap's free chunks cannot hold from their own mapping,
    returned to the OS when freed (glibc never grows the heap for them).

    glibc's default threshold grows after large frees (up to 32 MB), after which a forward pass's activations land in
    the heap and pin it: at 2,048 tokens (GPT-2 small shape) the peak above the plain forward was 320 MB or 630 MB
    depending on the process's history; with this fixed threshold it is 150 MB every time, for the same run time
    (fresh pages are touched either way). Process-wide; the app sets it once at start. False without glibc.
    """
    if not _glibc():
        return False
    return bool(_libc.mallopt(M_MMAP_THRESHOLD, int(nbytes)))
