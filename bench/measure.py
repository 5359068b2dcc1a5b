"""Figures every bench takes the same way: percentiles and a process's memory from /proc."""

from __future__ import annotations

from pathlib import Path


def percentile(values: list[float], q: float) -> float:
    """Return the nearest-rank `q` quantile of `values` (NaN when there are none)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def proc_mem_mb(pid: int | str = "self") -> tuple[float, float]:
    """Return (VmRSS, VmHWM) of `pid` (default: this process) in MiB; 0.0 where absent."""
    rss = hwm = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) / 1024
    return rss, hwm
