"""Shape helpers shared by the rule builders: labelling, broadcasting, reshape alignment."""

from __future__ import annotations

from collections.abc import Iterable

from peakcut.ir.dims.rule import Dims, Label

Shape = tuple[int, ...]


def names(rank: int, prefix: str = "d") -> tuple[Label, ...]:
    """Fresh labels prefix0..prefix{rank-1}, one per dimension."""
    return tuple(f"{prefix}{i}" for i in range(rank))


def norm_dim(dim: int, rank: int) -> int:
    """A possibly negative dim as an index in [0, rank) (0-d tensors accept 0 and -1)."""
    r = max(rank, 1)
    if not -r <= dim < r:
        raise ValueError(f"dim {dim} out of range for rank {rank}")
    return dim % r


def norm_dims(dims: int | Iterable[int] | None, rank: int) -> set[int]:
    """A dim / dim list as a set of indices; None or [] mean every dimension."""
    if dims is None:
        return set(range(rank))
    listed = [dims] if isinstance(dims, int) else list(dims)
    if not listed:
        return set(range(rank))
    return {norm_dim(d, rank) for d in listed} if rank else set()


def without(dims: Dims, drop: Iterable[int]) -> Dims:
    """`dims` minus the positions in `drop`."""
    gone = set(drop)
    return tuple(d for i, d in enumerate(dims) if i not in gone)


def cut(dims: Dims, *at: int) -> Dims:
    """`dims` with the positions in `at` set to None (never split)."""
    return tuple(None if i in at else d for i, d in enumerate(dims))


def broadcast(shape: Shape | None, out_shape: Shape, out_dims: Dims) -> Dims | None:
    """Labels of a tensor broadcast to `out_shape` (aligned from the right).

    A dimension gets the output's label when it has the output's length;
    broadcast (size-1) dimensions get None. None for an absent tensor.
    """
    if shape is None:
        return None
    offset = len(out_shape) - len(shape)
    if offset < 0:
        raise ValueError(f"shape {shape} does not broadcast to {out_shape}")
    return tuple(
        out_dims[offset + i] if size == out_shape[offset + i] else None
        for i, size in enumerate(shape)
    )


def broadcast_shapes(shapes: Iterable[Shape]) -> Shape:
    """The broadcast of several shapes (numpy rules)."""
    result: list[int] = []
    for shape in shapes:
        pad = len(shape) - len(result)
        if pad > 0:
            result = [1] * pad + result
        offset = len(result) - len(shape)
        for i, s in enumerate(shape):
            if s != 1:
                result[offset + i] = s
    return tuple(result)


def reshape_links(src: Shape, dst: Shape) -> list[tuple[int, int]]:
    """(src dim, dst dim) pairs a reshape keeps aligned.

    Both shapes are cut into the smallest blocks of equal element count (size-1
    dimensions skipped); the outermost dimensions of each block correspond,
    because slice p/n of a row-major block is slice p/n of its outermost
    dimension. [B, T, D] -> [B*T, D] links (0, 0) and (2, 1); [B*T, D] -> [B, T, H, E]
    links (0, 0) and (1, 2). Empty for tensors without elements.
    """
    if 0 in src or 0 in dst:
        return []
    links: list[tuple[int, int]] = []
    i = j = 0
    while True:
        while i < len(src) and src[i] == 1:
            i += 1
        while j < len(dst) and dst[j] == 1:
            j += 1
        if i == len(src) or j == len(dst):
            return links
        links.append((i, j))
        a, b = src[i], dst[j]
        i += 1
        j += 1
        while a != b:
            if a < b:
                a *= src[i]
                i += 1
            else:
                b *= dst[j]
                j += 1

