"""The GPU acceptance command: eager against peakcut's plans and the peers users pick, all
measured on one CUDA GPU within one deadline.

    python -m bench.gpu                                   # all seven at paper size, both limits, 540 s
    python -m bench.gpu bert-base resnet50 --size tiny --budget 3 --slowdown 20 --out /tmp/gpu   # on a CPU

Each workload runs in a process of its own: eager (the user's loop, AdamW lr 1e-4), gradient
accumulation at k = 2 and 4 and torchtitan-style selective activation checkpointing, and
peakcut.optimize(..., device="measured", latency_limit=1.10 | memory_limit=0.5) timed as the
user calls it (plan.step); peaks by torch.cuda.max_memory_allocated / max_memory_reserved,
times by CUDA events, every configuration's first step checked against eager's; the plan's
predicted figures and the device's analytic profile's simulated ones beside the measured.
Without CUDA the same code runs on the CPU as a dry run of itself.

Files:
- cli.py: the command line (the run, or one workload's process);
- runner.py: the run: a process per workload under the deadline, results.json / results.md
  rewritten after each;
- timeplan.py: which workloads and limits fit the deadline, their order, optimize budgets and
  timed steps;
- child.py: one workload's process: eager, the peers, a plan per limit, the simulated figures;
- measure.py: one configuration's peak and times (CUDA, or the CPU dry run);
- numbers.py: the number check of a first step against the reference's;
- peers.py: the peers' steps, their exactness and the best peer under a limit;
- simulated.py: the simulated figures (the device's analytic profile, the plan's report);
- tables.py: results.md.
"""
