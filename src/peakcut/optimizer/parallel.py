"""The search on several processes: k best-first searches over disjoint shares of the root.

    result = parallel_search(root, deriver, objective, jobs=2, time_budget=60, seed=0)

Worker i is a forked copy of this process (the root state, the deriver and its memos come
without copying) that runs `search(..., share=(i, jobs))`: it expands the root's children
at positions i, i + jobs, ... and then searches on from them on its own, under the same
deadline. Each worker validates its best on the full expansion (search module doc) and
sends it back with its Pareto front and counts; the result is the best of the workers'
bests (BetterThan, ties to the lower worker), the merged front, and the summed counts.
Progress messages of the workers are merged (states summed, the best of the bests).

Needs the "fork" start method (Linux; not Windows); with jobs > 1, a cost model that does
not measure: measuring op latencies in two processes at once would disturb each other's
timings.
The same seed and jobs give the same result when every worker ends by its queue, by
stalling (search module doc; each worker counts its own states) or by `max_states` (split
evenly between the workers).

With `isolate=True` and jobs = 1 the one search runs in a forked worker too (`isolated`
says where that is possible), so that the objects it makes and frees are the worker's: the
caller's process does not keep the heap the search grew and fragmented (peakcut.optimize
does this; the caller trains in that process). The result is the worker's, with its latest
KEPT_BESTS bests (shares.KEPT_BESTS: what the arena's choice reads). A measured cost model's
search runs there too, with its `pacer` (peakcut.optimizer.budget.MeasurePacer): the worker
ticks its copy between expansions, which asks the caller to measure (the caller answers
while the worker waits: the worker runs no parallel region, which a fork of a process that
ran OpenMP threads hangs in), and the caller's pacer takes the copy's counts at the end.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol, cast

from peakcut.optimizer.children import MoveSettings
from peakcut.optimizer.derive import Deriver
from peakcut.optimizer.objective import Objective
from peakcut.optimizer.search import FrontPoint, Progress, SearchResult, search
from peakcut.optimizer.shares import KEPT_BESTS
from peakcut.optimizer.state import State

HANDBACK_SECONDS = 1.0     # of the budget kept for workers to send their result back


class Pacer(Protocol):
    """Work a search does between its expansions (peakcut.optimizer.budget.MeasurePacer): in a
    forked worker its copy asks the caller (in_worker, answer) and hands back its outcome
    (handback, take)."""

    def tick(self) -> None: ...

    def in_worker(self, ask: Callable[[Any], Any]) -> None: ...

    def answer(self, request: Any) -> Any: ...

    def handback(self) -> Any: ...

    def take(self, outcome: Any) -> None: ...


def isolated(measures: bool) -> bool:
    """Whether a search can run in a forked worker here: on Linux, the cost model times no
    call itself (`measures`; a BudgetedCost's pacer asks the caller, module doc), neither
    CUDA nor torch.distributed has started in this process (a fork carries neither), this
    process is not a daemon (which may not have children) and runs no other Python thread
    (whose locks a fork would copy held)."""
    import torch

    return (sys.platform.startswith("linux") and can_fork() and not measures
            and not multiprocessing.current_process().daemon and threading.active_count() == 1
            and not torch.cuda.is_initialized()
            and not (torch.distributed.is_available() and torch.distributed.is_initialized()))


def can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


def parallel_search(root: State, deriver: Deriver, objective: Objective, *, jobs: int,
                    time_budget: float = 60.0, seed: int = 0, max_states: int | None = None,
                    settings: MoveSettings | None = None,
                    progress: Callable[[Progress], None] | None = None,
                    exact_front: bool = False, isolate: bool = False, pacer: Pacer | None = None) -> SearchResult:
    """`search` on `jobs` processes (see module doc); jobs = 1 is `search` itself, in this
    process unless `isolate`. pacer: ticked between expansions (jobs = 1 only)."""
    if jobs < 1:
        raise ValueError(f"jobs={jobs}: expected at least 1 process")
    if pacer is not None and jobs > 1:
        raise ValueError(f"jobs={jobs} with a pacer: measuring in several searches at once would disturb the timings")
    if jobs == 1 and not isolate:
        return search(root, deriver, objective, time_budget=time_budget, seed=seed, max_states=max_states,
                      settings=settings, progress=paced(progress, pacer), exact_front=exact_front)
    if not can_fork():
        raise ValueError(f"jobs={jobs} needs the 'fork' start method, which this platform lacks; use jobs=1")
    t0 = time.perf_counter()
    budget = max(0.0, time_budget - min(HANDBACK_SECONDS, 0.1 * time_budget if jobs == 1 else HANDBACK_SECONDS))
    each = None if max_states is None else max(1, math.ceil(max_states / jobs))
    ctx = multiprocessing.get_context("fork")
    conns: list[Connection] = []
    workers = []
    for i in range(jobs):
        receive, send = ctx.Pipe(duplex=pacer is not None)      # (a pacer's copy asks the caller)

        def work(i: int = i, send: Connection = send) -> None:
            _worker(send, root, deriver, objective, budget, seed, each, settings, exact_front, (i, jobs),
                    progress is not None, KEPT_BESTS if jobs == 1 else 0, pacer)

        p = ctx.Process(target=work, name=f"peakcut-search-{i}", daemon=True)
        p.start()
        send.close()
        conns.append(receive)
        workers.append(p)
    results: dict[int, SearchResult] = {}
    latest: dict[int, Progress] = {}
    index = {id(c): i for i, c in enumerate(conns)}
    pending = list(conns)
    try:
        while pending:
            # wait() returns some of `pending`: Connections, as they went in
            for conn in cast("list[Connection]", wait(pending)):
                i = index[id(conn)]
                try:
                    kind, payload = conn.recv()
                except EOFError:
                    raise RuntimeError(f"search worker {i} ended without a result "
                                       f"(exit code {workers[i].exitcode})") from None
                if kind == "error":
                    raise worker_error(i, *payload)
                if kind == "ask":
                    conn.send(cast("Pacer", pacer).answer(payload))
                    continue
                if kind == "progress":
                    latest[i] = payload
                    if progress is not None:
                        progress(_merged_progress(latest, objective))
                    continue
                found, outcome = payload
                found.root = root
                if pacer is not None:
                    pacer.take(outcome)
                results[i] = found
                pending.remove(conn)
    finally:
        for p in workers:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    if jobs == 1:
        results[0].seconds = time.perf_counter() - t0
        return results[0]
    return _merged(root, [results[i] for i in range(jobs)], objective, time.perf_counter() - t0)


def _worker(send: Connection, root: State, deriver: Deriver, objective: Objective, budget: float,
            seed: int, max_states: int | None, settings: MoveSettings | None, exact_front: bool,
            share: tuple[int, int], report_progress: bool, kept_bests: int, pacer: Pacer | None) -> None:
    try:
        import torch

        torch.set_num_threads(1)
        if pacer is not None:
            def ask(request: Any) -> Any:
                send.send(("ask", request))
                return send.recv()

            pacer.in_worker(ask)
        tell = (lambda p: send.send(("progress", p))) if report_progress else None
        result = search(root, deriver, objective, time_budget=budget, seed=seed, max_states=max_states,
                        settings=settings, progress=paced(tell, pacer), exact_front=exact_front, share=share)
        result.root = None    # type: ignore[assignment]  # the parent has it: not sent back
        result.bests = result.bests[-kept_bests:] if kept_bests else []   # the rest of the history stays here
        send.send(("result", (result, pacer.handback() if pacer is not None else None)))
    except BaseException as e:   # noqa: BLE001 - everything goes back to the parent, which raises
        text = traceback.format_exc()
        try:
            blob: bytes | None = pickle.dumps(e)
        except Exception:  # noqa: BLE001 - an exception that does not pickle goes back as its text
            blob = None
        send.send(("error", (blob, text)))
    finally:
        send.close()
        os._exit(0)        # skip the parent's atexit handlers and finalizers in the fork


def paced(progress: Callable[[Progress], None] | None, pacer: Pacer | None
          ) -> Callable[[Progress], None] | None:
    """The search's progress callback, ticking the pacer first."""
    if pacer is None:
        return progress

    def tick(p: Progress) -> None:
        pacer.tick()
        if progress is not None:
            progress(p)

    return tick


class SearchWorkerError(RuntimeError):
    """A forked search failed; the message holds the worker's traceback."""


def worker_error(worker: int, blob: bytes | None, text: str) -> Exception:
    """The exception to raise in the parent for a worker's failure: the worker's own (its type
    and message, as the search in this process would have raised it) caused by a
    SearchWorkerError with the worker's traceback; the SearchWorkerError alone where the
    exception did not pickle, does not unpickle, or is no Exception (an interrupt)."""
    cause = SearchWorkerError(f"search worker {worker} failed:\n{text}")
    try:
        exc = pickle.loads(blob) if blob is not None else None
    except Exception:  # noqa: BLE001 - an exception whose class does not rebuild from its args
        exc = None
    if not isinstance(exc, Exception):
        return cause
    exc.__cause__ = cause
    return exc


def _merged_progress(latest: dict[int, Progress], objective: Objective) -> Progress:
    best = _best_of(list(latest.values()), lambda p: objective.key(p.best_peak_bytes, p.best_latency_s),
                    objective)
    return Progress(sum(p.states for p in latest.values()), best.best_peak_bytes, best.best_latency_s,
                    best.feasible, max(p.elapsed_s for p in latest.values()))


def _best_of(items: list, key: Callable, objective: Objective):  # noqa: ANN202 - State or Progress
    winner = items[0]
    for item in items[1:]:
        if objective.better(key(item), key(winner)):
            winner = item
    return winner


def _merged(root: State, results: list[SearchResult], objective: Objective, seconds: float) -> SearchResult:
    best = _best_of([r.best for r in results], lambda s: objective.key(s.peak_bytes, s.latency_s), objective)
    front: list[FrontPoint] = []
    for point in sorted((p for r in results for p in r.front),
                        key=lambda p: (p.peak_bytes, p.latency_s, not p.exact)):
        if not any(f.peak_bytes <= point.peak_bytes and f.latency_s <= point.latency_s for f in front):
            front.append(point)
    stopped = {r.stopped for r in results}
    return SearchResult(
        best=best, root=root, states=sum(r.states for r in results) - (len(results) - 1),
        expanded=sum(r.expanded for r in results) - (len(results) - 1),
        duplicates=sum(r.duplicates for r in results), failed=sum(r.failed for r in results),
        seconds=seconds, stopped=" / ".join(sorted(stopped)), front=front, jobs=len(results))
