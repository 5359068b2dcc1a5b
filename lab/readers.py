"""Reading /metrics and /status as a real scraper does: a reader ServiceAccount's token.

The agents and controllers serve those paths over TLS to a bearer token that a TokenReview
authenticates and a SubjectAccessReview allows (agent/kube/access.py). The lab reads them
as Prometheus would: a ServiceAccount `nodelb-lab-reader` in nodelb-system bound to the
ClusterRole `nodelb-metrics-reader` exactly as deploy/daemonset.yaml defines it, with a token
from the TokenRequest API; and it verifies each process's self-signed certificate against
the copy the process published (`--metrics-cert-out`). There is no way around the check.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

from agent.serving_cert import client_context
from lab import nsclient
from lab.controlplane import ControlPlane

NAMESPACE = "nodelb-system"
READER = "nodelb-lab-reader"
READER_ROLE = "nodelb-metrics-reader"
_DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "daemonset.yaml"
_TOKENS: dict[int, str] = {}  # per ControlPlane object


def reader_role() -> dict[str, Any]:
    """Return the ClusterRole readers are bound to, as deploy/daemonset.yaml ships it."""
    for doc in yaml.safe_load_all(_DEPLOY.read_text()):
        if doc and doc["kind"] == "ClusterRole" and doc["metadata"]["name"] == READER_ROLE:
            return dict(doc)
    raise LookupError(f"{_DEPLOY}: no ClusterRole {READER_ROLE}")


def _create(call: Any, *args: Any) -> None:
    try:
        call(*args)
    except ApiException as exc:
        if exc.status != 409:
            raise


def reader_token(cp: ControlPlane) -> str:
    """Return a token of the lab's reader ServiceAccount (created and bound on first use)."""
    if id(cp) in _TOKENS:
        return _TOKENS[id(cp)]
    api = cp.api_client()
    rbac = kclient.RbacAuthorizationV1Api(api)
    _create(rbac.create_cluster_role, reader_role())
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": READER},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": READER_ROLE,
        },
        "subjects": [{"kind": "ServiceAccount", "name": READER, "namespace": NAMESPACE}],
    }
    _create(rbac.create_cluster_role_binding, binding)
    token = cp.serviceaccount_token(NAMESPACE, READER)
    _TOKENS[id(cp)] = token
    return token


def get(
    ns: str,
    url: str,
    *,
    cert: Path,
    token: str | None,
    timeout: float = 2.0,
) -> tuple[int, str]:
    """Return (status, body) of a GET on `url` from inside namespace `ns`, verifying the
    server against its published certificate `cert` and sending `token` (None: none)."""
    context: ssl.SSLContext = client_context(ca_file=cert, pinned=True)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with nsclient.pool_manager(ns, ssl_context=context) as pm:
        resp = pm.request(
            "GET", url, headers=headers, timeout=timeout, retries=False, preload_content=True
        )
        return resp.status, resp.data.decode(errors="replace")
