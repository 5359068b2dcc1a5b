"""Thin shell over `ip netns`: create, delete, run and spawn inside named network namespaces.

Every helper takes the namespace explicitly, so no code path can program the root namespace
by forgetting an argument. Processes are started in their own session so teardown can stop
exactly the process groups it started, by PID.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from agent.netns import NETNS_DIR, NetnsError

# Every namespace this process created and has not deleted yet: the test session's end check
# asserts this is empty, so a leaked namespace fails the run (other processes' labs, such as a
# demo running beside the tests, are not this process's business).
CREATED: set[str] = set()


def exists(name: str) -> bool:
    """Return True when the named namespace exists."""
    return (NETNS_DIR / name).exists()


def create(name: str) -> None:
    """Create the named namespace with its loopback up. Fails if it already exists."""
    if exists(name):
        raise NetnsError(f"network namespace {name!r} already exists")
    _ip("netns", "add", name)
    CREATED.add(name)
    run(name, ["ip", "link", "set", "lo", "up"])


def pids(name: str) -> list[int]:
    """Return the PIDs of every process whose network namespace is `name` (empty if none)."""
    if not exists(name):
        return []
    out = subprocess.run(
        ["ip", "netns", "pids", name], capture_output=True, text=True, check=False
    ).stdout
    return [int(p) for p in out.split()]


def delete(name: str, *, grace: float = 2.0) -> None:
    """Stop every process left inside `name` (TERM, then KILL), then delete the namespace.

    Only processes living in this lab namespace are signalled; they were started by the lab.
    Idempotent: a missing namespace is not an error.
    """
    if not exists(name):
        CREATED.discard(name)
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = pids(name)
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while pids(name) and time.monotonic() < deadline:
            time.sleep(0.05)
    subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
    if not exists(name):
        CREATED.discard(name)


def run(
    name: str,
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout: float = 30.0,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `argv` inside namespace `name` and return the completed process (text mode).

    With check=True a non-zero exit raises NetnsError carrying the command and its stderr.
    """
    cmd = ["ip", "netns", "exec", name, *argv]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, input=input, check=False
    )
    if check and proc.returncode != 0:
        raise NetnsError(
            f"in {name}: {' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}"
        )
    return proc


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    log: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start `argv` inside namespace `name` in a new session and return the Popen.

    Output goes to `log` (appended) when given, else is discarded. The caller owns the
    process and stops it with `stop()`.
    """
    return start(["ip", "netns", "exec", name, *argv], log=log, env=env)


def start(
    argv: Sequence[str], *, log: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start `argv` in a new session (its PID leads its process group) and return the Popen.

    Output goes to `log` (appended) when given, else is discarded. Callers put the namespace
    into `argv` themselves (`spawn` with `ip netns exec`, the real-node lab with nsenter).
    """
    out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    try:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
    finally:
        if log is not None and not isinstance(out, int):
            out.close()


def stop(proc: subprocess.Popen[bytes], *, sig: int = signal.SIGTERM, grace: float = 5.0) -> None:
    """Signal the process group `proc` leads, wait up to `grace` s, then KILL it."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace)


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")


__all__ = [
    "CREATED",
    "NETNS_DIR",
    "NetnsError",
    "create",
    "delete",
    "exists",
    "pids",
    "run",
    "spawn",
    "start",
    "stop",
]
