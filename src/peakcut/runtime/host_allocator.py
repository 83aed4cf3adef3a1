"""Host memory kept by the allocator: no page faults for tensors freed and made again.

    keep_freed_host_memory()    # True where applied (glibc), False where nothing changed
    release_freed_host_memory() # what malloc holds free goes back to the operating system

PyTorch's CPU tensors come from malloc. glibc's malloc gives large blocks back to the
operating system (blocks above the mmap threshold when they are freed, the heap's top when
more than the trim threshold is free), so a training step whose activations are freed
and made again every step makes the kernel hand out and zero the same memory every step:
a page fault per 4 KiB page. Measured on the 2-core development VM (torch 2.13, glibc
2.36) at medium size: ResNet-50 (batch 8, 224x224) took about 95,000 minor faults a step,
and its generated program ran 1.48-1.94 s against 1.41 s for its calls timed alone; with
this setting, 0 faults after the first step and 1.44-1.46 s (BERT-base, batch 4 x 128:
2.25-2.28 s against 2.16 s). The measured cost model times calls on warm buffers, so its
predictions hold for a process that keeps its memory.

This sets glibc's M_MMAP_THRESHOLD and M_TRIM_THRESHOLD to their largest value with
mallopt: freed blocks stay in the process and are reused, as CUDA's caching allocator
does on a GPU. The process's resident size then stays at its high-water mark; the c10
allocator's figures, which every peak peakcut reports is made of, do not change. It applies
to the whole process from the call on (the user's eager loop gets faster too) and is not
undone. Elsewhere (macOS, musl) it does nothing and says so.

`peakcut.optimize` calls release_freed_host_memory (malloc_trim) once before it returns, so
what the search and its verification allocated and freed is not held by the process while
the plan trains, and a Plan calls it once more after each program's first run (which builds
the program and its arena and makes the optimizer's state between its own transient tensors):
the steps then hold what they use (their own freed blocks kept, where the setting above
applies).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
_LARGEST = 2**31 - 1   # mallopt takes an int


def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def release_freed_host_memory() -> bool:
    """Give the memory glibc's malloc holds free back to the operating system (malloc_trim);
    True when it ran (glibc only)."""
    libc = _glibc()
    return libc is not None and libc.malloc_trim(0) >= 0


def keep_freed_host_memory() -> bool:
    """Make glibc's malloc keep freed memory (module doc); True when it did."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, _LARGEST)) and bool(libc.mallopt(M_TRIM_THRESHOLD, _LARGEST))
