"""Process-wide glibc malloc settings for the agent (ctypes; a no-op where glibc is absent).

glibc gives threads their own malloc arenas (up to 8 per CPU). The agent's threads (one
reflector per resource, the sync loop, libnftables inside it, the health server) each leave
freed memory behind in their own arena, where it stays mapped. Capping the arenas at 2 lowers
the agent's steady RSS at 10k Services × 10 endpoints by ~8 MB (146 → 138 MB) and the full
sync's peak by ~20 MB (bench/memory.py, docs/decisions.md). The GIL serializes most of the
agent's allocations anyway, so the contention this trades for is small.

An operator's `MALLOC_ARENA_MAX` in the environment wins: glibc reads it at start-up and this
module then leaves the setting alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Mapping
from typing import Any

M_ARENA_MAX = -8  # mallopt parameter number, from glibc's malloc.h
DEFAULT_ARENA_MAX = 2
ENV_ARENA_MAX = "MALLOC_ARENA_MAX"


def arena_limit(environ: Mapping[str, str], default: int = DEFAULT_ARENA_MAX) -> int | None:
    """Return the arena cap the agent should set, or None to leave glibc's setting alone.

    None when the environment already sets `MALLOC_ARENA_MAX` (glibc applied it itself, even
    an invalid value is the operator's call) or when `default` is 0 or less (no cap).
    """
    if ENV_ARENA_MAX in environ or default <= 0:
        return None
    return default


def _libc() -> Any:
    return ctypes.CDLL(ctypes.util.find_library("c") or None)


def limit_malloc_arenas(
    environ: Mapping[str, str], default: int = DEFAULT_ARENA_MAX, *, libc: Any = None
) -> int | None:
    """Cap glibc's malloc arenas; return the cap set, or None when nothing was set.

    Call it before the first threads start: threads that already have an arena keep it.
    Nothing is set when `arena_limit` says so, when the C library has no `mallopt` (not
    glibc), or when mallopt refuses (it returns 0).
    """
    limit = arena_limit(environ, default)
    if limit is None:
        return None
    try:
        lib = libc if libc is not None else _libc()
        mallopt = lib.mallopt
    except (OSError, AttributeError):
        return None
    return limit if mallopt(M_ARENA_MAX, limit) == 1 else None
