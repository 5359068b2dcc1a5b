"""A real Kubernetes control plane (etcd + kube-apiserver) inside one lab network namespace.

etcd listens on the namespace's own loopback; kube-apiserver serves HTTPS on the lab IP,
port 6443, with client-certificate and service-account-token authentication and RBAC. Both
logs stay in the work directory. Processes inside the lab reach the apiserver with the
kubeconfigs written here; the test process (root namespace) reaches it through clients whose
connections are opened inside the namespace (see lab/nsclient.py), so nothing is ever
added to the root namespace.
"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Callable, Sequence
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import urllib3
import yaml
from kubernetes import client as kclient
from kubernetes import config as kconfig
from kubernetes.client.exceptions import ApiException

from lab import binaries, netns, nsclient, pki
from lab.wait import wait_until

API_PORT = 6443
ETCD_CLIENT_URL = "http://127.0.0.1:2379"
ETCD_PEER_URL = "http://127.0.0.1:2380"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
DEFAULT_SERVICE_CIDR = "198.18.128.0/20"
# The cluster is dual-stack so Services may ask for IPv6 and both families (lab range).
DEFAULT_SERVICE_CIDR6 = "2001:db8:ffff::/112"
SERVICE_DNS_NAMES = (
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


class ControlPlaneError(RuntimeError):
    """The control plane failed to start or answer; the message carries the log tails."""


class ControlPlane:
    """etcd + kube-apiserver in lab namespace `ns`, serving on `ip4`:6443.

    Nothing happens until `start()`; `stop()` stops exactly the processes `start()` spawned
    and is idempotent. Files (PKI, data, logs, kubeconfigs) go under `workdir`, which is kept.
    """

    def __init__(
        self,
        ns: str,
        ip4: IPv4Address,
        workdir: Path,
        *,
        service_cidr: str = DEFAULT_SERVICE_CIDR,
        kubelets: bool = False,
    ) -> None:
        self.ns = ns
        self.kubelets = kubelets
        self.ip4 = ip4
        self.workdir = workdir
        self.service_cidr: IPv4Network = IPv4Network(service_cidr)
        self.etcd_log = workdir / "etcd.log"
        self.apiserver_log = workdir / "kube-apiserver.log"
        self._pki: pki.ControlPlanePki | None = None
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._clients: list[kclient.ApiClient] = []

    @property
    def url(self) -> str:
        """Return the apiserver URL as processes inside the lab dial it."""
        return f"https://{self.ip4}:{API_PORT}"

    @property
    def logs(self) -> list[Path]:
        """Return the log files of etcd and kube-apiserver (they may not exist yet)."""
        return [self.etcd_log, self.apiserver_log]

    @property
    def first_service_ip(self) -> IPv4Address:
        """Return the ClusterIP the apiserver gives the `kubernetes` Service."""
        return next(self.service_cidr.hosts())

    def start(self, *, etcd_timeout: float = 30.0, apiserver_timeout: float = 90.0) -> None:
        """Start etcd, then kube-apiserver, and return once `/readyz` answers 200.

        Raises ControlPlaneError (with log tails) if a process exits or a deadline passes;
        whatever was started is stopped again first. May be called again after `stop()`:
        the PKI and etcd's data are kept, so API objects survive the restart.
        """
        if self._procs:
            raise ControlPlaneError("control plane already started")
        etcd_bin = binaries.binary("etcd")
        apiserver_bin = binaries.binary("kube-apiserver")
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            if self._pki is None:
                self._pki = pki.generate(
                    self.workdir / "pki",
                    ips=[self.ip4, self.first_service_ip],
                    dns_names=SERVICE_DNS_NAMES,
                )
            etcd = self._spawn("etcd", [str(etcd_bin), *self._etcd_args()], self.etcd_log)
            self._wait_healthy(etcd, "etcd", self._etcd_healthy, etcd_timeout)
            apiserver = self._spawn(
                "kube-apiserver",
                [str(apiserver_bin), *self._apiserver_args(self._pki)],
                self.apiserver_log,
            )
            admin = self.api_client()
            self._wait_healthy(
                apiserver,
                "kube-apiserver /readyz",
                lambda: _get(admin.rest_client.pool_manager, f"{self.url}/readyz") == 200,
                apiserver_timeout,
            )
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd (only the processes start() spawned). Idempotent.

        Every process is stopped even if an earlier step fails; the first error is re-raised.
        """
        first_error: BaseException | None = None
        while self._procs:
            _, proc = self._procs.pop()
            try:
                netns.stop(proc)
            except Exception as exc:
                first_error = first_error or exc
        while self._clients:
            self._clients.pop().close()  # type: ignore[no-untyped-call]
        if first_error is not None:
            raise first_error

    def admin_kubeconfig(self) -> Path:
        """Return a kubeconfig for user system:masters (client cert), server `self.url`.

        For processes that run inside lab namespaces.
        """
        path = self.workdir / "admin.kubeconfig"
        if not path.exists():
            p = self._require_pki()
            user = {
                "client-certificate-data": _b64(p.admin.cert),
                "client-key-data": _b64(p.admin.key),
            }
            self._write_kubeconfig(path, "admin", user)
        return path

    def api_client(self, kubeconfig: Path | None = None) -> kclient.ApiClient:
        """Return a kubernetes ApiClient usable from the root namespace.

        It reads `kubeconfig` (default: the admin one); every connection it opens is created
        inside the control plane's namespace. The client is closed by `stop()`.
        """
        configuration = kclient.Configuration()
        kconfig.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig or self.admin_kubeconfig()),
            client_configuration=configuration,
            persist_config=False,
        )
        configuration.proxy = None  # never dial a proxy from the environment
        api = kclient.ApiClient(configuration)
        self._clients.append(api)
        nsclient.route_pool_manager(api.rest_client.pool_manager, self.ns)
        return api

    def serviceaccount_kubeconfig(
        self,
        namespace: str,
        name: str,
        *,
        expiration_seconds: int = 86400,
        pod: str | None = None,
    ) -> Path:
        """Return a kubeconfig authenticating as ServiceAccount `namespace`/`name` by token.

        The token is `serviceaccount_token`'s (bound to `pod` when given); the file is named
        after the ServiceAccount and the Pod.
        """
        token = self.serviceaccount_token(
            namespace, name, expiration_seconds=expiration_seconds, pod=pod
        )
        suffix = f"-{pod}" if pod else ""
        path = self.workdir / f"sa-{namespace}-{name}{suffix}.kubeconfig"
        self._write_kubeconfig(path, f"{namespace}-{name}{suffix}", {"token": token})
        return path

    def serviceaccount_token(
        self,
        namespace: str,
        name: str,
        *,
        expiration_seconds: int = 86400,
        pod: str | None = None,
        audiences: Sequence[str] = (SA_ISSUER,),
    ) -> str:
        """Return a token for ServiceAccount `namespace`/`name` from the TokenRequest API.

        Creates the namespace and the ServiceAccount when missing. With `pod` (an existing
        Pod of that namespace running as that ServiceAccount) the token is bound to the Pod,
        as the kubelet's projected tokens are: it names the Pod's node in the user's extra
        `authentication.kubernetes.io/node-name` and dies with the Pod. The SA has only the
        RBAC granted to it elsewhere.
        """
        core = kclient.CoreV1Api(self.api_client())
        _create_if_missing(
            lambda: core.create_namespace(
                kclient.V1Namespace(metadata=kclient.V1ObjectMeta(name=namespace))
            )
        )
        _create_if_missing(
            lambda: core.create_namespaced_service_account(
                namespace, kclient.V1ServiceAccount(metadata=kclient.V1ObjectMeta(name=name))
            )
        )
        bound = None
        if pod is not None:
            found = core.read_namespaced_pod(pod, namespace)
            uid = found.metadata.uid if found.metadata else None
            bound = kclient.V1BoundObjectReference(api_version="v1", kind="Pod", name=pod, uid=uid)
        request = kclient.AuthenticationV1TokenRequest(
            spec=kclient.V1TokenRequestSpec(
                audiences=list(audiences),
                expiration_seconds=expiration_seconds,
                bound_object_ref=bound,
            )
        )
        status = core.create_namespaced_service_account_token(name, namespace, request).status
        if status is None or not status.token:
            raise ControlPlaneError(f"TokenRequest for {namespace}/{name} returned no token")
        return str(status.token)

    def log_tails(self, lines: int = 50) -> str:
        """Return the last `lines` lines of each log, each under a header naming the file."""
        return "\n".join(tail(log, lines) for log in self.logs)

    # -- internals ---------------------------------------------------------------------

    def _spawn(self, what: str, argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
        proc = netns.spawn(self.ns, argv, log=log)
        self._procs.append((what, proc))
        return proc

    def _wait_healthy(
        self, proc: subprocess.Popen[bytes], what: str, healthy: Callable[[], bool], timeout: float
    ) -> None:
        try:
            wait_until(lambda: proc.poll() is not None or healthy(), timeout, what)
        except TimeoutError as exc:
            raise ControlPlaneError(f"{exc}\n{self.log_tails()}") from exc
        if proc.poll() is not None:
            raise ControlPlaneError(
                f"{what}: process exited with {proc.returncode}\n{self.log_tails()}"
            )

    def _etcd_healthy(self) -> bool:
        with nsclient.pool_manager(self.ns) as pm:
            return _get(pm, f"{ETCD_CLIENT_URL}/health") == 200

    def _etcd_args(self) -> list[str]:
        return [
            "--name=lab",
            f"--data-dir={self.workdir / 'etcd-data'}",
            f"--listen-client-urls={ETCD_CLIENT_URL}",
            f"--advertise-client-urls={ETCD_CLIENT_URL}",
            f"--listen-peer-urls={ETCD_PEER_URL}",
            f"--initial-advertise-peer-urls={ETCD_PEER_URL}",
            f"--initial-cluster=lab={ETCD_PEER_URL}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync=true",
        ]

    def _apiserver_args(self, p: pki.ControlPlanePki) -> list[str]:
        if self.kubelets:
            # As real clusters run: kubelets authorised by the Node authorizer and limited to
            # their own Node and Pods by NodeRestriction; the apiserver's own Endpoints for
            # the `kubernetes` Service (pods reach it through kube-proxy); a client cert for
            # the kubelets' API (logs, exec).
            kubelet_client = self.kubelet_client_cert()
            node_args = [
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                f"--kubelet-client-certificate={kubelet_client.cert}",
                f"--kubelet-client-key={kubelet_client.key}",
                "--kubelet-preferred-address-types=InternalIP",
            ]
        else:
            node_args = ["--authorization-mode=RBAC", "--endpoint-reconciler-type=none"]
        return [
            f"--etcd-servers={ETCD_CLIENT_URL}",
            f"--bind-address={self.ip4}",
            f"--advertise-address={self.ip4}",
            f"--secure-port={API_PORT}",
            f"--tls-cert-file={p.apiserver.cert}",
            f"--tls-private-key-file={p.apiserver.key}",
            f"--client-ca-file={p.ca.cert}",
            f"--service-account-issuer={SA_ISSUER}",
            f"--api-audiences={SA_ISSUER}",
            f"--service-account-key-file={p.sa_pub}",
            f"--service-account-signing-key-file={p.sa_key}",
            f"--service-cluster-ip-range={self.service_cidr},{DEFAULT_SERVICE_CIDR6}",
            *node_args,
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            "--profiling=false",
            "--v=1",
        ]

    def kubelet_client_cert(self) -> pki.CertKey:
        """Return the apiserver's client certificate for the kubelets' API (made once)."""
        p = self._require_pki()
        directory = self.workdir / "pki"
        if not (directory / "apiserver-kubelet-client.crt").exists():
            return pki.client_cert(
                p.ca, directory, "apiserver-kubelet-client",
                user="kube-apiserver-kubelet-client", groups=["system:masters"],
            )  # fmt: skip
        return pki.CertKey(
            directory / "apiserver-kubelet-client.crt", directory / "apiserver-kubelet-client.key"
        )

    def client_kubeconfig(self, stem: str, *, user: str, groups: Sequence[str] = ()) -> Path:
        """Return a kubeconfig authenticating as `user` in `groups` by a client certificate.

        For the lab's kubelets (system:node:<name> in system:nodes), kube-controller-manager
        and kube-scheduler (their own users, which RBAC's default bindings know). Made once;
        the file is `<stem>.kubeconfig` in the work directory.
        """
        path = self.workdir / f"{stem}.kubeconfig"
        if not path.exists():
            p = self._require_pki()
            cert = pki.client_cert(p.ca, self.workdir / "pki", stem, user=user, groups=groups)
            user_doc = {
                "client-certificate-data": _b64(cert.cert),
                "client-key-data": _b64(cert.key),
            }
            self._write_kubeconfig(path, user, user_doc)
        return path

    @property
    def certificates(self) -> pki.ControlPlanePki:
        """Return the control plane's PKI (CA, SA keys, ...); raises before `start()`."""
        return self._require_pki()

    def _require_pki(self) -> pki.ControlPlanePki:
        if self._pki is None:
            raise ControlPlaneError("control plane not started: no PKI yet")
        return self._pki

    def _write_kubeconfig(self, path: Path, user_name: str, user: dict[str, str]) -> None:
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "lab",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority-data": _b64(self._require_pki().ca.cert),
                    },
                }
            ],
            "users": [{"name": user_name, "user": user}],
            "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": user_name}}],
            "current-context": "lab",
        }
        path.touch(mode=0o600)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))


class ControlPlaneAccess:
    """The admin API of a lab's control plane, for the labs that run one (ClusterLab,
    RealNodeCluster): `controlplane` raises `not_up` before `up()`, `api` is made once."""

    not_up: type[Exception] = ControlPlaneError
    _cp: ControlPlane | None = None
    _api: kclient.ApiClient | None = None

    @property
    def controlplane(self) -> ControlPlane:
        """Return the running control plane; raises `not_up` before `up()`."""
        if self._cp is None:
            raise self.not_up("the lab is not up: no control plane")
        return self._cp

    @property
    def api(self) -> kclient.ApiClient:
        """Return an admin ApiClient usable from the test process (renewed after a restart)."""
        if self._api is None:
            self._api = self.controlplane.api_client()
        return self._api

    @property
    def core(self) -> kclient.CoreV1Api:
        """Return a CoreV1Api on `api`."""
        return kclient.CoreV1Api(self.api)

    @property
    def apps(self) -> kclient.AppsV1Api:
        """Return an AppsV1Api on `api`."""
        return kclient.AppsV1Api(self.api)

    @property
    def discovery(self) -> kclient.DiscoveryV1Api:
        """Return a DiscoveryV1Api on `api`."""
        return kclient.DiscoveryV1Api(self.api)


def tail(path: Path, lines: int = 50) -> str:
    """Return a header naming `path` and its last `lines` lines ("(missing)" if absent)."""
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except FileNotFoundError:
        text = ["(missing)"]
    return f"----- {path} (last {lines} lines) -----\n" + "\n".join(text)


def _get(pm: urllib3.PoolManager, url: str) -> int:
    return pm.request("GET", url, timeout=2.0, retries=False, preload_content=True).status


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def _create_if_missing(create: Callable[[], object]) -> None:
    try:
        create()
    except ApiException as exc:
        if exc.status != 409:
            raise
