"""Every workload at medium size, every peer and peakcut, run for real on this machine.

    python -m bench.measured [--workloads resnet50,bert-base] [--rounds 7] [--budget-factor 70] [--no-write]
    python -m bench.measured --cold-warm [--workloads ...]   # a measured search from an empty cost cache

Per workload: the user's eager AdamW loop; per-block activation checkpointing; torch.compile
(aot_eager) with activation_memory_budget 0.6, 0.4 and 0.2; peakcut.optimize at
latency_limit=1.10 and at memory_limit=0.5 (device="measured": per-op times measured here,
the plan verified by running it). Each configuration trains its own copy of the model with
its own torch.optim.AdamW. Time: after warm-up, rounds in which eager and every
configuration of a group run one step each, in turn (groups as large as memory allows);
a configuration's figure is the median over the rounds of its time / eager's time in the
same round, with min and max, and the same rounds give eager's noise band (interquartile
range / median). Peak: the parameters, buffers, optimizer state and batch the caller holds
plus the CPU allocator's peak over one step (torch.profiler memory events). Every peakcut
plan's first two steps are compared with eager's (loss, parameter updates, AdamW moments).

Several workloads run one after another in processes of their own (each saves its cells to
results.json as it ends; a workload killed for memory leaves the others' cells). Results:
bench/measured/results.json, the table between the markers in BENCHMARKS.md (--no-write:
stdout only) and a Pareto plot per workload in docs/measured/ (committed;
`--report-only` makes the table and the plots again from results.json).

--cold-warm (cold_warm.py): per workload, peakcut.optimize(device="measured",
latency_limit=1.10, time_budget=90) from an empty cost cache, then from the cache it filled:
seconds and states per phase, each plan's measured peak and their ratio
(bench/measured/cold_cache_run.md, cold_warm.json).
"""
