"""The supervisor the agent uses: `SpeakerProcess` runs agent.announce.vrrp.speaker as a child.

The child is `python -m agent.announce.vrrp.speaker` in its own process (so the agent's CPU work
cannot delay adverts), with:

- its configuration on a pipe to its stdin (one JSON line per `update`), so instances can be
  added, removed or re-prioritised at any time without disturbing the others;
- its status in a file it rewrites atomically (at once on a state change, else at most every
  100 ms), read by `status()`; the child never blocks on the parent;
- PR_SET_PDEATHSIG(SIGTERM), set by the child itself, and EOF on its stdin: either way, when
  the agent dies (even `kill -9`) the child resigns with priority-0 adverts, removes its
  addresses and exits, so a backup takes over after Skew_Time. PR_SET_PDEATHSIG fires when
  the *thread* that started the child exits, so `start()` must be called from a thread that
  lives as long as the speaker should (the agent's main thread).

`argv_prefix` runs the child under a wrapper that execs it in place, such as
`("ip", "netns", "exec", NS)` in the lab; the child's PID is then still `pid`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO

from agent.announce.vrrp.config import SpeakerConfig, to_json
from agent.announce.vrrp.control import (
    Command,
    Configure,
    SpeakerStatus,
    Stop,
    encode_command,
    parse_status,
)

_REPO_ROOT = Path(__file__).resolve().parents[3]


def read_status(path: Path) -> SpeakerStatus | None:
    """Return the snapshot in `path`, None when the speaker has not written one yet."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return parse_status(json.loads(text))


class SpeakerProcess:
    """Supervise one speaker child. Nothing starts in the constructor: call `start()`.

    `workdir` holds the config and status files (a fresh temporary directory when None,
    removed by `cleanup()`); `python` is the interpreter for the child; `rt_priority` > 0
    runs the child under SCHED_RR at that priority (needs CAP_SYS_NICE; see the speaker);
    `cpus` (empty: any) pins the child to those CPUs.

    Why pinning: on a kernel without full preemption (PREEMPT_NONE, common in VMs), a long
    kernel path in the agent's own process, such as committing a 10k-Service nftables
    transaction, is not preempted even by a SCHED_RR speaker that wakes on the same CPU;
    measured in the lab: 50-200 ms late adverts, none once the speaker had a CPU the agent's
    sync threads do not use. So on such nodes give the speaker a CPU and keep the agent's
    applier off it (os.sched_setaffinity).
    """

    def __init__(
        self,
        config: SpeakerConfig,
        *,
        workdir: Path | None = None,
        python: str = sys.executable,
        argv_prefix: Sequence[str] = (),
        log: Path | None = None,
        rt_priority: int = 0,
        cpus: Iterable[int] = (),
    ) -> None:
        self.config = config
        self._workdir = workdir
        self._own_workdir = workdir is None
        self._python = python
        self._argv_prefix = tuple(argv_prefix)
        self._log = log
        self._rt_priority = rt_priority
        self._cpus = tuple(sorted(set(cpus)))
        self._proc: subprocess.Popen[bytes] | None = None
        self._stdin: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """Return the child's PID, None before `start()`."""
        return None if self._proc is None else self._proc.pid

    @property
    def status_path(self) -> Path:
        """Return the path of the child's status file."""
        if self._workdir is None:
            raise RuntimeError("SpeakerProcess has not been started")
        return self._workdir / "status.json"

    def start(self) -> None:
        """Start the child with the current config (call from a long-lived thread, see above)."""
        if self._proc is not None:
            raise RuntimeError("SpeakerProcess already started")
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="nodelb-speaker-"))
        self._workdir.mkdir(parents=True, exist_ok=True)
        config_path = self._workdir / "config.json"
        config_path.write_text(json.dumps(to_json(self.config)))
        self.status_path.unlink(missing_ok=True)
        argv = [
            *self._argv_prefix,
            self._python,
            "-m",
            "agent.announce.vrrp.speaker",
            "--config",
            str(config_path),
            "--status",
            str(self.status_path),
            "--control-stdin",
            "--parent-pid",
            str(os.getpid()),
            "--rt-priority",
            str(self._rt_priority),
            "--cpus",
            ",".join(map(str, self._cpus)),
        ]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        out = open(self._log, "ab") if self._log is not None else None  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=out if out is not None else subprocess.DEVNULL,
                stderr=subprocess.STDOUT if out is not None else None,
                start_new_session=True,
                env=env,
            )
        finally:
            if out is not None:
                out.close()
        self._stdin = self._proc.stdin

    def update(self, config: SpeakerConfig) -> None:
        """Send a new configuration; the child adds, removes and changes only what differs.

        Raises ValueError when the interface changes (stop and start a new SpeakerProcess).
        """
        if config.interface != self.config.interface:
            raise ValueError("the interface cannot change; start a new SpeakerProcess")
        self.config = config
        self._send(Configure(config))

    def _send(self, command: Command) -> None:
        if self._stdin is None:
            raise RuntimeError("SpeakerProcess is not running")
        self._stdin.write(encode_command(command))
        self._stdin.flush()

    def status(self) -> SpeakerStatus | None:
        """Return the child's latest snapshot, None before it wrote its first one."""
        if self._workdir is None:
            return None
        return read_status(self.status_path)

    def alive(self) -> bool:
        """Return True while the child runs."""
        return self._proc is not None and self._proc.poll() is None

    def stop(self, *, graceful: bool = True, timeout: float = 10.0) -> int | None:
        """Stop the child and return its exit code (None if it was never started).

        Graceful: every Master resigns (priority-0 advert) and removes its addresses before
        the child exits. Not graceful: the child exits at once, still removing its
        addresses. A child that does not exit within `timeout` is killed (by its PID).
        """
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                self._send(Stop(graceful=graceful))
            except (OSError, ValueError):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=timeout)
        if self._stdin is not None:
            with contextlib.suppress(OSError):
                self._stdin.close()
            self._stdin = None
        return proc.returncode

    def cleanup(self) -> None:
        """Remove the temporary working directory this object created (after `stop()`)."""
        if self._own_workdir and self._workdir is not None:
            for f in self._workdir.iterdir():
                f.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self._workdir.rmdir()
