"""The agent's probe of the API server: says within seconds when the agent is cut off.

A thread asks the API server for its version every `interval` seconds (a small, unauthorised-
friendly GET that touches no etcd: `system:public-info-viewer` allows it), with a short
timeout, and decides from the outcomes whether the agent is cut off (agent/kube/contact.py).
On a change it logs (WARNING when cut off, with how long and the last error; INFO when the API
answers again), sets `nodelb_api_cut_off`, and calls `on_change(cut_off)`: the announcer then
stops (or resumes) taking new addresses.
"""

from __future__ import annotations

import copy
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from agent.kube import metrics
from agent.kube.contact import Contact, Reach, answered, decide, failed, sent

log = logging.getLogger(__name__)


class ContactProbe:
    """See the module docstring. `run(stop)` in a thread of its own; nothing in the constructor."""

    def __init__(
        self,
        api: Any,
        *,
        on_change: Callable[[bool], None] = lambda cut_off: None,
        interval: float = 1.0,
        timeout: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        ask: Callable[[float], object] | None = None,
    ) -> None:
        self._api = api
        self._ask = ask or self._get_version
        self._versions: Any = None  # VersionApi on a client of its own, made at first use
        self._on_change = on_change
        self._interval = interval
        self._timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()  # the contact
        self._acting = threading.Lock()  # one decision acted on at a time, in order
        self.contact = Contact()

    def _get_version(self, timeout: float) -> object:
        if self._versions is None:
            # A client of its own without urllib3's retries: a probe fails after one timeout,
            # and a cut does not log three retry warnings a second.
            configuration = copy.copy(self._api.configuration)
            configuration.retries = False
            self._versions = client.VersionApi(client.ApiClient(configuration))
        return self._versions.get_code(_request_timeout=timeout)

    def probe(self) -> Reach | None:
        """Send one probe, decide, and act on a change; return the new reach (None: same)."""
        at = self._clock()
        with self._lock:
            self.contact = sent(self.contact, at=at)
        try:
            self._ask(self._timeout)
            outcome = functools.partial(answered, at=self._clock())
        except ApiException as exc:
            if exc.status:  # the server answered, with an error: it is reachable
                outcome = functools.partial(answered, at=self._clock())
            else:
                outcome = functools.partial(failed, sent=at, error=str(exc).strip())
        except Exception as exc:
            outcome = functools.partial(failed, sent=at, error=f"{type(exc).__name__}: {exc}")
        with self._lock:
            self.contact = outcome(self.contact)
        return self.tick()

    def tick(self) -> Reach | None:
        """Decide now (also while a probe hangs, from the ticker thread) and act on a change;
        return the new reach (None: same)."""
        with self._acting:
            return self._decide()

    def _decide(self) -> Reach | None:
        now = self._clock()
        with self._lock:
            self.contact, change = decide(self.contact, now=now, timeout=self._timeout)
            c = self.contact
        if change is Reach.CUT_OFF:
            since = c.failing_since if c.failing_since is not None else c.last_answer
            log.warning(
                "cut off from the API server: no answer for %.1fs (%s); keeping what this node"
                " holds, taking no new addresses",
                now - (since if since is not None else now),
                c.error or "requests hang",
            )
            metrics.API_CUT_OFF.set(1)
            self._on_change(True)
        elif change is Reach.CONNECTED:
            log.info("the API server answers again")
            metrics.API_CUT_OFF.set(0)
            self._on_change(False)
        return change

    def run(self, stop: threading.Event) -> None:
        """Probe every `interval` seconds until `stop` is set (a ticker thread decides in
        between, so a probe stuck in the HTTP client's retries cannot hide the cut)."""

        def ticker() -> None:
            while not stop.wait(self._interval / 2):
                try:
                    self.tick()
                except Exception:
                    log.exception("API contact check failed")

        threading.Thread(target=ticker, name="api-probe-tick", daemon=True).start()
        while not stop.is_set():
            started = self._clock()
            try:
                self.probe()
            except Exception:
                log.exception("API probe failed")
            stop.wait(max(0.0, self._interval - (self._clock() - started)))
