"""Human-facing drawing: memory-timeline plots (plot.py: a step's profile, before and
after a plan, the memory/latency front). Imports only ir, memory and simulate."""
