"""The gloo link on this machine, measured: the figures cost/links.py's GLOO_LOOPBACK holds.

    python -m bench.links                 # 2 ranks, all-reduce of 1 KiB to 16 MiB, medians of 7
    python -m bench.links --ranks 4

Spawns the ranks on this CPU (gloo over loopback TCP, one intra-op thread each), times
torch.distributed.all_reduce of float32 tensors of each size (after warm-up, between
barriers, median of 7 per size on rank 0), and fits the ring model LinkProfile uses,
t = 2(p-1) * (step + n / p / bandwidth), by least squares over the sizes: prints each size's
median and the fitted step seconds and bus bandwidth. Measured, on whatever else the machine
is running.
"""

from __future__ import annotations

import argparse
import datetime
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = tuple(1 << k for k in range(10, 25, 2))     # 1 KiB .. 16 MiB
REPEATS = 7


def _rank(rank: int, world: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    medians = []
    for nbytes in SIZES:
        t = torch.ones(nbytes // 4)
        for _ in range(3):
            dist.all_reduce(t)
        times = []
        for _ in range(REPEATS):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        medians.append(float(np.median(times)))
    if rank == 0:
        Path(out).write_text(" ".join(map(repr, medians)))
    dist.barrier()
    dist.destroy_process_group()


def measure(ranks: int) -> tuple[list[float], float, float]:
    """Median seconds per size, and the fitted (step seconds, bus bytes/s)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "medians")
        mp.start_processes(_rank, args=(ranks, str(Path(tmp) / "init"), out), nprocs=ranks, start_method="spawn")
        medians = [float(x) for x in Path(out).read_text().split()]
    steps = 2 * (ranks - 1)
    # t / steps = step + (n / p) * (1 / bandwidth): least squares in seconds, so the large
    # transfers (the buckets that cost a step its time) fit best
    a = np.stack([np.ones(len(SIZES)), np.asarray(SIZES, dtype=float) / ranks], axis=1)
    (step, inverse), *_ = np.linalg.lstsq(a, np.asarray(medians) / steps, rcond=None)
    return medians, float(step), float(1.0 / inverse) if inverse > 0 else float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    medians, step, bandwidth = measure(args.ranks)
    print(f"gloo all-reduce on this machine, {args.ranks} ranks (measured, median of {REPEATS}):")
    for nbytes, seconds in zip(SIZES, medians, strict=True):
        print(f"  {nbytes:>10,} B  {seconds * 1e6:>10,.0f} us")
    print(f"fitted ring model: step {step * 1e6:,.0f} us, bus bandwidth {bandwidth / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
