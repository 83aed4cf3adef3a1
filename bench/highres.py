"""U-Net at high resolution (1024x1024, batch 4), simulated: eager, per-block checkpointing,
torch.compile's activation-memory budget (aot_eager partitions) and peakcut, on one yardstick.

    python -m bench.highres [--image 1024] [--batch 4]

Every row is a peakcut Graph run through the same memory simulator (CPU workspace model)
and the analytic RTX 3090 / H200 cost profiles (bench.peers.simulate); peakcut searches as
in bench.peers (PAPER_BUDGET seconds on the RTX 3090 profile). Nothing runs on a GPU.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from dataclasses import replace

import torch

import peakcut
from bench.peers.peakcut_hook import PAPER_BUDGET, PAPER_DEVICE
from bench.peers.simulate import PROFILES, simulate_workload
from bench.peers.tools import Tool, compile_tools
from peakcut.workloads.base import WorkloadInstance
from peakcut.workloads.unet import UNET_PAPER, UNet, segmentation_batch, segmentation_loss

BUDGETS = (1.0, 0.6, 0.4, 0.2, 0.0)
LIMITS = ("latency 1.1", "memory 0.5", "memory 0.4")


def instance(image: int, batch: int) -> WorkloadInstance:
    """The paper U-Net (64-1024 channels, BatchNorm) on `image`x`image` inputs."""
    cfg = replace(UNET_PAPER, image=image)
    torch.manual_seed(0)
    return WorkloadInstance("unet", f"{image}px", UNet(cfg), segmentation_batch(cfg, batch), segmentation_loss,
                            torch.float32, batch, f"U-Net, batch {batch}, 3x{image}x{image}, fp32")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(1)
    inst = instance(args.image, args.batch)
    tools = [Tool("eager"), Tool("checkpoint"), *compile_tools(("aot_eager",), BUDGETS, ("dp",)),
             *(Tool("peakcut", limit=limit) for limit in LIMITS)]
    t0 = time.perf_counter()
    cells = simulate_workload(inst, tools)
    eager = cells[0]
    print(f"Command: `python -m bench.highres --image {args.image} --batch {args.batch}` (peakcut: "
          f"{PAPER_BUDGET:g} s per search on {PAPER_DEVICE}). "
          f"Environment: torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} cores, peakcut "
          f"{peakcut.__version__}; {time.perf_counter() - t0:.0f} s. {inst.description}. All figures simulated "
          "(peakcut.memory.simulate, CPU workspace model; analytic device profiles).\n")
    print("| tool | peak GiB | vs eager | " + " | ".join(f"{p} step s (vs eager)" for p in PROFILES) + " | note |")
    print("|---|---|---|" + "---|" * len(PROFILES) + "---|")
    for c in cells:
        if not c.ok or c.peak_bytes is None or eager.peak_bytes is None:
            print(f"| {c.tool} | - | - | " + " | ".join("-" for _ in PROFILES) + f" | {c.error} |")
            continue
        lat = " | ".join(f"{c.latency[p]:.3f} ({c.latency[p] / eager.latency[p] - 1:+.1%})" for p in PROFILES)
        print(f"| {c.tool} | {c.peak_bytes / 2**30:.2f} | {c.peak_bytes / eager.peak_bytes:.1%} | {lat} | {c.note} |")


if __name__ == "__main__":
    main()
