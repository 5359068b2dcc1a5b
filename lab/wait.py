"""Wait for a condition by polling it against a deadline, never by sleeping a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """A condition did not become true before its deadline; the message names it."""


class GiveUp(Exception):
    """Raised by a predicate when the condition can never hold; wait_until re-raises it."""


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    what: str,
    *,
    interval: float = 0.02,
) -> T:
    """Return the first truthy value `predicate()` returns, polling until `timeout` seconds.

    Raises WaitTimeout naming `what` (and the last exception the predicate raised, if any)
    when the deadline passes first. Exceptions from the predicate count as "not yet", except
    GiveUp, which ends the wait at once and propagates. The predicate is always called at
    least once, and once more after the deadline, so a slow machine never fails a condition
    that has become true.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        expired = time.monotonic() >= deadline
        try:
            value = predicate()
        except GiveUp:
            raise
        except Exception as exc:  # the predicate may fail until the condition holds
            last_error = exc
        else:
            if value:
                return value
        if expired:
            detail = f" (last error: {last_error!r})" if last_error is not None else ""
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {what}{detail}")
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
