"""Which CPU the VRRP speaker is pinned to: a pure choice from the setting and the CPU set.

On kernels without full preemption (PREEMPT_NONE / voluntary, which most distribution kernels
and this project's lab VM run) a long nftables commit made by the agent cannot be preempted,
not even by the speaker at real-time priority: when the speaker wakes on that CPU its advert
waits for the commit (50-400 ms measured at 10k Services, enough for a false failover at 10 cs
adverts). Giving the speaker a CPU the agent's threads do not use removes the stall, so that
is the default whenever the agent may use two CPUs or more (docs/decisions.md).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

AUTO: Literal["auto"] = "auto"

# The `announce.speakerCPU` setting: a CPU number, "auto" (the default) or None (no pinning).
SpeakerCpuSetting = int | Literal["auto"] | None


class CpuReason(enum.StrEnum):
    """Why the speaker runs where it runs (logged at start, for the operator)."""

    CONFIGURED = "Configured"  # the configured CPU
    AUTO = "Auto"  # the highest CPU of the agent's set; the agent keeps the others
    SINGLE_CPU = "SingleCPU"  # auto with one CPU: nothing to keep apart
    DISABLED = "Disabled"  # speakerCPU: null
    NOT_ALLOWED = "NotAllowed"  # the configured CPU is outside the agent's set: auto instead


@dataclass(frozen=True, slots=True)
class SpeakerCpu:
    """The speaker's CPU (None: not pinned) and the CPUs left to the agent (empty: unchanged)."""

    cpu: int | None
    agent_cpus: frozenset[int]
    reason: CpuReason


def choose_speaker_cpu(setting: SpeakerCpuSetting, allowed: frozenset[int]) -> SpeakerCpu:
    """Return where the speaker runs, given the setting and the agent's allowed CPUs.

    A configured CPU outside `allowed` (a cpuset smaller than the operator thought) cannot be
    used: the speaker would fail to start, so the automatic choice is made instead and the
    reason says why. With a single allowed CPU nothing is pinned.
    """
    if setting is None:
        return SpeakerCpu(None, frozenset(), CpuReason.DISABLED)
    if setting != AUTO and setting in allowed:
        rest = allowed - {setting}
        return SpeakerCpu(setting, rest, CpuReason.CONFIGURED)
    if len(allowed) < 2:
        return SpeakerCpu(None, frozenset(), CpuReason.SINGLE_CPU)
    cpu = max(allowed)
    reason = CpuReason.AUTO if setting == AUTO else CpuReason.NOT_ALLOWED
    return SpeakerCpu(cpu, allowed - {cpu}, reason)
