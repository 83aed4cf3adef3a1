"""A model of the host heap PyTorch's CPU tensors come from: glibc's malloc, as configured.

    heap = HostHeapModel(keeps_freed=True)   # as peakcut configures glibc; False: glibc's defaults
    heap.malloc(key, nbytes); heap.free(key)
    heap.peak_reserved          # the most resident bytes: the heap up to its end + mapped chunks

c10 allocates a tensor of n bytes with posix_memalign(64, n), which asks _int_malloc for room
to align in (memalign_request: n + 8 rounded up to 16, plus 112) and splits off the lead and
the tail as small chunks (bins the process's own small objects take from). In the heap, a
tensor keeps a chunk of n rounded up to 64 plus a 64-byte header and alignment slack; a
request takes the smallest free chunk that holds its memalign_request (at equal sizes the
lowest address), splitting off the rest when at least MIN_SPLIT bytes are left, else it
extends the heap's top: a freed chunk is too small for a new tensor of its own size unless
it merged with a free neighbour. A freed chunk merges with free neighbours, and one that
reaches the top gives its bytes back to the top. The heap's touched pages stay resident up
to its end (the top's highest point since the last trim).

keeps_freed=True: peakcut sets glibc's mmap and trim thresholds to their largest
(runtime.host_allocator), so every tensor is a chunk of one heap that is never trimmed: the
process keeps the heap's high-water mark resident.

keeps_freed=False, glibc's default policy (malloc.c): a request the heap cannot serve (no free
chunk holds it, nor the top's free bytes) is mapped on its own (mmap, page rounded) when the
size posix_memalign asks _int_malloc for is at least the mmap threshold (MMAP_THRESHOLD at
first), else the top extends (the break moves TOP_PAD beyond it). Freeing a mapped chunk
unmaps it, and one above the threshold and at most MMAP_THRESHOLD_MAX raises the threshold to
its size and the trim threshold to twice it. A free whose merged chunk (the top included,
where it reaches it) is at least CONSOLIDATE bytes trims the top when its free bytes up to
the break are at least the trim threshold: the break goes back to TOP_PAD above the top.
Small-object bins (tcache, fastbins) and thread arenas are not modelled.
"""

from __future__ import annotations

import bisect

ALIGN = 64
HEADER = 64          # the chunk header and the slack posix_memalign(64) leaves
MIN_SPLIT = 64       # a rest smaller than this stays in the chunk
PAGE = 4096
MMAP_THRESHOLD = 128 * 1024          # M_MMAP_THRESHOLD and M_TRIM_THRESHOLD at first
MMAP_THRESHOLD_MAX = 32 * 1024**2    # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TOP_PAD = 128 * 1024                 # M_TOP_PAD: what the break keeps beyond the top
CONSOLIDATE = 64 * 1024              # FASTBIN_CONSOLIDATION_THRESHOLD: a free this large checks the trim
MEMALIGN_EXTRA = 112                 # posix_memalign(64) asks _int_malloc for the chunk + 64 + MINSIZE + 16
MAPPED_LEAD = 48                     # a mapped chunk's bytes before its 64-aligned start


def memalign_request(nbytes: int) -> int:
    """The chunk size posix_memalign(64, nbytes) asks _int_malloc for (64-bit glibc)."""
    nb = max(32, -(-(nbytes + 8) // 16) * 16)
    return nb + MEMALIGN_EXTRA


class HostHeapModel:
    """The heap of the module doc, replayed request by request; keeps_freed: glibc configured
    to keep freed memory (True) or its default policy (False)."""

    def __init__(self, keeps_freed: bool = True) -> None:
        self.keeps_freed = keeps_freed
        self.free_keys: list[tuple[int, int]] = []          # (size, address) of free chunks
        self.free_at: dict[int, int] = {}                   # address -> size of a free chunk
        self.free_end: dict[int, int] = {}                  # end address -> address of a free chunk
        self.chunk: dict[int, tuple[int, int]] = {}         # key -> (address, size) of a live chunk
        self.mapped: dict[int, int] = {}                    # key -> bytes of a live mapped chunk
        self.top = 0
        self.end = 0                 # the heap's resident end: the top's highest point since the last trim
        self.brk = 0                 # the program break: the top's free bytes end here
        self.mapped_bytes = 0
        self.mmap_threshold = MMAP_THRESHOLD
        self.trim_threshold = MMAP_THRESHOLD
        self.allocated = 0
        self.peak_allocated = 0
        self.peak_reserved = 0

    def malloc(self, key: int, nbytes: int, stream: int = 0) -> int:
        """Allocate `nbytes` for `key`; the chunk's address in the heap (-1 for a mapped chunk)."""
        if key in self.chunk or key in self.mapped:
            raise ValueError(f"malloc: key {key} is already allocated")
        size = ALIGN * -(-max(nbytes, 1) // ALIGN) + HEADER
        need = memalign_request(nbytes)
        i = bisect.bisect_left(self.free_keys, (need, -1))
        if i < len(self.free_keys):
            have, at = self.free_keys[i]
            self._take_free(at)
            if have - size >= MIN_SPLIT:
                self._add_free(at + size, have - size)
            else:
                size = have
        elif not self.keeps_freed and self.brk - self.top < need and need >= self.mmap_threshold:
            pages = PAGE * -(-(need + 8) // PAGE)
            self.mapped[key] = pages
            self.mapped_bytes += pages
            self._allocated(pages)
            return -1
        else:
            at = self.top
            self.top += size
            self.end = max(self.end, self.top)
            if self.top > self.brk:
                self.brk = self.top + TOP_PAD
        self.chunk[key] = (at, size)
        self._allocated(size)
        return at

    def free(self, key: int) -> None:
        """Give back the chunk of `key`: unmapped, merged with free neighbours, or into the top."""
        pages = self.mapped.pop(key, None)
        if pages is not None:
            self.mapped_bytes -= pages
            self.allocated -= pages
            if self.mmap_threshold < pages - MAPPED_LEAD <= MMAP_THRESHOLD_MAX:
                self.mmap_threshold = pages - MAPPED_LEAD
                self.trim_threshold = 2 * self.mmap_threshold
            return
        found = self.chunk.pop(key, None)
        if found is None:
            raise KeyError(f"free: key {key} is not allocated")
        at, size = found
        self.allocated -= size
        if at + size in self.free_at:                   # the next chunk is free: merge it
            size += self._take_free(at + size)
        start = self.free_end.get(at)
        if start is not None:                           # the chunk before is free: merge into it
            size += self._take_free(start)
            at = start
        if at + size == self.top:
            self.top = at                               # back to the top
            size = self.brk - at
        else:
            self._add_free(at, size)
        if not self.keeps_freed and size >= CONSOLIDATE and self.brk - self.top >= self.trim_threshold:
            self.brk = self.top + TOP_PAD               # the top trimmed
            self.end = min(self.end, self.brk)

    def _allocated(self, size: int) -> None:
        self.allocated += size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.end + self.mapped_bytes)

    def _add_free(self, at: int, size: int) -> None:
        bisect.insort(self.free_keys, (size, at))
        self.free_at[at] = size
        self.free_end[at + size] = at

    def _take_free(self, at: int) -> int:
        size = self.free_at.pop(at)
        del self.free_end[at + size]
        del self.free_keys[bisect.bisect_left(self.free_keys, (size, at))]
        return size
