"""An in-memory API server for the controller, enforcing resourceVersion as the real one does.

`FakeServer` holds Services, Nodes and Leases; `FakeServer.client(name)` is one replica's
`ControllerAPI` onto it, so every request is recorded with who made it. Like kube-apiserver,
every write bumps one global resourceVersion, and a write that carries a resourceVersion is
applied only to that version of the object (409 otherwise; a patch to a deleted Service is a
404): the two answers the controller maps to CONFLICT. `guard=False` turns that check off, so
a test can show that an interleaving it relies on really needs the guard.

Finalizers work as the apiserver's do: deleting a Service that has one only sets
metadata.deletionTimestamp, the Service goes once a patch removes the last one, and a patch
that adds one to a Service being deleted is refused (422).

After every write the server checks that no address is in two Services' status at once and
records each moment one is (`duplicates`): a test asserts the list stays empty.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agent.controller.api import CONFLICT, APIError, Patched, PatchResult, Watched

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Request:
    """One request the server answered: who sent it, what, about which object, and how it ended."""

    client: str
    verb: str  # "patch-status", "patch-metadata", "create-lease", "replace-lease"
    key: str
    result: str  # "ok", "conflict", "not-found", "invalid"
    body: dict[str, Any] | None = None


@dataclass
class FakeServer:
    """The objects and the request log; see the module doc."""

    guard: bool = True
    revision: int = 100
    services: dict[str, dict[str, Any]] = field(default_factory=dict)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    leases: dict[str, dict[str, Any]] = field(default_factory=dict)
    pool_status: dict[str, dict[str, Any]] = field(default_factory=dict)  # by pool name
    log: list[Request] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    # Called with (client, verb, key) before a write is applied: lets a test run another
    # replica's step exactly between this request's read and its write.
    before_write: Callable[[str, str, str], None] | None = None

    def client(self, name: str) -> FakeClient:
        """Return one replica's API onto this server."""
        return FakeClient(self, name)

    # -- what users do ----------------------------------------------------------------------

    def create_service(
        self,
        name: str,
        *,
        namespace: str = "ns",
        created: str = "2026-12-01T10:00:00Z",
        annotations: dict[str, str] | None = None,
        ports: tuple[int, ...] = (80,),
    ) -> str:
        """Create a LoadBalancer Service; return its key. `created` orders allocation."""
        key = f"{namespace}/{name}"
        self.services[key] = {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"uid-{name}",
                "creationTimestamp": created,
                "annotations": dict(annotations or {}),
                "resourceVersion": self._bump(),
            },
            "spec": {
                "type": "LoadBalancer",
                "ports": [{"port": p, "protocol": "TCP"} for p in ports],
                "ipFamilies": ["IPv4"],
                "ipFamilyPolicy": "SingleStack",
            },
            "status": {},
        }
        return key

    def annotate(self, key: str, annotations: dict[str, str]) -> None:
        """Change a Service's annotations (a user's edit: a new resourceVersion)."""
        meta = self.services[key]["metadata"]
        meta["annotations"] = {**meta["annotations"], **annotations}
        meta["resourceVersion"] = self._bump()

    def delete_service(self, key: str) -> None:
        """Delete a Service: at once without finalizers, else mark it (deletionTimestamp)."""
        meta = self.services[key]["metadata"]
        if not meta.get("finalizers"):
            del self.services[key]
        elif not meta.get("deletionTimestamp"):
            meta["deletionTimestamp"] = "2026-12-01T12:00:00Z"
            meta["resourceVersion"] = self._bump()

    def set_type(self, key: str, kind: str) -> None:
        """Change a Service's spec.type (the apiserver drops loadBalancerClass with it)."""
        obj = self.services[key]
        obj["spec"]["type"] = kind
        if kind != "LoadBalancer":
            obj["spec"].pop("loadBalancerClass", None)
        obj["metadata"]["resourceVersion"] = self._bump()

    # -- what a test reads ------------------------------------------------------------------

    def ips(self, key: str) -> tuple[str, ...]:
        """Return the addresses in a Service's status.loadBalancer.ingress, in order."""
        status = self.services[key].get("status") or {}
        ingress = (status.get("loadBalancer") or {}).get("ingress") or []
        return tuple(str(e["ip"]) for e in ingress if e.get("ip"))

    def holders(self) -> dict[str, list[str]]:
        """Return every address in some status with the Services holding it."""
        held: dict[str, list[str]] = {}
        for key in sorted(self.services):
            for ip in self.ips(key):
                held.setdefault(ip, []).append(key)
        return held

    def finalizers(self, key: str) -> list[str]:
        return list(self.services[key]["metadata"].get("finalizers") or [])

    def requests(self, client: str, verb: str = "patch-status") -> list[Request]:
        return [r for r in self.log if r.client == client and r.verb == verb]

    def writes(self, client: str) -> list[tuple[str, str, str]]:
        """Return (verb, key, result) of every Service patch `client` sent, in order."""
        return [
            (r.verb, r.key, r.result)
            for r in self.log
            if r.client == client and r.verb in ("patch-status", "patch-metadata")
        ]

    def write_results(self, client: str) -> dict[str, str]:
        """Return how the last Service patch `client` sent for each Service ended (a write
        stops at its first refused request, so this is how each one's last write ended)."""
        return {key: result for _, key, result in self.writes(client)}

    # -- the server -------------------------------------------------------------------------

    def _bump(self) -> str:
        self.revision += 1
        return str(self.revision)

    def _check_unique(self) -> None:
        for ip, keys in self.holders().items():
            if len(keys) > 1:
                self.duplicates.append(f"{ip} held by {keys} at revision {self.revision}")

    def patch_status(
        self, client: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> tuple[str, str]:
        """Apply a status merge patch; return (result, the resourceVersion after it)."""
        key = f"{namespace}/{name}"
        obj = self._guarded(client, "patch-status", key, patch)
        if obj is None:
            return self.log[-1].result, ""
        obj["status"] = merge_patch(obj.get("status") or {}, patch.get("status") or {})
        obj["metadata"]["resourceVersion"] = self._bump()
        self._check_unique()
        return self._answer(Request(client, "patch-status", key, "ok", patch)), obj["metadata"][
            "resourceVersion"
        ]

    def patch_metadata(
        self, client: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> tuple[str, str]:
        """Apply a merge patch of a Service's metadata; return (result, resourceVersion)."""
        key = f"{namespace}/{name}"
        obj = self._guarded(client, "patch-metadata", key, patch)
        if obj is None:
            return self.log[-1].result, ""
        meta = obj["metadata"]
        changes = {k: v for k, v in (patch.get("metadata") or {}).items() if k != "resourceVersion"}
        before = set(meta.get("finalizers") or [])
        after = merge_patch(meta, changes)
        if meta.get("deletionTimestamp") and set(after.get("finalizers") or []) - before:
            # The apiserver's answer: no new finalizers on an object being deleted.
            return self._answer(Request(client, "patch-metadata", key, "invalid", patch)), ""
        obj["metadata"] = after
        after["resourceVersion"] = self._bump()
        if after.get("deletionTimestamp") and not after.get("finalizers"):
            del self.services[key]  # the last finalizer gone: the deletion completes
        return self._answer(Request(client, "patch-metadata", key, "ok", patch)), after[
            "resourceVersion"
        ]

    def _guarded(
        self, client: str, verb: str, key: str, patch: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Return the object a guarded patch applies to; None when refused (and logged)."""
        if self.before_write is not None:
            self.before_write(client, verb, key)
        obj = self.services.get(key)
        if obj is None:
            self._answer(Request(client, verb, key, "not-found", patch))
            return None
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if self.guard and wanted is not None and wanted != obj["metadata"]["resourceVersion"]:
            self._answer(Request(client, verb, key, "conflict", patch))
            return None
        return obj

    def write_lease(self, client: str, verb: str, namespace: str, body: dict[str, Any]) -> str:
        name = body["metadata"]["name"]
        key = f"{namespace}/{name}"
        if self.before_write is not None:
            self.before_write(client, verb, key)
        current = self.leases.get(key)
        if verb == "create-lease" and current is not None:
            return self._answer(Request(client, verb, key, "conflict", body))
        if verb == "replace-lease":
            if current is None:
                return self._answer(Request(client, verb, key, "not-found", body))
            wanted = body["metadata"].get("resourceVersion")
            if self.guard and wanted != current["metadata"]["resourceVersion"]:
                return self._answer(Request(client, verb, key, "conflict", body))
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = self._bump()
        self.leases[key] = stored
        return self._answer(Request(client, verb, key, "ok", body))

    def _answer(self, request: Request) -> str:
        self.log.append(request)
        return request.result


def merge_patch(target: Any, patch: Any) -> Any:
    """Return `target` after a JSON merge patch (RFC 7386): None removes a key."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


@dataclass
class FakeClient:
    """One replica's ControllerAPI onto a FakeServer. `partitioned`: no request gets through."""

    server: FakeServer
    name: str
    partitioned: bool = False
    calls: list[str] = field(default_factory=list)  # the methods called, in order

    def _reach(self, call: str) -> None:
        self.calls.append(call)
        if self.partitioned:
            raise APIError("no answer: partitioned from the apiserver")

    def list_services(self) -> list[dict[str, Any]]:
        self._reach("list_services")
        return copy.deepcopy([self.server.services[k] for k in sorted(self.server.services)])

    def patch_service_status(self, namespace: str, name: str, patch: dict[str, Any]) -> Patched:
        self._reach("patch_service_status")
        return _patched(*self.server.patch_status(self.name, namespace, name, patch))

    def patch_service_metadata(self, namespace: str, name: str, patch: dict[str, Any]) -> Patched:
        self._reach("patch_service_metadata")
        return _patched(*self.server.patch_metadata(self.name, namespace, name, patch))

    def list_nodes(self) -> list[dict[str, Any]]:
        self._reach("list_nodes")
        return copy.deepcopy(self.server.nodes)

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._reach("read_lease")
        lease = self.server.leases.get(f"{namespace}/{name}")
        return copy.deepcopy(lease) if lease is not None else None

    def create_lease(self, namespace: str, body: dict[str, Any]) -> bool:
        self._reach("create_lease")
        return self.server.write_lease(self.name, "create-lease", namespace, body) == "ok"

    def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> bool:
        self._reach("replace_lease")
        result = self.server.write_lease(self.name, "replace-lease", namespace, body)
        if result == "not-found":
            raise APIError("HTTP 404: Not Found", status=404)
        return result == "ok"

    def watched(self, *, report_namespace: str) -> Watched:
        return Watched(_no_watch, _no_watch, _no_watch, _no_watch, _no_watch, _no_watch)

    def patch_pool_status(self, name: str, status: dict[str, Any]) -> None:
        self._reach("patch_pool_status")
        self.server.pool_status[name] = copy.deepcopy(status)


def _patched(result: str, version: str) -> Patched:
    """Return the client's answer for a server result, as KubeControllerAPI maps HTTP."""
    if result == "invalid":
        raise APIError("HTTP 422: Unprocessable Entity", status=422)
    return Patched(PatchResult.OK, version) if result == "ok" else CONFLICT


def _no_watch(**kwargs: Any) -> Any:
    raise AssertionError("unit tests feed the controller's stores themselves")


class FakeClock:
    """A monotonic and a wall clock that move only when a test moves them."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._wall0 = datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.UTC)
        self._start = start

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> datetime.datetime:
        return self._wall0 + datetime.timedelta(seconds=self.now - self._start)

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Queued:
    """A call submitted to a ManualExecutor and not run yet."""

    future: Future[Any]
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class ManualExecutor(Executor):
    """An executor that runs nothing until the test says which submitted call runs next."""

    def __init__(self) -> None:
        self.queued: list[Queued] = []

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        self.queued.append(Queued(future, fn, args, kwargs))
        return future

    def run(self, index: int = 0) -> None:
        """Run the `index`-th queued call (its done callbacks run here, as on a worker)."""
        call = self.queued.pop(index)
        try:
            call.future.set_result(call.fn(*call.args, **call.kwargs))
        except Exception as exc:
            call.future.set_exception(exc)

    def run_all(self) -> None:
        while self.queued:
            self.run()
