"""Build an API client from a kubeconfig file or the in-cluster service-account credentials."""

from __future__ import annotations

import ipaddress
import urllib.parse
from pathlib import Path
from typing import Any

from kubernetes import client, config

from agent.model.net import IPAddress


def api_client(kubeconfig: Path | None, *, pool_size: int = 8) -> Any:
    """Return a kubernetes ApiClient: from `kubeconfig`, else from the in-cluster credentials."""
    configuration = client.Configuration()
    if kubeconfig is not None:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig), client_configuration=configuration
        )
    else:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    # Watches hold connections open; one pool slot per reflector plus status writes and Events.
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


def read_body(resp: Any) -> bytes:
    """Return the body of a raw response (`_preload_content=False`) and give its connection
    back to the pool.

    A raw response whose body is never read keeps its pooled connection: the pool runs dry
    and every later request opens a new TLS connection (the handshake cost more than the
    request at 10k Services). Reading the whole body releases it; `release_conn` makes sure.
    """
    try:
        return bytes(resp.data)
    finally:
        resp.release_conn()


def api_host_addresses(api: Any) -> tuple[IPAddress, ...]:
    """Return the address the client reaches the API server at, when its URL names an IP
    literal (a host name gives none: resolving it here would be a guess)."""
    host = urllib.parse.urlsplit(str(api.configuration.host)).hostname or ""
    try:
        return (ipaddress.ip_address(host),)
    except ValueError:
        return ()
