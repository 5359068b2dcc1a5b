"""Figures every bench takes the same way: percentiles and a process's memory from /proc."""

from __future__ import annotations

import os
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


def proc_cpu_s(pid: int | str = "self") -> float:
    """Return the CPU seconds (user + system) process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the command's closing parenthesis: state is field 3, utime 14 and stime 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
