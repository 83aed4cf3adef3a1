"""Algorithm 3 of MAGIS: best-first search over the rules, with relaxation and dedup.

    result = search(root, deriver, objective, time_budget=60, seed=0)

- the queue is ordered by the objective's key (BetterThan), ties by insertion;
- a child is built only if its make-up (Move.key) and then its computation hash are
  new; it becomes the best when BetterThan; it joins the queue when within the
  relaxation δ of the best (MAGIS: 1.1); else, when it misses the limit that the best
  meets but beats the best on the objective's measure (memory mode: faster; latency
  mode: smaller), an approach queue, its head first by the violated measure, which
  takes every other turn (the first QUEUE_FIRST stay with the queue while each makes the
  best better by PAYS: a search of a few expansions depends on them); else a reserve
  queue that is expanded (best first) once the others are empty, so the budget is not
  left unused. Without the approach queue, the first
  plan to meet the limit decided the search: in memory mode it was the one that had
  cut the peak most (on paper-size BERT at 40% memory, every layer checkpointed, +28%
  simulated), and only its descendants were expanded after it, while a child of a
  cheaper state over the limit met the limit at +10%;
- Python's cyclic garbage collector is relaxed meanwhile (optimizer.collector);
- a popped state that is pending (a TASO-style rewrite made on its program only) is
  resolved first (Deriver.resolve: MAGIS Algorithm 3 line 16, Analyze updates the
  F-Tree); where that derives it again, the new state is judged as a child instead;
- the time budget is checked before every child, and a child whose kind recently
  took longer than the time left is skipped, so the search ends within about a
  second of the budget;
- it ends before the budget when it is done (SearchResult.stopped says why):
  "queue empty" when no state is left to expand, or "stalled" when the best has not
  improved over the last `patience(nodes, found_at)` states built: the most of
  STALL_STATES, STALL_PER_NODE per node of the root program, and the states built
  until the best last improved (with `exact_front`, a new front point counts as an
  improvement too). Both queues rarely empty: every state built joins one (the
  reserve takes those outside δ), and remat, swap, undo and TASO-style rewrites
  (view-only simplifications in any subset, matmul splits of splits, merges of the
  parts) combine into more distinct programs than a budget reaches, even on a
  one-layer model. The rule counts states, not seconds, so a stalled search is as
  reproducible as one ended by its queue. Measured (analytic profiles, 45-60 s
  searches): models of 60-180 ops found their last better state within the first
  200 states and then built 1,000-3,000 more in vain; on the tiny workloads (670-
  1,010 ops) and paper-size U-Net (873) the best kept improving to the end, at most
  161 states apart. Those graphs get a patience of 1,340 states and more, and a
  paper-size search builds fewer states within its budget than its patience
  (ResNet-50, U-Net++, the transformers: 2 x nodes exceeds every count in
  BENCHMARKS.md) or stalls only after 1,746 states without a better one (U-Net);
- with the same seed (and a search that ends by exhausting its queue, stalling or
  `max_states`, not by the clock) the result is the same;
- every built state's (peak, latency) enters the Pareto front;
- states are evaluated on compact fission expansions (Deriver), judged on their estimates
  worsened by the most that full expansions have exceeded them so far (EstimateMargin):
  a compact state that becomes the best within CALIBRATE_SLACK of the limit is derived
  on the full expansion at once (at most CALIBRATE_SHARE of the budget goes to that),
  the margin learns from it, and where it misses the limit the best falls back to the
  best of the earlier ones. Without this a search pressed its estimates up to the limit:
  on ViT-base at <= 10% latency (RTX 3090) the 14 latest bests, each 0.01% smaller than
  the last, were estimated under the limit and missed it by 0.2% on the full expansion;
- the result is validated on the full expansion (Deriver.exact): the latest best first,
  then older bests while the exact figures differ from the estimate (once every exact
  one misses the limit, only those whose estimate, worsened by the margin, still meets
  it), and the best exact one (or the best state built with exact figures) is returned
  (with two derivations' worth of time kept out of the search for that), resolved if
  pending. With `exact_front`, the front's compact states are re-derived too.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from peakcut.optimizer.children import MoveSettings, children, make_key
from peakcut.optimizer.collector import relaxed_collection
from peakcut.optimizer.derive import DeriveError, Deriver
from peakcut.optimizer.objective import Objective
from peakcut.optimizer.state import State
from peakcut.rules import UNDO_MOVES

QUEUE_LIMIT = 48    # states kept in the queue (each holds a program graph)
STALL_STATES = 200  # the search stops when its best has not improved over this many states, ...
STALL_PER_NODE = 2  # ... this many per node of the root program, and the states it took to find it
PAYS = 0.01         # the share by which an expansion from the queue must better the best's objective
# to keep the next turn from the approach queue (search._search's pop)
QUEUE_FIRST = 3     # pops from the queue before the approach queue takes every other turn
VALIDATE = 3        # latest bests re-derived on the full expansion at the end, at most
VALIDATE_RESERVE = 2   # full-expansion derivations' worth of the budget kept for that
CALIBRATE_SLACK = 0.02  # a compact best this close to the limit (share of it) is derived at once
CALIBRATE_SHARE = 0.1   # of the budget spent at most on those derivations
FRONT_SHARE = 0.25  # of the budget kept for re-deriving the Pareto front (exact_front)


@dataclass(frozen=True)
class Progress:
    states: int
    best_peak_bytes: int
    best_latency_s: float
    feasible: bool
    elapsed_s: float


@dataclass(frozen=True)
class FrontPoint:
    """A state on the Pareto front: its figures, what it applied, and whether they are exact
    (simulated on the program that runs) or a compact-expansion estimate."""

    peak_bytes: int
    latency_s: float
    applied: tuple[str, ...]
    exact: bool


@dataclass
class EstimateMargin:
    """The most by which full expansions have exceeded their compact estimates (exact /
    estimate, at least 1), per measure; a compact state is judged on its estimate times
    these. Seen on paper-size ViT-base: peaks up to 0.5% and latencies 0.2% over."""

    peak: float = 1.0
    latency: float = 1.0

    def observe(self, estimate: State, exact: State) -> None:
        self.peak = max(self.peak, exact.peak_bytes / max(1, estimate.peak_bytes))
        if estimate.latency_s > 0:
            self.latency = max(self.latency, exact.latency_s / estimate.latency_s)

    def figures(self, s: State) -> tuple[int, float]:
        """(peak bytes, latency s) to judge `s` on: its own when exact, else worsened."""
        if not s.compact:
            return s.peak_bytes, s.latency_s
        return math.ceil(s.peak_bytes * self.peak), s.latency_s * self.latency


@dataclass
class SearchResult:
    best: State
    root: State
    states: int                      # states built and simulated (the root included)
    expanded: int                    # states whose children were generated
    duplicates: int                  # children skipped because their hash was seen
    failed: int                      # children whose rule failed while building
    seconds: float
    stopped: str                     # "queue empty" | "stalled" | "time budget" | "max states"
    front: list[FrontPoint] = field(default_factory=list)   # Pareto front (peak, latency), by peak
    jobs: int = 1                    # processes the search ran on (optimizer.parallel)
    bests: list[State] = field(default_factory=list)   # every state that became the best, oldest first

    @property
    def states_per_minute(self) -> float:
        return 60 * self.states / self.seconds if self.seconds > 0 else 0.0


def _dominated(a: State, b: State) -> bool:
    """b dominates a."""
    return (b.peak_bytes <= a.peak_bytes and b.latency_s <= a.latency_s
            and (b.peak_bytes < a.peak_bytes or b.latency_s < a.latency_s))


def _update_front(front: list[State], s: State) -> bool:
    """Adds `s` to the Pareto front unless a point dominates or equals it; whether it was added."""
    if any(_dominated(s, f) or (f.peak_bytes, f.latency_s) == (s.peak_bytes, s.latency_s) for f in front):
        return False
    front[:] = [f for f in front if not _dominated(f, s)]
    front.append(s)
    front.sort(key=lambda x: (x.peak_bytes, x.latency_s))
    return True


def patience(nodes: int, found_at: int) -> int:
    """States built without a better best after which the search stops as "stalled".

    nodes: the root program's nodes; found_at: the states built when the best last
    improved (the root counts as the first). The neighbourhood of a state (hot-spot
    candidates, F-Tree mutations, TASO sites, undos) grows with the graph, hence the
    per-node term; waiting as long again as the best took keeps a search that still
    improves late from being cut short (it spends at most half its states past its
    last improvement).
    """
    return max(STALL_STATES, STALL_PER_NODE * nodes, found_at)


def search(root: State, deriver: Deriver, objective: Objective, *, time_budget: float = 60.0,
           seed: int = 0, max_states: int | None = None, settings: MoveSettings | None = None,
           progress: Callable[[Progress], None] | None = None, exact_front: bool = False,
           share: tuple[int, int] = (0, 1)) -> SearchResult:
    """Best-first search from `root` (see module doc).

    share (i, k): expand only the root's children at positions i, i + k, ... (one of k
    searches run side by side, see optimizer.parallel).
    """
    if time_budget < 0:
        raise ValueError(f"time_budget must be >= 0 seconds, got {time_budget}")
    with relaxed_collection():
        return _search(root, deriver, objective, time_budget, seed, max_states, settings, progress,
                       exact_front, share)


def _search(root: State, deriver: Deriver, objective: Objective, time_budget: float, seed: int,
            max_states: int | None, settings: MoveSettings | None,
            progress: Callable[[Progress], None] | None, exact_front: bool,
            share: tuple[int, int]) -> SearchResult:
    settings = settings or MoveSettings()
    settings.check(deriver.rules)
    rank = {kind: i for i, kind in enumerate((*deriver.rules.move_kinds, UNDO_MOVES))}   # the order moves are tried in
    rng = random.Random(seed)
    t0 = time.perf_counter()
    deadline = t0 + time_budget
    counter = itertools.count()
    margin = EstimateMargin()      # how far full expansions exceeded compact estimates
    key = lambda s: objective.key(*margin.figures(s))  # noqa: E731
    calibrated: dict[int, State | None] = {}   # id of a compact best -> its full expansion (None: failed)
    calibration_s = 0.0            # seconds spent deriving them
    best = root
    bests = [root]                 # every state that became the best, oldest first
    best_exact = root              # the best state built whose figures are exact (not compact)
    heap: list[tuple[tuple, int, State]] = [(key(root), next(counter), root)]
    reserve: list[tuple[tuple, int, State]] = []    # built, outside the relaxation: used when heap empties
    approach: list[tuple[tuple, int, State]] = []   # miss the limit, beat the best's measure (pop())
    seen_keys = {make_key(root)}
    seen_hashes = {root.digest}
    front: list[State] = []
    _update_front(front, root)
    states, expanded, duplicates, failed = 1, 0, 0, 0
    stopped = "queue empty"
    nodes = len(root.program.nodes)
    found_at = 1                   # states built when the best (or, exact_front, the front) last improved

    def stalled() -> bool:
        return states - found_at >= patience(nodes, found_at)

    def report() -> None:
        if progress is not None:
            progress(Progress(states, best.peak_bytes, best.latency_s,
                              objective.feasible(best.peak_bytes, best.latency_s),
                              time.perf_counter() - t0))

    def reserve_s() -> float:
        """Time kept for validating the best on the full expansion: two derivations
        (Deriver.expected_exact_seconds), the latest best's and, where it misses the limit,
        an older one's (_validated). A GPT-2-XL search at n = 16 ran 11 s past a 120 s
        budget when this was 4 compact fission derivations' worth."""
        front_share = FRONT_SHARE * time_budget if exact_front else 0.0
        return front_share + VALIDATE_RESERVE * deriver.expected_exact_seconds(best)

    def thin(s: State) -> bool:
        """s meets the limit (as judged) within CALIBRATE_SLACK of it."""
        peak, latency = margin.figures(s)
        measure = peak if objective.mode == "memory" else latency
        return objective.feasible(peak, latency) and measure > (1 - CALIBRATE_SLACK) * objective.limit

    def calibrate(s: State) -> None:
        """Derive the compact best `s` on the full expansion, learn the margin from it, and make
        the best the best of the bests so far on what is now known (s's exact twin for s)."""
        nonlocal best, best_exact, calibration_s
        t = time.perf_counter()
        try:
            exact: State | None = deriver.exact(s)
        except DeriveError:          # its recipes fail on the full expansion: never the plan
            exact = None
        calibration_s += time.perf_counter() - t
        calibrated[id(s)] = exact
        if exact is not None:
            margin.observe(s, exact)
            if objective.better(key(exact), key(best_exact)):
                best_exact = exact
        known = [calibrated.get(id(b), b) for b in bests]
        winner = best_exact
        for b in known:
            if b is not None and objective.better(key(b), key(winner)):
                winner = b
        if winner is not best:
            best = winner
            bests.append(winner)
            report()

    def judge(child: State) -> None:
        """A new state: the best when BetterThan (derived at once when compact and thin, see
        calibrate); queued within the relaxation, else in the approach queue when it
        approaches (Objective.approaches), else reserved."""
        nonlocal best, best_exact, heap, reserve, approach, found_at
        if _update_front(front, child) and exact_front:
            found_at = states
        k = key(child)
        if not child.compact and objective.better(k, key(best_exact)):
            best_exact = child
        if objective.better(k, key(best)):
            best = child
            bests.append(child)
            found_at = states
            report()
            if child.compact and thin(child) and (calibration_s + deriver.expected_exact_seconds(child)
                                                  <= CALIBRATE_SHARE * time_budget):
                calibrate(child)
                k = key(child)     # judged again with what the derivation taught the margin
        entry = (k, next(counter), child)
        if objective.within_relaxation(k, key(best)):
            heapq.heappush(heap, entry)
            if len(heap) > QUEUE_LIMIT:
                heap = heapq.nsmallest(QUEUE_LIMIT, heap)
                heapq.heapify(heap)
        elif objective.approaches(k, key(best)):
            heapq.heappush(approach, entry)
            if len(approach) > QUEUE_LIMIT:
                approach = heapq.nsmallest(QUEUE_LIMIT, approach)
                heapq.heapify(approach)
        else:
            heapq.heappush(reserve, entry)
            if len(reserve) > QUEUE_LIMIT:
                reserve = heapq.nsmallest(QUEUE_LIMIT, reserve)
                heapq.heapify(reserve)

    from_queue = True              # the last state popped came from the queue
    pops = 0
    mark = key(best)[:2]           # the best's (misses the limit, objective) when it was popped

    def pop() -> State | None:
        """The next state: from the approach queue (while its head still beats the best) when
        the last state came from the queue and either QUEUE_FIRST states have been popped or
        it did not make the best better on the objective by PAYS (nor meet the limit), or
        when the queue is empty; else from the queue, else from the reserve. So turns
        alternate, except that the first expansions stay with the queue while it pays:
        BTLM-3B's searches expand 4 states in 60 s, and with strict alternation from the
        second its <= 10% cell fell from 31.7% to 43.8% of eager (RTX 3090, simulated)."""
        nonlocal from_queue, mark, pops
        while approach and not objective.approaches(approach[0][0], key(best)):
            heapq.heappush(reserve, heapq.heappop(approach))
        pops += 1
        now = key(best)
        paid = now[0] < mark[0] or now[1] <= (1 - PAYS) * mark[1]
        from_queue = not (approach and ((from_queue and (pops > QUEUE_FIRST or not paid)) or not heap))
        mark = now[:2]
        queue = heap if from_queue and heap else approach if not from_queue else reserve
        return heapq.heappop(queue)[2] if queue else None

    while heap or reserve or approach:
        if time.perf_counter() >= deadline - reserve_s():
            stopped = "time budget"
            break
        if stalled():
            stopped = "stalled"
            break
        popped = pop()
        if popped is None:
            break
        state = popped
        if deadline - reserve_s() - time.perf_counter() <= (deriver.expected_seconds("moves")
                                                            + deriver.expected_seconds("resolve")):
            stopped = "time budget"
            break
        if state.pending is not None:
            try:
                resolved = deriver.resolve(state)
            except DeriveError:
                failed += 1
                continue
            if resolved is not state:      # another program: a new state, judged as a child
                if resolved.digest not in seen_hashes:
                    seen_hashes.add(resolved.digest)
                    states += 1
                    judge(resolved)
                continue
        expanded += 1
        t_moves = time.perf_counter()
        moves = list(children(state, deriver, settings, rng))
        deriver.record("moves", t_moves)
        late = False      # a child was skipped: its kind takes longer than the time left
        rng.shuffle(moves)
        moves.sort(key=lambda m: rank[m.kind])
        if state is root and share[1] > 1:
            moves = moves[share[0]::share[1]]
        for move in moves:
            left = deadline - reserve_s() - time.perf_counter()
            if left <= 0:
                stopped = "time budget"
                break
            if max_states is not None and states >= max_states:
                stopped = "max states"
                break
            if stalled():
                stopped = "stalled"
                break
            if move.key in seen_keys:
                duplicates += 1
                continue
            if deriver.expected_seconds(move.kind) > left:
                late = True
                continue
            seen_keys.add(move.key)
            try:
                child = move.build()
            except DeriveError:
                failed += 1
                continue
            if child.digest in seen_hashes:
                duplicates += 1
                continue
            seen_hashes.add(child.digest)
            states += 1
            judge(child)
        else:
            report()
            if not late:
                continue
            stopped = "time budget"    # the next states' children would be skipped alike
        break
    if stopped == "queue empty" and max_states is not None and states >= max_states:
        stopped = "max states"
    best = _validated(bests, best_exact, deriver, objective, deadline, margin, calibrated)
    if exact_front and any(s.compact for s in front):
        front = _exact_front(front, deriver, deadline)
    report()
    points = [FrontPoint(s.peak_bytes, s.latency_s, s.applied, not s.compact) for s in front]
    return SearchResult(best, root, states, expanded, duplicates, failed, time.perf_counter() - t0,
                        stopped, points, bests=bests)


def _exact_front(front: list[State], deriver: Deriver, deadline: float) -> list[State]:
    """The front re-derived on full expansions; compact states the budget leaves no time
    for are dropped (the front holds exact figures only)."""
    exact: list[State] = []
    for s in front:
        if s.compact and time.perf_counter() + deriver.expected_exact_seconds(s) > deadline:
            continue
        try:
            _update_front(exact, deriver.exact(s))
        except DeriveError:
            continue
    return exact


def _validated(bests: list[State], best_exact: State, deriver: Deriver, objective: Objective,
               deadline: float, margin: EstimateMargin, calibrated: dict[int, State | None]) -> State:
    """The best of the latest bests on the full expansion (see module doc): the latest is
    re-derived (or its derivation during the search taken from `calibrated`, which this
    extends), then older ones
    while the estimates were off, at most VALIDATE derivations and only while the next would
    end before `deadline`. Once the exact figures have all missed the limit, an older best is
    derived only if its estimate, worsened by the margin (which learns from each derivation),
    still meets it: a search presses its estimates up to the limit, and an estimate off by
    0.2% put every latest best of a ViT-base search over it (the root was returned).
    `best_exact`, the best state built with exact figures, is a candidate too."""
    key = lambda s: objective.key(s.peak_bytes, s.latency_s)  # noqa: E731
    found: list[State] = [s for s in bests if not s.compact]    # exact already (the root is)
    if all(s is not best_exact for s in found):
        found.append(best_exact)
    derived = 0
    exact: list[State] = []              # the full expansions of the bests looked at
    for s in reversed(bests):
        if not s.compact or derived >= VALIDATE:
            break
        if exact and not any(objective.feasible(e.peak_bytes, e.latency_s) for e in exact) \
                and not objective.feasible(*margin.figures(s)):
            continue    # would miss the limit as the later ones did
        if id(s) in calibrated:
            e = calibrated[id(s)]
            if e is None:
                continue
        else:
            if derived and time.perf_counter() + deriver.expected_exact_seconds(s) > deadline:
                break
            derived += 1
            try:
                e = calibrated[id(s)] = deriver.exact(s)
            except DeriveError:
                calibrated[id(s)] = None
                continue
            margin.observe(s, e)
        found.append(e)
        exact.append(e)
        if e.peak_bytes == s.peak_bytes and math.isclose(e.latency_s, s.latency_s, rel_tol=1e-9):
            break       # as estimated: the older bests are worse
    while True:     # ends: the root is never pending
        winner = found[0]
        for s in found[1:]:
            if objective.better(key(s), key(winner)):
                winner = s
        if winner.pending is None:
            return winner
        try:     # a pending state without regions: its program is exact, its base not made yet
            settled = deriver.exact(winner)
        except DeriveError:
            found.remove(winner)
            continue
        found[found.index(winner)] = settled
