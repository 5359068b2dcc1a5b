"""Status writes: how one ended, and what the loop does next (pure)."""

from __future__ import annotations

import enum


class WriteOutcome(enum.StrEnum):
    """How a status write ended (the values are the metric's result label)."""

    OK = "ok"
    CONFLICT = "conflict"  # 409 stale resourceVersion, or 404 deleted meanwhile
    ERROR = "error"
    NOT_LEADER = "not_leader"  # not sent: leadership lapsed before it left
