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
import ipaddress
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from agent.announce.vrrp.config import SpeakerConfig, to_json
from agent.model.desired_state import IPAddress

_REPO_ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True, slots=True)
class InstanceStatus:
    """One instance as the speaker last reported it; `master` None when none is known."""

    vrid: int
    family: int
    state: str  # Initialize | Backup | Master
    priority: int
    addresses: tuple[IPAddress, ...]
    master: IPAddress | None
    adverts_sent: int
    adverts_received: int
    takeovers: int
    transitions: tuple[tuple[str, int], ...]  # (to state, count), sorted


@dataclass(frozen=True, slots=True)
class Transition:
    """A state change the speaker made (for Events): `seq` grows by one per change."""

    seq: int
    time_us: int
    vrid: int
    family: int
    from_state: str
    to_state: str
    event: str


@dataclass(frozen=True, slots=True)
class Status:
    """A speaker's snapshot. `state` is starting | running | stopped; counters are totals.

    `dropped` and `gratuitous` are ((family, reason or kind), count) pairs, sorted; `held`
    the marked addresses on the interface; `transitions` the most recent state changes (up
    to 64), oldest first; `timer_late_max_us` the most a timer fired after its deadline and
    `timers_late` how many fired more than 10 ms late (the loop could not run in time).
    """

    pid: int
    seq: int
    time_us: int
    state: str
    interface: str
    instances: tuple[InstanceStatus, ...]
    dropped: tuple[tuple[tuple[int, str], int], ...]
    gratuitous: tuple[tuple[tuple[int, str], int], ...]
    held: tuple[IPAddress, ...]
    send_errors: int
    timer_late_max_us: int
    timers_late: int
    transitions: tuple[Transition, ...]
    errors: tuple[str, ...]

    def instance(self, family: int, vrid: int) -> InstanceStatus | None:
        """Return the instance (family, vrid), None when the speaker does not run it."""
        for i in self.instances:
            if (i.family, i.vrid) == (family, vrid):
                return i
        return None

    def dropped_count(self, family: int, reason: str) -> int:
        """Return how many packets of `family` were dropped for `reason` (0 if none)."""
        return dict(self.dropped).get((family, reason), 0)


def parse_status(raw: dict[str, Any]) -> Status:
    """Return the Status in a speaker's JSON snapshot; raises KeyError/ValueError if malformed."""

    def pairs(table: dict[str, dict[str, int]]) -> tuple[tuple[tuple[int, str], int], ...]:
        return tuple(
            sorted(((int(f), str(k)), int(n)) for f, c in table.items() for k, n in c.items())
        )

    return Status(
        pid=int(raw["pid"]),
        seq=int(raw["seq"]),
        time_us=int(raw["time_us"]),
        state=str(raw["state"]),
        interface=str(raw["interface"]),
        instances=tuple(
            InstanceStatus(
                vrid=int(i["vrid"]),
                family=int(i["family"]),
                state=str(i["state"]),
                priority=int(i["priority"]),
                addresses=tuple(ipaddress.ip_address(a) for a in i["addresses"]),
                master=None if i["master"] is None else ipaddress.ip_address(i["master"]),
                adverts_sent=int(i["adverts_sent"]),
                adverts_received=int(i["adverts_received"]),
                takeovers=int(i["takeovers"]),
                transitions=tuple(sorted((str(k), int(v)) for k, v in i["transitions"].items())),
            )
            for i in raw["instances"]
        ),
        dropped=pairs(raw["dropped"]),
        gratuitous=pairs(raw["gratuitous"]),
        held=tuple(ipaddress.ip_address(a) for f in ("4", "6") for a in raw["held"].get(f, ())),
        send_errors=int(raw["send_errors"]),
        timer_late_max_us=int(raw["timer_late_max_us"]),
        timers_late=int(raw["timers_late"]),
        transitions=tuple(
            Transition(
                seq=int(e["seq"]),
                time_us=int(e["time_us"]),
                vrid=int(e["vrid"]),
                family=int(e["family"]),
                from_state=str(e["from"]),
                to_state=str(e["to"]),
                event=str(e["event"]),
            )
            for e in raw["events"]
        ),
        errors=tuple(str(e) for e in raw["errors"]),
    )


def read_status(path: Path) -> Status | None:
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
        self._send({"config": to_json(config)})

    def _send(self, message: dict[str, Any]) -> None:
        if self._stdin is None:
            raise RuntimeError("SpeakerProcess is not running")
        self._stdin.write(json.dumps(message).encode() + b"\n")
        self._stdin.flush()

    def status(self) -> Status | None:
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
                self._send({"stop": {"graceful": graceful}})
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
