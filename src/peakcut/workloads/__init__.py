"""The seven benchmark workloads of the MAGIS paper (Table 2), at paper, medium and tiny size, and the
random NASNet-like networks of its incremental-scheduling benchmark (random_nasnet)."""

from peakcut.workloads.base import (
    SIZES,
    WORKLOAD_NAMES,
    Workload,
    WorkloadInstance,
    get_workload,
    list_workloads,
)
from peakcut.workloads.nasnet import random_nasnet

__all__ = ["SIZES", "WORKLOAD_NAMES", "Workload", "WorkloadInstance", "get_workload", "list_workloads",
           "random_nasnet"]
