"""List+watch one resource into a Store, parsing raw responses with orjson.

The shell around agent/kube/store.py: paginated list, then watch from the list's
resourceVersion with bookmarks; a 410 Gone (expired resourceVersion) relists, any other
failure reconnects with exponential backoff from the last resourceVersion seen. Raw bytes are
parsed with orjson and never through the client's model classes (see docs/decisions.md).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import orjson

from agent.backoff import Backoff
from agent.kube.lists import PAGE_SIZE, ListFn, RawResponse, list_pages
from agent.kube.store import Change, EventType, Store, resource_version

# ListFn and RawResponse live in agent.kube.lists; the roles' loops name them from here.
__all__ = ["GoneError", "ListFn", "RawResponse", "Reflector", "iter_lines"]

T = TypeVar("T")
log = logging.getLogger(__name__)


class GoneError(Exception):
    """The resourceVersion we watch from has expired (HTTP 410): a relist is needed."""


def iter_lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Yield complete newline-terminated lines from a chunked byte stream."""
    buf = b""
    for chunk in chunks:
        buf += chunk
        while (nl := buf.find(b"\n")) >= 0:
            line, buf = buf[:nl], buf[nl + 1 :]
            if line.strip():
                yield line
    if buf.strip():
        yield buf


class Reflector(Generic[T]):
    """Keeps `store` equal to the API server's view of one resource; reports every change.

    `on_changes` is called from the reflector's thread with the changes of one list or one
    watch event. `synced` is set once the first list has been stored.
    """

    def __init__(
        self,
        *,
        name: str,
        list_fn: ListFn,
        store: Store[T],
        on_changes: Callable[[list[Change[T]]], None],
        page_size: int = PAGE_SIZE,
        watch_timeout: int = 300,
        backoff: Backoff | None = None,
        on_restart: Callable[[str], None] | None = None,
    ) -> None:
        self.name = name
        self._list_fn = list_fn
        self._store = store
        self._on_changes = on_changes
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self._backoff = backoff or Backoff(initial=0.2, maximum=10.0)
        self._failures = 0
        self._on_restart = on_restart or (lambda reason: None)
        self._rv: str | None = None
        self._resp: RawResponse | None = None
        self.synced = threading.Event()

    def run(self, stop: threading.Event) -> None:
        """List and watch until `stop` is set; never raises."""
        while not stop.is_set():
            try:
                if self._rv is None:
                    self._relist()
                self._watch(stop)
                self._failures = 0
            except GoneError:
                log.info("%s: resourceVersion expired, relisting", self.name)
                self._rv = None
                self._on_restart("gone")
            except Exception as exc:
                if stop.is_set():
                    break
                self._failures += 1
                delay = self._backoff.delay(self._failures)
                log.warning("%s: watch failed (%s); retrying in %.1fs", self.name, exc, delay)
                self._on_restart("error")
                stop.wait(delay)

    def close(self) -> None:
        """Abort an in-flight watch so run() notices its stop event promptly.

        `shutdown()` unblocks a read in progress on another thread; `close()` would instead
        wait for that read (a watch can sit idle for minutes), so SIGTERM would hang.
        """
        resp = self._resp
        if resp is not None:
            resp.shutdown()

    def _call(self, **kwargs: Any) -> RawResponse:
        return self._checked(self._list_fn(_preload_content=False, **kwargs))

    def _list_call(self, **kwargs: Any) -> RawResponse:
        # list_pages adds _preload_content itself.
        return self._checked(self._list_fn(**kwargs))

    @staticmethod
    def _checked(resp: RawResponse) -> RawResponse:
        if resp.status == 410:
            raise GoneError
        if resp.status >= 400:
            raise RuntimeError(f"HTTP {resp.status}: {resp.data[:300]!r}")
        return resp

    def _relist(self) -> None:
        list_rv: list[str] = []
        changes = self._store.replace(self._pages(list_rv))
        self._rv = list_rv[-1]
        self.synced.set()
        if changes:
            self._on_changes(changes)

    def _pages(self, list_rv: list[str]) -> Iterator[Any]:
        """Yield the raw items of a paginated list, one page in memory at a time.

        The store parses each item as it comes, so a page's raw dicts are freed before the
        next page is fetched: at 10k EndpointSlices, keeping every page until the end held
        ~150 MB of raw dicts at once and left the heap fragmented (bench/memory.py). Appends
        each page's resourceVersion to `list_rv` (the last one is the list's).
        """
        for page in list_pages(self._list_call, limit=self._page_size, _request_timeout=60):
            list_rv.append(page.resource_version)
            yield from page.items
            page.items.clear()  # this page's raw dicts go before the next page is fetched

    def _watch(self, stop: threading.Event) -> None:
        resp = self._call(
            watch=True,
            resource_version=self._rv,
            allow_watch_bookmarks=True,
            timeout_seconds=self._watch_timeout,
            _request_timeout=(10, self._watch_timeout + 30),
        )
        self._resp = resp
        try:
            for line in iter_lines(resp.stream(65536)):
                if stop.is_set():
                    return
                self._handle(orjson.loads(line))
        finally:
            self._resp = None
            resp.release_conn()

    def _handle(self, event: dict[str, Any]) -> None:
        kind = EventType(event.get("type", "ERROR"))
        obj = event.get("object") or {}
        if kind is EventType.ERROR:
            if obj.get("code") == 410:
                raise GoneError
            raise RuntimeError(f"watch error: {obj.get('message', obj)}")
        rv = resource_version(obj)
        if kind is not EventType.BOOKMARK:
            change = self._store.apply(kind, obj)
            if change is not None:
                self._on_changes([change])
        if rv:
            self._rv = rv
