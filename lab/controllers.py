"""Run `nodelb controller` replicas in the lab's control-plane namespace (tests, bench, demo).

Each replica is a real process started with `ip netns exec` in the namespace that carries the
apiserver, tracked by the lab (stopped by PID at teardown). Replicas are named, and pass their
name as their Lease identity, so a test can find the leader from the Lease and kill it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

from agent.controller.loop import LEASE_NAME
from lab import netns, readers
from lab.controlplane import ControlPlane
from lab.topology import Lab

_REPO_ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "nodelb-system"
FAST_ELECTION = ("--lease-duration=4", "--renew-deadline=3", "--retry-period=0.5")


def ensure_node(core: kclient.CoreV1Api, name: str) -> None:
    """Create Node `name` if it is missing: the controller believes a node report only for a
    Node that exists, so a test reporting for a node without a lab node registers it."""
    try:
        core.create_node(kclient.V1Node(metadata=kclient.V1ObjectMeta(name=name)))
    except ApiException as exc:
        if exc.status != 409:
            raise


class ControllerSet:
    """Named controller replicas sharing one config file and one apiserver."""

    def __init__(
        self,
        lab: Lab,
        controlplane: ControlPlane,
        workdir: Path,
        *,
        kubeconfig: Path | None = None,
        election: tuple[str, ...] = FAST_ELECTION,
    ) -> None:
        self.lab = lab
        self.controlplane = controlplane
        self.workdir = workdir
        self.config_path = workdir / "controller-config.yaml"
        self.kubeconfig = kubeconfig or controlplane.admin_kubeconfig()
        self.election = election
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._ports: dict[str, int] = {}

    def write_config(self, config: Mapping[str, Any]) -> None:
        """Write the shared config file (controllers reload it within their reload period)."""
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        tmp.replace(self.config_path)  # atomic: a reload never reads half a file

    def ensure_namespace(self) -> None:
        """Create the namespace the Leases live in, if missing."""
        core = kclient.CoreV1Api(self.controlplane.api_client())
        try:
            core.create_namespace(
                kclient.V1Namespace(metadata=kclient.V1ObjectMeta(name=NAMESPACE))
            )
        except ApiException as exc:
            if exc.status != 409:
                raise

    def start(self, name: str, *, extra: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
        """Start replica `name`; return its process."""
        port = self._ports.setdefault(name, 9600 + len(self._ports))
        assert self.lab.controlplane is not None
        argv = [
            sys.executable,
            "-m",
            "agent.cli",
            "controller",
            f"--kubeconfig={self.kubeconfig}",
            f"--config={self.config_path}",
            f"--namespace={NAMESPACE}",
            f"--identity={name}",
            f"--metrics-address=127.0.0.1:{port}",
            f"--metrics-cert-out={self.cert(name)}",
            "--log-format=text",
            *self.election,
            *extra,
        ]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        proc = self.lab.spawn(
            self.lab.controlplane.ns, argv, log_name=f"controller-{name}", env=env
        )
        self.procs[name] = proc
        return proc

    def metrics_url(self, name: str) -> str:
        """Return the /metrics URL of replica `name` (dialled inside the control-plane ns)."""
        return f"https://127.0.0.1:{self._ports[name]}/metrics"

    def cert(self, name: str) -> Path:
        """Return where replica `name` publishes its self-signed certificate."""
        return self.workdir / f"controller-{name}-metrics.crt"

    def scrape(self, name: str, *, timeout: float = 2.0) -> tuple[int, str]:
        """Return (status, body) of replica `name`'s /metrics, read as a scraper does: the lab
        reader's token, the replica's published certificate verified (lab/readers.py)."""
        assert self.lab.controlplane is not None
        return readers.get(
            self.lab.controlplane.ns,
            self.metrics_url(name),
            cert=self.cert(name),
            token=readers.reader_token(self.controlplane),
            timeout=timeout,
        )

    def kill(self, name: str) -> None:
        """SIGKILL replica `name` (a crash: the Lease is not released)."""
        proc = self.procs.pop(name)
        netns.stop(proc, sig=signal.SIGKILL, grace=5.0)
        self.lab.stop(proc)

    def stop(self, name: str) -> None:
        """SIGTERM replica `name` (it releases the Lease) and wait for it."""
        proc = self.procs.pop(name)
        self.lab.stop(proc)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)

    def leader(self) -> str | None:
        """Return the identity holding the controller Lease, None when free or missing."""
        coord = kclient.CoordinationV1Api(self.controlplane.api_client())
        try:
            lease = coord.read_namespaced_lease(LEASE_NAME, NAMESPACE)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        holder = lease.spec.holder_identity if lease.spec else None
        return str(holder) if holder else None

    def log(self, name: str) -> str:
        path = self.lab.workdir / "logs" / f"controller-{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""
