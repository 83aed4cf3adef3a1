"""Which optimizer a step updates with: the user's torch.optim object, described by name.

A captured step records an OptimizerSpec: the kind (sgd, adam, adamw), and per param
group the parameters (by their names in the model), the hyper-parameters at capture
time, the options that change the update's code (maximize, nesterov, amsgrad,
weight decay on or off, momentum on or off) and the implementation torch.optim runs for
that group on the parameters' device (`impl`: "single" for the for-loop, "foreach",
"fused"; resolve_impl, as torch.optim's own default picks it). The update itself is in
capture.update; its hyper-parameters are run-time inputs read from the optimizer at every
step.

SGD, Adam and AdamW are recipes for a torch.optim optimizer over all trainable
parameters (what `optimizer="sgd"` / `"adamw"` mean), with torch.optim's default
implementation (foreach=None: foreach on a GPU, the for-loop on a CPU); any torch.optim.SGD,
Adam or AdamW instance is accepted as it is. Anything else is refused by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.optim.optimizer import _default_to_fused_or_foreach

SUPPORTED = "torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW"
IMPLS = ("single", "foreach", "fused")
"""How torch.optim runs a group's update: the for-loop, ops over tensor lists, one fused kernel."""
_REFUSED_FLAGS = {
    "capturable": "capturable keeps the step count on the device and changes the arithmetic",
    "differentiable": "a differentiable update is not a training step",
}


@dataclass(frozen=True)
class SGD:
    """A torch.optim.SGD over all trainable parameters (torch.optim's default implementation)."""

    lr: float = 1e-2
    momentum: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    dampening: float = 0.0
    maximize: bool = False

    def build(self, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay,
                               nesterov=self.nesterov, dampening=self.dampening, maximize=self.maximize)


@dataclass(frozen=True)
class Adam:
    """A torch.optim.Adam over all trainable parameters (torch.optim's default implementation)."""

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    amsgrad: bool = False
    maximize: bool = False

    def build(self, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        cls = torch.optim.AdamW if isinstance(self, AdamW) else torch.optim.Adam
        return cls(params, lr=self.lr, betas=(self.beta1, self.beta2), eps=self.eps,
                   weight_decay=self.weight_decay, amsgrad=self.amsgrad, maximize=self.maximize)


@dataclass(frozen=True)
class AdamW(Adam):
    """A torch.optim.AdamW over all trainable parameters (torch.optim's default implementation)."""

    weight_decay: float = 1e-2


Recipe = SGD | Adam | AdamW
_BY_NAME: dict[str, Recipe] = {"sgd": SGD(momentum=0.9), "adam": Adam(), "adamw": AdamW()}


@dataclass(frozen=True)
class GroupSpec:
    """One param group: parameter names, capture-time hyper-parameters, code-changing flags."""

    params: tuple[str, ...]
    hyper: dict[str, float]
    flags: tuple[str, ...] = ()
    impl: str = "single"                        # one of IMPLS

    def flag(self, name: str) -> bool:
        return name in self.flags

    def structure(self) -> tuple[Any, ...]:
        """What the traced update's code depends on (values of the rest are run-time inputs)."""
        return (self.hyper.get("weight_decay", 0) != 0, self.hyper.get("momentum", 0) != 0, self.flags, self.impl)


@dataclass(frozen=True)
class OptimizerSpec:
    """The update a step was captured with (see the module docstring)."""

    kind: str                                   # "sgd" | "adam" | "adamw"
    groups: tuple[GroupSpec, ...] = field(default_factory=tuple)

    def slots(self, group: GroupSpec) -> tuple[str, ...]:
        """State tensors of each parameter of `group` the traced update reads: Adam's 'step'
        only where the fused kernel reads it (a device tensor the step advances), else it stays
        in the state dict and the scalars are computed from it."""
        if self.kind == "sgd":
            return ("momentum_buffer",) if group.hyper["momentum"] != 0 else ()
        moments = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if group.flag("amsgrad") else ("exp_avg", "exp_avg_sq")
        return (*moments, "step") if group.impl == "fused" else moments

    def group_of(self) -> dict[str, int]:
        """Parameter name -> index of its group."""
        return {name: i for i, g in enumerate(self.groups) for name in g.params}

    def build(self, params: Mapping[str, torch.nn.Parameter]) -> torch.optim.Optimizer:
        """A fresh torch.optim optimizer with these groups over the named parameters."""
        groups = []
        for g in self.groups:
            h = dict(g.hyper)
            entry: dict[str, Any] = {"params": [params[n] for n in g.params]}
            if self.kind == "sgd":
                entry.update(lr=h["lr"], momentum=h["momentum"], dampening=h["dampening"],
                             weight_decay=h["weight_decay"], nesterov=g.flag("nesterov"))
            else:
                entry.update(lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"],
                             weight_decay=h["weight_decay"], amsgrad=g.flag("amsgrad"),
                             decoupled_weight_decay=g.flag("decoupled_weight_decay"))
            entry["maximize"] = g.flag("maximize")
            entry["foreach"] = g.impl == "foreach"
            entry["fused"] = True if g.impl == "fused" else None
            groups.append(entry)
        cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[self.kind]
        return cls(groups)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> OptimizerSpec | None:
        if not d:
            return None
        if d.get("kind") not in ("sgd", "adam", "adamw") or "groups" not in d:
            raise ValueError(f"unknown optimizer description {dict(d)!r} (saved by an older peakcut? "
                             "capture the model again)")
        groups = tuple(GroupSpec(tuple(g["params"]), dict(g["hyper"]), tuple(g.get("flags", ())),
                                 str(g.get("impl", "single")))
                       for g in d["groups"])
        unknown = sorted({g.impl for g in groups} - set(IMPLS))
        if unknown:
            raise ValueError(f"unknown update implementation {unknown[0]!r} in {dict(d)!r}")
        return OptimizerSpec(d["kind"], groups)


def resolve_optimizer(optimizer: object, trainable: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer | None:
    """None, "sgd" / "adam" / "adamw", a recipe (peakcut.SGD / Adam / AdamW) or a torch.optim
    optimizer -> the torch.optim optimizer the step updates with (recipes over `trainable`)."""
    if optimizer is None or isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    if isinstance(optimizer, str):
        recipe = _BY_NAME.get(optimizer.lower())
        if recipe is None:
            raise ValueError(f"optimizer={optimizer!r}: expected one of {sorted(_BY_NAME)}, a peakcut.SGD/Adam/"
                             f"AdamW recipe, a {SUPPORTED} instance, or None")
        return recipe.build(list(trainable))
    if isinstance(optimizer, (SGD, Adam, AdamW)):
        return optimizer.build(list(trainable))
    raise TypeError(f"optimizer: expected None, 'sgd', 'adam', 'adamw', a peakcut recipe or a {SUPPORTED} "
                    f"instance, got {type(optimizer).__name__}")


def describe(opt: torch.optim.Optimizer, model: torch.nn.Module,
             by_name: Mapping[str, torch.Tensor] | None = None) -> OptimizerSpec:
    """The OptimizerSpec of a torch.optim optimizer over `model`'s parameters (`by_name`:
    model.named_parameters() as a dict, when the caller has it); a clear error for
    optimizers, options and parameters peakcut cannot reproduce exactly."""
    name = type(opt).__name__
    if type(opt).__module__.startswith("accelerate."):
        raise TypeError(f"optimizer accelerate {name}: use peakcut.integrations.accelerate.optimize(accelerator, "
                        "model, batch, loss_fn, optimizer), which plans with the accelerator's mixed precision "
                        "and gradient accumulation")
    if type(opt) not in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW):
        raise TypeError(f"optimizer {type(opt).__module__}.{name} is not supported (subclasses neither: "
                        "their step() may differ): peakcut reproduces "
                        f"{SUPPORTED} exactly (any param groups, LR schedules, amsgrad, nesterov, maximize); "
                        "use one of them, or optimizer=None to get gradients and step your optimizer yourself")
    named = model.named_parameters() if by_name is None else by_name.items()
    names = {id(p): n for n, p in named}
    groups = []
    kind = "sgd" if isinstance(opt, torch.optim.SGD) else "adam"
    for gi, group in enumerate(opt.param_groups):
        for flag, why in _REFUSED_FLAGS.items():
            if group.get(flag):
                raise ValueError(f"{name} param group {gi}: {flag}=True is not supported ({why}); "
                                 f"use {flag}=False")
        params = []
        for p in group["params"]:
            if id(p) not in names:
                raise ValueError(f"{name} param group {gi} holds a parameter of shape {tuple(p.shape)} that is "
                                 f"not a parameter of {type(model).__name__}")
            if p.is_complex():
                raise ValueError(f"{name}: parameter {names[id(p)]!r} is complex; not supported")
            params.append(names[id(p)])
        if kind == "sgd":
            hyper = {k: _number(group[k], name, gi, k) for k in ("lr", "momentum", "dampening", "weight_decay")}
            flags = tuple(f for f in ("nesterov", "maximize") if group.get(f))
        else:
            kind = "adamw" if isinstance(opt, torch.optim.AdamW) else "adam"
            b1, b2 = group["betas"]
            hyper = {"lr": _number(group["lr"], name, gi, "lr"), "beta1": _number(b1, name, gi, "betas"),
                     "beta2": _number(b2, name, gi, "betas"), "eps": _number(group["eps"], name, gi, "eps"),
                     "weight_decay": _number(group["weight_decay"], name, gi, "weight_decay")}
            # AdamW is Adam with decoupled weight decay; torch.optim allows it per group
            flags = tuple(f for f in ("amsgrad", "maximize", "decoupled_weight_decay") if group.get(f))
        groups.append(GroupSpec(tuple(params), hyper, flags, resolve_impl(opt, group, gi)))
    return OptimizerSpec(kind, tuple(groups))


def resolve_impl(opt: torch.optim.Optimizer, group: Mapping[str, Any], gi: int) -> str:
    """The implementation torch.optim runs for this param group (IMPLS): the user's foreach=True or
    fused=True as set; with neither set, torch.optim's default on the parameters' device
    (torch.optim.optimizer._default_to_fused_or_foreach: foreach on CUDA, the for-loop on a
    CPU). Fused is accepted for Adam and AdamW (SGD's fused kernel is refused)."""
    fused, foreach = group.get("fused"), group.get("foreach")
    if fused and isinstance(opt, torch.optim.SGD):
        raise ValueError(f"SGD param group {gi}: fused=True is not supported (peakcut reproduces the fused "
                         "kernels of Adam and AdamW); use fused=False")
    if fused is None and foreach is None:
        params = [p for p in group["params"] if isinstance(p, torch.Tensor)]
        foreach = _default_to_fused_or_foreach(params, False, use_fused=False)[1]
    if isinstance(opt, torch.optim.SGD):
        return "foreach" if foreach else "fused" if fused else "single"
    return "fused" if fused else "foreach" if foreach else "single"


def _number(v: Any, opt: str, gi: int, key: str) -> float:
    if isinstance(v, torch.Tensor):
        raise ValueError(f"{opt} param group {gi}: {key} is a Tensor; peakcut supports Python-number "
                         "hyper-parameters only (a tensor lr changes torch.optim's arithmetic)")
    return float(v)
