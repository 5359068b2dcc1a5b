"""agent/memory.py: when the agent caps glibc's malloc arenas, and how it asks glibc."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from agent.memory import DEFAULT_ARENA_MAX, M_ARENA_MAX, arena_limit, limit_malloc_arenas


@dataclass(frozen=True, slots=True)
class Case:
    environ: dict[str, str]
    default: int
    want: int | None


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Case({}, DEFAULT_ARENA_MAX, 2), id="no environment setting: the default cap"),
        pytest.param(Case({}, 4, 4), id="a caller's default is used as given"),
        pytest.param(
            Case({"MALLOC_ARENA_MAX": "8"}, 2, None), id="the operator's MALLOC_ARENA_MAX wins"
        ),
        pytest.param(
            Case({"MALLOC_ARENA_MAX": ""}, 2, None),
            id="even an empty MALLOC_ARENA_MAX is left to glibc",
        ),
        pytest.param(Case({}, 0, None), id="a default of 0 means no cap"),
    ],
)
def test_arena_limit(case: Case) -> None:
    assert arena_limit(case.environ, case.default) == case.want


class FakeLibc:
    def __init__(self, answer: int) -> None:
        self.answer = answer
        self.calls: list[tuple[int, int]] = []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self.answer


def test_limit_malloc_arenas_calls_mallopt_with_m_arena_max() -> None:
    libc = FakeLibc(1)
    assert limit_malloc_arenas({}, libc=libc) == DEFAULT_ARENA_MAX
    assert libc.calls == [(M_ARENA_MAX, DEFAULT_ARENA_MAX)]


def test_limit_malloc_arenas_reports_a_refusal_as_nothing_set() -> None:
    assert limit_malloc_arenas({}, libc=FakeLibc(0)) is None


def test_limit_malloc_arenas_leaves_an_operator_setting_alone() -> None:
    libc = FakeLibc(1)
    assert limit_malloc_arenas({"MALLOC_ARENA_MAX": "1"}, libc=libc) is None
    assert libc.calls == []


def test_limit_malloc_arenas_without_mallopt_sets_nothing() -> None:
    assert limit_malloc_arenas({}, libc=object()) is None
