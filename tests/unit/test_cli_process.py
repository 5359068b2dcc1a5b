"""Process-level behaviour of `nodelb`: a crashed thread exits non-zero, a bad file waits.

Loopback sockets in this process only (the health server on 127.0.0.1, port 0).
"""

from __future__ import annotations

import argparse
import logging
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from agent import cli, logs
from agent.http_server import HealthServer
from agent.kube.access import Decision, Verdict
from lab.wait import wait_until

log = logging.getLogger("test")


def test_a_crashed_thread_stops_the_process_and_makes_the_exit_status_1() -> None:
    stop = threading.Event()
    crashes = cli.Crashes(stop, log)

    def boom(stop: threading.Event) -> None:
        raise RuntimeError("a bug")

    crashes.guard("announcer", boom)(stop)
    assert stop.is_set()
    assert crashes.crashed == ["announcer"] and crashes.exit_code == 1


def test_a_thread_that_ends_cleanly_keeps_the_exit_status_0() -> None:
    stop = threading.Event()
    crashes = cli.Crashes(stop, log)
    crashes.guard("tamper", lambda s: None)(stop)
    assert not stop.is_set() and crashes.exit_code == 0


class _Sink:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def run(self) -> None:
        pass

    def close(self) -> None:
        pass

    def wait_room(self, timeout: float) -> bool:
        return True


class _CrashingController:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.ready = threading.Event()

    def run(self, stop: threading.Event) -> None:
        raise TypeError("what a wrongly typed config did on main")

    def unready_reason(self) -> str:
        return "crashed"


def test_nodelb_controller_exits_1_when_its_loop_crashes(monkeypatch: pytest.MonkeyPatch) -> None:
    # `nodelb controller` imports its parts when it runs: patched where they live.
    monkeypatch.setattr("agent.kube.client.api_client", lambda *a, **k: object())
    monkeypatch.setattr("agent.kube.event_sender.KubeEventSink", _Sink)
    monkeypatch.setattr("agent.controller.api.KubeControllerAPI", lambda api: None)
    monkeypatch.setattr("agent.controller.loop.Controller", _CrashingController)
    monkeypatch.setattr(cli, "stop_on_signals", lambda stop, log: None)
    monkeypatch.setattr(logs, "setup", lambda *a: None)
    assert cli.main(["controller", "--metrics-address=127.0.0.1:0"]) == 1


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())


class ProbesOnly:
    """A gate that opens the probe paths and refuses the rest, as AccessGate does without a
    token (its reviews are tests/unit/test_metrics_auth.py's business)."""

    def check(self, path: str, authorization: str | None) -> Decision:
        if path in ("/healthz", "/readyz"):
            return Decision(Verdict.OPEN)
        return Decision(Verdict.NO_TOKEN, "a bearer token is required\n")


def test_readyz_says_why_it_is_not_ready() -> None:
    why = ["configuration refused: pools[0] (p).addresses: expected a list"]
    server = HealthServer(
        "127.0.0.1:0",
        alive=lambda: True,
        ready=lambda: not why[0],
        why_not_ready=lambda: why[0],
        gate=ProbesOnly(),
        tls=None,
    )
    server.run()
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert _get(f"{base}/readyz") == (503, f"not ready: {why[0]}\n".encode())
        assert _get(f"{base}/healthz")[0] == 200
        assert _get(f"{base}/metrics")[0] == 401  # the gate still guards the rest
        why[0] = ""
        assert _get(f"{base}/readyz") == (200, b"ready\n")
    finally:
        server.close()


def test_an_agent_with_a_bad_file_waits_for_a_good_one(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("handleClasslessServices: 'false'\n")  # a quoted boolean
    args = argparse.Namespace(config=path, node_name="n1", metrics_address="127.0.0.1:0")
    stop = threading.Event()
    got: list[Any] = []
    waiter = threading.Thread(
        target=lambda: got.append(
            cli.wait_for_config(
                args, stop, log, gate=ProbesOnly(), tls_for=lambda _: None, period=0.01
            )
        )
    )
    waiter.start()
    try:
        observe = threading.Event()
        observe.wait(0.1)  # several periods pass on the bad file ...
        assert waiter.is_alive() and got == []
        path.write_text("handleClasslessServices: false\n")  # ... until it is fixed
        wait_until(lambda: got, 10, "the fixed file to be loaded")
    finally:
        stop.set()
        waiter.join(timeout=10)
    assert got[0] is not None and got[0].handle_classless is False and got[0].node_name == "n1"


def test_an_agent_stopped_while_waiting_returns_none(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("")
    args = argparse.Namespace(config=path, node_name="n1", metrics_address="127.0.0.1:0")
    stop = threading.Event()
    stop.set()
    assert (
        cli.wait_for_config(args, stop, log, gate=ProbesOnly(), tls_for=lambda _: None, period=0.01)
        is None
    )
