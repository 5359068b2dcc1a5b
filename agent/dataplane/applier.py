"""The applier: puts DesiredState into the kernel's `inet nodelb` table, one transaction per sync.

It keeps a mirror, the last DesiredState the kernel accepted, and sends either the full table
(`rules.render.render`, which rewrites an existing table in place inside one batch, so taking
over from a previous agent or resyncing has no gap) or the element delta from the mirror
(`rules.delta.delta`). A full render must know which objects the table holds, to delete the
ones it no longer needs: the applier tracks them through its own transactions, and reads them
(`TableReader.objects` over netlink, or `NftRunner.list_declarations`, which fetches every
element: ~3.7 s at 10k Services) when it does not know them: on its
first full sync (a table left by a previous agent), after drift, and after a refused full
sync. Drift and a refused full sync make the next full sync replace the whole table
(`render(..., replace=True)`, which may cost a new flow its first packet, see
rules/render.py) instead of rewriting it.
A refused transaction changes nothing in the kernel (nft batches are atomic), so the mirror
stays as it was; the caller retries after `SyncResult.retry_after` seconds (exponential
backoff), and after `full_after_failures` consecutive failures the next attempt is a full
resync. `check_drift` reads the table back, compares it with the mirror (rules/readback.py),
and repairs any difference with a full resync. After a successful sync, stale UDP conntrack
entries that point at removed endpoints are deleted (agent/dataplane/conntrack.py).

With an ElementSender (dataplane/netlink.py; the batch is encoded by rules/netlink.py from
the typed ops), element-only partial syncs go out as one raw netlink batch, and an in-place
full sync is split: objects and rules through libnftables, the content of every encodable set
as one netlink batch (flushes and additions), then the stale objects' removal
(`rules.netlink.split_full` says why each state in between is safe). libnftables would parse
the 100k elements of a 10k-Service table into ~250 MB of heap; the batch costs a few MB. The
table-replacing shape (after drift) stays one libnftables transaction.

The applier only ever names its own table; it never flushes the ruleset.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from agent.backoff import Backoff
from agent.dataplane import metrics
from agent.dataplane.conntrack import ConntrackRunner, delete_stale_udp, removed_udp_endpoints
from agent.dataplane.libnft import NftError, NftRunner, release_memory
from agent.dataplane.netlink import ElementSender
from agent.model.desired_state import DesiredState, FrontendKey
from rules import layout as L
from rules.delta import delta
from rules.netlink import ElementBatch, FullSplit, element_ops, ops_summary, split_full
from rules.plan import RenderError
from rules.readback import Snapshot, expected, from_json, kernel_objects
from rules.render import KernelObjects, objects_after, render, render_cleanup
from rules.transaction import Rule, Transaction

log = logging.getLogger(__name__)


class SyncMode(enum.StrEnum):
    """Which kind of transaction a sync sent."""

    FULL = "full"  # the whole table, replacing what was there
    PARTIAL = "partial"  # element additions and deletions from the mirror
    NONE = "none"  # nothing: the delta was empty


class SyncOutcome(enum.StrEnum):
    """Why a sync ended the way it did."""

    APPLIED = "applied"  # the kernel accepted the transaction; the mirror is the new state
    UNCHANGED = "unchanged"  # the kernel already holds this state; nothing was sent
    REFUSED = "refused"  # the kernel refused the transaction; the old state stays
    INVALID = "invalid"  # the state cannot be rendered (RenderError); nothing was sent


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What one `Dataplane.sync` did.

    `retry_after` is None when the sync succeeded (APPLIED or UNCHANGED); otherwise the caller
    should call `sync` again (with the same or a newer state) after that many seconds.
    `error` is nft's (or the renderer's) error text on failure, else None. `failures` counts
    consecutive failed syncs including this one (0 after a success). `duration` is the time
    spent rendering and applying, in the injected clock's seconds. `ops` is the number of nft
    commands sent (0 when nothing was sent). `conntrack_deleted` counts stale UDP entries
    removed after an applied sync.
    """

    outcome: SyncOutcome
    mode: SyncMode
    duration: float = 0.0
    ops: int = 0
    error: str | None = None
    retry_after: float | None = None
    failures: int = 0
    conntrack_deleted: int = 0

    @property
    def ok(self) -> bool:
        """Return True when the kernel holds the requested state after this sync."""
        return self.outcome in (SyncOutcome.APPLIED, SyncOutcome.UNCHANGED)


class TableReader(Protocol):
    """Reads the nodelb table back without libnftables (netlink_dump.NetlinkTableReader)."""

    def snapshot(self) -> Snapshot:
        """Return the table's content (rules.readback.Snapshot). Raises NftError."""
        ...

    def objects(self) -> KernelObjects | None:
        """Return the table's objects, None when there is no table. Raises NftError."""
        ...

    def rule_prints(self) -> Mapping[str, tuple[str, ...]]:
        """Return each chain's rules as fingerprints of what the kernel holds, in order
        (netlink_dump.rule_print). Raises NftError."""
        ...


class Dataplane:
    """Applies DesiredState through an NftRunner; see the module docstring for the contract.

    `backoff_initial` and `backoff_max` bound the retry delay (doubling per consecutive
    failure); `full_after_failures` consecutive failures make the next attempt a full resync.
    `conntrack` (optional) deletes stale UDP conntrack entries after each applied sync.
    `mark` is the masquerade mark mask handed to the renderer. `elements` (optional) applies
    partial syncs made only of element ops without libnftables (netlink.py); a batch it
    refuses is sent again through the runner, and counted in `fast_fallbacks`. `readback`
    (optional, netlink_dump.py) reads the table for the drift check and the objects a full
    sync must know, instead of the runner's listings (which fetch every element).
    Construction does no I/O.
    """

    def __init__(
        self,
        runner: NftRunner,
        *,
        clock: Callable[[], float] = time.monotonic,
        conntrack: ConntrackRunner | None = None,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        full_after_failures: int = 3,
        mark: int = L.DEFAULT_MASQ_MARK,
        elements: ElementSender | None = None,
        readback: TableReader | None = None,
    ) -> None:
        self._runner = runner
        self._fast = elements
        self._readback = readback
        self.fast_applied = 0  # partial syncs sent as raw netlink element batches
        self.fast_fallbacks = 0  # of those refused there, then sent through libnftables
        self._clock = clock
        self._conntrack = conntrack
        self._backoff = Backoff(initial=backoff_initial, maximum=backoff_max)
        self._full_after = full_after_failures
        self._mark = mark
        self._mirror: DesiredState | None = None
        self._full_pending = True
        self._failures = 0
        self._elements = 0
        self._next_attempt_at: float | None = None
        self._applied = 0  # transactions the kernel accepted (drift checks compare it)
        # Keys that may differ from the mirror, from the hints of syncs since the last success
        # (None: unknown, compare everything).
        self._pending_hint: set[FrontendKey] | None = set()
        # The objects the table holds (None: no table), valid while _kernel_known.
        self._kernel: KernelObjects | None = None
        self._kernel_known = False
        self._replace_next = False  # after drift or a refused full sync: replace the table
        self._lock = threading.RLock()
        # Threads that committed transactions (native ids), so a change notification of ours
        # is told apart from someone else's (agent/dataplane/tamper.py). Bounded: the agent
        # commits from a handful of long-lived threads.
        self._committers: dict[int, None] = {}
        # The chains' rules as the kernel held them after our last transaction that wrote
        # rules (None: unknown). The mirror says which rules must be there, but only the
        # kernel can say how it compiled them, so the drift check compares content with this
        # (a rule replaced in place keeps the count the Snapshot compares).
        self._prints: Mapping[str, tuple[str, ...]] | None = None

    # -- state -------------------------------------------------------------------------------

    @property
    def mirror(self) -> DesiredState | None:
        """Return the last state the kernel accepted (None before the first applied sync)."""
        return self._mirror

    @property
    def failures(self) -> int:
        """Return the number of consecutive failed syncs (0 after a success)."""
        return self._failures

    @property
    def next_full(self) -> bool:
        """Return True when the next sync will send the full table."""
        return self._full_pending or self._mirror is None

    @property
    def next_attempt_at(self) -> float | None:
        """Return the clock time after which a failed sync should be retried (None if ok)."""
        return self._next_attempt_at

    def request_full(self) -> None:
        """Make the next sync a full resync (on demand, e.g. from an admin endpoint)."""
        with self._lock:
            self._full_pending = True

    # -- sync --------------------------------------------------------------------------------

    def sync(
        self,
        desired: DesiredState,
        *,
        full: bool = False,
        changed: Iterable[FrontendKey] | None = None,
    ) -> SyncResult:
        """Apply `desired` in one transaction and return what happened.

        Sends the full table on the first sync, when `full` is True, after `request_full`,
        after drift, and after `full_after_failures` consecutive failures; otherwise the delta
        from the mirror (nothing at all if the delta is empty). Never raises for a refused
        transaction or an unrenderable state: the result says so, and when to retry.

        `changed` optionally names the frontend keys that may differ from the state passed to
        the previous `sync` call (None: any key may). With it, a delta costs time in the
        number of changed frontends instead of all of them; hints of failed syncs are kept
        and merged until one succeeds, so a retry with a newer hint stays correct.
        """
        with self._lock:
            start = self._clock()
            hint = self._merge_hint(changed)
            mode = SyncMode.FULL if (full or self.next_full) else SyncMode.PARTIAL
            if mode is SyncMode.FULL and not self._kernel_known:
                try:
                    self._kernel = self._read_objects()
                except NftError as exc:
                    return self._failed(SyncOutcome.REFUSED, mode, start, 0, exc.text)
                self._kernel_known = True
            try:
                if mode is SyncMode.FULL:
                    tx = render(
                        desired, mark=self._mark, existing=self._kernel, replace=self._replace_next
                    )
                else:
                    assert self._mirror is not None
                    tx = delta(
                        self._mirror,
                        desired,
                        mark=self._mark,
                        candidates=hint,
                        existing=self._kernel if self._kernel_known else None,
                    )
            except RenderError as exc:
                return self._failed(SyncOutcome.INVALID, mode, start, 0, str(exc))
            if not tx.ops:
                self._mirror = desired
                self._pending_hint = set()
                self._failures = 0
                self._next_attempt_at = None
                return SyncResult(SyncOutcome.UNCHANGED, SyncMode.NONE, self._clock() - start)
            try:
                self._send(tx, mode, desired)
            except NftError as exc:
                if mode is SyncMode.FULL:
                    self._kernel_known = False
                    self._replace_next = True
                return self._failed(SyncOutcome.REFUSED, mode, start, len(tx.ops), exc.text)
            duration = self._clock() - start
            old = self._mirror
            self._mirror = desired
            self._applied += 1
            self._pending_hint = set()
            self._failures = 0
            self._full_pending = False
            self._next_attempt_at = None
            self._kernel = objects_after(self._kernel, tx)
            if mode is SyncMode.FULL:
                self._replace_next = False
            if mode is SyncMode.FULL or any(isinstance(op.obj, Rule) for op in tx.ops):
                self._prints = self._read_prints()
            added, deleted = tx.element_count()
            self._elements = added if mode is SyncMode.FULL else self._elements + added - deleted
            metrics.SYNC_DURATION.labels(mode=mode.value).observe(duration)
            metrics.PROGRAMMED_FRONTENDS.set(len(desired.frontends))
            metrics.PROGRAMMED_MAP_ELEMENTS.set(self._elements)
            cleared = self._clear_conntrack(old, desired, hint)
            return SyncResult(
                SyncOutcome.APPLIED, mode, duration, len(tx.ops), conntrack_deleted=cleared
            )

    def committed_from(self, tid: int) -> bool:
        """Return True when thread `tid` (a native thread id) sent one of our transactions."""
        return tid in self._committers

    def _note_committer(self) -> None:
        tid = threading.get_native_id()
        if tid not in self._committers:
            if len(self._committers) >= 64:
                del self._committers[next(iter(self._committers))]
            self._committers[tid] = None

    def _send(self, tx: Transaction, mode: SyncMode, desired: DesiredState) -> None:
        """Apply `tx`: element-only partial syncs as a netlink batch when an ElementSender is
        set (netlink.py: no libnftables cache fetch), everything else, and a batch the
        kernel refused, through the runner. Raises NftError if the runner refuses."""
        self._note_committer()
        if mode is SyncMode.FULL and self._fast is not None:
            split = split_full(tx)
            if split is not None:
                self._send_split(split, desired)
                return
        ops = element_ops(tx) if self._fast is not None and mode is SyncMode.PARTIAL else None
        if ops is not None and self._fast is not None:
            try:
                self._fast.apply(ElementBatch(tx.ops, ops))
                self.fast_applied += 1
                return
            except NftError as exc:
                self.fast_fallbacks += 1
                metrics.NFT_FAST_PATH_FALLBACKS.inc()
                log.warning(
                    "netlink element batch (%s) failed, using nft: %s", ops_summary(ops), exc
                )
        self._runner.run(tx)

    def _send_split(self, split: FullSplit, desired: DesiredState) -> None:
        """Apply a full in-place transaction as structure (libnftables), every element
        (one netlink batch), then cleanup (libnftables): see rules.netlink.split_full.

        libnftables parses a 100k-element transaction into ~250 MB of heap; the elements as
        one netlink batch cost a few MB. If the element batch is refused, the structure is
        already in, so the whole table is rendered against it and sent through libnftables.
        Raises NftError if the runner refuses.
        """
        assert self._fast is not None
        self._runner.run(split.structure)
        try:
            self._fast.apply(ElementBatch(split.elements))
        except NftError as exc:
            self.fast_fallbacks += 1
            metrics.NFT_FAST_PATH_FALLBACKS.inc()
            log.warning("netlink full element batch failed, using nft: %s", exc)
            mid = objects_after(self._kernel, split.structure)
            self._runner.run(render(desired, mark=self._mark, existing=mid))
            return
        self.fast_applied += 1
        if split.cleanup.ops:
            self._runner.run(split.cleanup)

    def _failed(
        self, outcome: SyncOutcome, mode: SyncMode, start: float, ops: int, error: str
    ) -> SyncResult:
        self._failures += 1
        if outcome is SyncOutcome.REFUSED:
            metrics.NFT_TRANSACTION_FAILURES.inc()
        if self._failures >= self._full_after:
            self._full_pending = True
        retry = self._backoff.delay(self._failures)
        now = self._clock()
        self._next_attempt_at = now + retry
        log.warning(
            "%s sync %s (failure %d in a row, retry in %.2fs): %s",
            mode.value,
            outcome.value,
            self._failures,
            retry,
            error,
        )
        return SyncResult(
            outcome,
            mode,
            now - start,
            ops,
            error=error,
            retry_after=retry,
            failures=self._failures,
        )

    def _merge_hint(self, changed: Iterable[FrontendKey] | None) -> set[FrontendKey] | None:
        """Return the keys that may differ from the mirror (None: any), counting failed syncs."""
        if changed is None or self._pending_hint is None:
            self._pending_hint = None
            return None
        self._pending_hint |= set(changed)
        return set(self._pending_hint)

    def _clear_conntrack(
        self, old: DesiredState | None, new: DesiredState, hint: set[FrontendKey] | None
    ) -> int:
        if self._conntrack is None or old is None:
            return 0
        removed = removed_udp_endpoints(old, new, candidates=hint)
        if not removed:
            return 0
        deleted, errors = delete_stale_udp(self._conntrack, removed)
        metrics.CONNTRACK_DELETED.inc(deleted)
        if errors:
            metrics.CONNTRACK_FAILURES.inc(len(errors))
        return deleted

    # -- drift -------------------------------------------------------------------------------

    def check_drift(self) -> bool:
        """Return True when the kernel's table differed from the mirror (and was resynced).

        Reads the table back and compares it with what the mirror says must be there. On a
        difference the drift is logged and counted and a full resync of the mirror is sent at
        once (if that fails, the next `sync` is full as well). False when there is no mirror
        yet (nothing applied), when the table matches, and when a sync was applied while the
        table was being read (the reading may mix both states; check again later). Raises
        NftError when the table cannot be read.

        The read and the comparison (seconds at 10k Services: `nft -j list table` dominates)
        run without holding the sync lock, so syncs are not delayed by them.
        """
        with self._lock:
            mirror, applied = self._mirror, self._applied
        if mirror is None:
            return False
        # What the mirror says first: building it needs every element's (key, value) pair
        # for a moment, which is freed before the read-back's elements arrive (a lower peak).
        want = expected(mirror, mark=self._mark)
        have = self._read_table()
        diffs = want.differences(have)
        del want, have
        release_memory()  # the read-back's objects are gone: give their pages back
        if not diffs:
            diffs = self._rule_differences()
        if not diffs:
            return False
        with self._lock:
            if self._applied != applied:
                return False
            metrics.NFT_DRIFT_REPAIRS.inc()
            # A tampered dispatch chain cannot be rewritten in place (it is kept as it is):
            # replace the whole table, and read what it holds again afterwards.
            self._replace_next = True
            self._kernel_known = False
            log.warning("nodelb table drifted from the mirror; full resync: %s", "; ".join(diffs))
            self._full_pending = True
            self.sync(mirror, full=True)
            return True

    def _read_prints(self) -> Mapping[str, tuple[str, ...]] | None:
        """Return the kernel's rule fingerprints now, None without a netlink reader or when
        they cannot be read (the next drift check then compares counts only)."""
        if self._readback is None:
            return None
        try:
            return self._readback.rule_prints()
        except NftError as exc:
            log.warning("cannot read the rules back for the drift check: %s", exc)
            return None

    def _rule_differences(self) -> list[str]:
        """Return one line per chain whose rules differ from what our last rule-writing
        transaction left (empty when they agree, or when that is unknown)."""
        with self._lock:
            prints = self._prints
        if prints is None:
            return []
        now = self._read_prints()
        if now is None:
            return []
        return [
            f"chain {name}: its rules were changed in place"
            for name in sorted(prints.keys() & now.keys())
            if prints[name] != now[name]
        ]

    def _read_table(self) -> Snapshot:
        """Return what the kernel's table holds: over netlink when a reader is wired (cheap),
        else through libnftables' JSON listing. Raises NftError."""
        if self._readback is None:
            return from_json(self._runner.list_table(L.TABLE_FAMILY, L.TABLE_NAME))
        return self._readback.snapshot()

    def _read_objects(self) -> KernelObjects | None:
        """Return the objects the kernel's table holds (None: no table). Raises NftError."""
        if self._readback is None:
            return kernel_objects(self._runner.list_declarations(L.TABLE_FAMILY, L.TABLE_NAME))
        return self._readback.objects()

    def repair(self) -> bool:
        """Replace the table with the mirror's now, because someone else changed it; return
        True when the kernel took the repair (False: nothing applied yet, or refused, and the
        next sync is a full one).

        Called when a change notification shows a foreign write (agent/dataplane/tamper.py):
        what was changed is unknown (a rule replaced in place has the same count), so nothing
        is compared; the whole table is rewritten by the replacing shape, which also rebuilds
        the dispatch chains an in-place rewrite keeps as they are.
        """
        with self._lock:
            mirror = self._mirror
            if mirror is None:
                return False
            self._replace_next = True
            self._kernel_known = False
            self._full_pending = True
            return self.sync(mirror, full=True).ok

    # -- cleanup -----------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Remove the nodelb table (and nothing else); the next sync is full.

        Raises NftError if the kernel refuses (it does not when the table is already absent).
        """
        with self._lock:
            self._note_committer()
            self._runner.run(render_cleanup())
            self._applied += 1
            self._mirror = None
            self._pending_hint = set()
            self._full_pending = True
            self._elements = 0
            self._kernel = None
            self._kernel_known = True
            self._prints = None
            metrics.PROGRAMMED_FRONTENDS.set(0)
            metrics.PROGRAMMED_MAP_ELEMENTS.set(0)
