"""Which failed requests a move of the IP explains (lab.requestloop.unexplained_failures)."""

from __future__ import annotations

from lab.requestloop import Request, unexplained_failures


def req(t: float, end: float, *, ok: bool = False, error: str = "ConnectionResetError") -> Request:
    return Request(t, ok, "pod" if ok else "", "" if ok else error, end)


MOVE = (10.00, 10.02)  # the router's entry changed MAC between these samples


def test_a_request_in_flight_at_a_move_is_explained() -> None:
    assert unexplained_failures([req(9.99, 10.01)], [MOVE]) == []


def test_a_request_that_ended_just_before_the_window_is_explained_within_the_slack() -> None:
    assert unexplained_failures([req(9.90, 9.97)], [MOVE], slack=0.05) == []


def test_a_failure_far_from_any_move_is_not_explained() -> None:
    far = req(12.0, 12.001)
    assert unexplained_failures([far], [MOVE]) == [far]


def test_a_failure_with_no_move_at_all_is_not_explained() -> None:
    lost = req(10.0, 10.01, error="ConnectionRefusedError")
    assert unexplained_failures([lost], []) == [lost]


def test_one_move_explains_one_failure_only() -> None:
    first, second = req(9.99, 10.01), req(10.015, 10.03)
    assert unexplained_failures([first, second], [MOVE]) == [second]


def test_two_moves_explain_one_failure_each() -> None:
    moves = [MOVE, (20.0, 20.02)]
    lost = [req(10.0, 10.01), req(20.01, 20.03)]
    assert unexplained_failures(lost, moves) == []


def test_answered_requests_need_no_explanation() -> None:
    assert unexplained_failures([req(1.0, 1.01, ok=True), req(50.0, 50.1, ok=True)], []) == []
