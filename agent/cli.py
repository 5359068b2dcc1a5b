"""`nodelb` command line: agent, controller, render, status, cleanup, lab."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import signal
import socket
import ssl
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from agent import logs, memory, status_command
from agent.config import DEFAULT_METRICS_ADDRESS, AgentConfig, ConfigError
from agent.config_file import load_config
from agent.kube.manifests import ManifestError, load_files
from agent.node.cluster_state import ClusterState, Dirty, listed
from agent.node.status_document import desired_dict
from agent.serving_cert import DEFAULT_CERT_OUT
from rules.render import RenderError, render, render_cleanup

if TYPE_CHECKING:
    from agent.announce.announcer import Announcer
    from agent.http_server import Gate
    from agent.kube.node_reporter import NodeReporter

# The long-running roles import what they run inside their own command (PLC0415 allowed
# there): the kubernetes client, pyroute2, the dataplane and the announcer take ~1 s of CPU
# to import, which `nodelb render` and `nodelb status` must not pay (docs/decisions.md).


def cmd_render(args: argparse.Namespace) -> int:
    """Print the full transaction (or the desired state) the agent would apply on a node."""
    cfg = load_config(args.config, node_name=args.node)
    objects = load_files(args.file)
    # The agent's own core, fed as its reflectors would be, recomputing everything as its
    # first sync does (no announcer: every programmed LoadBalancer IP is held when serveAllIPs).
    state = ClusterState(cfg)
    state.apply(
        listed(
            services=objects.get("Service", []),
            slices=objects.get("EndpointSlice", []),
            nodes=objects.get("Node", []),
        )
    )
    outcome = state.recompute(Dirty(everything=True))
    desired = outcome.desired
    for key, problems in sorted(outcome.problems.items()):
        for p in problems:
            print(f"warning: {key}: {p.reason}: {p.message}", file=sys.stderr)
    if args.json:
        sys.stdout.write(orjson.dumps(desired_dict(desired), option=orjson.OPT_INDENT_2).decode())
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(desired).text())
    return 0


def stop_on_signals(stop: threading.Event, log: logging.Logger) -> None:
    """Make SIGTERM and SIGINT set `stop`; the loops notice it and wind down in order."""

    def on_signal(signum: int, frame: object) -> None:
        log.info("stopping", extra={"signal": signal.Signals(signum).name})
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def run_until_done(loop: threading.Thread) -> None:
    """Start `loop` and wait for it, waking often so the main thread still takes signals."""
    loop.start()
    while loop.is_alive():
        loop.join(timeout=0.5)


class Crashes:
    """The uncaught exceptions of a process's threads: the first one stops the process.

    A thread that dies of an exception would otherwise leave the process running without it
    (the announcer, the tamper guard) or ending with status 0 once its loop is gone, which a
    Deployment treats as a clean exit. `exit_code` is 1 once any guarded thread crashed.
    """

    def __init__(self, stop: threading.Event, log: logging.Logger) -> None:
        self._stop = stop
        self._log = log
        self.crashed: list[str] = []

    def guard(
        self, name: str, target: Callable[[threading.Event], None]
    ) -> Callable[[threading.Event], None]:
        """Return `target` wrapped so that an exception is logged and stops the process."""

        def run(stop: threading.Event) -> None:
            try:
                target(stop)
            except BaseException:
                self._log.exception("thread crashed; stopping", extra={"thread_name": name})
                self.crashed.append(name)
                self._stop.set()

        return run

    @property
    def exit_code(self) -> int:
        """Return the process's exit status: 1 when a thread crashed, else 0."""
        return 1 if self.crashed else 0


def wait_for_config(
    args: argparse.Namespace,
    stop: threading.Event,
    log: logging.Logger,
    *,
    gate: Gate,
    tls_for: Callable[[str], ssl.SSLContext | None],
    period: float = 2.0,
) -> AgentConfig | None:
    """Return the agent's config once the file holds a valid one (None: stopped first).

    A refused file leaves the agent running and unready: /healthz answers 200 and /readyz 503
    with the reason, on --metrics-address or the default address (the file's own is unknown
    until it is valid), and the file is read again every `period` seconds. Each distinct
    refusal is logged once.
    """
    from agent.http_server import HealthServer  # noqa: PLC0415

    try:
        return load_config(args.config, node_name=args.node_name)
    except ConfigError as exc:
        reason = [str(exc)]
    log.error("configuration refused; not ready until it is fixed: %s", reason[0])
    address = args.metrics_address or DEFAULT_METRICS_ADDRESS
    health = HealthServer(
        address,
        alive=lambda: True,
        ready=lambda: False,
        why_not_ready=lambda: f"configuration refused: {reason[0]}",
        gate=gate,  # /metrics stays behind its token while the file is refused
        tls=tls_for(address),
    )
    health.run()
    try:
        while not stop.wait(period):
            try:
                return load_config(args.config, node_name=args.node_name)
            except ConfigError as exc:
                if str(exc) != reason[0]:
                    reason[0] = str(exc)
                    log.error("configuration refused; not ready until it is fixed: %s", exc)
        return None
    finally:
        health.close()


def cmd_agent(args: argparse.Namespace) -> int:
    """Run the node agent until SIGTERM/SIGINT."""
    from kubernetes import client  # noqa: PLC0415

    from agent.announce.announcer import Announcer  # noqa: PLC0415
    from agent.dataplane.applier import Dataplane  # noqa: PLC0415
    from agent.dataplane.conntrack import ToolConntrackRunner  # noqa: PLC0415
    from agent.dataplane.libnft import LibNftRunner  # noqa: PLC0415
    from agent.dataplane.netlink import NetlinkElementSender  # noqa: PLC0415
    from agent.dataplane.netlink_dump import NetlinkTableReader  # noqa: PLC0415
    from agent.dataplane.spread_plane import SpreadPlane  # noqa: PLC0415
    from agent.dataplane.tamper import TamperGuard  # noqa: PLC0415
    from agent.http_server import HealthServer  # noqa: PLC0415
    from agent.kube.client import api_client, api_host_addresses  # noqa: PLC0415
    from agent.kube.contact_probe import ContactProbe  # noqa: PLC0415
    from agent.kube.event_sender import KubeEventSink  # noqa: PLC0415
    from agent.kube.reviews import AccessGate, KubeReviewer  # noqa: PLC0415
    from agent.node.healthcheck import HealthCheckServers  # noqa: PLC0415
    from agent.node.loop import Agent, list_fns  # noqa: PLC0415

    # Before any thread starts: threads keep the malloc arena they first got.
    arenas = memory.limit_malloc_arenas(os.environ)
    # A 1 ms GIL switch interval (Python's default is 5 ms): while a drift check or a full
    # recompute runs on another thread, each blocking call of a sync (netlink, locks) waits
    # up to one interval for the GIL back. Measured with a drift check looping next to
    # one-element syncs at 10k Services: sync p50 6-11 -> 2 ms, p90 16 -> 3-4 ms.
    sys.setswitchinterval(0.001)
    logs.setup(args.log_level, args.log_format)
    log = logging.getLogger("nodelb.agent")
    log.debug("malloc arenas", extra={"arena_max": arenas})
    stop = threading.Event()
    stop_on_signals(stop, log)
    api = api_client(args.kubeconfig)
    gate = AccessGate(KubeReviewer(api))
    cfg = wait_for_config(args, stop, log, gate=gate, tls_for=functools.partial(metrics_tls, args))
    if cfg is None:
        return 0  # asked to stop while waiting for a valid configuration
    if not cfg.node_name:
        raise ConfigError("the node name is unset: pass --node-name or set $NODE_NAME")
    events = KubeEventSink(client.CoreV1Api(api), component="nodelb-agent", host=cfg.node_name)
    # Element-only changes go out as raw netlink batches: libnftables would first fetch every
    # table in the namespace (kube-proxy's too), hundreds of ms at 10k Services.
    # The drift check reads the table back over netlink too (dataplane/netlink_dump.py): a
    # libnftables listing builds a cache of every element, ~300 MB at 10k Services. On a socket
    # of its own: a dump of 100k elements holds its socket ~100 ms, and a sync must not wait for it.
    dataplane = Dataplane(
        LibNftRunner(),
        conntrack=ToolConntrackRunner(),
        elements=NetlinkElementSender.open(),
        readback=NetlinkTableReader(NetlinkElementSender.open()),
    )
    # Someone else's write to the table is undone from the mirror at once (change
    # notifications), not at the next drift check.
    guard = TamperGuard(dataplane)
    health_ports = HealthCheckServers() if cfg.health_check_node_ports else None
    lists = list_fns(api)
    announcer, reporter = None, None
    held_changed: list[Any] = []  # the agent's callback, once the agent exists

    def on_held_change() -> None:
        held_changed[0]()

    if cfg.announce.enabled:
        # Started from the main thread: the speaker child dies with the thread that made it.
        announcer = Announcer(
            cfg.announce,
            cfg.node_name,
            events=events,
            on_held_change=on_held_change,
        )
        announcer.start()
        reporter = node_reporter(api, cfg, announcer)
        announcer.reporter = reporter
        lists = dataclasses.replace(lists, reports=report_list_fn(api, cfg))
    agent = Agent(
        cfg,
        dataplane=dataplane,
        events=events,
        lists=lists,
        on_health=health_ports.update if health_ports else None,
        announcer=announcer,
        freeze_heap=True,
        # The address this agent reaches the API at is never held (a control-plane VIP is
        # seen nowhere else): agent/node/holdable.py.
        api_addresses=api_host_addresses(api),
        # The tunnel and the netdev table, only while some Service is spread (issue #15).
        spread=SpreadPlane(LibNftRunner()),
    )
    held_changed.append(agent.held_changed)
    # Says within seconds when the API stops answering; the announcer then takes nothing new.
    probe = ContactProbe(api, on_change=announcer.set_cut_off if announcer else lambda c: None)
    crashes = Crashes(stop, log)
    loop = threading.Thread(
        target=crashes.guard("agent", agent.run), args=(stop,), name="agent", daemon=True
    )
    helpers = [
        threading.Thread(
            target=crashes.guard(name, runner.run), args=(stop,), name=name, daemon=True
        )
        for name, runner in (
            ("announcer", announcer),
            ("reporter", reporter),
            ("tamper", guard),
            ("api-probe", probe),
        )
        if runner is not None
    ]
    address = args.metrics_address or cfg.metrics_address
    health = HealthServer(
        address,
        alive=loop.is_alive,
        ready=agent.ready.is_set,
        status=agent.status_document,
        gate=gate,
        tls=metrics_tls(args, address),
    )

    events.run()
    health.run()
    log.info("agent starting", extra={"node": cfg.node_name, "metrics_port": health.port})
    for t in helpers:
        t.start()
    run_until_done(loop)
    if announcer is not None:
        # Resign first (priority-0 adverts): a backup takes over within Skew_Time, while this
        # node's rules still serve whatever arrives meanwhile.
        announcer.stop(graceful=True)
    if reporter is not None:
        reporter.wake()
    for t in helpers:
        t.join(timeout=10)
    health.close()
    if health_ports is not None:
        health_ports.close()
    events.close()
    # The table stays in place: a restarted agent takes it over in one transaction, and
    # traffic keeps flowing meanwhile. `nodelb cleanup` removes it.
    log.info("agent stopped", extra={"crashed": crashes.crashed})
    return crashes.exit_code


def node_reporter(api: Any, cfg: AgentConfig, announcer: Announcer) -> NodeReporter:
    """Return the reporter of this node's served IPs, publishing its VRRP advert sources."""
    from kubernetes import client  # noqa: PLC0415

    from agent.kube.node_report import MAC_ANNOTATION, SOURCES_ANNOTATION  # noqa: PLC0415
    from agent.kube.node_reporter import NodeReporter  # noqa: PLC0415

    duration = cfg.announce.report_lease_seconds
    return NodeReporter(
        client.CoordinationV1Api(api),
        node=cfg.node_name,
        namespace=cfg.announce.report_namespace,
        duration=duration,
        renew_every=duration / 3,
        extra={
            SOURCES_ANNOTATION: ",".join(map(str, announcer.sources())),
            # The speakers of the other nodes accept this node's adverts only from this MAC.
            **({MAC_ANNOTATION: announcer.mac} if announcer.mac else {}),
        },
    )


def report_list_fn(api: Any, cfg: AgentConfig) -> Any:
    """Return the list call for the node report Leases (the announcer's IPv6 peers)."""
    from kubernetes import client  # noqa: PLC0415

    from agent.kube.node_report import REPORT_LABEL, REPORT_LABEL_VALUE  # noqa: PLC0415

    return functools.partial(
        client.CoordinationV1Api(api).list_namespaced_lease,
        cfg.announce.report_namespace,
        label_selector=f"{REPORT_LABEL}={REPORT_LABEL_VALUE}",
    )


def cmd_controller(args: argparse.Namespace) -> int:
    """Run the allocation controller (leader-elected) until SIGTERM/SIGINT."""
    from kubernetes import client  # noqa: PLC0415

    from agent.controller.api import KubeControllerAPI  # noqa: PLC0415
    from agent.controller.leader import ElectionTiming  # noqa: PLC0415
    from agent.controller.loop import Controller, ControllerSettings  # noqa: PLC0415
    from agent.http_server import HealthServer  # noqa: PLC0415
    from agent.kube.client import api_client  # noqa: PLC0415
    from agent.kube.event_sender import KubeEventSink  # noqa: PLC0415
    from agent.kube.reviews import AccessGate, KubeReviewer  # noqa: PLC0415

    logs.setup(args.log_level, args.log_format)
    log = logging.getLogger("nodelb.controller")
    identity = (
        args.identity or os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    )
    timing = ElectionTiming(
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
    )
    settings = ControllerSettings(
        namespace=args.namespace,
        identity=identity,
        config_path=args.config,
        election=timing,
        config_map=args.config_map,
    )
    if args.write_concurrency is not None:
        if args.write_concurrency < 1:
            raise ConfigError("--write-concurrency must be at least 1")
        settings = dataclasses.replace(settings, write_concurrency=args.write_concurrency)
    # Up to six watches (the pools' with pool objects), the Lease, the status writers and the
    # Event senders each hold a connection.
    senders = 4  # Event writes in flight
    api = api_client(args.kubeconfig, pool_size=10 + settings.write_concurrency + senders)
    events = KubeEventSink(
        client.CoreV1Api(api), component="nodelb-controller", host=identity, senders=senders
    )
    controller = Controller(
        KubeControllerAPI(api), settings, events=events, event_room=events.wait_room
    )
    stop = threading.Event()
    crashes = Crashes(stop, log)
    loop = threading.Thread(
        target=crashes.guard("controller", controller.run),
        args=(stop,),
        name="controller",
        daemon=True,
    )
    health = HealthServer(
        args.metrics_address,
        alive=loop.is_alive,
        ready=controller.ready.is_set,
        gate=AccessGate(KubeReviewer(api)),
        tls=metrics_tls(args, args.metrics_address),
        why_not_ready=controller.unready_reason,
    )

    stop_on_signals(stop, log)
    events.run()
    health.run()
    log.info("controller starting", extra={"identity": identity, "metrics_port": health.port})
    run_until_done(loop)
    health.close()
    events.close()
    log.info("controller stopped", extra={"crashed": crashes.crashed})
    return crashes.exit_code


def cmd_cleanup(args: argparse.Namespace) -> int:
    """Remove the nodelb table from this network namespace (no other table is touched)."""
    from agent.dataplane.libnft import LibNftRunner  # noqa: PLC0415
    from agent.dataplane.spread_plane import SpreadPlane  # noqa: PLC0415

    runner = LibNftRunner()
    runner.run(render_cleanup())
    SpreadPlane(runner).remove()
    print("removed table inet nodelb, table netdev nodelb and nlb-vx (if they existed)")
    return 0


class LabUnavailable(RuntimeError):
    """`nodelb lab` was run from an installed nodelb without the repository's lab package."""


def _lab_modules() -> Any:
    """Return the lab's `session` and `demo` modules, from the checkout this program runs from.

    The lab is not part of the wheel or the image (it builds namespaces, spawns kube-apiserver,
    and only a developer's machine needs it): it lives in the repository's top-level `lab/`
    package, next to `agent/`. Imported here, not at start-up, so `nodelb agent` never loads it.
    """
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "lab" / "__init__.py").is_file() and str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    try:
        from lab import demo, session  # noqa: PLC0415  (see the docstring)
    except ImportError as exc:
        raise LabUnavailable(
            f"the lab is not installed with nodelb; run it from a checkout ({exc})"
        ) from None
    return session, demo


def cmd_lab(args: argparse.Namespace) -> int:
    """Manage the persistent network-namespace lab (see docs/lab.md)."""
    try:
        session, demo = _lab_modules()
    except LabUnavailable as exc:
        print(f"nodelb lab: {exc}", file=sys.stderr)
        return 1
    try:
        if args.lab_command == "up" and args.real_nodes:
            real = session.up_real_nodes(nodes=args.nodes)
            print(
                f"lab up: {len(real.nodes)} real nodes (kubelet, containerd, nodelb from "
                "deploy/); `nodelb lab status` describes it"
            )
        elif args.lab_command == "up":
            cluster = session.up(
                nodes=args.nodes, pods_per_node=args.pods, kube_proxy=not args.no_kube_proxy
            )
            print(f"lab up: {len(cluster.nodes)} nodes; `nodelb lab status` describes it")
        elif args.lab_command == "down":
            removed = session.down()
            print(f"lab down: removed {len(removed)} namespaces")
        elif args.lab_command == "status":
            state = session.status()
            if args.json:
                print(orjson.dumps(state, option=orjson.OPT_INDENT_2).decode())
            else:
                for key in ("workdir", "apiserver", "kubeconfig", "agents", "kube_proxies"):
                    if key in state:
                        print(f"{key:<13} {state[key]}")
                for node in state.get("real_nodes", {}).get("nodes", []):
                    print(f"{'real node':<13} {node['name']}: {node['base']}")
                alive = state.get("alive", {})
                print(f"{'namespaces':<13} {sum(alive.values())}/{len(alive)} present")
        elif args.lab_command == "demo":
            return int(demo.run())
    except session.SessionError as exc:
        print(f"nodelb lab: {exc}", file=sys.stderr)
        return 1
    return 0


def metrics_tls(args: argparse.Namespace, address: str) -> ssl.SSLContext:
    """Return the metrics endpoint's TLS context: the mounted pair, else a self-signed one
    whose certificate is published to --metrics-cert-out (agent/serving_cert.py)."""
    from agent.http_server import parse_addresses  # noqa: PLC0415
    from agent.serving_cert import server_context  # noqa: PLC0415

    hosts = [h for h, _ in parse_addresses(address) if h not in ("0.0.0.0", "::")]
    return server_context(
        cert_file=args.metrics_cert_file,
        key_file=args.metrics_key_file,
        publish_to=args.metrics_cert_out,
        hosts=hosts,
    )


def add_metrics_tls_arguments(p: argparse.ArgumentParser, cert_out: str) -> None:
    """Add the metrics endpoint's certificate options to `p`."""
    p.add_argument("--metrics-cert-file", type=Path, default=None, help="serving certificate (PEM)")
    p.add_argument("--metrics-key-file", type=Path, default=None, help="its private key (PEM)")
    p.add_argument(
        "--metrics-cert-out",
        type=Path,
        default=Path(cert_out),
        help="where the self-signed certificate made when none is mounted is written, for "
        "clients on this host to pin (default: %(default)s)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nodelb", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("agent", help="run the node agent")
    p.add_argument("--config", type=Path, default=None)
    p.add_argument("--kubeconfig", type=Path, default=None, help="default: in-cluster")
    p.add_argument("--node-name", default=None, help="default: $NODE_NAME")
    p.add_argument(
        "--metrics-address",
        default=None,
        help="host:port[,host:port] for /metrics, /status, /healthz, /readyz (TLS)",
    )
    add_metrics_tls_arguments(p, DEFAULT_CERT_OUT)
    p.add_argument("--log-level", default="info")
    p.add_argument("--log-format", choices=("json", "text"), default="json")
    p.set_defaults(func=cmd_agent)

    p = sub.add_parser("controller", help="run the IP allocation controller")
    p.add_argument("--config", type=Path, default=None, help="the shared config file")
    p.add_argument("--kubeconfig", type=Path, default=None, help="default: in-cluster")
    p.add_argument("--namespace", default="nodelb-system", help="where the Leases live")
    p.add_argument(
        "--config-map",
        default="nodelb-config",
        help="the ConfigMap (in --namespace) the config file comes from: refusals are its Events",
    )
    p.add_argument("--identity", default=None, help="default: $POD_NAME, else host-pid")
    p.add_argument("--metrics-address", default="0.0.0.0:9473,[::]:9473")
    add_metrics_tls_arguments(p, "/tmp/nodelb-controller-metrics.crt")
    p.add_argument("--lease-duration", type=int, default=15, help="seconds")
    p.add_argument("--renew-deadline", type=float, default=10.0, help="seconds")
    p.add_argument("--retry-period", type=float, default=2.0, help="seconds")
    p.add_argument(
        "--write-concurrency",
        type=int,
        default=None,
        help="Service writes in flight at once, one per Service at most (default: 16)",
    )
    p.add_argument("--log-level", default="info")
    p.add_argument("--log-format", choices=("json", "text"), default="json")
    p.set_defaults(func=cmd_controller)

    p = sub.add_parser("render", help="print the nft transaction the agent would apply")
    p.add_argument("--node", required=True, help="the node to render for")
    p.add_argument("-f", "--file", type=Path, action="append", required=True)
    p.add_argument("--config", type=Path, default=None)
    p.add_argument("--json", action="store_true", help="print the desired state instead")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("status", help="show what the agent on this node is doing")
    status_command.add_arguments(p)
    p.set_defaults(func=status_command.run)

    p = sub.add_parser("cleanup", help="remove nodelb's nftables table")
    p.set_defaults(func=cmd_cleanup)

    p = sub.add_parser("lab", help="the network-namespace lab (root)")
    lab = p.add_subparsers(dest="lab_command", required=True)
    up = lab.add_parser("up", help="build the lab and leave it running")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--pods", type=int, default=2, help="pods per node")
    up.add_argument("--no-kube-proxy", action="store_true")
    up.add_argument(
        "--real-nodes",
        action="store_true",
        help="kubelet and containerd in every node, a router and an outside client, nodelb "
        "installed from deploy/ (needs `make realnodes` built; see README)",
    )
    lab.add_parser("down", help="remove the lab")
    st = lab.add_parser("status", help="describe the running lab")
    st.add_argument("--json", action="store_true")
    lab.add_parser("demo", help="build the lab and show traffic reaching LoadBalancer IPs")
    p.set_defaults(func=cmd_lab)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (ConfigError, ManifestError, RenderError) as exc:
        print(f"nodelb: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
