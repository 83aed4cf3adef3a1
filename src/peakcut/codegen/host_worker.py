"""The host stream of a generated step: ops of updates that run on the host, in program order.

A step whose plan runs parameters' updates on the host (its lines: codegen/host_update_code.py) takes a
keyword `host_ops`, a HostWorker owned by the Step. Each host op is one line

    m1 = host_ops.run(aten.lerp_.Scalar, s_w_exp_avg, g_host, 0.1, after=(ev_g_host_stored,))

which returns a Future of the op's result. Arguments that are Futures (results of earlier host
ops) are resolved when the op runs, and a result buffer (`out=host_ops.buffer(shape, stride,
dtype)`) is allocated then, from the step's HostPool; `after` lists CUDA events (the device-to-host copies of
what the op reads) the op waits for first. `host_ops.upload(p, p_host, h2d, ev)` copies a
parameter's new value back into its device tensor on the stream h2d once the compute stream
reached `ev` (the readers of the old value are done), and `host_ops.join()` ends the step's
host work, raising the first error of any of its ops.

threaded=True (CUDA): the ops run on one worker thread, in submission order, so that the
Python thread goes on issuing device kernels while the host computes (PyTorch's CPU kernels
release the GIL). threaded=False (a CPU device, where the host is the device): each op runs
when it is submitted, as a plain call would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from peakcut.codegen.swap import HostPool


@dataclass(frozen=True)
class Buffer:
    """A host buffer to allocate when the op that writes it runs (HostWorker.buffer)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


class HostWorker:
    """Runs a step's host ops in submission order (module doc); `threaded` picks a worker
    thread (CUDA) or inline calls (CPU); `buffers` allocates the ops' result buffers (the
    step's HostPool, which counts them apart from device memory)."""

    def __init__(self, threaded: bool, buffers: HostPool | None = None) -> None:
        self.threaded = threaded
        self.buffers = buffers if buffers is not None else HostPool()
        self._pool: ThreadPoolExecutor | None = None
        # futures not done yet (a done one is dropped: its result lives only as long as the
        # step's variables hold it), and the first error of any op
        self._pending: dict[Future[Any], None] = {}     # in submission order
        self._lock = threading.Lock()
        self._error: BaseException | None = None

    def buffer(self, shape: Sequence[int], stride: Sequence[int], dtype: torch.dtype) -> Buffer:
        """A result buffer, allocated (from `buffers`) only when the op it is given to runs."""
        return Buffer(tuple(shape), tuple(stride), dtype)

    def _resolved(self, value: Any) -> Any:
        """`value` with every Future in it (nested in lists and tuples) replaced by its result
        and every Buffer by a new host tensor."""
        if isinstance(value, Future):
            return value.result()
        if isinstance(value, Buffer):
            return self.buffers.empty_strided(value.shape, value.stride, value.dtype)
        if isinstance(value, list):
            return [self._resolved(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self._resolved(v) for v in value)
        return value

    def _call(self, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any],
              after: Sequence[Any]) -> Any:
        for event in after:
            event.synchronize()
        with torch.no_grad():       # (grad mode is per thread: the step runs under no_grad)
            return fn(*self._resolved(tuple(args)), **{k: self._resolved(v) for k, v in kwargs.items()})

    def _submit(self, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any],
                after: Sequence[Any]) -> Future[Any]:
        if not self.threaded:
            done: Future[Any] = Future()
            done.set_result(self._call(fn, args, kwargs, after))
            return done
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="peakcut-host")
        with self._lock:
            future = self._pool.submit(self._call, fn, args, kwargs, after)
            self._pending[future] = None
        future.add_done_callback(self._done)
        return future

    def _done(self, future: Future[Any]) -> None:
        """A future done: its error kept, unless join or discard claimed it first (they read
        the errors of the futures they claimed themselves: a done future wakes its waiters
        before it runs this callback)."""
        with self._lock:
            if future not in self._pending:
                return      # claimed by join or discard
            del self._pending[future]
            if self._error is None and not future.cancelled() and future.exception() is not None:
                self._error = future.exception()

    def _claim(self) -> list[Future[Any]]:
        """The futures not done yet, in submission order, taken from `_pending`."""
        with self._lock:
            claimed = list(self._pending)
            self._pending.clear()
        return claimed

    def run(self, op: Callable[..., Any], *args: Any, after: Sequence[Any] = (), **kwargs: Any) -> Future[Any]:
        """Run op(*args, **kwargs) on the host after the earlier ops and the events `after`."""
        return self._submit(op, args, kwargs, after)

    def upload(self, device_tensor: torch.Tensor, host_tensor: Any, stream: Any = None,
               compute_done: Any = None) -> Future[Any]:
        """Copy `host_tensor` (a tensor or the Future of one) into `device_tensor` in place after
        the earlier ops; on CUDA on `stream` once it has waited for the event `compute_done`."""
        return self._submit(_upload, (device_tensor, host_tensor, stream, compute_done), {}, ())

    def join(self) -> None:
        """Wait for every op submitted; raise the first error of any of them."""
        errors = [future.exception() for future in self._claim()]     # (waits)
        with self._lock:
            error, self._error = self._error, None
        error = error or next((e for e in errors if e is not None), None)
        if error is not None:
            raise error

    def discard(self) -> None:
        """After a failed step: drop the ops not started, wait for the running one."""
        claimed = self._claim()
        for future in claimed:
            future.cancel()
        for future in claimed:
            if not future.cancelled():
                future.exception()
        with self._lock:
            self._error = None


def _upload(device_tensor: torch.Tensor, host_tensor: torch.Tensor, stream: Any, compute_done: Any) -> None:
    if stream is None:
        device_tensor.copy_(host_tensor)
        return
    stream.wait_event(compute_done)
    with torch.cuda.stream(stream):
        device_tensor.copy_(host_tensor, non_blocking=True)
