"""Where the VRRP speaker runs: the pure choice from `announce.speakerCPU` and the CPU set."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from agent.announce.settings import AnnounceConfigError, parse_announce
from agent.announce.speaker_cpu import (
    AUTO,
    CpuReason,
    SpeakerCpu,
    SpeakerCpuSetting,
    choose_speaker_cpu,
)


@dataclass(frozen=True, slots=True)
class Case:
    setting: SpeakerCpuSetting
    allowed: frozenset[int]
    expected: SpeakerCpu


CASES = [
    pytest.param(
        Case(AUTO, frozenset({0, 1}), SpeakerCpu(1, frozenset({0}), CpuReason.AUTO)),
        id="auto on two CPUs: the speaker on the higher one, the agent on the other",
    ),
    pytest.param(
        Case(AUTO, frozenset({2, 5, 9}), SpeakerCpu(9, frozenset({2, 5}), CpuReason.AUTO)),
        id="auto in a sparse cpuset takes the highest CPU of the set, not of the machine",
    ),
    pytest.param(
        Case(AUTO, frozenset({3}), SpeakerCpu(None, frozenset(), CpuReason.SINGLE_CPU)),
        id="auto with one CPU pins nothing (the agent keeps its only CPU)",
    ),
    pytest.param(
        Case(None, frozenset({0, 1}), SpeakerCpu(None, frozenset(), CpuReason.DISABLED)),
        id="null turns pinning off",
    ),
    pytest.param(
        Case(0, frozenset({0, 1, 2}), SpeakerCpu(0, frozenset({1, 2}), CpuReason.CONFIGURED)),
        id="a configured CPU in the set is used and kept from the agent",
    ),
    pytest.param(
        Case(7, frozenset({0, 1}), SpeakerCpu(1, frozenset({0}), CpuReason.NOT_ALLOWED)),
        id="a configured CPU outside the set falls back to the automatic choice",
    ),
    pytest.param(
        Case(7, frozenset({0}), SpeakerCpu(None, frozenset(), CpuReason.SINGLE_CPU)),
        id="a configured CPU outside a one-CPU set pins nothing",
    ),
    pytest.param(
        Case(4, frozenset({4}), SpeakerCpu(4, frozenset(), CpuReason.CONFIGURED)),
        id="the agent's only CPU may be given to the speaker; the agent's set is then unchanged",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_choice(case: Case) -> None:
    got = choose_speaker_cpu(case.setting, case.allowed)
    assert got == case.expected
    # Whatever the case: the speaker's CPU is one the agent may use, and never one it keeps.
    assert got.cpu is None or got.cpu in case.allowed
    assert got.cpu not in got.agent_cpus and got.agent_cpus <= case.allowed


def test_the_setting_defaults_to_auto_and_takes_null_a_number_or_auto() -> None:
    assert parse_announce({}).speaker_cpu == AUTO
    assert parse_announce({"speakerCPU": "auto"}).speaker_cpu == AUTO
    assert parse_announce({"speakerCPU": None}).speaker_cpu is None
    assert parse_announce({"speakerCPU": 3}).speaker_cpu == 3


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("Auto", id="auto is lower case"),
        pytest.param("1", id="a number in quotes"),
        pytest.param(-1, id="a negative CPU"),
        pytest.param(4096, id="past the kernel's range"),
        pytest.param(True, id="a boolean"),
        pytest.param([1], id="a list of CPUs"),
    ],
)
def test_anything_else_is_refused_naming_the_key(value: object) -> None:
    with pytest.raises(AnnounceConfigError, match=r"announce\.speakerCPU"):
        parse_announce({"speakerCPU": value})
