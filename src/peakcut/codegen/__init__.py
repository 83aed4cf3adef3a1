"""Code generation: a graph and an order become a readable, runnable PyTorch program."""

from peakcut.codegen.program import Step, StepBindingError, default_program_dir
from peakcut.codegen.source import generate_source
from peakcut.codegen.update_progress import PartialUpdateError

__all__ = ["PartialUpdateError", "Step", "StepBindingError", "default_program_dir", "generate_source"]
