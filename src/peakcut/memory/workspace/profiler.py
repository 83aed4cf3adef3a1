"""A torch.profiler session that records the CPU allocator's events and prints nothing.

    with allocator_profile() as prof:
        run()
    prof.profiler.kineto_results.events()     # "[memory]" events: +bytes allocated, -bytes freed

Kineto, torch's profiler library, writes a ``USDT: ... profiler_start`` and a
``USDT: ... profiler_stop`` line to the process's standard error (file descriptor 2, from C++)
each time a session starts and stops: notices for tracing tools, not for people. Its only
setting that drops them (``KINETO_LOG_LEVEL`` above 5) is read once per process, when the
first session starts, and drops its error messages too. So while a session starts and while
it stops (not while the profiled code runs), file descriptor 2 goes to a temporary file,
and afterwards everything written there except the ``USDT:`` lines goes on to standard error.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from torch.profiler import ProfilerActivity, profile

_STDERR = 2
_NOTICE = b"USDT:"


@contextlib.contextmanager
def allocator_profile() -> Iterator[Any]:
    """A CPU profiler session with ``profile_memory=True`` whose start and stop print no
    kineto notices (see the module docstring). It yields what ``with profile(...) as prof``
    gives (untyped in torch, so Any here)."""
    session = contextlib.ExitStack()
    with without_notices():
        prof = session.enter_context(profile(activities=[ProfilerActivity.CPU], profile_memory=True))
    try:
        yield prof
    finally:
        with without_notices():
            session.close()


@contextlib.contextmanager
def without_notices() -> Iterator[None]:
    """Run the body with file descriptor 2 sent to a temporary file, then write what it got,
    less the lines that start with ``USDT:``, to standard error."""
    _flush()
    try:
        saved = os.dup(_STDERR)
    except OSError:                 # no standard error to keep clean
        saved = -1
    if saved < 0:
        yield
        return
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), _STDERR)
        try:
            yield
        finally:
            _flush()
            os.dup2(saved, _STDERR)
            os.close(saved)
            caught.seek(0)
            kept = memoryview(b"".join(line for line in caught if not line.startswith(_NOTICE)))
            while kept:
                kept = kept[os.write(_STDERR, kept):]


def _flush() -> None:
    """Write out what Python holds for standard error, so that it keeps its place."""
    if sys.stderr is not None:
        sys.stderr.flush()
