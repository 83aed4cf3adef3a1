"""A model of the host heap PyTorch's CPU tensors come from, as peakcut configures glibc.

    heap = HostHeapModel()
    heap.malloc(key, nbytes); heap.free(key)
    heap.peak_reserved          # the heap's high-water mark: the resident bytes it keeps

peakcut sets glibc's mmap and trim thresholds to their largest (runtime.host_allocator), so
every tensor is a chunk of one heap that never shrinks: the process keeps the heap's
high-water mark resident. The model: a tensor of n bytes takes a chunk of n rounded up to
64 (c10's alignment) plus a 64-byte header and alignment slack; a request takes the smallest
free chunk that holds it (at equal sizes the lowest address), splitting off the rest when
at least MIN_SPLIT bytes are left, else it extends the heap's top; a freed chunk merges with
free neighbours, and one that reaches the top gives its bytes back to the top. Small-object bins and thread arenas are not modelled.
"""

from __future__ import annotations

import bisect

ALIGN = 64
HEADER = 64          # the chunk header and the slack posix_memalign(64) leaves
MIN_SPLIT = 64       # a rest smaller than this stays in the chunk


class HostHeapModel:
    """The heap of the module doc, replayed request by request."""

    def __init__(self) -> None:
        self.free_keys: list[tuple[int, int]] = []          # (size, address) of free chunks
        self.free_at: dict[int, int] = {}                   # address -> size of a free chunk
        self.free_end: dict[int, int] = {}                  # end address -> address of a free chunk
        self.chunk: dict[int, tuple[int, int]] = {}         # key -> (address, size) of a live chunk
        self.top = 0
        self.allocated = 0
        self.peak_allocated = 0
        self.peak_reserved = 0

    def malloc(self, key: int, nbytes: int, stream: int = 0) -> int:
        """Allocate `nbytes` for `key`; the chunk's address."""
        if key in self.chunk:
            raise ValueError(f"malloc: key {key} is already allocated")
        size = ALIGN * -(-max(nbytes, 1) // ALIGN) + HEADER
        i = bisect.bisect_left(self.free_keys, (size, -1))
        if i < len(self.free_keys):
            have, at = self.free_keys[i]
            self._take_free(at)
            if have - size >= MIN_SPLIT:
                self._add_free(at + size, have - size)
            else:
                size = have
        else:
            at = self.top
            self.top += size
            self.peak_reserved = max(self.peak_reserved, self.top)
        self.chunk[key] = (at, size)
        self.allocated += size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return at

    def free(self, key: int) -> None:
        """Give back the chunk of `key`: merged with free neighbours, or into the top."""
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
            return
        self._add_free(at, size)

    def _add_free(self, at: int, size: int) -> None:
        bisect.insort(self.free_keys, (size, at))
        self.free_at[at] = size
        self.free_end[at + size] = at

    def _take_free(self, at: int) -> int:
        size = self.free_at.pop(at)
        del self.free_end[at + size]
        del self.free_keys[bisect.bisect_left(self.free_keys, (size, at))]
        return size
