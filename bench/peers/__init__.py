"""Peer comparison harness: eager PyTorch, activation checkpointing (per block, and torchtitan's
selective policy), gradient accumulation, torch.compile's activation-memory budget
(aot_eager / inductor x budgets x solvers), the ZeRO-Offload-style peer and peakcut, on the
seven workloads.

    python -m bench.peers [--quick] [--sizes tiny,medium,paper] [--workloads ...] [--tools ...]
    python -m bench.peers --headline [...]      # the opening table of BENCHMARKS.md

Tiny and medium sizes are measured on this CPU (measure.py); paper sizes are captured over
FakeTensors and simulated with peakcut's memory simulator and device cost models
(simulate.py). Files: tools.py (the rows and how each wraps a model), sac.py (torchtitan's
selective checkpointing policy), accumulate.py (gradient accumulation: the user's loop and its
captured graph), measure.py, simulate.py, peakcut_hook.py (peakcut's rows), results.py (a
cell), report.py and plots.py (tables and Pareto plots), headline.py and headline_table.py (the
opening table). See docs/peers.md.
"""
