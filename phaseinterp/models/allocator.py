"""The C allocator under CPU forwards: keep freed memory in the process instead of handing it
back to the kernel (glibc on Linux only).

`keep_freed_memory` raises glibc's mmap and trim thresholds for this process (``mallopt``), so the
few-MiB intermediates a forward allocates and frees layer after layer are reused instead of being
page-faulted in and zeroed again. The numbers do not change, only where the memory comes from; the
cost is that memory freed after a peak stays mapped to the process. `ENVIRONMENT` holds the same
settings for a process not yet started. Speed-ups: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import ctypes
import sys

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 256 << 20  # blocks up to 256 MiB come from the heap
TRIM_THRESHOLD = 1 << 30  # the heap top is trimmed only above 1 GiB free

# The same settings for a process not yet started (glibc reads them at start-up).
ENVIRONMENT = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}

_applied = False


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (see the module docstring).
    Returns True when they are set (now or by an earlier call), False where there is no glibc
    (macOS, Windows, musl): there it does nothing. Idempotent."""
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: glibc's (no ldconfig subprocess)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _applied
