"""Run a function on several gloo ranks of this CPU and fail the test if they do not finish."""

from __future__ import annotations

import datetime
import faulthandler
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, world: int, init_file: str, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
    faulthandler.enable(all_threads=True)    # a rank that crashes in C++ prints every Python thread's stack
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        torch.set_num_threads(1)
        fn(rank, world, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable[..., None], world: int, tmp_path: Path, *args: Any, timeout_s: float = 240.0) -> None:
    """fn(rank, world, *args) on `world` spawned processes, each in a gloo process group."""
    ctx = mp.start_processes(_entry, args=(world, str(tmp_path / "init"), fn, args), nprocs=world, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                pytest.fail(f"the {world} ranks did not finish in {timeout_s:.0f} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join()
