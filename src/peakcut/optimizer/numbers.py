"""Numbers verified: each candidate plan's first step against the user's eager step.

    found = check(candidates, model, batch, eager, optimizer, entry, reset, tolerance, snapshot_bytes)

Verification (peakcut.optimizer.verify) runs the user's eager step once and then every
candidate once, each from the state the user's objects were in on entry (parameters,
buffers, optimizer state, and the RNG, so that dropout draws the same masks; `reset` puts
them back after every run), with every .grad None as after optimizer.zero_grad(). Compared:
the loss, and a fingerprint of each value the step changes: a trainable parameter's update
(its value after - before), a buffer's change, an optimizer state tensor's change (before:
the entry value, or zeros for state the step creates), and the gradient left in .grad of a
trainable parameter that no optimizer updates (all of them without an optimizer). A
fingerprint is three float64 numbers: the sum, the norm, and the dot product with a fixed
pseudo-random +-1 probe (seeded by the value's name: independent bits), made on the host
CHUNK values at a time with float64 operands only (a mixed-dtype subtraction or product runs
torch's slow path: 5x the time).

Tolerance. `relative` (tolerance_for) comes from the dtypes of the candidates' graphs and
their largest tensor K (an upper bound of any reduction's length): reductions accumulate in
the least precise floating dtype of the step, but at least float32, so
rounding_tolerance(that dtype, K) (runtime.equivalence); values of a narrower dtype (bf16
autocast) are rounded to it by the ops that make them, so at least NARROW_ROUNDINGS x
rounding_tolerance(narrow, 1) (bf16: 0.125, 32 roundings; a gradient scaled by 1.5 is off by
0.5); so are float32 values where float32 math is TF32 (float16's mantissa: a GPU's
convolutions by default) or bf16 (float32_math). A value's error norm E may be `relative` x the larger of its own norm and sqrt(numel)
x its group's scale: the upper quartile of the per-element RMS of every update (or gradient,
each buffer name, each state slot) of as many dimensions, or of any dimensions where fewer
than MIN_GROUP share them. A gradient that is zero up to rounding (an attention key's bias, a
bias before a norm) is rounding noise in eager and in any plan, of the size of rounding of
its neighbours' values. From E follow: the norm may differ by E; the sum by sqrt(numel) x E
(Cauchy-Schwarz: always); the probe's dot product by PROBE_SIGMAS x E (the probe is
independent of rounding errors: a larger difference has probability below
2 exp(-PROBE_SIGMAS^2 / 2) = 2.5e-14). The loss may differ by `relative` x its size.

Adam's update divides by sqrt(exp_avg_sq): an element whose gradient is within rounding of
zero may flip its update's sign, so the update's error grows as the square root of its
gradient's relative error r (E / norm of the parameter's exp_avg): E = 2 sqrt(r) x its norm,
and where r >= NOISE_RATIO it is not judged (its gradient is rounding noise, and so is its
update, in eager too); exp_avg and exp_avg_sq are judged as above and carry the gradient.

A candidate with a value that differs by more, values that are not the same set, or a
non-finite value where eager's is finite (or the other way) does not compute eager's numbers.

Memory: the fingerprints (FINGERPRINT_BYTES a value), two float64 chunks and one chunk's
probe bits at a time in host memory (and a flat host copy of the value or of its entry value
where it lives on a device or is not contiguous),
and no snapshot beyond the entry state verification holds anyway (verify.Restore).
"""

from __future__ import annotations

import math
import statistics
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from peakcut.codegen.program import Step
from peakcut.cost.inputs import error_line
from peakcut.ir.graph import Graph
from peakcut.runtime.equivalence import rounding_tolerance
from peakcut.units import format_bytes

PROBE_SIGMAS = 8.0
NARROW_ROUNDINGS = 2.0
NOISE_RATIO = 0.25
"""Adam's update is not judged where its gradient's relative error allowed reaches this."""
FIRST_MOMENT, SECOND_MOMENT = "exp_avg", "exp_avg_sq"
FINGERPRINT_BYTES = 3 * 8
MIN_GROUP = 4
CHUNK = 1 << 20
"""Values fingerprinted at once (two float64 chunks: 16 MiB)."""
_BIT_SHIFTS = torch.arange(8, dtype=torch.uint8)
TIMING_SAMPLE = 1 << 22
"""Values fingerprinted once to time it here (16 MB of float32: past the caches, as the step's are)."""
CHANGED_INPUTS = ("param:", "state:", "buffer:")
"""The step's inputs whose values the check fingerprints after each run (their updates)."""


@dataclass(frozen=True)
class Fingerprint:
    """One value in float64: its element count and dimensions, sum, norm and dot product with
    its probe."""

    numel: int
    ndim: int
    sum: float
    norm: float
    dot: float


@dataclass(frozen=True)
class StepNumbers:
    """One step's loss and fingerprints: 'param:<name>' (update), 'grad:<name>', 'buffer:<name>'
    (change), 'state:<param>.<slot>' (change); None for a .grad the step left None."""

    loss: float
    values: dict[str, Fingerprint | None]
    transient_bytes: int          # the most host memory one fingerprint took


@dataclass(frozen=True)
class Tolerance:
    """The relative tolerance of one check, and what it was derived from."""

    relative: float
    dtypes: tuple[str, ...]        # accumulation dtype first, then a narrower one, if any
    reduction: int

    def as_dict(self) -> dict[str, Any]:
        return {"relative": self.relative, "dtypes": list(self.dtypes), "reduction": self.reduction,
                "probe_sigmas": PROBE_SIGMAS}


@dataclass(frozen=True)
class Judgement:
    """One candidate's numbers against eager's: the largest difference / allowed seen, and why
    it does not compute eager's numbers ('' when it does)."""

    index: int                     # in the candidates given
    name: str
    worst: float
    worst_value: str
    why: str = ""
    unjudged: tuple[str, ...] = ()

    @property
    def matches(self) -> bool:
        return not self.why

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "matches": self.matches, "worst": self.worst, "worst_value": self.worst_value,
                **({"why": self.why} if self.why else {}),
                **({"unjudged": list(self.unjudged)} if self.unjudged else {})}


@dataclass(frozen=True)
class NumbersCheck:
    """What the check found for every candidate, and what it cost."""

    tolerance: Tolerance
    judged: tuple[Judgement, ...]
    failed: tuple[tuple[int, str, str], ...]     # (index, name, why) of candidates that could not run
    values: int                                  # fingerprinted values per step
    transient_bytes: int
    snapshot_bytes: int                          # the entry state verification holds anyway
    seconds: float
    stepped: bool = False                        # the last candidate's state stays (check: settle)
    reference: StepNumbers | None = field(default=None, repr=False, compare=False)   # eager's, for check(ref=)

    def with_more(self, later: NumbersCheck) -> NumbersCheck:
        """This check and `later` (candidates checked against the same reference afterwards)."""
        return replace(self, judged=self.judged + later.judged, failed=self.failed + later.failed,
                       transient_bytes=max(self.transient_bytes, later.transient_bytes),
                       seconds=self.seconds + later.seconds, stepped=later.stepped)

    @property
    def rejected(self) -> tuple[tuple[str, str], ...]:
        """(name, why) of every candidate whose numbers differ from eager's."""
        return tuple((j.name, j.why) for j in self.judged if not j.matches)

    @property
    def passed(self) -> frozenset[int]:
        return frozenset(j.index for j in self.judged if j.matches)

    @property
    def fingerprint_bytes(self) -> int:
        """Eager's fingerprints and one candidate's, held at once (the loss with each)."""
        return 2 * (FINGERPRINT_BYTES * self.values + 8)

    def report(self) -> dict[str, Any]:
        return {
            "method": "first step of each candidate against eager's, from the same parameters, buffers, "
                      "optimizer state and RNG: the loss, and float64 fingerprints (sum, norm, dot with a fixed "
                      "+-1 probe) of every update, buffer change, optimizer state change and .grad left",
            "tolerance": self.tolerance.as_dict(),
            "values": self.values,
            "memory": {"fingerprint_bytes": self.fingerprint_bytes, "transient_host_bytes": self.transient_bytes,
                       "snapshot_bytes": 0, "entry_snapshot_bytes": self.snapshot_bytes,
                       "text": f"{format_bytes(self.fingerprint_bytes)} of fingerprints (3 float64 for each of "
                               f"{self.values} values, eager's and one candidate's at a time) and at most "
                               f"{format_bytes(self.transient_bytes)} of host memory while one is made, between "
                               "runs (no measured run sees it); no snapshot beyond the entry state verification "
                               f"holds anyway ({format_bytes(self.snapshot_bytes)}, host memory)"},
            "candidates": [j.as_dict() for j in self.judged],
            "rejected": [{"name": n, "why": w} for n, w in self.rejected],
            "seconds": round(self.seconds, 3),
        }


def float32_math(device: torch.device) -> torch.dtype | None:
    """The mantissa float32 matmuls and convolutions may be rounded to on `device`: float16's
    for TF32 (float32 matmul precision "high"; on a GPU also cuDNN's allow_tf32, on by
    default), bfloat16's for precision "medium"; None: float32's own."""
    precision = torch.get_float32_matmul_precision()
    if precision == "medium":
        return torch.bfloat16
    if precision == "high" or (device.type == "cuda" and (torch.backends.cuda.matmul.allow_tf32
                                                         or torch.backends.cudnn.allow_tf32)):
        return torch.float16
    return None


def tolerance_for(graphs: Iterable[Graph], float32_as: torch.dtype | None = None) -> Tolerance:
    """The check's relative tolerance for steps made of `graphs` (module doc); float32_as:
    the dtype whose mantissa float32 math is rounded to (float32_math), if narrower."""
    dtypes: set[torch.dtype] = set()
    reduction = 1
    for g in graphs:
        for t in g.tensors.values():
            dtype = t.torch_dtype
            if dtype.is_floating_point:
                dtypes.add(dtype)
            reduction = max(reduction, t.numel)
    eps32 = torch.finfo(torch.float32).eps
    accumulated = max(dtypes, key=lambda d: min(torch.finfo(d).eps, eps32), default=torch.float32)
    if torch.finfo(accumulated).eps > eps32:
        accumulated = torch.float32
    relative = rounding_tolerance(accumulated, reduction)
    names = [str(accumulated).removeprefix("torch.")]
    rounded = {*dtypes, *([float32_as] if float32_as is not None and torch.float32 in dtypes else [])}
    narrow = max(rounded, key=lambda d: torch.finfo(d).eps, default=accumulated)
    if torch.finfo(narrow).eps > torch.finfo(accumulated).eps:
        relative = max(relative, NARROW_ROUNDINGS * rounding_tolerance(narrow, 1))
        names.append(str(narrow).removeprefix("torch.") + (" (float32 math)" if narrow not in dtypes else ""))
    return Tolerance(relative, tuple(names), reduction)


def fingerprint(value: torch.Tensor, key: str, before: torch.Tensor | None = None) -> tuple[Fingerprint, int]:
    """The fingerprint of value - before (module doc), and the host bytes it took to make."""
    value = value.detach()
    extra = 0
    if value.device.type != "cpu":
        value = value.to("cpu")
        extra = value.numel() * value.element_size()
    if not value.is_contiguous():          # flattened into a copy of its own dtype
        extra += value.numel() * value.element_size()
    flat = value.reshape(-1)
    base = None
    if before is not None and before.shape == value.shape:
        if before.device.type != "cpu" or not before.is_contiguous():
            extra += before.numel() * before.element_size()
        base = before.detach().to("cpu").reshape(-1)
    n = flat.numel()
    x = torch.empty(min(n, CHUNK), dtype=torch.float64)
    y = torch.empty_like(x)
    probe = torch.Generator().manual_seed(zlib.crc32(key.encode()))
    total = squares = dot = 0.0
    for start in range(0, n, CHUNK):
        m = min(CHUNK, n - start)
        xs, ys = x[:m], y[:m]
        xs.copy_(flat[start:start + m])
        if base is not None:
            xs.sub_(ys.copy_(base[start:start + m]))
        total += float(xs.sum())
        squares += float(torch.dot(xs, xs))
        packed = torch.randint(0, 256, ((m + 7) // 8,), dtype=torch.uint8, generator=probe)
        bits = packed.unsqueeze(1).bitwise_right_shift(_BIT_SHIFTS).bitwise_and_(1).view(-1)[:m]
        dot += float(torch.dot(xs, ys.copy_(bits).mul_(2).sub_(1)))      # the +-1 probe in float64
        del packed, bits
    used = x.numel() * (2 * x.element_size() + 1) + x.numel() // 8
    return Fingerprint(n, value.dim(), total, math.sqrt(squares), dot), extra + used


def checked_values(g: Graph) -> int:
    """The values the numbers check fingerprints after one run of step `g`: its trainable
    parameters' (a frozen parameter, a LoRA model's base weights, is not fingerprinted), its
    buffers' and its optimizer state's."""
    trained = {f"param:{name}" for name in g.signature.requires_grad}
    return sum(g.tensors[t].numel for t, name in zip(g.inputs, g.input_names, strict=True)
               if name.startswith(CHANGED_INPUTS) and (not name.startswith("param:") or name in trained))


def check_seconds(g: Graph) -> float:
    """About what fingerprinting one run of step `g` takes on this machine (module doc):
    checked_values(g) x the time of a fingerprint of TIMING_SAMPLE values, timed here (the
    second of two: the first pays for first touches). On BTLM-3B at medium size (858 million
    values) about 3 s a run on the 2-core development VM, three runs in a latency limit's
    check."""
    sample = torch.ones(TIMING_SAMPLE)
    before = torch.zeros(TIMING_SAMPLE)
    fingerprint(sample, "timing", before)
    t0 = time.perf_counter()
    fingerprint(sample, "timing", before)
    return (time.perf_counter() - t0) * checked_values(g) / TIMING_SAMPLE


def take(loss: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
         entry: Mapping[str, torch.Tensor]) -> StepNumbers:
    """The numbers of the step just run on `model` and `optimizer` (module doc); `entry`: the
    values before it, by key ('param:<name>', 'buffer:<name>', 'state:<param>.<slot>')."""
    updated = set() if optimizer is None else {id(p) for g in optimizer.param_groups for p in g["params"]}
    values: dict[str, Fingerprint | None] = {}
    most = 0

    def add(key: str, value: torch.Tensor | None, before: torch.Tensor | None = None) -> None:
        nonlocal most
        if value is None:
            values[key] = None
            return
        values[key], used = fingerprint(value, key, before)
        most = max(most, used)

    names: dict[int, str] = {}
    for name, p in model.named_parameters():
        names[id(p)] = name
        if p.requires_grad:
            if id(p) in updated:
                add(f"param:{name}", p, entry.get(f"param:{name}"))
            else:
                add(f"grad:{name}", p.grad)
    for name, b in model.named_buffers():
        add(f"buffer:{name}", b, entry.get(f"buffer:{name}"))
    for owner, state in ({} if optimizer is None else optimizer.state).items():
        pname = names.get(id(owner))
        if pname is not None:
            for slot, v in state.items():
                if isinstance(v, torch.Tensor):
                    add(f"state:{pname}.{slot}", v, entry.get(f"state:{pname}.{slot}"))
    return StepNumbers(float(torch.as_tensor(loss).detach().double().cpu()), values, most)


def _groups(key: str, f: Fingerprint) -> tuple[str, str]:
    """The values whose elements are of about one size: every update (or gradient), each
    buffer name, each optimizer state slot; and among them, those of as many dimensions."""
    kind, _, name = key.partition(":")
    group = f"{kind}:{name.rpartition('.')[2]}" if kind in ("buffer", "state") else kind
    return group, f"{group}:{f.ndim}"


def allowances(ref: StepNumbers, relative: float) -> dict[str, float | None]:
    """Each value's allowed error norm against eager's `ref` (None: not judged; module doc).
    A value's scale: the upper quartile of its group's per-element RMS, among those of as
    many dimensions where they are MIN_GROUP or more."""
    rms: dict[str, list[float]] = {}
    for key, f in ref.values.items():
        if f is not None and f.numel and math.isfinite(f.norm):
            for group in _groups(key, f):
                rms.setdefault(group, []).append(f.norm / math.sqrt(f.numel))
    scale = {g: statistics.quantiles(v, n=4)[2] if len(v) > 1 else v[0] for g, v in rms.items()}
    allowed: dict[str, float | None] = {}
    for key, f in ref.values.items():
        if f is None:
            allowed[key] = 0.0
            continue
        group, fine = _groups(key, f)
        size = scale.get(fine if len(rms.get(fine, ())) >= MIN_GROUP else group, 0.0)
        allowed[key] = relative * max(f.norm, math.sqrt(f.numel) * size)
    for key, f in ref.values.items():
        name = key.removeprefix("param:")
        if f is None or name == key or f"state:{name}.{SECOND_MOMENT}" not in ref.values:
            continue
        moment, moment_allowed = ref.values.get(f"state:{name}.{FIRST_MOMENT}"), allowed.get(f"state:{name}.{FIRST_MOMENT}")
        r = moment_allowed / moment.norm if moment is not None and moment_allowed is not None and moment.norm > 0 else math.inf
        base = allowed[key]
        allowed[key] = None if r >= NOISE_RATIO or base is None else max(base, 2 * math.sqrt(r) * f.norm)
    return allowed


def _describe(key: str) -> str:
    kind, _, name = key.partition(":")
    return {"param": f"update of {name}", "grad": f"gradient of {name}", "buffer": f"change of buffer {name}",
            "state": f"change of optimizer state {name}"}.get(kind, key)


def judge(index: int, name: str, ref: StepNumbers, ours: StepNumbers, allowed: Mapping[str, float | None],
          relative: float) -> Judgement:
    """Candidate `ours` against eager's `ref` (module doc)."""
    worst, worst_value = 0.0, ""
    bad: list[tuple[float, str, str]] = []       # (difference / allowed, key, what)

    def see(key: str, what: str, a: float, b: float, limit: float) -> None:
        nonlocal worst, worst_value
        if not (math.isfinite(a) and math.isfinite(b)):
            if not ((math.isnan(a) and math.isnan(b)) or a == b):
                bad.append((math.inf, key, f"{what}: {a:.6g}, eager's {b:.6g}"))
            return
        diff = abs(a - b)
        ratio = diff / limit if limit > 0 else (0.0 if diff == 0 else math.inf)
        if ratio > worst:
            worst, worst_value = ratio, what
        if ratio > 1:
            bad.append((ratio, key, f"{what}: {a:.6g}, eager's {b:.6g}: differs by {diff:.3g}, allowed {limit:.3g}"))

    # at least relative * 1: a loss near zero by cancellation rounds like its terms, not like itself
    see("loss", "loss", ours.loss, ref.loss, relative * max(abs(ref.loss), 1.0))
    unjudged = []
    for key in sorted(ref.values.keys() | ours.values.keys()):
        f, g = ref.values.get(key), ours.values.get(key)
        what = _describe(key)
        if key not in ref.values or key not in ours.values or (f is None) != (g is None):
            has, lacks = ("the plan", "eager") if f is None else ("eager", "the plan")
            bad.append((math.inf, key, f"{what}: {has} has one, {lacks} none"))
            continue
        limit = allowed.get(key)
        if f is None or g is None:
            continue
        if limit is None:
            unjudged.append(key)
        elif f.numel != g.numel:
            bad.append((math.inf, key, f"{what}: {g.numel} elements, eager's {f.numel}"))
        else:
            see(key, f"{what}, norm", g.norm, f.norm, limit)
            see(key, f"{what}, probe dot", g.dot, f.dot, PROBE_SIGMAS * limit)
            see(key, f"{what}, sum", g.sum, f.sum, math.sqrt(f.numel) * limit)
    if not bad:
        return Judgement(index, name, worst, worst_value, "", tuple(unjudged))
    ratio, _, why = max(bad, key=lambda b: b[0])
    others = len({key for _, key, _ in bad}) - 1
    if others:
        why += f" ({others} more value{'s' if others > 1 else ''} differ{'' if others > 1 else 's'})"
    return Judgement(index, name, ratio, why, why, tuple(unjudged))


def check(candidates: Sequence[tuple[str, Step]], model: torch.nn.Module, batch: Any,
          eager: Callable[[], Any], optimizer: torch.optim.Optimizer | None,
          entry: Mapping[str, torch.Tensor], reset: Callable[[], None], tolerance: Tolerance,
          snapshot_bytes: int, settle: Callable[[], None] | None = None,
          ref: StepNumbers | None = None, first: int = 0) -> NumbersCheck:
    """Run `eager` (keeping its gradients) and then every candidate once, each after reset()
    and with every .grad None, and judge each candidate's numbers against eager's (module
    doc). A candidate that raises is in `failed`; `reset` runs after every run. With
    `settle`, the last candidate's run, where it ran whole and matched, is followed by
    settle() instead: the state it left stays, one step past the entry's, as a warm-up step
    of eager's would leave it (NumbersCheck.stepped). With `ref` (an earlier check's
    reference), eager does not run again: reset() puts the entry back first; `first` is the
    index of the first candidate in the list the earlier check's were taken from."""
    t0 = time.perf_counter()
    params = list(model.parameters())

    def cleared() -> None:
        for p in params:
            p.grad = None

    cleared()
    if ref is None:
        try:
            ref = take(eager(), model, optimizer, entry)
        finally:
            reset()
    else:
        reset()
    allowed = allowances(ref, tolerance.relative)
    judged: list[Judgement] = []
    failed: list[tuple[int, str, str]] = []
    most = ref.transient_bytes
    stepped = False
    for index, (name, step) in enumerate(candidates):
        cleared()
        try:
            ours = take(step(model, batch), model, optimizer, entry)
        # Whatever a candidate raises, the others are still judged (verify does the same).
        except Exception as e:
            reset()
            failed.append((first + index, name, error_line(e)))
            continue
        most = max(most, ours.transient_bytes)
        judged.append(judge(first + index, name, ref, ours, allowed, tolerance.relative))
        if settle is not None and index == len(candidates) - 1 and judged[-1].matches:
            stepped = True
            cleared()
            settle()
        else:
            reset()
    return NumbersCheck(tolerance, tuple(judged), tuple(failed), len(ref.values), most, snapshot_bytes,
                        time.perf_counter() - t0, stepped, ref)
