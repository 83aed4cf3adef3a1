"""A model of PyTorch's CUDA caching allocator: the bytes it reserves for an allocation sequence.

    model = CachingAllocatorModel(AllocatorConfig(max_split_size=None, expandable_segments=False))
    model.malloc(key, nbytes); model.free(key)
    model.peak_reserved, model.peak_allocated       # max_memory_reserved / max_memory_allocated

The rules it follows (one device; every block on one stream unless told otherwise):

- a request is rounded up to a multiple of 512 bytes (512 at least);
- requests of at most 1 MiB come from the small pool, larger ones from the large pool; a
  freed block goes back to its pool and is kept (reserved), never given back to the device
  unless a `capacity` would be exceeded;
- a request takes the smallest free block of its pool (and stream) that holds it, at equal
  sizes the one at the lowest address (best fit);
- without one, a new segment is reserved: 2 MiB for a small request, 20 MiB for a large one
  below 10 MiB, else the request rounded up to 2 MiB;
- a block larger than the request is split (the request at its start, the rest a free block)
  when the rest is at least 512 bytes in the small pool, and in the large pool when the rest
  is more than 1 MiB and the request is below max_split_size; otherwise the request takes
  the whole block, and the allocated bytes count all of it;
- with max_split_size: a request below it never takes a free block of that size or more,
  and a request of that size or more takes a free block only if it is less than 20 MiB
  larger; such blocks are never split;
- a freed block merges with free neighbours of its segment;
- expandable_segments: one segment per pool and stream that grows by mapping pages (2 MiB in
  the small pool, 20 MiB in the large one) at its end; blocks split whenever the rest is at
  least 512 bytes; the best fit counts a free block at the segment's end as able to grow,
  and prefers a block that need not grow; a request no free block holds maps the pages
  it lacks at the lowest address that has room, merging with a free block before them;
- with a `capacity`, a segment that does not fit first frees the cached segments that hold
  no allocated block, and raises MemoryError if it still does not fit.

Reserved bytes are the segments (or mapped pages); allocated bytes the blocks handed out.
Not modelled: roundup_power2_divisions, garbage_collection_threshold, CUDA graph pools,
and the events that hold a block used by another stream (a caller frees such a block when
the other stream's use ends).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MIN_BLOCK = 512                 # every request is rounded up to a multiple of this
SMALL_SIZE = 1 << 20            # the largest request of the small pool
SMALL_BUFFER = 2 << 20          # a small pool's segment
LARGE_BUFFER = 20 << 20         # a large pool's segment for requests below MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20      # from here, a segment is the request rounded up to ROUND_LARGE
ROUND_LARGE = 2 << 20
UNLIMITED = 1 << 62             # max_split_size when none is set
ADDRESS_SPACE = 1 << 48         # an expandable segment's virtual size


@dataclass(frozen=True)
class AllocatorConfig:
    """The allocator's settings (PYTORCH_CUDA_ALLOC_CONF): max_split_size in bytes (None:
    unlimited), expandable_segments, and the device's capacity in bytes (None: unlimited)."""

    max_split_size: int | None = None
    expandable_segments: bool = False
    capacity: int | None = None

    def __post_init__(self) -> None:
        if self.max_split_size is not None and self.max_split_size < LARGE_BUFFER:
            raise ValueError(f"max_split_size={self.max_split_size}: PyTorch accepts no less than 20 MiB")


@dataclass(eq=False)
class Block:
    """A block of a segment: free or allocated, mapped (always, but in expandable segments)."""

    ptr: int
    size: int
    small: bool
    stream: int
    allocated: bool = False
    mapped: bool = True
    expandable: bool = False
    prev: Block | None = field(default=None, repr=False)
    next: Block | None = field(default=None, repr=False)

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class _Pool:
    """Free blocks of one pool ordered by (stream, size, address), and its unmapped blocks."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int, int]] = []
        self.blocks: dict[tuple[int, int, int], Block] = {}
        self.unmapped: dict[int, Block] = {}       # address -> unmapped block (expandable segments)

    def add(self, b: Block) -> None:
        key = (b.stream, b.size, b.ptr)
        bisect.insort(self.keys, key)
        self.blocks[key] = b

    def remove(self, b: Block) -> None:
        key = (b.stream, b.size, b.ptr)
        del self.keys[bisect.bisect_left(self.keys, key)]
        del self.blocks[key]


def round_size(nbytes: int) -> int:
    """A request's bytes as the allocator rounds them: a multiple of 512, at least 512."""
    return MIN_BLOCK * max(1, -(-nbytes // MIN_BLOCK))


def allocation_size(rounded: int) -> int:
    """The segment reserved for a rounded request no free block holds (module doc)."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * -(-rounded // ROUND_LARGE)


class CachingAllocatorModel:
    """The allocator of the module doc, replayed request by request."""

    def __init__(self, config: AllocatorConfig | None = None) -> None:
        self.config = config or AllocatorConfig()
        self.max_split = self.config.max_split_size or UNLIMITED
        self.pools = {True: _Pool(True), False: _Pool(False)}
        self.live: dict[int, Block] = {}
        self.reserved = 0
        self.allocated = 0
        self.peak_reserved = 0
        self.peak_allocated = 0
        self.segments = 0
        self._next_address = 0

    # -- the public calls --------------------------------------------------------------------------

    def malloc(self, key: int, nbytes: int, stream: int = 0) -> Block:
        """Allocate `nbytes` for `key` (an id the caller frees it by)."""
        if key in self.live:
            raise ValueError(f"malloc: key {key} is already allocated")
        if nbytes < 0:
            raise ValueError(f"malloc: nbytes={nbytes} is negative")
        size = round_size(nbytes)
        pool = self.pools[size <= SMALL_SIZE]
        block = self._free_block(pool, size, stream)
        if block is None:
            block = self._new_block(pool, size, stream)
        block = self._take(pool, block, size)
        self.live[key] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block

    def free(self, key: int) -> None:
        """Give back the block of `key`: it stays reserved, merged with free neighbours."""
        block = self.live.pop(key, None)
        if block is None:
            raise KeyError(f"free: key {key} is not allocated")
        block.allocated = False
        self.allocated -= block.size
        pool = self.pools[block.small]
        for other in (block.prev, block.next):
            self._merge(block, other, pool)
        pool.add(block)

    # -- finding a block ---------------------------------------------------------------------------

    def _free_block(self, pool: _Pool, size: int, stream: int) -> Block | None:
        """The best-fitting free block of `pool` for a request of `size` rounded bytes."""
        keys = pool.keys
        i = bisect.bisect_left(keys, (stream, size, -1))
        if i == len(keys) or keys[i][0] != stream:
            return None
        block = pool.blocks[keys[i]]
        if block.expandable:
            if self.config.expandable_segments:    # a block that can grow counts its growth
                while (block.expandable and i + 1 < len(keys) and keys[i + 1][0] == stream
                       and _growable(pool.blocks[keys[i + 1]]) < _growable(block)):
                    i += 1
                    block = pool.blocks[keys[i]]
            else:
                while block.expandable:
                    i += 1
                    if i == len(keys) or keys[i][0] != stream:
                        return None
                    block = pool.blocks[keys[i]]
        if size < self.max_split <= block.size:
            return None
        if size >= self.max_split and block.size >= size + LARGE_BUFFER:
            return None
        pool.remove(block)
        return block

    def _new_block(self, pool: _Pool, size: int, stream: int) -> Block:
        """A new segment (or mapped pages of an expandable one) for the request."""
        if self.config.expandable_segments:
            return self._expand(pool, size, stream)
        segment = allocation_size(size)
        if self.config.capacity is not None and self.reserved + segment > self.config.capacity:
            self._release_cached()
            if self.reserved + segment > self.config.capacity:
                raise MemoryError(f"out of memory: {segment} bytes more would reserve {self.reserved + segment}, "
                                  f"above the capacity of {self.config.capacity}")
        block = Block(ptr=self._next_address, size=segment, small=pool.small, stream=stream)
        self._next_address += segment
        self._reserve(segment)
        self.segments += 1
        return block

    def _take(self, pool: _Pool, block: Block, size: int) -> Block:
        """Allocate the start of `block` for `size` bytes; the rest stays free where it is
        split off (module doc)."""
        rest = block.size - size
        if pool.small or self.config.expandable_segments:
            split = rest >= MIN_BLOCK
        else:
            split = size < self.max_split and rest > SMALL_SIZE
        if split:
            remaining = Block(ptr=block.ptr + size, size=rest, small=block.small, stream=block.stream,
                              expandable=block.expandable, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = remaining
            block.next = remaining
            block.size = size
            pool.add(remaining)
        block.allocated = True
        return block

    def _merge(self, dst: Block, src: Block | None, pool: _Pool) -> None:
        """Merge the free neighbour `src` into `dst` (same mapping state only)."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        if src.mapped:
            pool.remove(src)
        else:
            del pool.unmapped[src.ptr]
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    # -- expandable segments -----------------------------------------------------------------------

    def _expand(self, pool: _Pool, size: int, stream: int) -> Block:
        """Map pages for a request no free block holds: at the lowest unmapped address with
        room (taking the free block before it), in a new segment where none has room."""
        candidate = None
        for ptr in sorted(pool.unmapped):
            c = pool.unmapped[ptr]
            if c.stream != stream:
                continue
            if c.prev is not None and not c.prev.allocated and c.prev.mapped:
                c = c.prev
            room = 0
            b: Block | None = c
            while room < size and b is not None and not b.allocated:
                room += b.size
                b = b.next
            if room >= size:
                candidate = c
                break
        if candidate is None:
            candidate = Block(ptr=self._next_address, size=ADDRESS_SPACE, small=pool.small, stream=stream,
                              mapped=False, expandable=True)
            self._next_address += ADDRESS_SPACE
            pool.unmapped[candidate.ptr] = candidate
            self.segments += 1
        if not candidate.mapped:
            candidate = self._map(pool, candidate, min(candidate.size, size))
        while candidate.size < size:
            following = candidate.next
            if following is None:       # unreachable: the candidate had room
                raise RuntimeError("expandable segment: no room after the candidate block")
            candidate = self._map(pool, following, min(size - candidate.size, following.size))
        pool.remove(candidate)
        return candidate

    def _map(self, pool: _Pool, block: Block, size: int) -> Block:
        """Map the pages that cover the first `size` bytes of the unmapped `block`; the mapped
        part merges with free mapped neighbours and joins the free blocks."""
        page = SMALL_BUFFER if pool.small else LARGE_BUFFER
        mapped = page * -(-size // page)
        if self.config.capacity is not None and self.reserved + mapped > self.config.capacity:
            raise MemoryError(f"out of memory: mapping {mapped} bytes would reserve {self.reserved + mapped}, "
                              f"above the capacity of {self.config.capacity}")
        del pool.unmapped[block.ptr]
        if mapped < block.size:
            rest = Block(ptr=block.ptr + mapped, size=block.size - mapped, small=block.small, stream=block.stream,
                         mapped=False, expandable=True, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = mapped
            pool.unmapped[rest.ptr] = rest
        block.mapped = True
        for other in (block.prev, block.next):
            self._merge(block, other, pool)
        pool.add(block)
        self._reserve(mapped)
        return block

    # -- reserved bytes ----------------------------------------------------------------------------

    def _reserve(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def _release_cached(self) -> None:
        """Give back every cached segment that holds no allocated block (not split)."""
        for pool in self.pools.values():
            for key in list(pool.keys):
                b = pool.blocks[key]
                if not b.is_split and not b.expandable:
                    pool.remove(b)
                    self.reserved -= b.size
                    self.segments -= 1


def _growable(b: Block) -> int:
    """A free block's size counting the unmapped space right after it (expandable segments)."""
    following = b.next
    return b.size + (following.size if following is not None and not following.mapped else 0)
