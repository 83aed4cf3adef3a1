"""The seven benchmark workloads of the MAGIS paper (Table 2) and two full-size LLMs beyond it
(Llama-2-7B, GPT-2-XL), full-graph GNN steps on graphs of ROC's datasets' shape, at paper, medium
and tiny size, and the random NASNet-like networks of the paper's incremental-scheduling
benchmark (random_nasnet).

- base.py: the registry (Workload, WorkloadInstance, the names and sizes), and GPT-2-XL deepened
  for scale tests (deepened_gpt2_xl);
- resnet.py: ResNet-50;
- hf.py: the transformers models (BERT-base, ViT-base, GPT-Neo-1.3B) and their losses;
- btlm.py: BTLM-3B-8K;
- unet.py: U-Net and U-Net++;
- llm.py: Llama-2-7B and GPT-2-XL;
- gnn.py: GCN (edge list and torch.sparse.mm), GraphSAGE, GIN and GAT in plain PyTorch, their losses;
- graphs.py: synthetic power-law graphs of Reddit's and Amazon's shape;
- nasnet.py: random NASNet-like inference networks.
"""

from peakcut.workloads.base import (
    ALL_WORKLOAD_NAMES,
    GNN_WORKLOAD_NAMES,
    LLM_WORKLOAD_NAMES,
    SIZES,
    WORKLOAD_NAMES,
    Workload,
    WorkloadInstance,
    get_workload,
    list_workloads,
)
from peakcut.workloads.nasnet import random_nasnet

__all__ = ["ALL_WORKLOAD_NAMES", "GNN_WORKLOAD_NAMES", "LLM_WORKLOAD_NAMES", "SIZES", "WORKLOAD_NAMES", "Workload", "WorkloadInstance",
           "get_workload", "list_workloads", "random_nasnet"]
