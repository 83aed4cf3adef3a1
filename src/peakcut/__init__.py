"""peakcut: fit deep-learning training steps into less accelerator memory.

    g = peakcut.capture(model, batch, loss_fn, optimizer="adamw")
    peakcut.memory.simulate(g).peak_bytes   # simulated peak of the eager order
    step = peakcut.build(g)          # generated, runnable program
    loss = step(model, batch)        # one real step, parameters updated in place
    m = peakcut.measure(step, model, batch)

    plan = peakcut.optimize(model, batch, loss_fn, "adamw", memory_limit=0.5, device="h200")
    plan.step(batch); plan.report; plan.save("out/plan"); peakcut.load_plan("out/plan", model)

api.py: capture, build, measure; cli.py and cli_optimize.py: the `peakcut` command, and
cli_model.py the step it works on (a workload or the user's module:factory); units.py:
sizes and durations for people; version.py: the version. Packages, in the order data flows:
capture, ir, memory, cost, simulate, schedule, fission, transform, rules, optimizer, codegen,
runtime; besides them spec (optimizer descriptions), workloads and report (docs/architecture.md).
"""

from peakcut.api import build, capture, measure
from peakcut.capture import SGD, Adam, AdamW, CaptureError
from peakcut.codegen import PartialUpdateError, Step, StepBindingError
from peakcut.ir import Graph, GraphError, Role
from peakcut.optimizer import LimitNotMet, Plan, load_plan, optimize
from peakcut.optimizer.data_parallel import RankMismatch
from peakcut.runtime import Measurement, check_equivalence
from peakcut.version import __version__

__all__ = [
    "SGD", "Adam", "AdamW", "CaptureError", "Graph", "GraphError", "LimitNotMet", "Measurement", "RankMismatch", "PartialUpdateError",
    "Plan", "Role", "Step", "StepBindingError", "__version__", "build", "capture", "check_equivalence", "load_plan",
    "measure", "optimize",
]
