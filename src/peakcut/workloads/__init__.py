"""The seven benchmark workloads of the MAGIS paper (Table 2), at paper and tiny size."""

from peakcut.workloads.base import (
    WORKLOAD_NAMES,
    Workload,
    WorkloadInstance,
    get_workload,
    list_workloads,
)

__all__ = ["WORKLOAD_NAMES", "Workload", "WorkloadInstance", "get_workload", "list_workloads"]
