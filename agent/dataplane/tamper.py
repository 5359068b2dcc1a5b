"""Tamper repair: a foreign write to the nodelb table is undone from the mirror within a second.

The drift check (Dataplane.check_drift, every `driftCheckPeriod`) compares the whole table
with the mirror; between two checks a deleted table or a rule replaced by hand would drop
traffic for minutes. The guard here watches the table's change notifications
(agent/dataplane/monitor.py): a committed batch that touched the nodelb table and was not
committed by one of this agent's threads is foreign, and the table is rewritten from the
mirror after a short debounce (a person's `nft -f` script commits in one batch; a loop of
`nft` commands in quick succession is repaired once). When the kernel dropped notifications
the guard cannot know what changed, so it runs a drift check instead (a comparison, repaired
only on a difference).

The decisions (`plan`) are pure; `TamperGuard.run` is the thread.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from agent.dataplane import metrics
from agent.dataplane.monitor import Generation, Overrun, TableMonitor

log = logging.getLogger(__name__)


class Repairable(Protocol):
    """What the guard needs of the applier (agent/dataplane/applier.Dataplane)."""

    def committed_from(self, tid: int) -> bool: ...

    def repair(self) -> bool: ...

    def check_drift(self) -> bool: ...


class Action(enum.StrEnum):
    """What the guard does next."""

    NOTHING = "nothing"
    REPAIR = "repair"  # rewrite the table from the mirror
    CHECK = "check"  # compare the table with the mirror (notifications were lost)
    LIMITED = "limited"  # a repair is due but the rate limit is reached: postponed


@dataclass(frozen=True, slots=True)
class GuardState:
    """The guard's bookkeeping: when a repair or check is due (monotonic seconds; None: none
    pending), and the recent repairs (for the rate limit)."""

    repair_due: float | None = None
    check_due: float | None = None
    recent: tuple[float, ...] = ()


DEBOUNCE = 0.1
"""Seconds a foreign change waits for the rest of a burst before the table is rewritten."""
RATE_WINDOW = 60.0
RATE_LIMIT = 10
"""At most this many repairs per RATE_WINDOW seconds: two writers fighting over the table (a
second agent on the node) must not turn into a busy loop; beyond it the guard waits for the
window to pass and says so."""


def observe(
    state: GuardState, *, foreign: Sequence[Generation], overrun: bool, now: float
) -> GuardState:
    """Return the state after seeing `foreign` batches (and, with `overrun`, lost ones)."""
    if foreign and state.repair_due is None:
        state = replace(state, repair_due=now + DEBOUNCE)
    if overrun and state.check_due is None:
        state = replace(state, check_due=now + DEBOUNCE)
    return state


def due(state: GuardState, now: float) -> tuple[Action, GuardState]:
    """Return what to do at `now` and the state after doing it.

    A due repair comes first (it also makes a pending check moot); it is postponed while the
    rate limit is reached (until the oldest repair in the window ages out).
    """
    recent = tuple(t for t in state.recent if t > now - RATE_WINDOW)
    state = replace(state, recent=recent)
    if state.repair_due is not None and now >= state.repair_due:
        if len(recent) >= RATE_LIMIT:
            return Action.LIMITED, replace(state, repair_due=recent[0] + RATE_WINDOW)
        return Action.REPAIR, GuardState(recent=(*recent, now))
    if state.check_due is not None and now >= state.check_due:
        return Action.CHECK, replace(state, check_due=None)
    return Action.NOTHING, state


def next_wakeup(state: GuardState) -> float | None:
    """Return when something is due, None when nothing is pending."""
    pending = [t for t in (state.repair_due, state.check_due) if t is not None]
    return min(pending, default=None)


def live_thread(tid: int) -> bool:
    """Return True when `tid` is a thread of this process (one that is still running)."""
    return os.path.exists(f"/proc/{os.getpid()}/task/{tid}")


class TamperGuard:
    """Watches the nodelb table and repairs foreign writes; `run(stop)` in a thread.

    `monitor` opens the subscription in the namespace the applier programs (TableMonitor.open
    on a node; a lab namespace in tests). A batch is ours when a thread of this process that
    committed through the applier, or any live thread of this process, committed it.
    """

    def __init__(
        self,
        dataplane: Repairable,
        *,
        monitor: Callable[[], TableMonitor] = TableMonitor.open,
        clock: Callable[[], float] = time.monotonic,
        poll: float = 0.5,
    ) -> None:
        self._dataplane = dataplane
        self._open = monitor
        self._clock = clock
        self._poll = poll
        self.seen = 0  # batches that touched the table, ours and others'
        self.foreign = 0  # of those, committed by another process
        self.repairs = 0
        self.checks = 0
        self.ready = threading.Event()

    def _ours(self, tid: int) -> bool:
        return self._dataplane.committed_from(tid) or live_thread(tid)

    def run(self, stop: threading.Event) -> None:
        """Watch until `stop` is set; a failure to subscribe is logged, not raised."""
        try:
            monitor = self._open()
        except OSError as exc:
            log.error("cannot watch the nodelb table for foreign changes: %s", exc)
            return
        self.ready.set()
        state = GuardState()
        try:
            while not stop.is_set():
                try:
                    state = self._turn(monitor, state)
                except Exception:  # a bad notification must not end the guard
                    log.exception("tamper guard turn failed")
                    stop.wait(self._poll)
        finally:
            monitor.close()

    def _turn(self, monitor: TableMonitor, state: GuardState) -> GuardState:
        """Read what arrived (up to the next due time), note foreign batches, act on what is
        due; return the new state."""
        now = self._clock()
        wake = next_wakeup(state)
        timeout = self._poll if wake is None else max(0.0, min(self._poll, wake - now))
        overrun = False
        try:
            seen = monitor.read(timeout)
        except Overrun:
            seen, overrun = [], True
            metrics.NFT_MONITOR_OVERRUNS.inc()
            log.warning("nodelb table notifications were lost; comparing the table")
        foreign = [g for g in seen if not self._ours(g.pid)]
        self.seen += len(seen)
        self.foreign += len(foreign)
        for g in foreign:
            for kind in g.changed:
                metrics.NFT_FOREIGN_CHANGES.labels(kind).inc()
            log.warning(
                "the nodelb table was changed by another process; repairing",
                extra={"pid": g.pid, "command": g.process, "changed": list(g.changed)},
            )
        state = observe(state, foreign=foreign, overrun=overrun, now=self._clock())
        action, state = due(state, self._clock())
        self._perform(action)
        return state

    def _perform(self, action: Action) -> None:
        try:
            if action is Action.REPAIR:
                self.repairs += 1
                ok = self._dataplane.repair()
                metrics.NFT_TAMPER_REPAIRS.labels("ok" if ok else "failed").inc()
            elif action is Action.CHECK:
                self.checks += 1
                self._dataplane.check_drift()
            elif action is Action.LIMITED:
                log.error(
                    "the nodelb table keeps being changed by another process: %d repairs in "
                    "%.0f s, the next waits for the window to pass",
                    RATE_LIMIT,
                    RATE_WINDOW,
                )
        except Exception:
            log.exception("tamper repair failed")
