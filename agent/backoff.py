"""Exponential backoff as a pure function of the number of consecutive failures.

One definition for every retry loop: the watch reconnects, the dataplane's refused
transactions and the allocator's exhausted pools.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """Retry delays: `initial`, multiplied by `factor` per failure, capped at `maximum`."""

    initial: float = 5.0
    factor: float = 2.0
    maximum: float = 300.0

    def delay(self, failures: int) -> float:
        """Return the delay after the `failures`-th consecutive failure (1-based; 0 -> 0)."""
        if failures <= 0:
            return 0.0
        return float(min(self.initial * self.factor ** (failures - 1), self.maximum))
