"""Workload registry: the seven benchmark training steps of the MAGIS paper (Table 2),
:data:`WORKLOAD_NAMES`, and two full-size LLMs beyond the paper, :data:`LLM_WORKLOAD_NAMES`
(Llama-2-7B, GPT-2-XL; :mod:`.llm`). :data:`ALL_WORKLOAD_NAMES` is both. The full-graph GNN
steps (:mod:`.gnn`), :data:`GNN_WORKLOAD_NAMES`, are found by name but listed apart.

A :class:`Workload` describes one benchmark; :meth:`Workload.build` turns it into a
:class:`WorkloadInstance` holding a model, an example batch and a loss function such that
``loss_fn(model, batch)`` is one training step's scalar loss.

Three sizes exist for every workload:

* ``"paper"``: the configuration of the paper. The model and batch live on the ``meta`` device
  (no memory is allocated), cast to the paper dtype. Meant for shape-only capture.
* ``"medium"``: the paper architecture (the LLMs: the paper's widths and vocabulary, 2 layers;
  llama2-7b: its decoder widths, 1 layer, vocabulary 8000, see :mod:`.llm`)
  at a batch and input where one real fp32 eager AdamW step on a 2-core CPU takes about 1-4 s
  and holds about 1-5 GB (bench.medium_sizes): big enough that the work is in the kernels, for measured comparisons.
  Real tensors, deterministic in ``seed``; ``facts("medium")`` says what was scaled.
* ``"tiny"``: the same architecture family, shrunk so that one fp32 forward+backward on CPU
  takes milliseconds. Weights and batch are real tensors, deterministic in ``seed``.

Model families live in their own modules (:mod:`.resnet`, :mod:`.unet`, :mod:`.hf`,
:mod:`.btlm`, :mod:`.llm`); each exposes ``make_<workload>(size, batch_size) -> (model, batch)`` which
creates tensors on the ambient default device, and a loss function.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from peakcut.workloads import btlm, gnn, hf, llm, resnet, unet

Batch = tuple[torch.Tensor, ...]
LossFn = Callable[[nn.Module, Batch], torch.Tensor]
MakeFn = Callable[[str, int], tuple[nn.Module, Batch]]

SIZES: tuple[str, ...] = ("paper", "medium", "tiny")
_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class WorkloadInstance:
    """A built workload: ``loss_fn(model, batch)`` is the scalar training loss."""

    name: str
    size: str
    model: nn.Module
    batch: Batch
    loss_fn: LossFn
    dtype: torch.dtype
    batch_size: int
    description: str


@dataclass(frozen=True)
class Workload:
    """One benchmark workload at three sizes (``paper``, ``medium`` and ``tiny``).

    ``paper`` / ``medium`` / ``tiny`` are human-readable facts; their ``"batch"``, ``"dtype"`` and
    ``"input"`` entries are also what :meth:`build` uses for defaults and the description.
    ``title`` names the model in descriptions; ``make(size, batch_size)`` creates the model
    and batch on the ambient device; ``loss`` is the instance's ``loss_fn``.
    """

    name: str
    summary: str
    paper: dict
    medium: dict
    tiny: dict
    title: str = field(kw_only=True, repr=False)
    make: MakeFn = field(kw_only=True, repr=False, compare=False)
    loss: LossFn = field(kw_only=True, repr=False, compare=False)

    def facts(self, size: str) -> dict:
        """The facts dict of ``size`` (one of SIZES)."""
        if size not in SIZES:
            raise ValueError(f"unknown size {size!r}; expected one of {', '.join(SIZES)}")
        return {"paper": self.paper, "medium": self.medium, "tiny": self.tiny}[size]

    def build(
        self, size: str = "tiny", batch_size: int | None = None, seed: int = 0,
        device: str | torch.device | None = None,
    ) -> WorkloadInstance:
        """Build model, example batch and loss function at ``size``.

        By default ``paper`` builds on the ``meta`` device (nothing allocated); ``medium`` and
        ``tiny`` build real CPU tensors whose values depend only on ``seed``. ``device`` builds
        real tensors there instead, at any size (``"cuda"``: a paper-size step on a GPU); values
        then depend on ``seed`` and the device's random generator. The model is in ``train()`` mode.
        """
        facts = self.facts(size)
        bs = int(facts["batch"] if batch_size is None else batch_size)
        if bs < 1:
            raise ValueError(f"batch_size must be >= 1, got {bs}")
        dtype = _DTYPES[facts["dtype"]]
        with _build_context(size, seed, device):
            model, batch = self.make(size, bs)
            model = model.to(dtype=dtype)
            batch = tuple(t.to(dtype) if t.is_floating_point() else t for t in batch)
        model.train()
        description = f"{self.title}, batch {bs}, {facts['input']}, {facts['dtype']}"
        return WorkloadInstance(
            name=self.name,
            size=size,
            model=model,
            batch=batch,
            loss_fn=self.loss,
            dtype=dtype,
            batch_size=bs,
            description=description,
        )


@contextlib.contextmanager
def _build_context(size: str, seed: int, device: str | torch.device | None) -> Iterator[None]:
    """The ambient device tensors are made on (default: meta for ``paper``, else the CPU), with
    a seeded random generator isolated from the caller's."""
    dev = torch.device(device if device is not None else "meta" if size == "paper" else "cpu")
    if dev.type == "meta":
        with torch.device(dev):
            yield
        return
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    with torch.random.fork_rng(devices=[dev.index] if dev.type == "cuda" else []), torch.device(dev):
        torch.manual_seed(seed)
        yield


_WORKLOADS: tuple[Workload, ...] = (
    Workload(
        name="resnet50",
        summary="ResNet-50 image classification (bottleneck, BatchNorm, 1000 classes), CE loss",
        paper={"batch": 64, "input": "3x224x224", "dtype": "fp32", "params": "25.6M"},
        medium={"batch": 8, "input": "3x224x224", "dtype": "fp32", "params": "25.6M"},
        tiny={"batch": 4, "input": "3x32x32", "dtype": "fp32", "classes": 10, "width": 8},
        title="ResNet-50",
        make=resnet.make_resnet50,
        loss=resnet.classification_loss,
    ),
    Workload(
        name="bert-base",
        summary="BERT-base masked-LM (HF BertForMaskedLM, 12x768, 12 heads), MLM loss",
        paper={"batch": 32, "input": "seq 512", "dtype": "fp32", "params": "110M"},
        medium={"batch": 4, "input": "seq 128", "dtype": "fp32", "params": "110M"},
        tiny={"batch": 4, "input": "seq 32", "dtype": "fp32", "layers": 2, "hidden": 64},
        title="BERT-base MLM",
        make=hf.make_bert_base,
        loss=hf.masked_lm_loss,
    ),
    Workload(
        name="vit-base",
        summary="ViT-base/16 image classification (HF ViTForImageClassification), CE loss",
        paper={"batch": 64, "input": "3x224x224", "dtype": "fp32", "params": "86M"},
        medium={"batch": 4, "input": "3x224x224", "dtype": "fp32", "params": "86M"},
        tiny={"batch": 4, "input": "3x32x32", "dtype": "fp32", "patch": 8, "hidden": 64},
        title="ViT-base/16",
        make=hf.make_vit_base,
        loss=hf.image_classification_loss,
    ),
    Workload(
        name="unet",
        summary="U-Net segmentation (base 64, depth 4, BatchNorm, transposed-conv up), pixel CE",
        paper={"batch": 32, "input": "3x256x256", "dtype": "fp32", "params": "31.0M"},
        medium={"batch": 6, "input": "3x128x128", "dtype": "fp32", "params": "31.0M"},
        tiny={"batch": 2, "input": "3x32x32", "dtype": "fp32", "base": 8, "depth": 3},
        title="U-Net",
        make=unet.make_unet,
        loss=unet.segmentation_loss,
    ),
    Workload(
        name="unetpp",
        summary="U-Net++ segmentation (nested dense skips, base 32, depth 4), pixel CE",
        paper={"batch": 16, "input": "3x256x256", "dtype": "fp32", "params": "9.0M"},
        medium={"batch": 8, "input": "3x128x128", "dtype": "fp32", "params": "9.0M"},
        tiny={"batch": 2, "input": "3x32x32", "dtype": "fp32", "base": 8, "depth": 3},
        title="U-Net++",
        make=unet.make_unetpp,
        loss=unet.segmentation_loss,
    ),
    Workload(
        name="gpt-neo-1.3b",
        summary="GPT-Neo-1.3B causal LM (HF GPTNeoForCausalLM, local/global attention), LM loss",
        paper={"batch": 32, "input": "seq 512", "dtype": "bf16", "params": "1.3B"},
        medium={"batch": 1, "input": "seq 128", "dtype": "fp32", "layers": 2, "params": "208M"},
        tiny={"batch": 4, "input": "seq 32", "dtype": "fp32", "layers": 2, "hidden": 64},
        title="GPT-Neo-1.3B",
        make=hf.make_gpt_neo_1_3b,
        loss=hf.causal_lm_loss,
    ),
    Workload(
        name="btlm-3b",
        summary="BTLM-3B-8K causal LM (ALiBi, SwiGLU, muP, tied head), LM loss",
        paper={"batch": 32, "input": "seq 512", "dtype": "bf16", "params": "2.6B"},
        medium={"batch": 1, "input": "seq 128", "dtype": "fp32", "layers": 2, "params": "286M"},
        tiny={"batch": 4, "input": "seq 32", "dtype": "fp32", "layers": 2, "hidden": 64},
        title="BTLM-3B-8K",
        make=btlm.make_btlm_3b,
        loss=btlm.btlm_loss,
    ),
)

_LLM_WORKLOADS: tuple[Workload, ...] = (
    Workload(
        name="llama2-7b",
        summary="Llama-2-7B causal LM (HF LlamaForCausalLM, RoPE, SwiGLU, RMSNorm, untied head), LM loss",
        paper={"batch": 8, "input": "seq 2048", "dtype": "bf16", "params": "6.74B"},
        medium={"batch": 1, "input": "seq 128", "dtype": "fp32", "layers": 1, "vocab": 8000,
                "params": "268M"},
        tiny={"batch": 4, "input": "seq 32", "dtype": "fp32", "layers": 2, "hidden": 64},
        title="Llama-2-7B",
        make=llm.make_llama2_7b,
        loss=hf.causal_lm_loss,
    ),
    Workload(
        name="gpt2-xl",
        summary="GPT-2-XL causal LM (HF GPT2LMHeadModel, 48x1600, 25 heads, tied head), LM loss",
        paper={"batch": 16, "input": "seq 1024", "dtype": "fp32", "params": "1.56B"},
        medium={"batch": 1, "input": "seq 128", "dtype": "fp32", "layers": 2, "params": "144M"},
        tiny={"batch": 4, "input": "seq 32", "dtype": "fp32", "layers": 2, "hidden": 64},
        title="GPT-2-XL",
        make=llm.make_gpt2_xl,
        loss=hf.causal_lm_loss,
    ),
)



def _gnn_workload(model: str, dataset: str, title: str, summary: str) -> Workload:
    """A full-graph GNN step (:mod:`.gnn`) on a synthetic graph of `dataset`'s shape (batch: one graph)."""
    def facts(size: str) -> dict:
        dims = gnn.size_of(dataset, size)
        g = dims.graph
        return {"batch": 1, "input": f"{g.vertices:,} vertices, {g.edges:,} edges, {g.features} features",
                "dtype": "fp32", "classes": g.classes, "hidden": dims.hidden,
                **({"heads": dims.heads} if model == "gat" else {})}
    return Workload(name=f"{dataset}-{model}", summary=summary, paper=facts("paper"), medium=facts("medium"),
                    tiny=facts("tiny"), title=f"{title} on {'an' if dataset[0] in 'aeiou' else 'a'} "
                                              f"{dataset.capitalize()}-shaped graph",
                    make=functools.partial(gnn.make_gnn, model, dataset), loss=gnn.masked_loss)


_GNN_WORKLOADS: tuple[Workload, ...] = (
    _gnn_workload("gcn", "reddit", "GCN", "GCN, 2 layers, index_add_ over an edge list, Reddit-shaped graph, masked CE"),
    _gnn_workload("sage", "reddit", "GraphSAGE", "GraphSAGE (mean), 2 layers, Reddit-shaped graph, masked CE"),
    _gnn_workload("gin", "reddit", "GIN", "GIN (learned eps, 2-layer MLPs), 2 layers, Reddit-shaped graph, masked CE"),
    _gnn_workload("gat", "reddit", "GAT", "GAT (edge softmax), 8 heads then 1, Reddit-shaped graph, masked CE"),
    _gnn_workload("gcn-sparse", "reddit", "GCN (torch.sparse.mm)",
                  "GCN, 2 layers, torch.sparse.mm over a COO adjacency, Reddit-shaped graph, masked CE"),
    _gnn_workload("gcn", "amazon", "GCN", "GCN, 2 layers, index_add_ over an edge list, Amazon-shaped graph, masked CE"),
)

WORKLOAD_NAMES: tuple[str, ...] = tuple(w.name for w in _WORKLOADS)
"""The seven MAGIS Table 2 workloads (what benchmarks iterate; no 7B model among them)."""
LLM_WORKLOAD_NAMES: tuple[str, ...] = tuple(w.name for w in _LLM_WORKLOADS)
"""The full-size LLMs beyond the paper's table: Llama-2-7B and GPT-2-XL."""
ALL_WORKLOAD_NAMES: tuple[str, ...] = WORKLOAD_NAMES + LLM_WORKLOAD_NAMES
GNN_WORKLOAD_NAMES: tuple[str, ...] = tuple(w.name for w in _GNN_WORKLOADS)
"""The full-graph GNN steps (:mod:`.gnn`), named ``<dataset>-<model>``; not among the benchmarks' lists."""


def list_workloads(gnn: bool = False) -> list[Workload]:
    """The paper's Table 2 in its order, then the LLMs; with ``gnn``, then the GNN steps."""
    return [*_WORKLOADS, *_LLM_WORKLOADS, *(_GNN_WORKLOADS if gnn else ())]


def get_workload(name: str) -> Workload:
    """The workload called ``name``; raises ``ValueError`` listing valid names otherwise."""
    for workload in (*_WORKLOADS, *_LLM_WORKLOADS, *_GNN_WORKLOADS):
        if workload.name == name:
            return workload
    raise ValueError(f"unknown workload {name!r}; valid names: {', '.join(ALL_WORKLOAD_NAMES + GNN_WORKLOAD_NAMES)}")


def deepened_gpt2_xl(n_layer: int = 96, size: str = "paper", batch_size: int | None = None,
                     seed: int = 0) -> WorkloadInstance:
    """The ``gpt2-xl`` workload with ``n_layer`` layers instead of 48, built as the registry builds
    it (``paper``: on the meta device, nothing allocated), for scale tests."""
    workload = dataclasses.replace(get_workload("gpt2-xl"), title=f"GPT-2-XL deepened to {n_layer} layers",
                                   make=functools.partial(llm.make_gpt2_xl, n_layer=n_layer))
    return workload.build(size, batch_size, seed)
