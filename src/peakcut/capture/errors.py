"""The error capture raises for a step it cannot capture."""

from __future__ import annotations


class CaptureError(RuntimeError):
    """The model (or loss) could not be traced; the message names the module and cause."""
