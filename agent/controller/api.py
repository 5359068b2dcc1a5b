"""What the controller needs from the outside world: a narrow API interface, and the clocks.

`ControllerAPI` is every request the controller makes (its watches aside): one consistent
list of every Service, a status patch and a metadata patch (the cleanup finalizer), both
guarded by resourceVersion, the list of Nodes a pool configuration is checked against, and
the Lease calls of the leader election (`LeaseAPI`).
Objects go in and come out as raw dicts parsed with orjson (`_preload_content=False`), never
through the client's model classes (docs/decisions.md). `KubeControllerAPI` is the real one
over the kubernetes client; the unit tests use an in-memory fake that enforces
resourceVersion the way the apiserver does.

`Clock` is the monotonic time (timers, Lease expiry as this process saw it) and the wall time
(written into Leases and condition timestamps); the loop and the elector take one, so tests
move time by hand and never sleep.
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, cast

import orjson
import urllib3.exceptions
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from agent.kube.client import read_body
from agent.kube.lists import ListFn, list_all
from agent.kube.node_report import REPORT_LABEL, REPORT_LABEL_VALUE

MERGE_PATCH = "application/merge-patch+json"
POOL_GROUP, POOL_VERSION, POOL_PLURAL = "nodelb.io", "v1alpha1", "loadbalancerippools"


class APIError(Exception):
    """A request the API server refused, or could not be sent (`status` None: no answer)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class PatchResult(enum.StrEnum):
    """How a guarded patch ended, when the server answered it."""

    OK = "ok"
    CONFLICT = "conflict"  # 409: the resourceVersion moved on since the view; 404: deleted


@dataclass(frozen=True, slots=True)
class Patched:
    """How a guarded patch ended, and the Service's resourceVersion after it ("" unless OK).

    The next request of the same write is guarded by that resourceVersion: the controller's
    own patch moved it on, anyone else's since makes the next one fail.
    """

    result: PatchResult
    resource_version: str = ""


CONFLICT = Patched(PatchResult.CONFLICT)


@dataclass(frozen=True, slots=True)
class Watched:
    """The list calls the controller's reflectors list and watch (raw responses)."""

    services: ListFn
    namespaces: ListFn
    reports: ListFn  # node report Leases, in the controller's namespace
    slices: ListFn  # EndpointSlices: what the Services' addresses can serve
    nodes: ListFn  # which nodes exist (a report speaks only for one), and their labels
    pools: ListFn | None = None  # LoadBalancerIPPool objects (when the file has no pools:)


class LeaseAPI(Protocol):
    """The Lease requests of the leader election (agent.controller.leader)."""

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Return the raw Lease, or None when it does not exist."""
        ...

    def create_lease(self, namespace: str, body: dict[str, Any]) -> bool:
        """Return True when the Lease was created, False when another candidate was first."""
        ...

    def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> bool:
        """Return True when written, False when refused for the body's resourceVersion.

        The body carries the resourceVersion it was computed from; a Lease that changed
        since (another candidate wrote first) is not overwritten.
        """
        ...


class ControllerAPI(LeaseAPI, Protocol):
    """Every request the controller makes; each raises APIError for other failures."""

    def list_services(self) -> list[dict[str, Any]]:
        """Return every Service, from one consistent (paginated) read."""
        ...

    def patch_service_status(self, namespace: str, name: str, patch: dict[str, Any]) -> Patched:
        """Return how a JSON merge patch of a Service's status ended.

        `patch` carries metadata.resourceVersion: the server applies it only to that version
        (CONFLICT otherwise, or when the Service is gone).
        """
        ...

    def patch_service_metadata(self, namespace: str, name: str, patch: dict[str, Any]) -> Patched:
        """Return how a JSON merge patch of a Service itself ended (its metadata.finalizers).

        Guarded by the metadata.resourceVersion `patch` carries, as the status patch is.
        """
        ...

    def list_nodes(self) -> list[dict[str, Any]]:
        """Return every Node (what a pool configuration must not overlap)."""
        ...

    def watched(self, *, report_namespace: str) -> Watched:
        """Return the list calls for the reflectors (node reports from `report_namespace`)."""
        ...

    def patch_pool_status(self, name: str, status: dict[str, Any]) -> None:
        """Replace a LoadBalancerIPPool's status (a merge patch of the status subresource).

        Unguarded: only the leader writes pool status and each write is the whole status
        computed from its own state, so a lost race is repaired by the next write.
        """
        ...


class Clock(Protocol):
    """The two clocks the controller reads."""

    def monotonic(self) -> float:
        """Return seconds on a monotonic origin (timers, expiry as this process saw it)."""
        ...

    def wall(self) -> datetime.datetime:
        """Return the current UTC time (what is written for people and other machines)."""
        ...


class SystemClock:
    """The real clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC)


@contextlib.contextmanager
def _as_api_error() -> Iterator[None]:
    """Raise the client's errors as APIError: an answer with its status, or no answer."""
    try:
        yield
    except ApiException as exc:
        raise APIError(f"HTTP {exc.status}: {exc.reason}", status=exc.status) from exc
    except urllib3.exceptions.HTTPError as exc:
        raise APIError(f"no answer: {exc}") from exc


class KubeControllerAPI:
    """ControllerAPI over the kubernetes client (an ApiClient)."""

    def __init__(self, api_client: Any) -> None:
        self._core = client.CoreV1Api(api_client)
        self._coord = client.CoordinationV1Api(api_client)
        self._discovery = client.DiscoveryV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)

    def list_services(self) -> list[dict[str, Any]]:
        with _as_api_error():
            return list_all(cast(ListFn, self._core.list_service_for_all_namespaces))

    def patch_service_status(self, namespace: str, name: str, patch: dict[str, Any]) -> Patched:
        return self._patched(
            functools.partial(self._core.patch_namespaced_service_status, name, namespace, patch)
        )

    def patch_service_metadata(self, namespace: str, name: str, patch: dict[str, Any]) -> Patched:
        return self._patched(
            functools.partial(self._core.patch_namespaced_service, name, namespace, patch)
        )

    @staticmethod
    def _patched(call: functools.partial[Any]) -> Patched:
        """Send a merge patch; return its result and the resourceVersion the server answered."""
        try:
            with _as_api_error():
                raw: Any = call(_content_type=MERGE_PATCH, _preload_content=False)
        except APIError as exc:
            if exc.status in (404, 409):
                return CONFLICT
            raise
        obj = orjson.loads(read_body(raw))
        version = (
            (obj.get("metadata") or {}).get("resourceVersion") if isinstance(obj, dict) else None
        )
        if not version:
            raise APIError("patch answered without metadata.resourceVersion")
        return Patched(PatchResult.OK, str(version))

    def list_nodes(self) -> list[dict[str, Any]]:
        with _as_api_error():
            raw: Any = self._core.list_node(_preload_content=False)
        items: list[dict[str, Any]] = orjson.loads(read_body(raw)).get("items") or []
        return items

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            with _as_api_error():
                raw: Any = self._coord.read_namespaced_lease(
                    name, namespace, _preload_content=False
                )
        except APIError as exc:
            if exc.status == 404:
                return None
            raise
        lease: dict[str, Any] = orjson.loads(read_body(raw))
        return lease

    def create_lease(self, namespace: str, body: dict[str, Any]) -> bool:
        return self._written(
            functools.partial(self._coord.create_namespaced_lease, namespace, cast(Any, body))
        )

    def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> bool:
        return self._written(
            functools.partial(
                self._coord.replace_namespaced_lease, name, namespace, cast(Any, body)
            )
        )

    @staticmethod
    def _written(call: functools.partial[Any]) -> bool:
        try:
            with _as_api_error():
                read_body(call(_preload_content=False))  # unread, it would keep its connection
        except APIError as exc:
            if exc.status in (409, 422):  # another candidate wrote first
                return False
            raise
        return True

    def watched(self, *, report_namespace: str) -> Watched:
        return Watched(
            services=cast(ListFn, self._core.list_service_for_all_namespaces),
            namespaces=cast(ListFn, self._core.list_namespace),
            reports=cast(
                ListFn,
                functools.partial(
                    self._coord.list_namespaced_lease,
                    report_namespace,
                    label_selector=f"{REPORT_LABEL}={REPORT_LABEL_VALUE}",
                ),
            ),
            slices=cast(ListFn, self._discovery.list_endpoint_slice_for_all_namespaces),
            nodes=cast(ListFn, self._core.list_node),
            pools=cast(
                ListFn,
                functools.partial(
                    self._custom.list_cluster_custom_object, POOL_GROUP, POOL_VERSION, POOL_PLURAL
                ),
            ),
        )

    def patch_pool_status(self, name: str, status: dict[str, Any]) -> None:
        with _as_api_error():
            self._custom.patch_cluster_custom_object_status(
                POOL_GROUP,
                POOL_VERSION,
                POOL_PLURAL,
                name,
                {"status": status},
                _content_type=MERGE_PATCH,
                _preload_content=False,
            )
