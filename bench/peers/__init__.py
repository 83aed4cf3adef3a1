"""Peer comparison harness: eager PyTorch, activation checkpointing, torch.compile's
activation-memory budget (aot_eager / inductor x budgets x solvers) and peakcut, on the
seven workloads.

    python -m bench.peers [--quick] [--sizes tiny,paper] [--workloads ...] [--tools ...]

Tiny sizes are measured on this CPU (bench.peers.measure); paper sizes are captured over
FakeTensors and simulated with peakcut's memory simulator and device cost models
(bench.peers.simulate). See docs/peers.md.
"""
