"""The bearer-token gate's shell: TokenReview and SubjectAccessReview calls, and the cache.

The decision is agent/kube/access.py (pure); this module asks the apiserver and keeps the
answers for their TTL. `AccessGate.check(path, authorization)` is what the HTTP handler calls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import orjson
from kubernetes import client

from agent.kube import metrics
from agent.kube.access import (
    VERB,
    AccessResult,
    Decision,
    Identity,
    ReviewCache,
    TokenResult,
    Verdict,
    bearer_token,
    decide,
    identity_from_review,
    needs_token,
    token_key,
)

REVIEW_TIMEOUT = 5.0  # s per review request


class ReviewError(OSError):
    """A review could not be made (the apiserver did not answer it)."""


class Reviewer(Protocol):
    """The two reviews the gate needs."""

    def review_token(self, token: str) -> TokenResult:
        """Return who `token` is (TokenReview); raise ReviewError when it cannot be asked."""
        ...

    def review_access(self, identity: Identity, path: str) -> AccessResult:
        """Return whether `identity` may get `path` (SubjectAccessReview); ReviewError else."""
        ...


class KubeReviewer:
    """Reviewer over the kubernetes client (needs create on tokenreviews and
    subjectaccessreviews: the ClusterRoles in deploy/daemonset.yaml grant both)."""

    def __init__(self, api: Any) -> None:
        self._authn = client.AuthenticationV1Api(api)
        self._authz = client.AuthorizationV1Api(api)

    def review_token(self, token: str) -> TokenResult:
        body = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token))
        status = _status("TokenReview", self._authn.create_token_review, body)
        return identity_from_review(status)

    def review_access(self, identity: Identity, path: str) -> AccessResult:
        body = client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=identity.username,
                uid=identity.uid or None,
                groups=list(identity.groups),
                extra=identity.extra_dict() or None,
                non_resource_attributes=client.V1NonResourceAttributes(path=path, verb=VERB),
            )
        )
        status = _status("SubjectAccessReview", self._authz.create_subject_access_review, body)
        return AccessResult(status.get("allowed") is True, str(status.get("reason") or ""))


def _status(kind: str, create: Callable[..., Any], body: Any) -> dict[str, Any]:
    """Return the raw `status` of a review `create` answers; ReviewError when it cannot."""
    try:
        raw: Any = create(body, _preload_content=False, _request_timeout=REVIEW_TIMEOUT)
        status = orjson.loads(raw.data).get("status") or {}
    except Exception as exc:  # any transport or API failure: the caller answers 503
        raise ReviewError(f"{kind} failed: {exc}") from None
    return dict(status) if isinstance(status, dict) else {}


class AccessGate:
    """Decides each request with cached reviews; safe to call from many handler threads."""

    def __init__(
        self,
        reviewer: Reviewer,
        *,
        clock: Callable[[], float] = time.monotonic,
        cache: ReviewCache | None = None,
    ) -> None:
        self._reviewer = reviewer
        self._clock = clock
        self._cache = cache if cache is not None else ReviewCache()
        self._lock = threading.Lock()

    def check(self, path: str, authorization: str | None) -> Decision:
        """Return the decision for a GET of `path` with that Authorization header."""
        if not needs_token(path):
            return Decision(Verdict.OPEN)
        decision = self._decide(path, authorization)
        metrics.HTTP_AUTH.labels(decision.verdict.value).inc()
        return decision

    def _decide(self, path: str, authorization: str | None) -> Decision:
        token = bearer_token(authorization)
        if token is None:
            return decide(None, None)
        key = token_key(token)
        try:
            who = self._cached(("token", key), lambda: self._reviewer.review_token(token))
            assert isinstance(who, TokenResult)
            if who.identity is None:
                return decide(who, None)
            identity = who.identity
            may = self._cached(
                ("access", key, path), lambda: self._reviewer.review_access(identity, path)
            )
            assert isinstance(may, AccessResult)
        except ReviewError as exc:
            return Decision(Verdict.REVIEW_FAILED, f"Service Unavailable: {exc}\n")
        return decide(who, may)

    def _cached(
        self, key: tuple[str, ...], review: Callable[[], TokenResult | AccessResult]
    ) -> TokenResult | AccessResult:
        with self._lock:
            found = self._cache.get(key, self._clock())
        if found is not None:
            return found
        result = review()  # outside the lock: one slow review must not hold up the others
        with self._lock:
            self._cache.put(key, result, self._clock())
        return result
