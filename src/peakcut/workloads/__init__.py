"""The seven benchmark workloads of the MAGIS paper (Table 2) and the full-size LLMs of issue 17
(Llama-2-7B, GPT-2-XL), at paper, medium and tiny size, and the random NASNet-like networks of
the paper's incremental-scheduling benchmark (random_nasnet)."""

from peakcut.workloads.base import (
    ALL_WORKLOAD_NAMES,
    LLM_WORKLOAD_NAMES,
    SIZES,
    WORKLOAD_NAMES,
    Workload,
    WorkloadInstance,
    get_workload,
    list_workloads,
)
from peakcut.workloads.nasnet import random_nasnet

__all__ = ["ALL_WORKLOAD_NAMES", "LLM_WORKLOAD_NAMES", "SIZES", "WORKLOAD_NAMES", "Workload", "WorkloadInstance",
           "get_workload", "list_workloads", "random_nasnet"]
